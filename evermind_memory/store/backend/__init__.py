"""The store's database: `open_backend` picks the engine for a path (an SQLite file or ":memory:", or a
PostgreSQL URL) and `migrate` copies a store from one to the other.

This module is the only one that imports both engines; the engines and the rest of the store import the rows and
the interface from backend/base.py (re-exported here), so no import runs from an engine back to the factory.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...errors import InvalidInput
from .base import (
    Backend, ChangeRow, FactRow, GenerationRows, Integrity, LeaseRow, NewFact, Reads, Selection, StaleRow, WaitingRow,
    Writes, is_server_url, new_id, utc_now,
)

if TYPE_CHECKING:
    from .postgres_migrate import MigrationReport


def open_backend(path: str, *, read_only: bool, durability: str, busy_timeout: float) -> Backend:
    """Open the database of a store: an SQLite file or ":memory:" (backend/sqlite.py), or a PostgreSQL URL
    (backend/postgres.py).

    Raises:
        InvalidInput: read_only on a missing file (or a database with no store).
        EvermindError: not an evermind store, or one made by a newer version; the server cannot be reached.
    """
    if is_server_url(path):
        from .postgres import PostgresBackend

        return PostgresBackend(path, read_only=read_only, durability=durability, busy_timeout=busy_timeout)
    from .sqlite import SQLiteBackend

    return SQLiteBackend(path, read_only=read_only, durability=durability, busy_timeout=busy_timeout)


def _open_for_copy(target: str, *, create: bool) -> Backend:
    """One end of a migration: the source read-only, the destination created (a new file, or an empty database)."""
    if not is_server_url(target):
        if create and os.path.exists(target):
            raise InvalidInput(f"migrate: {target} exists; the copy goes to a new file (choose another name).")
        if not create and not os.path.isfile(target):
            raise InvalidInput(f"migrate: no store at {target}.")
        target = os.path.realpath(target)
    return open_backend(target, read_only=not create, durability="full", busy_timeout=30.0)


def migrate(source: str, dest: str) -> MigrationReport:
    """Copy the store at `source` into the new, empty `dest` and verify it (backend/postgres_migrate.py says how).

    Args:
        source, dest: an SQLite file path or a PostgreSQL URL each.
    Returns:
        MigrationReport (rows and checksums per table, adapters copied).
    Raises:
        InvalidInput: a path that is not text (None, bytes, empty, NUL); no store at the source; the destination
            file exists or the database holds a store already.
        EvermindError: the copy differs from the source (the report's table is named); the source or the
            destination cannot be opened.
    """
    from ..validate import check_path
    from .postgres_migrate import copy_store

    source, dest = check_path(source, "source", "migrate"), check_path(dest, "dest", "migrate")
    src = _open_for_copy(source, create=False)
    try:
        dst = _open_for_copy(dest, create=True)
        try:
            return copy_store(src, dst)
        finally:
            dst.close()
    finally:
        src.close()


__all__ = [
    "Backend", "ChangeRow", "FactRow", "GenerationRows", "Integrity", "LeaseRow", "NewFact", "Reads", "Selection",
    "StaleRow", "WaitingRow", "Writes", "is_server_url", "migrate", "new_id", "open_backend", "utc_now",
]
