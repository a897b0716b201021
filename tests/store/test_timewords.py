"""Time words in a query (store/timewords.py) and recall(..., time_words=True): the facts created in the span the
query names come first."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from evermind_memory.errors import InvalidInput
from evermind_memory.store.timewords import parse_span

NOW = datetime(2026, 12, 5, 15, 0, tzinfo=timezone.utc)  # a Saturday


@pytest.mark.parametrize("query, start, end", [
    ("what did Ada say yesterday?", "2026-12-04", "2026-12-05"),
    ("anything today", "2026-12-05", "2026-12-06"),
    ("plans we made last week", "2026-11-23", "2026-11-30"),
    ("what happened in May", "2026-05-01", "2026-06-01"),
    ("in December", "2026-12-01", "2027-01-01"),
    ("in May 2025", "2025-05-01", "2025-06-01"),
    ("3 days ago", "2026-12-01", "2026-12-04"),
    ("on Tuesday", "2026-12-01", "2026-12-02"),
    ("last Saturday", "2026-11-28", "2026-11-29"),
    ("last month", "2026-11-01", "2026-12-01"),
    ("this year", "2026-01-01", "2027-01-01"),
    ("in 2024", "2024-01-01", "2025-01-01"),
])
def test_time_words_name_a_span(query, start, end):
    span = parse_span(query, NOW)
    assert (span.start.date().isoformat(), span.end.date().isoformat()) == (start, end)


@pytest.mark.parametrize("query", ["what does Ada drink?", "this may be wrong", "the may pole", "week planner",
                                   # the future names no span a fact was made in ("next Friday" was once last Friday)
                                   "what is planned for next Friday", "tomorrow's meeting", "the coming week",
                                   # outside the calendar (once OverflowError / ValueError out of recall)
                                   "what happened 5000 years ago", "what happened 99999999999 days ago"])
def test_no_time_words_no_span(query):
    assert parse_span(query, NOW) is None


def test_a_span_before_year_one_is_none_and_recall_still_answers(store):
    assert parse_span("what happened last year", datetime(1, 6, 1, tzinfo=timezone.utc)) is None
    fid = store.remember("Ada planted the apple tree")
    for query, now in (("what did Ada plant 5000 years ago", None),
                       ("what did Ada plant last year", "0001-06-01T00:00:00Z")):
        assert [h.id for h in store.recall(query, k=1, time_words=True, now=now)] == [fid]


def test_recall_with_time_words_puts_the_span_first(store):
    ada = store.scope(user="ada")
    october = ada.remember("Ada's flight to Porto leaves Tuesday.", at="2026-10-12T10:00:00+00:00")
    november = ada.remember("Ada's flight to Kyoto leaves Friday.", at="2026-11-20T10:00:00+00:00")
    ada.remember("Ada's cat is called Miso.", at="2026-11-21T10:00:00+00:00")
    for month, want in (("October", october), ("November", november)):
        hits = ada.recall(f"where is Ada's flight going in {month}?", k=2, mode="lexical", time_words=True,
                          now=datetime(2026, 12, 5, tzinfo=timezone.utc))
        assert hits[0].id == want and len(hits) == 2  # the span's fact first, then the best of the rest
    none = ada.recall("where is Ada's flight going?", k=3, mode="lexical", time_words=True, now=NOW)
    assert [h.id for h in none] == [h.id for h in ada.recall("where is Ada's flight going?", k=3, mode="lexical")]


@pytest.mark.parametrize("kwargs, message", [
    ({"now": NOW}, "time_words=True"),
    ({"time_words": True, "now": "last tuesday"}, "ISO 8601"),
    ({"time_words": "yes"}, "time_words"),
])
def test_recall_refuses_bad_time_word_arguments(store, kwargs, message):
    store.remember("x")
    with pytest.raises(InvalidInput, match=message):
        store.recall("x yesterday", **kwargs)


def test_time_words_with_the_largest_k(store):
    """k=1000 with a span holding fewer facts than k once asked the plain recall for k + those facts (> 1000)."""
    inside = store.remember("Ada planted the apple tree", at=NOW)
    store.remember("Ada repotted the fig")
    hits = store.recall("what did Ada plant on Saturday", k=1000, time_words=True, now=NOW)
    assert hits[0].id == inside and len(hits) == 2
