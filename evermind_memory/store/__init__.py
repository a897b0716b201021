"""The store: SQLite (the truth), the HNSW cache over its vectors, and MemoryStore joining them with an embedder.

memory_store.py (the public front), memory_store_maintenance.py and memory_store_adaptation.py (its maintenance and
adaptation methods), parts.py (what an open store is made of, passed to the modules that need it); writer.py (the
write paths); selection.py (a call's filters, scope and time as one Selection), filters.py (the where language),
scope.py (scopes), timing.py (ttl, windows, recency), dedup.py (the duplicate rule); backend/ (every SQL statement:
the interface in base.py, the factory in __init__.py, SQLite in sqlite.py and sqlite_session.py, the filter
compilers in filter_sql.py); vectors.py (the vector cache and its catch-up from the change feed); search.py
(lexical, vector, hybrid) with lexical.py (which words FTS5 matches) and fusion.py (how the two scores combine),
study.py (recall's candidate pools, for offline study); embedding.py (the background vector worker); generations.py
(the serving model and how it is replaced); maintenance.py (check, backup, export/import, sweeper, compaction,
stats); checkpoints.py (WAL checkpoints: every write passes through); repair.py (repair_store: by path) and
salvage.py (rebuilding a damaged file), damage.py (reads skip damaged rows); closing.py (close, finaliser, atexit);
access.py (who may write); leases.py (which process runs a job now); identity.py (one file, one canonical name);
index.py (the usearch graph wrapper); index_feed.py (the change feed and SQLite set against an index); lock.py,
records.py, validate.py.
"""

from __future__ import annotations

from .index_config import IndexConfig
from .memory_store import MemoryStore
from .records import Change, CheckReport, DuplicatePair, Fact, Recall, RepairReport, StoreStats

__all__ = ["Change", "CheckReport", "DuplicatePair", "Fact", "IndexConfig", "MemoryStore", "Recall", "RepairReport",
           "StoreStats", "repair_store"]


def __getattr__(name: str):
    # repair.py (and the backend's repair code under it) is imported when it is first used: a command that only
    # reads rows starts without it (issue 19)
    if name == "repair_store":
        from . import repair

        value = getattr(repair, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
