"""Copying a whole store between SQLite and PostgreSQL, with its history, and proving the copy complete.

`backend.migrate(src, dest)` (`evermind migrate --from agent.db --to postgresql://...`, or back from a server to a new
file) copies, from one consistent snapshot of the source: the facts with their ids, rids, labels, seqs,
vectors and fingerprints, the whole change log (so every fact's history and every label's origin come along),
the feedback, the store's meta (store_id, serving model, active adapter, ...) and a generation part way built;
and the adapters (files beside an SQLite store, the `adapters` table on PostgreSQL). Derived rows are rebuilt
by the destination (tag rows from each fact's tags JSON; the full-text index). Leases and the SQLite-only meta
"path" are not copied.

Then it reads both sides again in one canonical form (times as UTC text, vectors as bytes) and compares, table
by table, the row counts and a SHA-256 over the rows in key order; a difference raises and the report says
where. The destination must be empty (a new file, or a database or schema with no store), so a failed run can
simply be repeated after dropping it. Writes made to the source after its snapshot are not copied: stop the
writers first.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
import sqlite3
from typing import TYPE_CHECKING, Iterable, Iterator, Union

from ...errors import EvermindError, InvalidInput
from ..timing import time_text
from .base import Backend
from .filter_sql import tag_row
from .postgres_adapters import DatabaseAdapters

if TYPE_CHECKING:
    from ..adapter_history import AdapterHistory
    from psycopg import Connection

    from .base import Reads, Writes

    EngineConnection = Union[sqlite3.Connection, Connection]

# (table, columns in canonical order, the columns holding times, key)
TABLES = (
    ("meta", ("key", "value"), (), "key"),
    ("fingerprints", ("id", "fingerprint"), (), "id"),  # (before facts, which reference them by id)
    ("facts", ("rid", "id", "text", "tags", "source", "created_at", "updated_at", "vector", "fingerprint_id", "label",
               "seq", "owner", "expires_at", "pinned", "scope"), ("created_at", "updated_at", "expires_at"), "rid"),
    ("changes",
     ("seq", "fact_id", "op", "at", "text", "tags", "source", "vector_added", "label_removed", "scope", "link"),
     ("at",), "seq"),
    ("feedback", ("id", "at", "query", "fact_id", "useful"), ("at",), "id"),
    ("adapt_vectors", ("label", "fingerprint", "vector"), (), "label"),
)
SKIP_META = ("path", "schema_version")  # the file's own name; the destination's own schema
BATCH = 2000


@dataclass
class MigrationReport:
    """What a migration copied and how it was checked."""

    source: str
    dest: str
    rows: dict[str, int] = field(default_factory=dict)  # table -> rows copied (and found again at the destination)
    checksums: dict[str, str] = field(default_factory=dict)  # table -> SHA-256 of its canonical rows (both sides)
    adapters: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"source": self.source, "dest": self.dest, "rows": self.rows, "checksums": self.checksums,
                "adapters": self.adapters, "seconds": round(self.seconds, 3)}


def _canon(row: tuple, times: tuple[int, ...]) -> tuple:
    out = list(row)
    for i in times:
        if out[i] is not None:
            value = out[i]
            dt = value if isinstance(value, datetime) else datetime.fromisoformat(value)
            out[i] = time_text(dt)
    return tuple(bytes(v) if isinstance(v, memoryview) else v for v in out)


# ---- reading a snapshot --------------------------------------------------------------------------------------
def _sqlite_rows(conn: sqlite3.Connection, table: str, cols: tuple[str, ...], times: tuple[str, ...],
                 key: str) -> Iterator[tuple]:
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if table not in have:
        return
    where = " WHERE key NOT IN ('path', 'schema_version')" if table == "meta" else ""
    idx = tuple(cols.index(c) for c in times)
    for row in conn.execute(f"SELECT {', '.join(cols)} FROM {table}{where} ORDER BY {key}"):  # (our table names)
        yield _canon(row, idx)


def _postgres_rows(conn: Connection, table: str, cols: tuple[str, ...], times: tuple[str, ...],
                   key: str) -> Iterator[tuple]:
    where = " WHERE key NOT IN ('path', 'schema_version')" if table == "meta" else ""
    idx = tuple(cols.index(c) for c in times)
    with conn.cursor(binary=True) as cur:
        cur.execute(f"SELECT {', '.join(cols)} FROM {table}{where} ORDER BY {key}")  # (our table names)
        while True:
            rows = cur.fetchmany(BATCH)
            if not rows:
                return
            for row in rows:
                yield _canon(row, idx)


def _checksum(rows: Iterable[tuple]) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    for row in rows:
        h.update(repr(row).encode("utf-8", "surrogatepass"))
        h.update(b"\n")
        n += 1
    return n, h.hexdigest()


# ---- writing -------------------------------------------------------------------------------------------------
def _tag_rows(fid: str, tags: str) -> list[tuple]:
    try:
        parsed = json.loads(tags)
    except ValueError:
        return []
    return [tag_row(fid, k, v) for k, v in parsed.items()] if isinstance(parsed, dict) else []


def _load_postgres(tx: Writes, conn: Connection, table: str, cols: tuple[str, ...], times: tuple[str, ...],
                   rows: Iterable[tuple]) -> None:
    idx = [cols.index(c) for c in times]
    if table == "meta":
        for key, value in rows:
            tx.set_meta(key, value)
        return
    tags: list[tuple] = []
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:  # (our names)
        for row in rows:
            out = list(row)
            for i in idx:
                out[i] = None if out[i] is None else datetime.fromisoformat(out[i])
            copy.write_row(out)
            if table == "facts":
                tags.extend(_tag_rows(row[1], row[3]))
    if tags:
        with conn.cursor() as cur, cur.copy("COPY fact_tags (fact_id, key, value, vtype, num) FROM STDIN") as copy:
            for t in tags:
                copy.write_row(t)
    if table in ("facts", "feedback", "fingerprints"):
        key = "rid" if table == "facts" else "id"
        conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', '{key}'), "  # (our names)
                     f"GREATEST((SELECT MAX({key}) FROM {table}), 1))")


def _load_sqlite(conn: sqlite3.Connection, table: str, cols: tuple[str, ...], rows: Iterable[tuple]) -> None:
    if table == "meta":
        conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET "
                         "value = excluded.value", list(rows))
        return
    if table == "adapt_vectors":
        conn.execute("CREATE TABLE IF NOT EXISTS adapt_vectors (label INTEGER PRIMARY KEY, fingerprint TEXT NOT NULL, "
                     "vector BLOB NOT NULL)")  # (as SQLiteSession.generation_begin creates it)
    marks = ", ".join("?" * len(cols))
    batch: list[tuple] = []

    def flush() -> None:
        conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})", batch)  # (our names)
        if table == "facts":
            conn.executemany("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", [(r[0], r[2]) for r in batch])
            conn.executemany("INSERT INTO fact_tags (fact_id, key, value, vtype, num) VALUES (?, ?, ?, ?, ?)",
                             [t for r in batch for t in _tag_rows(r[1], r[3])])
        batch.clear()

    for row in rows:
        batch.append(row)
        if len(batch) >= BATCH:
            flush()
    if batch:
        flush()


# ---- the copy ------------------------------------------------------------------------------------------------
def _conn(session: Reads | Writes) -> EngineConnection:
    """The connection under an engine's session (both engines' sessions have one)."""
    from .postgres_session import PostgresSession
    from .sqlite_session import SQLiteSession

    if not isinstance(session, (SQLiteSession, PostgresSession)):
        raise TypeError(f"migrate copies between SQLite and PostgreSQL stores, not {type(session).__name__}")
    return session.conn


def _rows_of(conn: EngineConnection, table: str, cols: tuple[str, ...], times: tuple[str, ...],
             key: str) -> Iterator[tuple]:
    if isinstance(conn, sqlite3.Connection):
        return _sqlite_rows(conn, table, cols, times, key)
    return _postgres_rows(conn, table, cols, times, key)


def _adapters(backend: Backend) -> AdapterHistory | DatabaseAdapters:
    in_db = backend.adapters()
    if in_db is None:
        from ..adapter_history import AdapterHistory

        p = Path(backend.path)
        return AdapterHistory(p.parent / (p.name + ".adapters"))
    if not isinstance(in_db, DatabaseAdapters):  # (the one backend that keeps them in its database)
        raise TypeError(f"migrate cannot copy adapters kept by {type(in_db).__name__}")
    return in_db


def _adapter_bytes(history: AdapterHistory | DatabaseAdapters, entry: dict) -> bytes | None:
    if isinstance(history, DatabaseAdapters):
        return history.data(entry["id"])
    try:
        path = history.path(entry)
        return path.read_bytes() if path.is_file() else None
    except (OSError, EvermindError):
        return None


def copy_store(src: Backend, dst: Backend) -> MigrationReport:
    """Copy the store open as `src` into the empty store just created as `dst` and verify the copy (see the module
    docstring); `backend.migrate()` opens the two ends, `PostgresBackend.backup()` passes itself.

    Raises:
        InvalidInput: `dst` holds a store already.
        EvermindError: the copy differs from the source (the table is named).
    """
    t0 = time.perf_counter()
    report = MigrationReport(source=src.path, dest=dst.path)
    with dst.reading() as r:
        if r.max_seq() or r.count():
            raise InvalidInput(f"migrate: {dst.path} already holds a store ({r.count()} facts); copy into an "
                               "empty database, schema or new file.")
    with src.snapshot() as s, dst.transaction() as tx:
        conn, into = _conn(s), _conn(tx)
        for table, cols, times, key in TABLES:
            rows = _rows_of(conn, table, cols, times, key)
            if isinstance(into, sqlite3.Connection):
                _load_sqlite(into, table, cols, rows)
            else:
                _load_postgres(tx, into, table, cols, times, rows)
        expected = {table: _checksum(_rows_of(conn, table, cols, times, key))
                    for table, cols, times, key in TABLES}
        src_adapters = _adapters(src)
        entries = [(e, _adapter_bytes(src_adapters, e)) for e in src_adapters.entries()]
    dst_adapters = _adapters(dst)
    for entry, data in entries:
        if data is None:
            continue
        dst_adapters.put(entry, data)
        report.adapters += 1
    with dst.snapshot() as s:
        for table, cols, times, key in TABLES:
            got = _checksum(_rows_of(_conn(s), table, cols, times, key))
            if got != expected[table]:
                raise EvermindError(f"migrate: the copy of table {table} differs from the source ({got[0]} rows "
                                    f"against {expected[table][0]}, or their checksum); {dst.path} is incomplete: "
                                    "drop it and run migrate again.")
            report.rows[table], report.checksums[table] = got
    for entry, data in entries:
        if data is not None and _adapter_bytes(dst_adapters, entry) != data:
            raise EvermindError(f"migrate: adapter {entry.get('id')} differs after the copy.")
    report.seconds = time.perf_counter() - t0
    return report


def copy_to_sqlite(backend: Backend, dest: str) -> None:
    """PostgresBackend.backup(): the store at `backend` copied (and verified) into the new SQLite file `dest`."""
    from .sqlite import SQLiteBackend

    dst = SQLiteBackend(dest, read_only=False, durability="full", busy_timeout=30.0)
    try:
        copy_store(backend, dst)
    finally:
        dst.close()
