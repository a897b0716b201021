"""Time words in a query: "yesterday", "last week", "in May", "3 days ago" -> the span of time they name, against
a clock (the store's, or a given `now`), so recall(..., time_words=True) can prefer facts from that span.

English only, and only unambiguous spans; the first time expression of the query wins. A span is [start, end) in
UTC, days cut at UTC midnight. Pure functions, no store state.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, NamedTuple

from ..errors import InvalidInput
from .timing import parse_time
from .validate import K_MAX

if TYPE_CHECKING:
    from .memory_store import MemoryStore
    from .records import Recall

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "couple of": 2, "few": 3}
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}


class Span(NamedTuple):
    start: datetime  # inclusive, UTC
    end: datetime  # exclusive, UTC
    words: str  # the matched expression


def _day(t: datetime) -> datetime:
    return t.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)


def _month_start(year: int, month: int) -> datetime:
    return datetime(year, month, 1, tzinfo=timezone.utc)


def _next_month(year: int, month: int) -> datetime:
    return _month_start(year + (month == 12), 1 if month == 12 else month + 1)


_PATTERNS = [
    # a future time ("next Friday", "tomorrow") names no span a remembered fact was made in: no preference
    ("future", re.compile(r"\b(tomorrow|(next|coming|upcoming) (week|month|year|" + "|".join(WEEKDAYS) + r"))\b")),
    ("today", re.compile(r"\b(today|this (morning|afternoon|evening))\b")),
    ("yesterday", re.compile(r"\b(yesterday|last night)\b")),
    ("ago", re.compile(r"\b(\d+|an?|one|two|three|four|five|six|seven|eight|nine|ten|couple of|few) "
                       r"(day|week|month|year)s? ago\b")),
    ("last_unit", re.compile(r"\b(last|previous) (week|month|year)\b")),
    ("this_unit", re.compile(r"\b(this|the current) (week|month|year)\b")),
    ("weekday", re.compile(r"\b(on |last )?(" + "|".join(WEEKDAYS) + r")\b")),
    ("month", re.compile(r"\b(in|during|last) (" + "|".join(MONTHS) + r")( (\d{4}))?\b")),
    ("year", re.compile(r"\b(in|during) ((?:19|20)\d\d)\b")),
]


def parse_span(query: str, now: datetime) -> Span | None:
    """The span of time the query's first time expression names, relative to `now` (aware); None when it names
    none, names the future, or lies outside the calendar ("5000 years ago" from 2026). A month or weekday without
    a year means the last one up to now ("in May" in June: this May)."""
    try:
        return _span(query, now)
    except (OverflowError, ValueError):  # before year 1 or after 9999: no span a fact was made in
        return None


def _span(query: str, now: datetime) -> Span | None:
    text = query.lower()
    found = []
    for kind, pattern in _PATTERNS:
        m = pattern.search(text)
        if m:
            found.append((m.start(), kind, m))
    if not found:
        return None
    _, kind, m = min(found, key=lambda f: f[0])
    if kind == "future":
        return None
    today = _day(now)
    if kind == "today":
        return Span(today, today + timedelta(days=1), m.group(0))
    if kind == "yesterday":
        return Span(today - timedelta(days=1), today, m.group(0))
    if kind == "ago":
        n = int(m.group(1)) if m.group(1).isdigit() else _NUMBERS[m.group(1)]
        unit = _UNIT_DAYS[m.group(2)]
        center = today - timedelta(days=n * unit)
        slack = timedelta(days=max(1, unit // 2) if unit > 1 else 1)
        return Span(center - slack, center + slack + timedelta(days=1 if unit == 1 else 0), m.group(0))
    if kind in ("last_unit", "this_unit"):
        unit_name = m.group(2)
        if unit_name == "week":
            start = today - timedelta(days=today.weekday())  # Monday
            if kind == "last_unit":
                return Span(start - timedelta(days=7), start, m.group(0))
            return Span(start, start + timedelta(days=7), m.group(0))
        if unit_name == "month":
            start = _month_start(today.year, today.month)
            if kind == "last_unit":
                prev = start - timedelta(days=1)
                return Span(_month_start(prev.year, prev.month), start, m.group(0))
            return Span(start, _next_month(today.year, today.month), m.group(0))
        year = today.year - (kind == "last_unit")
        return Span(datetime(year, 1, 1, tzinfo=timezone.utc), datetime(year + 1, 1, 1, tzinfo=timezone.utc),
                    m.group(0))
    if kind == "weekday":
        back = (today.weekday() - WEEKDAYS.index(m.group(2))) % 7 or (7 if m.group(1) == "last " else 0)
        day = today - timedelta(days=back)
        return Span(day, day + timedelta(days=1), m.group(0))
    if kind == "month":
        month = MONTHS.index(m.group(2)) + 1
        if m.group(4):
            year = int(m.group(4))
        else:
            year = today.year if month <= today.month else today.year - 1
            if m.group(1) == "last" and month == today.month:
                year -= 1
        return Span(_month_start(year, month), _next_month(year, month), m.group(0))
    year = int(m.group(2))
    return Span(datetime(year, 1, 1, tzinfo=timezone.utc), datetime(year + 1, 1, 1, tzinfo=timezone.utc), m.group(0))


def recall_in_span(store: MemoryStore, query: str, k: int, time_words: bool, now: object, args: dict) -> list["Recall"]:
    """recall(..., time_words=True): the best hits created in the span the query's time words name, then (fewer
    than k) the best of the others; a plain recall when the query names no span."""
    if not time_words:
        raise InvalidInput("recall(now=...) is the time that time_words count from; pass time_words=True with it.")
    clock = datetime.now(timezone.utc) if now is None else parse_time(now, "recall(now=...)")
    span = parse_span(query, clock)
    if span is None:
        return store.recall(query, k, **args)
    within = {"created_at": {"$gte": span.start, "$lt": span.end}}
    where = args["where"]
    inside = store.recall(query, k, **{**args, "where": within if where is None else {"$and": [where, within]}})
    if len(inside) >= k:
        return inside
    seen = {h.id for h in inside}
    rest = [h for h in store.recall(query, min(k + len(inside), K_MAX), **args) if h.id not in seen]
    return inside + rest[: k - len(inside)]
