"""The SQLite backend, the only source of truth (R1): connections, schema and migrations, and the sessions.

Connections are ours (R14): per process one writing connection guarded by a mutex, read-only connections per
thread, WAL, a chosen `synchronous`, `busy_timeout`, `foreign_keys=ON`, `trusted_schema=OFF`, `mmap_size=0`.
Any number of processes write one file: SQLite serialises their `BEGIN IMMEDIATE` transactions. sqlite-utils
creates and inspects the schema; the queries (backend/sqlite_session.py) are plain parameterised SQL in
explicit transactions, so the FTS rows, tags and change log commit with the fact or not at all.

The WAL-reset bug (SQLite 3.7.0-3.51.2, fixed in 3.51.3; this Python links 3.40.1): a checkpoint that runs
while another connection commits the transaction that resets the WAL can record a wrong backfill count and
corrupt the database. So no checkpoint ever runs beside a commit here: every connection sets
`wal_autocheckpoint=0`, and `checkpoint()` runs a PASSIVE checkpoint on a second connection *while the
writing connection holds the writer lock* (`BEGIN IMMEDIATE`), so no other connection, in any process, can
commit or reset the WAL until it ends. FULL/RESTART/TRUNCATE are not enough on their own: when they cannot get
the writer lock in time, SQLite silently downgrades them to PASSIVE (wal.c, sqlite3WalCheckpoint). The last
connection to close a file checkpoints only under an exclusive lock on it (no one else is there).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import threading
from pathlib import Path
from typing import Callable, Iterator

from ..._crash import crash_point
from ...errors import EvermindError, InvalidInput, StoreCorrupt, StoreLocked
from ..identity import FileIdentity, identify, resolve
from . import vector_blobs
from .base import new_id, utc_now
from .codec import RepairCounts
from .filter_sql import migrate_typed_tags
from .sqlite_faults import preflight, repair_hint, translate
from .sqlite_session import GEN_TABLE, SQLiteSession

# 1: the first release; 2: + feedback (query -> fact judged useful or not, for adaptation); 3: many writer
# processes: + leases, + facts.owner (who embeds a waiting fact); 4: typed tags, expires_at, pinned, scopes,
# history links (issue 20); 5: vectors stored as float16 (issue 34: half the bytes of a row's vector); 6: each
# embedder fingerprint stored once, in `fingerprints`, and referenced by id from facts.fingerprint_id (issue 34);
# 7: vectors stored as int8 with a scale a row (issue 34: a quarter of float32's bytes)
SCHEMA_VERSION = 7
FTS_TABLE_SQL = ("CREATE VIRTUAL TABLE facts_fts USING fts5(text, content='facts', content_rowid='rid', "
                 "tokenize='porter unicode61')")
FTS_CHECK_SQL = "INSERT INTO facts_fts (facts_fts, rank) VALUES ('integrity-check', 1)"  # FTS5's deep check
WAL_SIZE_LIMIT = 64 << 20  # bytes a reset WAL file is truncated back to
SQLITE_FIXED = ((3, 51, 3), (3, 50, 7), (3, 44, 6))  # WAL-reset bug fixed in these (and later) releases
# The tables a store of SCHEMA_VERSION has: those _create_schema makes (tests/store/test_backend.py checks it).
EXPECTED_TABLES = frozenset({"changes", "fact_tags", "facts", "facts_fts", "facts_fts_config", "facts_fts_data",
                             "facts_fts_docsize", "facts_fts_idx", "feedback", "fingerprints", "leases", "meta"})
# Text columns are decoded by us: a damaged byte in one row's text then yields that row (with lone surrogates,
# which the row's reader refuses: backend.FactRow) instead of failing the whole query it belongs to.
_decode_text = functools.partial(str, encoding="utf-8", errors="surrogateescape")


def _create_feedback(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE feedback (id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, query TEXT NOT NULL, "
        "fact_id TEXT NOT NULL, useful INTEGER NOT NULL CHECK (useful IN (0, 1)))"
    )
    conn.execute("CREATE INDEX feedback_fact ON feedback (fact_id, query)")


def _create_leases(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE leases (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires REAL NOT NULL)")


def _add_owners(conn: sqlite3.Connection) -> None:
    """Schema 3: leases, and the owner of each fact still waiting for its vector (the process embedding it)."""
    _create_leases(conn)
    conn.execute("ALTER TABLE facts ADD COLUMN owner TEXT")
    conn.execute("CREATE INDEX facts_waiting ON facts (owner) WHERE vector IS NULL")


def _compact_vectors(conn: sqlite3.Connection) -> None:
    """Schemas 5 and 7: every float32 (schema 4) or float16 (schemas 5 and 6) vector rewritten in the row format of
    backend/vector_blobs.py (float16 then, int8 and a scale now), the facts' and those of a generation being built, a
    batch of rows at a time. The pages freed are reused by later writes (VACUUM returns them to the file system:
    `evermind compact`, which vacuums unless --no-vacuum). A saved index snapshot of float32 rows names that format
    and is rebuilt once, at the next vector use; one of float16 rows is kept (its nodes are within NEAR_TOL of the
    int8 rows, which its background check compares)."""
    tables = [("facts", "rid")]
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (GEN_TABLE,)).fetchone():
        tables.append((GEN_TABLE, "label"))
    for table, key in tables:  # (names from the list above, never from data)
        last = -1
        while True:
            rows = conn.execute(f"SELECT {key}, vector FROM {table} WHERE {key} > ? AND vector IS NOT NULL "
                                f"ORDER BY {key} LIMIT ?", (last, COMPACT_BATCH)).fetchall()
            if not rows:
                break
            conn.executemany(f"UPDATE {table} SET vector = ? WHERE {key} = ?", vector_blobs.compact_rows(rows))
            last = rows[-1][0]


FINGERPRINTS_SQL = "CREATE TABLE IF NOT EXISTS fingerprints (id INTEGER PRIMARY KEY, fingerprint TEXT NOT NULL UNIQUE)"
FINGERPRINT_INDEX_SQL = "CREATE INDEX facts_fingerprint ON facts (fingerprint_id, label)"


def _reference_fingerprints(conn: sqlite3.Connection) -> None:
    """Schema 6: each fingerprint string stored once, in `fingerprints`, and facts referencing it by id (issue
    34: the string and its index cost ~140 bytes a fact). Inside the migration's one transaction, with the
    version it records, so a crash leaves schema 5 whole and the next writer runs it again from the start."""
    conn.execute(FINGERPRINTS_SQL)
    conn.execute("INSERT OR IGNORE INTO fingerprints (fingerprint) SELECT DISTINCT fingerprint FROM facts "
                 "WHERE fingerprint IS NOT NULL ORDER BY fingerprint")
    conn.execute("ALTER TABLE facts ADD COLUMN fingerprint_id INTEGER")
    conn.execute("UPDATE facts SET fingerprint_id = (SELECT p.id FROM fingerprints p WHERE p.fingerprint = "
                 "facts.fingerprint) WHERE fingerprint IS NOT NULL")
    conn.execute("DROP INDEX IF EXISTS facts_fingerprint")
    conn.execute("ALTER TABLE facts DROP COLUMN fingerprint")  # (SQLite 3.35+; rewrites the table once)
    conn.execute(FINGERPRINT_INDEX_SQL)
    crash_point("migrate.fingerprints")  # (before the transaction commits: tests/store/test_fingerprint_ids.py)


COMPACT_BATCH = 5000  # rows read and rewritten at a time by the schema 5 and 7 migrations
# Migrations: MIGRATIONS[v] upgrades a store from schema v to v + 1 inside one transaction.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _create_feedback, 2: _add_owners,
                                                               3: migrate_typed_tags,
                                                              4: _compact_vectors, 5: _reference_fingerprints,
                                                              6: _compact_vectors}


def sqlite_has_wal_reset_fix(version: str = sqlite3.sqlite_version) -> bool:
    """Whether the linked SQLite has the WAL-reset corruption fix (R6, R14)."""
    v = tuple(int(p) for p in version.split(".")[:3])
    if v >= SQLITE_FIXED[0]:
        return True
    return any(v[:2] == fixed[:2] and v >= fixed for fixed in SQLITE_FIXED[1:])


def _share_legacy_lock(path: str) -> int | None:
    """Hold a shared `flock` on `<db>.lock` for as long as the store is open, and return its descriptor.

    Versions before schema 3 allowed one writer per store, which held an exclusive `flock` on that file and knew
    nothing of other writers (it checkpoints beside their commits and its index skips their changes). While any
    writer of this version holds the shared lock, an old one cannot start (StoreLocked); while an old one holds
    it, this one refuses. None where flock does not exist (there was no such lock either).

    Raises:
        StoreLocked: an older evermind_memory writer has the store open.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        return None
    try:
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        raise translate(exc, path, f"opening the writer lock file {path}.lock (a writer needs to create and "
                                   "write it beside the database)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(
            f"{path} is open in an older evermind_memory (one writer per store, holding {path}.lock), which cannot "
            "share it with other writers. Close that process, or upgrade it, then open the store again."
        ) from None
    return fd


