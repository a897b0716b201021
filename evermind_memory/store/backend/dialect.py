"""What differs between SQLite's and PostgreSQL's SQL in the statements both engines share (backend/session.py)
and in compiled filters (backend/filter_sql.py): the placeholder, how an IN list travels, how a time travels and
reads back, null-safe comparisons, and SQLite's planner hints. One `Dialect` per engine, as Chroma's `SqlDB`
has a parameter format per database. What an engine does differently rather than spells differently (FTS5 or
tsvector, the change log's upkeep, integrity checks, the generation table) stays in its own session module.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Sequence

from ..timing import time_text

IN_CHUNK = 500  # values per SQLite IN list (well under its limit on parameters)


def when(text: str | None) -> datetime | None:
    """An ISO 8601 text time (as the front passes them) as an aware datetime parameter."""
    return None if text is None else datetime.fromisoformat(text)


def _same(value: Any) -> Any:
    return value


def _canonical_text(column: str) -> str:
    """A timestamptz column as the canonical text (time_text): UTC, microseconds, "+00:00"."""
    return f"to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')"


@functools.lru_cache(maxsize=1024)
def _with_marks(sql: str, mark: str) -> str:
    return sql.replace("?", mark)


@dataclass(frozen=True)
class Dialect:
    """How one SQL engine spells what the shared statements need."""

    name: str
    mark: str  # the parameter placeholder
    distinct: str  # null-safe "not equal": a NULL column counts as different from any value
    same: str  # null-safe "equal": NULL matches NULL
    text_order: str  # appended to a text column compared with < > so that strings order by code point
    time_param: Callable[[datetime], Any]  # how a (UTC) time travels as a parameter
    text_time: Callable[[str | None], Any]  # how a time the front holds as ISO text travels (None stays None)
    read_time: Callable[[Any], datetime]  # a time column's value (not through time_column) as an aware datetime
    time_column: Callable[[str], str]  # a time column in a select list, read as the canonical text rows hold
    arrays: bool  # an IN list travels as one array parameter (`= ANY(?)`), not as chunks of `IN (?, ...)`
    no_limit: int | None = -1  # the LIMIT parameter that means "all rows"
    hint: str = ""  # prefixed to an indexed column that must not drive the query (SQLite: a unary plus)
    driving_join: str = "JOIN"  # a join that keeps its left side as the outer loop (SQLite: CROSS JOIN)

    def statement(self, sql: str) -> str:
        """A statement written with `?` placeholders in this engine's; a compiled filter in it (which carries
        this engine's marks already) has no `?`, and no statement of ours holds a literal `?`."""
        return sql if self.mark == "?" else _with_marks(sql, self.mark)

    def in_list(self, column: str, values: Sequence) -> Iterator[tuple[str, list]]:
        """(condition "`column` is one of `values`", its parameters), one per statement to run; none for no
        values. SQLite takes them in chunks of IN_CHUNK, PostgreSQL as one array."""
        if not len(values):
            return
        if self.arrays:
            yield f"{column} = ANY(?)", [list(values)]
            return
        for start in range(0, len(values), IN_CHUNK):
            chunk = list(values[start : start + IN_CHUNK])
            yield f"{column} IN ({','.join('?' * len(chunk))})", chunk

    def limit(self, n: int) -> int | None:
        """A LIMIT parameter; a negative `n` means no limit."""
        return self.no_limit if n < 0 else n


SQLITE = Dialect("sqlite", "?", "IS NOT", "IS", "", time_text, _same, datetime.fromisoformat, _same, arrays=False,
                 hint="+", driving_join="CROSS JOIN")
POSTGRES = Dialect("postgres", "%s", "IS DISTINCT FROM", "IS NOT DISTINCT FROM", ' COLLATE "C"', _same, when,
                   lambda value: value.astimezone(timezone.utc), _canonical_text, arrays=True, no_limit=None)
