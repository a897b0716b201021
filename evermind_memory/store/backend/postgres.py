"""The PostgreSQL backend: `MemoryStore("postgresql://user@host/db")`. The database is the truth shared by every
node (process, on any machine); each node's HNSW index is a cache that follows the change feed.

Connections. psycopg 3 and a psycopg_pool connection pool (autocommit connections; the sessions open their own
transactions). The URL is a libpq connection string: host, port, database, user, `sslmode` and the rest, with
the password and TLS settings also taken from libpq's environment (PGPASSWORD, PGSSLMODE, ~/.pgpass, ...).
The store keeps the URL with its password removed (`redact`) for everything it shows: repr, info(), error
messages and logs never carry a credential. A store lives in the database's current schema (search_path: put
`?options=-csearch_path%3Dname` in the URL to keep several stores, or other tables, apart).

Order of changes. Every write transaction first takes one transaction-scoped advisory lock (the store's key: a
constant and the schema), so writers in every node commit one at a time, as SQLite's `BEGIN IMMEDIATE` orders them;
the seq of a change is the head + 1 read under that lock, so seqs are assigned in commit order and a node that has
read the head N has every change up to N (a sequence would hand out numbers that commit out of order, and a cache
would skip the late one). The lock is taken in the transaction's first round trip (BEGIN and the lock pipelined)
and released by COMMIT (pipelined with the NOTIFY); a remember adds one statement in between (its fact, change row
and tags: PostgresSession.insert), so the lock is held for about two round trips, and a batch of vectors from the
worker likewise takes one statement. busy_timeout becomes `lock_timeout`: a writer that waits longer gets
StoreLocked, as with SQLite. Leases (store/leases.py) are claimed inside such a transaction, so a claim is atomic
across nodes. Readers never wait: `reading()` is autocommit READ COMMITTED, `snapshot()` one REPEATABLE READ READ
ONLY transaction.

Following. A write transaction that touched the change feed or meta sends `NOTIFY evermind_changes` with the
new head as it commits; `follow(callback)` starts a thread on a connection of its own that LISTENs and calls
back with each head (and every POLL_S seconds when nothing came, and after a reconnect, so a lost notification
or a dropped connection only delays it). The store uses it to catch its index up in the background; every
answer still reads the head first (one indexed query), so an acknowledged write is in every node's next answer.

Liveness across machines: an owner on another host is "unknown" to store/leases.owner_alive, so only a lease's
expiry counts there (holders renew at half its TTL). `checkpoint()` does nothing (the server has its own WAL),
`identity` is None (a database is named by its URL and its store_id), adapters live in the `adapters` table
(postgres_adapters.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Iterator, Sequence
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ..._crash import crash_point
from ...errors import EvermindError, InvalidInput, StorageError, StoreCorrupt, StoreLocked
from . import vector_blobs
from .base import utc_now
from .codec import RepairCounts
from .postgres_session import FTS_CONFIG, GEN_TABLE, PostgresSession

if TYPE_CHECKING:  # (psycopg is imported when a postgresql:// store opens: _import_psycopg)
    from psycopg import Connection
    from psycopg_pool import ConnectionPool

    from .postgres_adapters import DatabaseAdapters

SCHEMA_VERSION = 7  # the SQLite schema's number: the same tables and meanings (typed tags, expiry, scopes, leases;
# 5: vectors stored as float16, migrated from 4 by the first writer to open the store; 6: fingerprints stored once
# and referenced by id, migrated from 5 the same way; 7: vectors stored as int8 with a scale, migrated from 6)
COMPACT_BATCH = 5000  # rows read and rewritten at a time by the schema 5 and 7 migrations
LOCK_KEY = 0x45564D44  # "EVMD": the first half of the store's advisory lock (the second: its schema)
CHANNEL = "evermind_changes"
POLL_S = 1.0  # the follower's fallback poll when no notification came
POOL_MAX = 8
CONNECT_TIMEOUT_S = 10
_log = logging.getLogger(__name__)
# The pool logs each failed connection attempt; without a handler of the application's, Python's last-resort
# handler printed them on stderr (CLI output, an MCP server's log) while our own errors already say what failed.
# A NullHandler keeps them out of stderr and still lets them reach an application's logging config.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())
_URL_SCHEMES = ("postgresql://", "postgres://")
_SECRET_KEYS = {"password", "sslpassword"}


def is_postgres_url(path: str) -> bool:
    """Whether a store path is a PostgreSQL URL."""
    return isinstance(path, str) and path.startswith(_URL_SCHEMES)


def redact(url: str) -> str:
    """The URL without its password (in the user part or a `password=` parameter): what may be shown."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "postgresql://(unparsable URL)"
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        if ":" in user:
            user = user.split(":", 1)[0] + ":***"
        netloc = f"{user}@{host}"
    query = urlencode([(k, "***" if k.lower() in _SECRET_KEYS else v) for k, v in parse_qsl(parts.query,
                                                                                            keep_blank_values=True)],
                      safe="/", quote_via=quote)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _secrets(url: str) -> list[str]:
    """The credential strings in a URL (to scrub from any message that might quote them)."""
    out = []
    try:
        parts = urlsplit(url)
        if parts.password:
            out += [parts.password, quote(parts.password, safe="")]
        out += [v for k, v in parse_qsl(parts.query) if k.lower() in _SECRET_KEYS and v]
    except ValueError:
        pass
    return [s for s in out if s]