class SQLiteBackend:
    """SQLite access for one store file (or ":memory:"); implements backend.Backend.

    Args:
        path: database file (canonical: see store/identity.py), or ":memory:".
        read_only: open only read-only connections; the store must exist.
        durability: "normal" (synchronous=NORMAL) or "full" (synchronous=FULL).
        busy_timeout: seconds SQLite waits on a locked database.
    Raises:
        InvalidInput: read_only on a missing file.
        StoreMoved: the file cannot be opened safely through this path (see identity.resolve).
        EvermindError: not an evermind store, or made by a newer version.
    """

    def __init__(self, path: str, *, read_only: bool, durability: str, busy_timeout: float) -> None:
        self.memory = path == ":memory:"
        self.identity: FileIdentity | None = None
        if not self.memory:
            found = resolve(path)
            if found is None and read_only:
                raise InvalidInput(f"{path} does not exist; open it once without read_only=True to create it.")
            path = found.path if found is not None else os.path.realpath(path)
        self.path = path
        self.read_only = read_only
        self.synchronous = "FULL" if durability == "full" else "NORMAL"
        self.busy_ms = int(busy_timeout * 1000)
        self.write_mutex = threading.RLock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._writer: sqlite3.Connection | None = None
        self._writer_session: SQLiteSession | None = None
        self._checkpointer: sqlite3.Connection | None = None
        self._legacy_fd: int | None = None
        if not self.memory:
            preflight(self.path)  # before SQLite or our lock file touch a damaged or foreign file
        try:
            if read_only:
                with self.reading() as session:
                    self._check_readable_schema(session)
            else:
                self._legacy_fd = None if self.memory else _share_legacy_lock(self.path)
                self._writer = self._connect(write=True)
                self._writer_session = SQLiteSession(self._writer)
                self._ensure_schema()
            if not self.memory:
                self.identity = identify(self.path)
        except BaseException as exc:
            self.close()
            if isinstance(exc, (sqlite3.Error, OSError)):
                raise translate(exc, self.path, "opening the store") from exc
            raise

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._closed

    # ---- connections ---------------------------------------------------------------------------------------
    def _connect(self, *, write: bool) -> sqlite3.Connection:
        if self.memory:
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        elif write:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=self.busy_ms / 1000)
        else:
            uri = Path(self.path).as_uri() + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                                   timeout=self.busy_ms / 1000)
        try:
            conn.text_factory = _decode_text
            conn.execute(f"PRAGMA busy_timeout = {self.busy_ms}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA trusted_schema = OFF")
            conn.execute("PRAGMA mmap_size = 0")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # checkpoints only through checkpoint() (the WAL-reset bug)
            if write and not self.memory:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise EvermindError(f"{self.path}: could not switch to WAL journal mode (got {mode}); is it on a "
                                        "local disk?")
                conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")  # a reset WAL shrinks back to this
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

    @contextlib.contextmanager
    def reading(self) -> Iterator[SQLiteSession]:
        """A session for reads: this thread's read-only connection (the writer's, locked, for :memory:)."""
        if self._closed:
            raise EvermindError("this MemoryStore is closed.")
        if self.memory:
            with self.write_mutex:
                try:
                    yield self._write_session()
                except sqlite3.Error as exc:
                    raise translate(exc, self.path, "reading") from exc
            return
        session = getattr(self._local, "session", None)
        try:
            if session is None:
                conn = self._connect(write=False)
                session = self._local.session = SQLiteSession(conn)
                with self._readers_lock:
                    self._readers.append(conn)
            yield session
        except (sqlite3.Error, OSError) as exc:
            raise translate(exc, self.path, "reading") from exc

    def _write_session(self) -> SQLiteSession:
        """The writing connection's session (a store opened read_only has none)."""
        if self._writer_session is None:
            raise EvermindError(f"{self.path} was opened with read_only=True; open a writer to change it.")
        return self._writer_session

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[SQLiteSession]:
        """A read session inside one read transaction: every query sees the same committed state."""
        with self.reading() as session:
            session.conn.execute("BEGIN")
            try:
                yield session
            finally:
                session.conn.execute("COMMIT")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[SQLiteSession]:
        """`BEGIN IMMEDIATE` ... `COMMIT` on the writing connection, under the write mutex (R2).

        Raises:
            StoreMoved: the file was deleted or replaced since it was opened (nothing is written).
            EvermindError: SQLite refused the write (disk full, I/O error, locked past busy_timeout).
        """
        if self._closed:
            raise EvermindError("this MemoryStore is closed.")
        session = self._write_session()
        with self.write_mutex:
            if self.identity is not None:
                self.identity.require_here()
            conn = session.conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield session
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:  # disk full, I/O error, locked past busy_timeout
                if "locked" in str(exc) or "busy" in str(exc):
                    raise StoreLocked(
                        f"{self.path}: another process held the write lock for longer than busy_timeout "
                        f"({self.busy_ms / 1000:g} s); nothing from this call was stored. Retry, or open the store "
                        "with a larger busy_timeout."
                    ) from exc
                kind = translate(exc, self.path, "writing")
                err = type(kind)(f"{self.path}: SQLite refused the write ({exc}); nothing from this call was stored. "
                                 "Free disk space or check the file's permissions, then retry.")
                if isinstance(kind, OSError) and isinstance(err, OSError):
                    err.errno = kind.errno
                raise err from exc
            except (sqlite3.Error, OSError) as exc:  # a damaged page, table or row met by the write
                raise translate(exc, self.path, "writing (nothing from this call was stored)") from exc

    def checkpoint(self) -> tuple[int, int]:
        """Copy the WAL back into the database while no one can commit (see the module docstring).

        Holds the writer lock (waiting up to busy_timeout for the current writer) for the copy: writers in
        every process wait meanwhile, readers do not. Returns (frames in the WAL, frames copied); they are equal
        when the next writer may restart the WAL from its beginning.
        """
        if self.memory or self._writer is None or self._closed:
            return 0, 0
        with self.write_mutex:
            try:
                if self._checkpointer is None:
                    self._checkpointer = self._connect(write=True)
                self._writer.execute("BEGIN IMMEDIATE")
                try:
                    _, log, done = self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                finally:
                    if self._writer.in_transaction:
                        self._writer.execute("ROLLBACK")
            except (sqlite3.Error, OSError) as exc:
                raise translate(exc, self.path, "checkpointing the WAL") from exc
        return int(log), int(done)

    def describe(self) -> dict:
        """schema_version, sqlite_version and whether that SQLite has the WAL-reset fix."""
        with self.reading() as session:
            schema = session.meta("schema_version")
        return {"schema_version": int(schema or SCHEMA_VERSION), "sqlite_version": sqlite3.sqlite_version,
                "sqlite_wal_reset_fixed": sqlite_has_wal_reset_fix()}

    def fts_integrity(self) -> str | None:
        """FTS5's own deep check: None when it passes, else the error text. A writer runs it on its writing
        connection; a reader, which may not write the file, on a private copy (_fts_integrity_of_copy)."""
        if self._writer is None:
            return self._fts_integrity_of_copy()
        with self.write_mutex:
            try:
                self._writer.execute(FTS_CHECK_SQL)
            except sqlite3.DatabaseError as exc:
                return str(exc)
        return None

    def _fts_integrity_of_copy(self) -> str | None:
        """The same check for a read-only store. FTS5's 'integrity-check' is an INSERT, which a read-only
        connection refuses, so it runs in a scratch database (SQLite's private temp file, deleted at close) holding
        a copy of the index's tables and of the texts it indexes, both read in one read transaction. So a reader's
        check() sees what a writer's does (a text changed behind the index's back). Costs one pass over the texts
        and the index."""
        scratch = sqlite3.connect("", uri=True, isolation_level=None)
        try:
            scratch.execute(f"PRAGMA busy_timeout = {self.busy_ms}")
            scratch.execute("PRAGMA trusted_schema = OFF")
            scratch.execute("ATTACH DATABASE ? AS store", (Path(self.path).as_uri() + "?mode=ro",))
            scratch.execute("CREATE TABLE main.facts (rid INTEGER PRIMARY KEY, text)")
            scratch.execute(FTS_TABLE_SQL)
            scratch.execute("BEGIN")
            scratch.execute("INSERT INTO main.facts (rid, text) SELECT rid, text FROM store.facts")
            for part in ("data", "idx", "docsize", "config"):
                scratch.execute(f"DELETE FROM main.facts_fts_{part}")
                scratch.execute(f"INSERT INTO main.facts_fts_{part} SELECT * FROM store.facts_fts_{part}")
            scratch.execute("COMMIT")
            scratch.execute(FTS_CHECK_SQL)
        except sqlite3.DatabaseError as exc:
            return str(exc)
        finally:
            _close_quietly(scratch)
        return None

    def count_damaged(self, dim: int) -> tuple[int, int, str | None]:
        """(fact rows a read would skip, damaged vectors, the first reason): check()'s row audit."""
        from . import sqlite_repair  # (repair code: imported when a check or repair needs it)

        with self.snapshot() as session:
            return sqlite_repair.count_damaged(session.conn, dim)

    def repair_rows(self, dim: int) -> tuple[RepairCounts, list[str]]:
        """Repair in place, in one write transaction (other processes may stay open): rebuild the indexes, fix or
        quarantine damaged fact rows, rebuild the tag rows and the full-text index. Returns (what was done, the
        integrity check afterwards: ["ok"] when the file is sound, else the file needs salvage)."""
        from . import sqlite_repair  # (repair code: imported when a check or repair needs it)

        from .. import postings_file

        counts = RepairCounts()
        with self.write_mutex:
            # The saved postings go first: the full-text index is rebuilt below from rows repair may change without
            # a change row, which a reader patching the file from the change feed would not see.
            postings_file.path_for(self.path).unlink(missing_ok=True)
            try:
                self._write_session().conn.execute("REINDEX")
            except sqlite3.DatabaseError as exc:
                return counts, [f"REINDEX failed: {exc}"]
            with self.transaction() as tx:
                sqlite_repair.fix_rows(tx.conn, dim, counts)
                try:
                    sqlite_repair.rebuild_derived(tx.conn)
                except sqlite3.DatabaseError as exc:
                    raise StoreCorrupt(f"{self.path}: the derived tables cannot be rebuilt in place ({exc}).",
                                       path=self.path, part="full-text index") from exc
            with self.reading() as r:
                return counts, sqlite_repair.integrity(r.conn)

    def backup(self, dest: str) -> None:
        """`VACUUM INTO` a new file: a consistent copy while the store stays live."""
        with self.reading() as session:
            session.conn.execute("VACUUM INTO ?", (dest,))  # (reading() turns a refusal into our error)

    def vacuum(self) -> None:
        """VACUUM on the writing connection: free pages go back to the file system once the WAL holding the new
        copy is checkpointed (the caller does that, under the checkpoint lease, as any checkpoint here)."""
        if self._writer is None:
            raise EvermindError(f"{self.path} was opened with read_only=True; open a writer to compact it.")
        with self.write_mutex:
            try:
                self._writer.execute("INSERT INTO facts_fts (facts_fts) VALUES ('optimize')")  # merge FTS5 segments
                self._writer.execute("VACUUM")
            except sqlite3.OperationalError as exc:
                raise EvermindError(f"{self.path}: SQLite could not VACUUM ({exc}); nothing was lost. Retry when "
                                    "no reader holds a long transaction, or with more free disk space.") from exc

    def file_bytes(self) -> dict:
        """{"db": bytes, "wal": bytes} of the database files (0 for ":memory:")."""
        if self.memory:
            return {"db": 0, "wal": 0}
        return {kind: (Path(self.path + suffix).stat().st_size if Path(self.path + suffix).exists() else 0)
                for kind, suffix in (("db", ""), ("wal", "-wal"))}

    def save_postings(self, *, claim: Callable[[], bool] = lambda: True, force: bool = False) -> bool:
        """Rewrite `<db>.postings` (store/postings_file.py) when it is due, or with `force` whenever the store
        has MIN_FACTS facts; `claim()` is asked only then (a lease), and a False answer skips the write. True
        when written."""
        if self.memory or self.read_only:
            return False
        from .. import postings_file

        with self.reading() as session:
            facts, seq, store_id = session.count(), session.max_seq(), session.meta("store_id") or ""
        if not postings_file.due(self.path, facts=facts, seq=seq, store_id=store_id, force=force) or not claim():
            return False
        postings_file.refresh(self.path)
        return True

    def follow(self, callback: Callable[[int], None]) -> None:
        """Nothing: every process reads the file's head before it answers (one cheap read)."""

    def adapters(self) -> None:
        """None: adapters are files beside the database (`<db>.adapters/`)."""
        return None

    def close(self) -> None:
        """Close every connection (idempotent). The store checkpoints first (under its lease), not this."""
        if self._closed:
            return
        self._closed = True
        with self._readers_lock:
            for conn in self._readers:
                _close_quietly(conn)
            self._readers.clear()
        if self._writer is not None:
            with self.write_mutex:
                if self._checkpointer is not None:
                    _close_quietly(self._checkpointer)
                _close_quietly(self._writer)
        if self._legacy_fd is not None:
            os.close(self._legacy_fd)  # (closing the descriptor releases its shared lock)
            self._legacy_fd = None

    # ---- schema --------------------------------------------------------------------------------------------
    def _ensure_schema(self) -> None:
        with self.transaction() as session:
            names = {r[0] for r in session.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "meta" not in names:
                if names - {"sqlite_sequence"}:
                    raise EvermindError(f"{self.path} is an SQLite file but not an evermind store (tables: "
                                        f"{sorted(names)[:5]}).")
                self._create_schema(session.conn)
            version = _schema_version(session, self.path)
            if version > SCHEMA_VERSION:
                raise EvermindError(
                    f"{self.path} has schema version {version}; this evermind_memory knows up to {SCHEMA_VERSION}. "
                    "Upgrade evermind_memory to open it."
                )
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](session.conn)
                version += 1
                session.set_meta("schema_version", str(version))
            self._check_tables(session)
            moved = not self.memory and session.meta("path") != self.path
            if moved:
                session.set_meta("path", self.path)  # the name every process opens it by (store/identity.py)
        if moved:
            self.checkpoint()  # into the main file, where identity.recorded_path() reads it without the WAL

    def _check_readable_schema(self, session: SQLiteSession) -> None:
        names = {r[0] for r in session.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in names:
            raise EvermindError(f"{self.path} is not an evermind store.")
        version = _schema_version(session, self.path)
        if version != SCHEMA_VERSION:
            raise EvermindError(
                f"{self.path} has schema version {version}, expected {SCHEMA_VERSION}; open it once as a writer "
                "(read_only=False) with this version to migrate it."
            )
        self._check_tables(session)

    def _check_tables(self, session: SQLiteSession) -> None:
        """Refuse a store missing tables its schema has (a dropped full-text index, a lost table).

        Raises:
            StoreCorrupt: naming the missing tables.
        """
        have = {r[0] for r in session.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = sorted(EXPECTED_TABLES - have)
        if missing:
            part = "full-text index" if all(m.startswith("facts_fts") for m in missing) else "schema"
            raise StoreCorrupt(f"{self.path}: the {part} is damaged: table{'s' * (len(missing) > 1)} "
                               f"{', '.join(missing)} {'are' if len(missing) > 1 else 'is'} missing. "
                               f"{repair_hint(self.path)}.", path=self.path, part=part)

    @staticmethod
    def _create_schema(conn: sqlite3.Connection) -> None:
        import sqlite_utils  # here only: 0.1 s to import, needed to create a new store and by nothing else

        db = sqlite_utils.Database(conn)
        db.table("meta").create({"key": str, "value": str}, pk="key", not_null={"value"})
        db.table("facts").create(
            {"rid": int, "id": str, "text": str, "tags": str, "source": str, "created_at": str, "updated_at": str,
             "vector": bytes, "fingerprint_id": int, "label": int, "seq": int, "owner": str},
            pk="rid", not_null={"id", "text", "tags", "created_at", "updated_at", "seq"},
        )
        db.table("facts").create_index(["id"], index_name="facts_id", unique=True)
        db.table("facts").create_index(["label"], index_name="facts_label", unique=True)
        conn.execute(FINGERPRINTS_SQL)
        conn.execute(FINGERPRINT_INDEX_SQL)
        conn.execute("CREATE INDEX facts_waiting ON facts (owner) WHERE vector IS NULL")
        db.table("fact_tags").create(
            {"fact_id": str, "key": str, "value": str}, pk=("fact_id", "key"),
            not_null={"value"}, foreign_keys=[("fact_id", "facts", "id")],
        )
        db.table("fact_tags").create_index(["key", "value"], index_name="fact_tags_kv")
        conn.execute(
            "CREATE TABLE changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, fact_id TEXT NOT NULL, "
            "op TEXT NOT NULL CHECK (op IN ('remember', 'update', 'forget', 'reembed')), at TEXT NOT NULL, "
            "text TEXT, tags TEXT, source TEXT, vector_added INTEGER NOT NULL DEFAULT 0, label_removed INTEGER)"
        )
        conn.execute("CREATE INDEX changes_fact ON changes (fact_id, seq)")
        conn.execute(FTS_TABLE_SQL)
        _create_feedback(conn)
        _create_leases(conn)
        migrate_typed_tags(conn)  # schema 4's columns and indexes: the very statements a migrated store ran
        now = utc_now()
        conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [("schema_version", str(SCHEMA_VERSION)), ("store_id", new_id()), ("created_at", now)],
        )


def _close_quietly(conn: sqlite3.Connection) -> None:
    """Close a connection; a close that fails (a full disk refusing the WAL's last write) leaves nothing to do:
    what was committed is in the WAL, and the next opener recovers it."""
    try:
        conn.close()
    except sqlite3.Error:
        pass


def _schema_version(session: SQLiteSession, path: str) -> int:
    """The store's schema version, from meta.

    Raises:
        StoreCorrupt: the recorded version is not a number.
    """
    raw = session.meta("schema_version")
    try:
        return int(raw or 0)
    except ValueError:
        raise StoreCorrupt(f"{path}: the schema version recorded in meta is {raw!r:.40}, not a number. "
                           f"{repair_hint(path)}.", path=path, part="schema") from None


def created_tables() -> frozenset[str]:
    """The tables _create_schema makes, in a scratch in-memory database (EXPECTED_TABLES must equal them)."""
    conn = sqlite3.connect(":memory:")
    try:
        SQLiteBackend._create_schema(conn)
        return frozenset(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                         if not r[0].startswith("sqlite_"))
    finally:
        conn.close()


def salvage_into(damaged: str, new_path: str, final_path: str, dim: int) -> tuple[RepairCounts, list[str]]:
    """Build a new store file at `new_path` from the readable rows of the damaged copy `damaged`, then repair its
    rows (see sqlite_repair). `final_path` is the name it will have (recorded as meta "path").

    Returns:
        (what was done, the new file's integrity check).
    """
    from . import sqlite_repair  # (repair code: imported when a check or repair needs it)

    counts = RepairCounts()
    if not sqlite_repair.patch_header(damaged) and os.path.getsize(damaged) == 0:
        counts.note("the database file was empty: nothing to salvage")
    src = None
    try:
        sqlite_repair.drop_lost_tables(damaged)
        src = sqlite_repair.open_damaged(damaged)
        src.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        counts.note(f"the damaged file cannot be read at all ({exc})")
        counts.unreadable_pages += 1
        if src is not None:
            src.close()
        src = None
    new = SQLiteBackend(new_path, read_only=False, durability="full", busy_timeout=5.0)
    try:
        with new.transaction() as tx:
            if src is not None:
                sqlite_repair.salvage(src, tx.conn, counts)
            tx.set_meta("path", final_path)
        done, found = new.repair_rows(dim)
        for name in ("scanned", "fixed", "quarantined", "vectors_cleared"):
            setattr(counts, name, getattr(counts, name) + getattr(done, name))
        counts.reasons += done.reasons[: max(0, 20 - len(counts.reasons))]
        new.checkpoint()
    finally:
        new.close()
        if src is not None:
            src.close()
    return counts, found
