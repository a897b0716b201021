"""The public read arguments (tags, where, source, since, until) turned into one `Selection` per call, with the
handle's scope and the time of the call: what every read and every bulk forget passes to the backend.

    select("recall", scope, tags={"topic": "travel"}, where={"n": {"$gt": 2}}, since="2025-05-01T00:00:00Z")

`tags` is the exact-match shorthand (every tag equal), `source` an exact source, `since` / `until` inclusive
bounds on created_at; they are ANDed with the where-filter (store/filters.py). The scope and the expiry
condition are not part of the filter: the backend adds them to every query itself.
"""

from __future__ import annotations

from datetime import datetime, timezone

from .backend.base import Selection
from .filters import Compare, Exists, Field, Filter, all_of, parse_where, tags_filter, time_window
from .validate import check_source, check_typed_tags


def source_filter(source: str | None) -> Filter:
    """The exact-source leaf (of a checked source); None: no condition."""
    return all_of() if source is None else Compare(Field("source"), "$eq", source)


def select(method: str, scope: str, *, tags: object = None, where: object = None, source: object = None,
           since: object = None, until: object = None, now: datetime | None = None) -> Selection:
    """The Selection of one call's arguments (checked here), in `scope`, alive at `now` (default: now).

    Raises:
        InvalidInput: a bad tags, where, source, since or until (the message names which, and where inside).
    """
    flt = all_of(tags_filter(check_typed_tags(tags)), parse_where(where), source_filter(check_source(source)),
                 time_window(since, until))
    return Selection(flt, scope, now or datetime.now(timezone.utc))


def same_kind(scope: str, tags: dict, source: str | None, now: datetime) -> Selection:
    """The facts a new fact could duplicate: exactly its scope, carrying its tags, from its source (or none)."""
    origin = Exists(Field("source"), False) if source is None else Compare(Field("source"), "$eq", source)
    return Selection(all_of(tags_filter(tags), origin), scope, now, below=False)
