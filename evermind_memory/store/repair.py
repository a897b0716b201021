"""Repair a damaged store: keep every readable fact, quarantine what cannot be read, rebuild what is derived.

Two ways, chosen by what the damage allows:
- in place (`MemoryStore.repair()` on a store that opens): one write transaction, safe while other processes
  keep the store open. Damaged fact rows are fixed from their change log (timestamps, tags, source, text) or
  quarantined in the `quarantine` table with the reason and their original values; damaged vectors are cleared
  and embedded again; tag rows and the full-text index are rebuilt; then the HNSW index.
- salvage (`repair_store(path)`, `evermind repair PATH`, or `repair()` when SQLite's own integrity check still
  fails): needs the store to itself (no other writer: StoreLocked otherwise). The damaged files are first copied
  into `<db>.damaged-<time>/` (kept: nothing is deleted); the readable rows are read from that copy, page
  failures stepped over, facts whose rows are lost restored from the change log, into a new file that then
  takes the store's name. The index sidecars move aside too (a cache: rebuilt on open).

Afterwards the store is opened with the embedder given, facts without a vector are embedded, and the report says
what was kept, fixed, quarantined and restored. This module is the entry point by path (it opens a MemoryStore);
the file work is in salvage.py, below the front, which `MemoryStore.repair()` calls too.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..errors import EvermindError, InvalidInput, StoreCorrupt
from .backend.base import is_server_url
from .memory_store import MemoryStore
from .records import RepairReport
from .salvage import report_of, salvage
from .validate import check_path

if TYPE_CHECKING:
    from ..embedder.base import Embedder


__all__ = ["RepairReport", "repair_store"]


def repair_store(path: str | os.PathLike, embedder: Embedder | None = None, **options: Any) -> RepairReport:
    """Repair the store at `path`, whether or not it opens (see the module docstring).

    Args:
        path: the database file.
        embedder: the embedder the store is used with (None: the shipped model); it embeds the facts whose
            vectors were damaged or lost.
        options: passed to MemoryStore (index_config, durability, busy_timeout).
    Returns:
        RepairReport.
    Raises:
        InvalidInput: `path` is not a text path (None, bytes, empty, NUL), or no file is there.
        StoreLocked: salvage is needed and another process has the store open.
        StoreCorrupt: the file is not an SQLite database and nothing beside it says it was a store (repair leaves
            it alone), or salvage could not produce a sound file (the original is untouched).
    """
    path = check_path(path, "path", "repair_store")
    if is_server_url(path):  # a server keeps its pages sound: only the rows can need repair
        with MemoryStore(path, embedder, **options) as store:
            return store.repair()
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        raise InvalidInput(f"repair found no store file at {real}.")
    try:
        store = MemoryStore(real, embedder, **options)
    except StoreCorrupt as exc:
        if exc.part == "database header" and "show it was" not in str(exc) and "shorter" not in str(exc) \
                and "page size" not in str(exc):
            raise StoreCorrupt(f"{real} is not an SQLite database and nothing beside it says it was an evermind store; "
                               "repair leaves it alone. Choose another path.", path=real, part=exc.part) from None
        counts, aside = salvage(real, embedder)
        with MemoryStore(real, embedder, **options) as store:
            try:
                store.flush()  # facts whose vectors were lost are embedded now
            except EvermindError:
                pass  # the embedder failed on some: check() reports them below
            return report_of(real, "salvaged", counts, store.check(), (str(exc),), kept_aside=str(aside))
    with store:
        return store.repair()