def _row(conn: Connection, sql: str, params: Sequence[object] = ()) -> tuple:
    """The row of a statement that always returns one (a function's value, an aggregate, a one-row table)."""
    row = conn.execute(sql, params).fetchone()
    if row is None:
        raise StorageError(f"PostgreSQL returned no row for {sql!r:.80}.")
    return row


def _import_psycopg() -> ModuleType:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        from ..._extras import install_command

        raise EvermindError("a postgresql:// store needs psycopg 3 and psycopg-pool; install them with "
                            f"`{install_command('postgres')}`.") from exc
    return psycopg


class PostgresBackend:
    """PostgreSQL access for one store (a database, or a schema in one); implements backend.Backend.

    Args:
        url: libpq URL (postgresql://user[:password]@host[:port]/db[?sslmode=...]).
        read_only: sessions only read (default_transaction_read_only); the store must exist.
        durability: "normal" (synchronous_commit=on, the server default) or "full" (the same: a commit is
            durable on the server before it is acknowledged; replicas are the server's business).
        busy_timeout: seconds a writer waits for another writer's transaction (lock_timeout) before StoreLocked.
        pool_size: most connections this process opens for sessions (plus one for the follower).
    Raises:
        EvermindError: the server cannot be reached or refused the login (message without the password), the
            database holds tables that are not an evermind store, or a store of a newer schema.
        InvalidInput: read_only on a database with no store.
    """

    def __init__(self, url: str, *, read_only: bool, durability: str, busy_timeout: float,
                 pool_size: int = POOL_MAX) -> None:
        self._psycopg = _import_psycopg()
        self._url = url
        self._scrub = _secrets(url)
        self.path = redact(url)
        self.memory = False
        self.read_only = read_only
        self.identity = None
        self.durability = durability
        self.busy_ms = int(busy_timeout * 1000)
        self.write_mutex = threading.RLock()
        self._closed = False
        self._pool: ConnectionPool | None = None
        self._key2 = 0
        self._follower: _Follower | None = None
        self._lock = threading.Lock()
        try:
            with self._connect() as conn:  # one plain connection first: a bad login fails here, at once
                self._key2 = int(_row(conn, "SELECT hashtext(current_schema())")[0])
                if read_only:
                    self._check_readable(conn)
                else:
                    self._ensure_schema(conn)
            from psycopg_pool import ConnectionPool

            # check: a connection is tried (an empty query) as it leaves the pool, so one left dead by a server
            # restart is replaced there instead of failing the first call after the server is back
            self._pool = ConnectionPool(url, min_size=1, max_size=max(2, pool_size), kwargs={"autocommit": True},
                                        configure=self._configure, open=False, name="evermind", timeout=30.0,
                                        check=ConnectionPool.check_connection)
            self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except BaseException as exc:
            self.close()
            if isinstance(exc, self._psycopg.Error) or type(exc).__module__.startswith("psycopg_pool"):
                raise self._error(exc, "opening the store") from None
            raise

    # ---- errors --------------------------------------------------------------------------------------------
    def _clean(self, text: str) -> str:
        for secret in self._scrub:
            text = text.replace(secret, "***")
        return text

    def _error(self, exc: BaseException, doing: str) -> EvermindError:
        """Our error for a driver error (the message scrubbed of credentials, the cause not chained)."""
        errors = self._psycopg.errors
        detail = self._clean(str(exc).strip() or type(exc).__name__)
        if isinstance(exc, (errors.LockNotAvailable, errors.QueryCanceled)):
            return StoreLocked(f"{self.path}: another node held the store's write lock for longer than busy_timeout "
                               f"({self.busy_ms / 1000:g} s); nothing from this call was stored. Retry, or open the "
                               "store with a larger busy_timeout.")
        if isinstance(exc, errors.DiskFull):
            return StorageError(f"{self.path}: the server's disk is full ({detail}); nothing from this call was "
                                "stored. Free space on the server, then retry.")
        if isinstance(exc, errors.InsufficientPrivilege):
            return EvermindError(f"{self.path}: the server refused {doing}: {detail}. Grant the user the rights on "
                                 "the store's schema (or open it read_only=True).")
        if isinstance(exc, self._psycopg.OperationalError) or type(exc).__module__.startswith("psycopg_pool"):
            return StorageError(f"{self.path}: the PostgreSQL server could not be reached or refused the "
                                f"connection while {doing} ({detail}); nothing from this call was stored. Check that "
                                "the server runs and the URL, user and password (PGPASSWORD, ~/.pgpass) are right, "
                                "then retry.")
        return EvermindError(f"{self.path}: PostgreSQL failed while {doing} ({type(exc).__name__}: {detail}).")

    # ---- connections ---------------------------------------------------------------------------------------
    def _connect(self) -> Connection:
        conn = self._psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        self._configure(conn)
        return conn

    def _configure(self, conn: Connection) -> None:
        """Every connection: UTC times, our lock timeout, read-only when the store is."""
        conn.execute("SET TIME ZONE 'UTC'")
        conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{max(self.busy_ms, 1)}ms",))
        conn.execute("SELECT set_config('synchronous_commit', 'on', false)")
        if self.read_only:
            conn.execute("SET default_transaction_read_only = on")

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._closed

    @contextlib.contextmanager
    def _connection(self, doing: str) -> Iterator[Connection]:
        """A pooled connection; a driver error while it is held becomes ours (_error)."""
        pool = self._pool
        if self._closed or pool is None:
            raise EvermindError("this MemoryStore is closed.")
        try:
            with pool.connection() as conn:
                yield conn
        except self._psycopg.Error as exc:
            if isinstance(exc, self._psycopg.OperationalError):
                pool.check()  # a restarted server: drop the other dead connections too
            raise self._error(exc, doing) from None

    @contextlib.contextmanager
    def _session(self, doing: str) -> Iterator[PostgresSession]:
        with self._connection(doing) as conn:
            yield PostgresSession(conn)

    @contextlib.contextmanager
    def reading(self) -> Iterator[PostgresSession]:
        """A session for reads; each statement sees the latest commit."""
        with self._session("reading") as session:
            yield session

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[PostgresSession]:
        """One REPEATABLE READ, READ ONLY transaction: every query sees the same committed state."""
        with self._session("reading") as session:
            session.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                yield session
            finally:
                session.conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[PostgresSession]:
        """BEGIN, the store's advisory lock (every writer of every node waits for it), ... COMMIT (with a NOTIFY of
        the new head when the change feed or meta changed).

        Round trips: BEGIN and the lock go to the server with the body's first statement (one pipeline), and the
        NOTIFY with the COMMIT, so a remember takes two round trips and holds the lock for about one. No
        process-wide mutex is taken here: a second thread's transaction waits for the advisory lock on the server
        like another node's (the callers that mirror a commit into the vector cache hold `write_mutex` themselves).

        Raises:
            StoreLocked: another writer held the lock past busy_timeout.
            StorageError: the server went away (nothing from this call was stored).
        """
        if self.read_only:
            raise EvermindError(f"{self.path} was opened with read_only=True; open a writer to change it.")
        with self._connection("writing") as conn:
            try:
                if self.busy_ms == 0:  # no waiting: try the lock at once
                    with conn.pipeline():
                        conn.execute("BEGIN")
                        got = conn.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", (LOCK_KEY, self._key2))
                    row = got.fetchone()
                    if row is None or not row[0]:
                        raise self._psycopg.errors.LockNotAvailable("the write lock is held")
                    session = PostgresSession(conn)
                else:  # BEGIN and the lock go out with the body's first statement (PostgresSession._start)
                    session = PostgresSession(conn, ("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_KEY, self._key2)))
                yield session
                if session.started:  # (a body that sent nothing began no transaction)
                    with conn.pipeline():
                        if session.changed:
                            conn.execute("SELECT pg_notify(%s, (SELECT COALESCE(MAX(seq), 0) FROM changes)::text)",
                                         (CHANNEL,))
                        conn.execute("COMMIT")
            except BaseException:
                if not conn.closed and conn.info.transaction_status != 0:  # (0: idle, nothing to roll back)
                    with contextlib.suppress(self._psycopg.Error):
                        conn.execute("ROLLBACK")
                raise

    def checkpoint(self) -> tuple[int, int]:
        """Nothing to do: the server checkpoints its own WAL."""
        return 0, 0

    def describe(self) -> dict:
        """schema_version, the server's version (no SQLite here), pgvector's version when the server has it, and
        how many change notifications this node's follower received."""
        with self.reading() as session:
            schema = session.meta("schema_version")
            version = _row(session.conn, "SHOW server_version")[0]
            vector = session.conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        follower = self._follower
        return {"schema_version": int(schema or SCHEMA_VERSION), "backend": "postgresql", "server_version": version,
                "pgvector": None if vector is None else vector[0], "sqlite_version": None,
                "sqlite_wal_reset_fixed": None, "notifications": None if follower is None else follower.notified}

    def fts_integrity(self) -> str | None:
        """The full-text statistics against the facts: None when they agree, else what differs."""
        with self.snapshot() as s:
            docs, tokens = _row(s.conn, "SELECT docs, tokens FROM fts_stats")
            facts, ntok = _row(s.conn, "SELECT COUNT(*), COALESCE(SUM(ntok), 0) FROM facts")
            stale = _row(s.conn, f"SELECT COUNT(*) FROM facts WHERE tsv != to_tsvector('{FTS_CONFIG}', "
                         "evermind_fts_text(text))")[0]
        if (docs, tokens) != (facts, ntok) or stale:
            return (f"fts_stats holds {docs} documents / {tokens} tokens for {facts} facts / {ntok} tokens; {stale} "
                    "tsvectors disagree with their text. repair() rebuilds them.")
        return None

    def count_damaged(self, dim: int) -> tuple[int, int, str | None]:
        """(fact rows a read would skip, damaged vectors, the first reason)."""
        from .postgres_repair import count_damaged

        with self.snapshot() as s:
            return count_damaged(s, dim)

    def repair_rows(self, dim: int) -> tuple[RepairCounts, list[str]]:
        """Rebuild the derived rows (tags, full-text statistics), clear damaged vectors (their facts are embedded
        again), quarantine unreadable rows; in one transaction."""
        from .postgres_repair import repair

        with self.transaction() as tx:
            counts = repair(tx, dim)
        problem = self.fts_integrity()
        return counts, ["ok"] if problem is None else [problem]

    def backup(self, dest: str) -> None:
        """A consistent copy of the store (facts, history, feedback, adapters) in a new SQLite file `dest`."""
        from .postgres_migrate import copy_to_sqlite

        copy_to_sqlite(self, dest)

    def vacuum(self) -> None:
        """VACUUM (ANALYZE) the store's tables and drop the stems no fact holds any more."""
        if self.read_only:
            raise EvermindError(f"{self.path} was opened with read_only=True; open a writer to compact it.")
        with self.transaction() as tx:
            tx.conn.execute("DELETE FROM fts_terms WHERE df <= 0")
        with self._session("vacuuming") as s:
            for table in ("facts", "fact_tags", "changes", "feedback", "fts_terms", GEN_TABLE):
                s.conn.execute(f"VACUUM (ANALYZE) {table}")  # (our own table names)

    def save_postings(self, *, claim: Callable[[], bool] = lambda: True, force: bool = False) -> bool:
        """False: PostgreSQL ranks lexical recall with its own full-text index (nothing is saved beside it)."""
        return False

    def file_bytes(self) -> dict:
        """{"db": the store's tables and indexes in bytes, "wal": 0} (the server's WAL is not the store's)."""
        with self.reading() as s:
            return {"db": s.sizes()["page_bytes"], "wal": 0}

    # ---- following ------------------------------------------------------------------------------------------
    def follow(self, callback: Callable[[int], None]) -> None:
        """Call `callback(head)` from a thread of its own whenever another writer commits (LISTEN/NOTIFY; every
        POLL_S seconds without one). Idempotent; ends with close()."""
        with self._lock:
            if self._follower is None and not self._closed:
                self._follower = _Follower(self, callback)
                self._follower.start()

    def adapters(self) -> DatabaseAdapters:
        """The store's adapters, in its `adapters` table (postgres_adapters.DatabaseAdapters)."""
        from .postgres_adapters import DatabaseAdapters

        return DatabaseAdapters(self)

    def close(self) -> None:
        """Close the pool and the follower's connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.stop()
        if self._pool is not None:
            with contextlib.suppress(Exception):
                self._pool.close(timeout=5.0)

    # ---- schema --------------------------------------------------------------------------------------------
    def _check_readable(self, conn: Connection) -> None:
        if _row(conn, "SELECT to_regclass('meta')")[0] is None:
            raise InvalidInput(f"{self.path} holds no evermind store; open it once without read_only=True to "
                               "create it.")
        self._check_version(conn)

    def _check_version(self, conn: Connection) -> None:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        raw = None if row is None else row[0]
        try:
            version = 0 if row is None else int(row[0])
        except ValueError:
            raise StoreCorrupt(f"{self.path}: the schema version recorded in meta is {raw!r:.40}, not a number.",
                               path=self.path, part="schema") from None
        if version > SCHEMA_VERSION:
            raise EvermindError(f"{self.path} has schema version {version}; this evermind_memory knows up to "
                                f"{SCHEMA_VERSION}. Upgrade evermind_memory to open it.")
        if version < SCHEMA_VERSION:
            raise EvermindError(f"{self.path} has schema version {version}, expected {SCHEMA_VERSION}.")

    def _ensure_schema(self, conn: Connection) -> None:
        from .postgres_schema import SCHEMA, TABLES

        with conn.transaction():
            # two nodes creating it at once
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_KEY, self._key2))
            if _row(conn, "SELECT to_regclass('meta')")[0] is None:
                present = [t for t in TABLES if _row(conn, "SELECT to_regclass(%s)", (t,))[0] is not None]
                if present:
                    raise EvermindError(f"{self.path} already has tables named {', '.join(present[:4])} but no "
                                        "evermind store; use another database, or a schema of its own "
                                        "(?options=-csearch_path%3Dname).")
                for statement in SCHEMA:
                    conn.execute(statement)
                conn.execute("INSERT INTO meta (key, value) VALUES (%s, %s), (%s, %s), (%s, %s)",
                             ("schema_version", str(SCHEMA_VERSION), "store_id", uuid.uuid4().hex,
                              "created_at", utc_now()))
            raw = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if raw is not None and raw[0] == "4":
                self._compact_vectors(conn, to=5)
                raw = ("5",)
            if raw is not None and raw[0] == "5":
                self._reference_fingerprints(conn)
                raw = ("6",)
            if raw is not None and raw[0] == "6":
                self._compact_vectors(conn, to=7)
            self._check_version(conn)

    @staticmethod
    def _compact_vectors(conn: Connection, to: int) -> None:
        """Schema 4 -> 5 and 6 -> 7 (inside _ensure_schema's transaction): every float32 or float16 vector rewritten
        in the row format of backend/vector_blobs.py (int8 and a scale), the facts' and those of a generation being
        built, a batch at a time; records schema version `to`."""
        for table, key in (("facts", "rid"), (GEN_TABLE, "label")):  # (names from this list, never from data)
            last = -1
            while True:
                with conn.cursor(binary=True) as cur:
                    rows = cur.execute(f"SELECT {key}, vector FROM {table} WHERE {key} > %s AND vector IS NOT NULL "
                                       f"ORDER BY {key} LIMIT %s", (last, COMPACT_BATCH)).fetchall()
                if not rows:
                    break
                with conn.cursor() as cur:
                    cur.executemany(f"UPDATE {table} SET vector = %s WHERE {key} = %s", vector_blobs.compact_rows(rows))
                last = rows[-1][0]
        conn.execute("UPDATE meta SET value = %s WHERE key = 'schema_version'", (str(to),))

    @staticmethod
    def _reference_fingerprints(conn: Connection) -> None:
        """Schema 5 -> 6 (inside _ensure_schema's transaction, which also records the version: a crash leaves
        schema 5 whole): each fingerprint string stored once, in `fingerprints`, facts referencing it by id."""
        from .postgres_schema import FINGERPRINT_INDEX_SQL, FINGERPRINTS_SQL

        conn.execute(FINGERPRINTS_SQL)
        conn.execute("INSERT INTO fingerprints (fingerprint) SELECT DISTINCT fingerprint FROM facts "
                     "WHERE fingerprint IS NOT NULL ORDER BY fingerprint ON CONFLICT (fingerprint) DO NOTHING")
        conn.execute("ALTER TABLE facts ADD COLUMN fingerprint_id bigint")
        conn.execute("UPDATE facts f SET fingerprint_id = p.id FROM fingerprints p WHERE p.fingerprint = f.fingerprint")
        conn.execute("DROP INDEX IF EXISTS facts_fingerprint")
        conn.execute("ALTER TABLE facts DROP COLUMN fingerprint")
        conn.execute(FINGERPRINT_INDEX_SQL)
        conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
        crash_point("migrate.fingerprints")  # (before the transaction commits: tests/store/test_fingerprint_ids.py)


class _Follower:
    """The LISTEN thread of one backend (see PostgresBackend.follow)."""

    def __init__(self, backend: PostgresBackend, callback: Callable[[int], None]) -> None:
        self._backend = backend
        self._callback = callback
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="evermind-follow", daemon=True)
        self._conn: Connection | None = None
        self._wake = f"evermind_stop_{uuid.uuid4().hex}"  # this follower's own channel: stop() wakes it at once
        self.notified = 0  # notifications received (for tests and info)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the thread: a notification on its own channel wakes it from its wait (a server that cannot be
        reached: it ends at its next poll, within POLL_S)."""
        self._stop.set()
        conn = self._conn
        if conn is not None and self._backend._pool is not None:
            with contextlib.suppress(Exception):
                with self._backend._pool.connection(timeout=1.0) as c:
                    c.execute("SELECT pg_notify(%s, '')", (self._wake,))
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _call(self, head: int) -> None:
        try:
            self._callback(head)
        except Exception as exc:  # noqa: BLE001 (the next answer catches up itself; keep following)
            _log.debug("evermind follower: catch-up failed: %s", self._backend._clean(str(exc)))

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                self._conn = self._backend._connect()
                self._conn.execute(f"LISTEN {CHANNEL}")
                self._conn.execute(f"LISTEN {self._wake}")  # (our own generated name)
                backoff = 0.1
                self._call(-1)  # (re)connected: notifications may have been missed meanwhile
                while not self._stop.is_set():
                    got = False
                    for note in self._conn.notifies(timeout=POLL_S, stop_after=64):
                        if self._stop.is_set():
                            break
                        got = True
                        head = int(note.payload) if note.payload.isdigit() else -1
                        self.notified += 1
                        self._call(head)
                    if not got:
                        self._call(-1)  # the fallback poll
            except Exception as exc:  # noqa: BLE001 (a dropped connection: reconnect with backoff)
                if self._stop.is_set():
                    break
                _log.debug("evermind follower: %s; reconnecting", self._backend._clean(str(exc)))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                conn, self._conn = self._conn, None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
