"""The store: SQLite (the truth), the HNSW cache over its vectors, and MemoryStore joining them with an embedder.

memory_store.py (the public front) and adapting.py (its adaptation methods); backend/ (every SQL statement:
the interface in __init__.py, SQLite in sqlite.py and sqlite_session.py); vectors.py (the vector cache and its
catch-up from the change feed); search.py (lexical, vector, hybrid) with lexical.py (which words FTS5 matches)
and fusion.py (how the two scores combine); embedding.py (the background vector worker); generations.py (the
serving model and how it is replaced); maintenance.py (check, WAL checkpoints, backup, export/import); repair.py (repair, salvage) and damage.py (reads skip damaged rows);
access.py (who may write); leases.py (which process runs a job now); identity.py (one file, one canonical
name); index.py (the hnswlib wrapper); lock.py, records.py, validate.py.
"""

from __future__ import annotations

from .index import IndexConfig
from .memory_store import MemoryStore
from .records import Change, CheckReport, Fact, Recall
from .repair import RepairReport, repair_store

__all__ = ["Change", "CheckReport", "Fact", "IndexConfig", "MemoryStore", "Recall", "RepairReport", "repair_store"]
