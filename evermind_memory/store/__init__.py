"""The store: SQLite facts (the truth), the HNSW cache, and MemoryStore joining them with an embedder."""

from __future__ import annotations

from .index import IndexConfig
from .memory_store import MemoryStore
from .records import Change, CheckReport, Fact, Recall

__all__ = ["Change", "CheckReport", "Fact", "IndexConfig", "MemoryStore", "Recall"]
