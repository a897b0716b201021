"""The SQLite side of a store, the only source of truth (R1): facts, tags, the change log and FTS5.

Connections are ours (R14): one writing connection guarded by a mutex, read-only connections per thread,
WAL, a chosen `synchronous`, `busy_timeout`, `foreign_keys=ON`, `trusted_schema=OFF`, `mmap_size=0`.
sqlite-utils creates and inspects the schema; the hot paths are plain parameterised SQL in explicit
`BEGIN IMMEDIATE` transactions, so the FTS rows, tags and change log commit with the fact or not at all.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import sqlite_utils

from ..errors import EvermindError, InvalidInput
from .records import Change, Fact, Recall

SCHEMA_VERSION = 2  # 1: the first release; 2: + feedback (query -> fact judged useful or not, for adaptation)
SQLITE_FIXED = ((3, 51, 3), (3, 50, 7), (3, 44, 6))  # WAL-reset bug fixed in these (and later) releases
FACT_COLS = "rid, id, text, tags, source, created_at, updated_at, fingerprint, label, seq"
_IN_CHUNK = 500
_INSERT_FACT = (
    "INSERT INTO facts (id, text, tags, source, created_at, updated_at, vector, fingerprint, label, seq) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_CHANGE = (
    "INSERT INTO changes (seq, fact_id, op, at, text, tags, source, vector_added, label_removed) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)



def _create_feedback(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE feedback (id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, query TEXT NOT NULL, "
        "fact_id TEXT NOT NULL, useful INTEGER NOT NULL CHECK (useful IN (0, 1)))"
    )
    conn.execute("CREATE INDEX feedback_fact ON feedback (fact_id, query)")


# Migrations: MIGRATIONS[v] upgrades a store from schema v to v + 1 inside one transaction.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _create_feedback}


def utc_now() -> str:
    """Current UTC time as ISO 8601 text with microseconds (sorts as text)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def new_id() -> str:
    """A fresh opaque fact id (uuid4 hex)."""
    return uuid.uuid4().hex


def sqlite_has_wal_reset_fix(version: str = sqlite3.sqlite_version) -> bool:
    """Whether the linked SQLite has the WAL-reset corruption fix (R6, R14)."""
    v = tuple(int(p) for p in version.split(".")[:3])
    if v >= SQLITE_FIXED[0]:
        return True
    return any(v[:2] == fixed[:2] and v >= fixed for fixed in SQLITE_FIXED[1:])


def _dt(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _tags(text: str) -> dict[str, str]:
    return {} if text == "{}" else json.loads(text)  # most facts carry no tags: skip the JSON parser


def row_to_fact(row: tuple) -> Fact:
    """A `FACT_COLS` row -> Fact."""
    return Fact(
        id=row[1], text=row[2], tags=_tags(row[3]), source=row[4], created_at=_dt(row[5]),
        updated_at=_dt(row[6]), fingerprint=row[7],
    )


def row_to_recall(row: tuple, score: float) -> Recall:
    """A `FACT_COLS` row and a score -> Recall."""
    return Recall(
        id=row[1], text=row[2], score=float(score), tags=_tags(row[3]), source=row[4],
        created_at=_dt(row[5]), updated_at=_dt(row[6]),
    )


def tags_json(tags: dict[str, str]) -> str:
    """Canonical JSON for a tag dict."""
    return json.dumps(tags, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def tag_filter_sql(tags: dict[str, str], column: str = "f.id") -> tuple[str, list[str]]:
    """SQL conditions (AND-joined, leading ' AND ') selecting facts that carry every tag exactly."""
    sql = "".join(f" AND {column} IN (SELECT fact_id FROM fact_tags WHERE key = ? AND value = ?)" for _ in tags)
    params = [p for kv in sorted(tags.items()) for p in kv]
    return sql, params


def tagged_from_sql(tags: dict[str, str]) -> tuple[str, list[str]]:
    """A FROM clause over `facts f` restricted to facts carrying every tag, driven by the tag index.

    (`f.id IN (subquery)` makes SQLite scan every fact and probe; starting from fact_tags visits only matches.)
    """
    if not tags:
        return "facts f", []
    items = sorted(tags.items())
    sql = "fact_tags t0 CROSS JOIN facts f ON f.id = t0.fact_id AND t0.key = ? AND t0.value = ?"
    sql += "".join(f" JOIN fact_tags t{i} ON t{i}.fact_id = f.id AND t{i}.key = ? AND t{i}.value = ?" for i in range(1, len(items)))
    return sql, [p for kv in items for p in kv]


def vectors_from_blobs(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """Concatenate float32 blobs into a (N, dim) matrix."""
    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)  # (0, D)
    return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), dim).astype(np.float32)  # (N, D)


def _stale_sql(include_waiting: bool) -> str:
    """The WHERE condition (one `?`: the current fingerprint) for stale vectors, with or without missing ones."""
    if include_waiting:
        return "(fingerprint IS NOT ? OR vector IS NULL)"
    return "(vector IS NOT NULL AND fingerprint IS NOT ?)"


def _chunks(items: Sequence, size: int = _IN_CHUNK) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class FactsDB:
    """SQLite access for one store file (or ":memory:").

    Args:
        path: database file, or ":memory:".
        read_only: open only read-only connections; the store must exist.
        durability: "normal" (synchronous=NORMAL) or "full" (synchronous=FULL).
        busy_timeout: seconds SQLite waits on a locked database.
    Raises:
        InvalidInput: read_only on a missing file.
        EvermindError: not an evermind store, or made by a newer version.
    """

    def __init__(self, path: str, *, read_only: bool, durability: str, busy_timeout: float) -> None:
        self.path = path
        self.memory = path == ":memory:"
        self.read_only = read_only
        self.synchronous = "FULL" if durability == "full" else "NORMAL"
        self.busy_ms = int(busy_timeout * 1000)
        self.write_mutex = threading.RLock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self.writer: sqlite3.Connection | None = None
        if read_only:
            if not Path(path).is_file():
                raise InvalidInput(f"{path} does not exist; open it once without read_only=True to create it.")
            with self.reading() as conn:
                self._check_readable_schema(conn)
        else:
            self.writer = self._connect(write=True)
            self._ensure_schema()

    # ---- connections ---------------------------------------------------------------------------------------
    def _connect(self, *, write: bool) -> sqlite3.Connection:
        if self.memory:
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        elif write:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=self.busy_ms / 1000)
        else:
            uri = Path(self.path).resolve().as_uri() + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=self.busy_ms / 1000)
        conn.execute(f"PRAGMA busy_timeout = {self.busy_ms}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA trusted_schema = OFF")
        conn.execute("PRAGMA mmap_size = 0")
        if write and not self.memory:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                conn.close()
                raise EvermindError(f"{self.path}: could not switch to WAL journal mode (got {mode}); is it on a local disk?")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        return conn

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """A connection for reads: this thread's read-only connection (the writer's, locked, for :memory:)."""
        if self._closed:
            raise EvermindError("this MemoryStore is closed.")
        if self.memory:
            with self.write_mutex:
                yield self.writer
            return
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect(write=False)
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        yield conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """`BEGIN IMMEDIATE` ... `COMMIT` on the writing connection, under the write mutex (R2)."""
        if self._closed:
            raise EvermindError("this MemoryStore is closed.")
        if self.writer is None:
            raise EvermindError(f"{self.path} was opened with read_only=True; open a writer to change it.")
        with self.write_mutex:
            conn = self.writer
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:  # disk full, I/O error, locked past busy_timeout
                raise EvermindError(
                    f"{self.path}: SQLite refused the write ({exc}); nothing from this call was stored. "
                    "Free disk space or check the file's permissions, then retry."
                ) from exc

    def close(self) -> None:
        """Close every connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
        if self.writer is not None:
            with self.write_mutex:
                if not self.memory:
                    with contextlib.suppress(sqlite3.Error):
                        self.writer.execute("PRAGMA wal_checkpoint(PASSIVE)")
                self.writer.close()

    # ---- schema --------------------------------------------------------------------------------------------
    def _ensure_schema(self) -> None:
        db = sqlite_utils.Database(self.writer)
        with self.transaction() as conn:
            names = set(db.table_names())
            if "meta" not in names:
                if names - {"sqlite_sequence"}:
                    raise EvermindError(f"{self.path} is an SQLite file but not an evermind store (tables: {sorted(names)[:5]}).")
                self._create_schema(db, conn)
            version = int(self.meta(conn, "schema_version") or 0)
            if version > SCHEMA_VERSION:
                raise EvermindError(
                    f"{self.path} has schema version {version}; this evermind_memory knows up to {SCHEMA_VERSION}. "
                    "Upgrade evermind_memory to open it."
                )
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](conn)
                version += 1
                self.set_meta(conn, "schema_version", str(version))

    def _check_readable_schema(self, conn: sqlite3.Connection) -> None:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in names:
            raise EvermindError(f"{self.path} is not an evermind store.")
        version = int(self.meta(conn, "schema_version") or 0)
        if version != SCHEMA_VERSION:
            raise EvermindError(
                f"{self.path} has schema version {version}, expected {SCHEMA_VERSION}; open it once as a writer "
                "(read_only=False) with this version to migrate it."
            )

    @staticmethod
    def _create_schema(db: sqlite_utils.Database, conn: sqlite3.Connection) -> None:
        db["meta"].create({"key": str, "value": str}, pk="key", not_null={"value"})
        db["facts"].create(
            {"rid": int, "id": str, "text": str, "tags": str, "source": str, "created_at": str, "updated_at": str,
             "vector": bytes, "fingerprint": str, "label": int, "seq": int},
            pk="rid", not_null={"id", "text", "tags", "created_at", "updated_at", "seq"},
        )
        db["facts"].create_index(["id"], index_name="facts_id", unique=True)
        db["facts"].create_index(["label"], index_name="facts_label", unique=True)
        db["facts"].create_index(["fingerprint", "label"], index_name="facts_fingerprint")
        db["fact_tags"].create(
            {"fact_id": str, "key": str, "value": str}, pk=("fact_id", "key"),
            not_null={"value"}, foreign_keys=[("fact_id", "facts", "id")],
        )
        db["fact_tags"].create_index(["key", "value"], index_name="fact_tags_kv")
        conn.execute(
            "CREATE TABLE changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, fact_id TEXT NOT NULL, "
            "op TEXT NOT NULL CHECK (op IN ('remember', 'update', 'forget', 'reembed')), at TEXT NOT NULL, "
            "text TEXT, tags TEXT, source TEXT, vector_added INTEGER NOT NULL DEFAULT 0, label_removed INTEGER)"
        )
        conn.execute("CREATE INDEX changes_fact ON changes (fact_id, seq)")
        conn.execute(
            "CREATE VIRTUAL TABLE facts_fts USING fts5(text, content='facts', content_rowid='rid', "
            "tokenize='porter unicode61')"
        )
        _create_feedback(conn)
        now = utc_now()
        conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [("schema_version", str(SCHEMA_VERSION)), ("store_id", uuid.uuid4().hex), ("created_at", now)],
        )

    @staticmethod
    def meta(conn: sqlite3.Connection, key: str) -> str | None:
        """A meta value, or None."""
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    @staticmethod
    def set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
        """Set a meta value (inside a transaction)."""
        conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))

    # ---- feedback ------------------------------------------------------------------------------------------
    @staticmethod
    def add_feedback(conn: sqlite3.Connection, at: str, query: str, fact_id: str, useful: bool, limit: int) -> None:
        """Record a judgement and keep only the newest `limit` ones (inside a transaction)."""
        cur = conn.execute("INSERT INTO feedback (at, query, fact_id, useful) VALUES (?, ?, ?, ?)",
                           (at, query, fact_id, int(useful)))
        conn.execute("DELETE FROM feedback WHERE id <= ?", (cur.lastrowid - limit,))

    @staticmethod
    def feedback_pairs(conn: sqlite3.Connection, fingerprint: str) -> list[tuple[str, int]]:
        """(query, label) of every query whose latest judgement of a fact with a current vector was "useful"."""
        return conn.execute(
            "SELECT f.query, facts.label FROM feedback f JOIN facts ON facts.id = f.fact_id "
            "WHERE facts.fingerprint = ? AND facts.label IS NOT NULL AND f.id = "
            "(SELECT MAX(g.id) FROM feedback g WHERE g.query = f.query AND g.fact_id = f.fact_id) AND f.useful = 1 "
            "ORDER BY f.id",
            (fingerprint,),
        ).fetchall()

    # ---- reads ---------------------------------------------------------------------------------------------
    @staticmethod
    def max_seq(conn: sqlite3.Connection) -> int:
        """The highest change sequence (0 for a new store)."""
        return int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0])

    @staticmethod
    def count(conn: sqlite3.Connection, fingerprint: str | None = None) -> int:
        """Live facts (with that fingerprint when given)."""
        if fingerprint is None:
            return int(conn.execute("SELECT COUNT(*) FROM facts").fetchone()[0])
        return int(conn.execute("SELECT COUNT(*) FROM facts WHERE fingerprint = ?", (fingerprint,)).fetchone()[0])

    @staticmethod
    def fetch(conn: sqlite3.Connection, fact_id: str) -> tuple | None:
        """A fact row by id, or None."""
        return conn.execute(f"SELECT {FACT_COLS} FROM facts WHERE id = ?", (fact_id,)).fetchone()

    @staticmethod
    def fetch_where(conn: sqlite3.Connection, column: str, values: Sequence) -> dict:
        """Rows whose `column` (rid, id or label) is in `values`, keyed by that column."""
        pos = {"rid": 0, "id": 1, "label": 8}[column]
        out: dict = {}
        for chunk in _chunks(list(values)):
            marks = ",".join("?" * len(chunk))
            for row in conn.execute(f"SELECT {FACT_COLS} FROM facts WHERE {column} IN ({marks})", list(chunk)):
                out[row[pos]] = row
        return out

    @staticmethod
    def list_rows(conn: sqlite3.Connection, limit: int, offset: int, tags: dict[str, str], source: str | None) -> list[tuple]:
        """Facts in insertion order, filtered by tags and source."""
        source_sql, params = tagged_from_sql(tags)
        where = ""
        if source is not None:
            where += " AND f.source = ?"
            params.append(source)
        cols = ", ".join("f." + c for c in FACT_COLS.split(", "))
        sql = f"SELECT {cols} FROM {source_sql} WHERE 1 = 1{where} ORDER BY f.rid LIMIT ? OFFSET ?"
        return conn.execute(sql, [*params, limit, offset]).fetchall()

    @staticmethod
    def history(conn: sqlite3.Connection, fact_id: str) -> list[Change]:
        """Every change of one fact, oldest first.

        The arrival of a first vector (a 'reembed' that removed no label: background embedding of a
        remembered fact) is part of remembering it, not a change, and is left out, so a fact's history reads
        the same whether it was embedded before or after its commit."""
        rows = conn.execute(
            "SELECT seq, op, at, text, tags, source FROM changes WHERE fact_id = ? "
            "AND NOT (op = 'reembed' AND label_removed IS NULL) ORDER BY seq", (fact_id,)
        ).fetchall()
        return [
            Change(seq=r[0], op=r[1], at=_dt(r[2]), text=r[3], tags=None if r[4] is None else json.loads(r[4]), source=r[5])
            for r in rows
        ]

    @staticmethod
    def changes_after(conn: sqlite3.Connection, seq: int, upto: int) -> list[tuple[int, int, int | None]]:
        """(seq, vector_added, label_removed) of changes in (seq, upto], in order (R3 replay)."""
        return conn.execute(
            "SELECT seq, vector_added, label_removed FROM changes WHERE seq > ? AND seq <= ? ORDER BY seq", (seq, upto)
        ).fetchall()

    @staticmethod
    def vectors(conn: sqlite3.Connection, fingerprint: str, dim: int, *, labels: Sequence[int] | None = None,
                tags: dict[str, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(labels (N,), vectors (N, D)) of facts with `fingerprint`, optionally restricted to labels or tags."""
        out_labels: list[int] = []
        blobs: list[bytes] = []
        if labels is not None:
            for chunk in _chunks(list(labels)):
                marks = ",".join("?" * len(chunk))
                for label, blob in conn.execute(
                    f"SELECT label, vector FROM facts WHERE fingerprint = ? AND label IN ({marks})", [fingerprint, *chunk]
                ):
                    out_labels.append(label)
                    blobs.append(blob)
        else:
            source_sql, params = tagged_from_sql(tags or {})
            for label, blob in conn.execute(
                f"SELECT f.label, f.vector FROM {source_sql} WHERE f.fingerprint = ? ORDER BY f.label", [*params, fingerprint]
            ):
                out_labels.append(label)
                blobs.append(blob)
        good = [i for i, b in enumerate(blobs) if b is not None and len(b) == 4 * dim]
        if len(good) != len(blobs):
            out_labels = [out_labels[i] for i in good]
            blobs = [blobs[i] for i in good]
        return np.array(out_labels, dtype=np.int64), vectors_from_blobs(blobs, dim)  # (N,), (N, D)

    @staticmethod
    def count_tagged(conn: sqlite3.Connection, tags: dict[str, str], fingerprint: str) -> int:
        """How many facts with `fingerprint` carry every tag."""
        source_sql, params = tagged_from_sql(tags)
        return int(conn.execute(f"SELECT COUNT(*) FROM {source_sql} WHERE f.fingerprint = ?", [*params, fingerprint]).fetchone()[0])

    @staticmethod
    def lexical(conn: sqlite3.Connection, match: str, limit: int, tags: dict[str, str]) -> list[tuple[tuple, float]]:
        """FTS5 BM25 search: [(row, score)] with score = -bm25 (higher is better), best first."""
        cols = ", ".join("f." + c for c in FACT_COLS.split(", "))
        if not tags:  # let FTS5 sort by rank (bm25) itself and join only the top rows
            sql = (
                f"SELECT {cols}, r.rank FROM (SELECT rowid, rank FROM facts_fts WHERE facts_fts MATCH ? "
                "ORDER BY rank LIMIT ?) r JOIN facts f ON f.rid = r.rowid ORDER BY r.rank, f.rid"
            )
            return [(row[:-1], -float(row[-1])) for row in conn.execute(sql, [match, limit])]
        where, params = tag_filter_sql(tags)
        sql = (
            f"SELECT {', '.join('f.' + c for c in FACT_COLS.split(', '))}, bm25(facts_fts) AS b FROM facts_fts "
            f"JOIN facts f ON f.rid = facts_fts.rowid WHERE facts_fts MATCH ?{where} ORDER BY b, f.rid LIMIT ?"
        )
        return [(row[:-1], -float(row[-1])) for row in conn.execute(sql, [match, *params, limit])]

    @staticmethod
    def stale(conn: sqlite3.Connection, fingerprint: str | None, limit: int, *, after_rid: int = 0,
              include_waiting: bool = True) -> list[tuple[int, str, str, int | None]]:
        """(rid, id, text, label) of facts whose vector is from another fingerprint or missing (only those
        with a vector when include_waiting is False; all facts for fingerprint None), by rid."""
        if fingerprint is None:
            return conn.execute(
                "SELECT rid, id, text, label FROM facts WHERE rid > ? ORDER BY rid LIMIT ?", (after_rid, limit)
            ).fetchall()
        return conn.execute(
            f"SELECT rid, id, text, label FROM facts WHERE {_stale_sql(include_waiting)} AND rid > ? "
            "ORDER BY rid LIMIT ?", (fingerprint, after_rid, limit),
        ).fetchall()

    @staticmethod
    def count_stale(conn: sqlite3.Connection, fingerprint: str, include_waiting: bool = True) -> int:
        """Facts whose vector is from another fingerprint or (with include_waiting) missing."""
        return int(conn.execute(
            f"SELECT COUNT(*) FROM facts WHERE {_stale_sql(include_waiting)}", (fingerprint,)
        ).fetchone()[0])

    @staticmethod
    def waiting(conn: sqlite3.Connection) -> list[tuple[int, str, str]]:
        """(rid, id, text) of the facts with no vector yet, oldest first (background embedding's queue)."""
        return conn.execute("SELECT rid, id, text FROM facts WHERE vector IS NULL ORDER BY rid").fetchall()

    @staticmethod
    def labels(conn: sqlite3.Connection, fingerprint: str) -> set[int]:
        """Labels of the facts whose vector is from `fingerprint` (what the index must hold)."""
        return {r[0] for r in conn.execute("SELECT label FROM facts WHERE fingerprint = ?", (fingerprint,))}

    # ---- writes (inside `transaction()`) -------------------------------------------------------------------
    def _log(self, conn: sqlite3.Connection, seq: int, fact_id: str, op: str, at: str, text: str | None,
             tags: str | None, source: str | None, vector_added: bool, label_removed: int | None) -> None:
        conn.execute(
            "INSERT INTO changes (seq, fact_id, op, at, text, tags, source, vector_added, label_removed) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, fact_id, op, at, text, tags, source, int(vector_added), label_removed),
        )

    def insert(self, conn: sqlite3.Connection, items: Sequence[tuple], vectors: np.ndarray | None,
               fingerprint: str | None) -> tuple[list[int], int]:
        """Insert new facts with their vectors; each gets a change seq that is also its index label.

        Args:
            conn: the transaction's connection.
            items: (id, text, tags dict, source, created_at, updated_at) per fact.
            vectors: (N, D) float32 unit rows, or None: the facts wait for a vector (no label until
                `set_vectors` gives them one; background embedding).
            fingerprint: the embedder fingerprint that made them (None with vectors None).
        Returns:
            (the seqs in order (== the labels when vectors are given), the first new rid).
        """
        base = self.max_seq(conn)
        seqs = list(range(base + 1, base + 1 + len(items)))
        fact_rows, change_rows, tag_rows = [], [], []
        tag_texts: dict[int, str] = {}  # one JSON text per tags dict (remember_many shares one among all items)
        has_vec = vectors is not None
        for i, (seq, (fid, text, tags, source, created, updated)) in enumerate(zip(seqs, items)):
            tj = tag_texts.get(id(tags))
            if tj is None:
                tj = tag_texts[id(tags)] = tags_json(tags) if tags else "{}"
            blob = vectors[i].astype("<f4").tobytes() if has_vec else None
            fact_rows.append((fid, text, tj, source, created, updated, blob, fingerprint, seq if has_vec else None, seq))
            change_rows.append((seq, fid, "remember", updated, text, tj, source, int(has_vec), None))
            tag_rows.extend((fid, k, v) for k, v in tags.items())
        if len(fact_rows) == 1:  # one fact (remember): plain statements, and the FTS row straight from its rid
            first = conn.execute(_INSERT_FACT, fact_rows[0]).lastrowid
            conn.execute(_INSERT_CHANGE, change_rows[0])
            conn.execute("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", (first, fact_rows[0][1]))
        else:
            first = int(conn.execute("SELECT COALESCE(MAX(rid), 0) FROM facts").fetchone()[0]) + 1
            conn.executemany(_INSERT_FACT, fact_rows)
            conn.executemany(_INSERT_CHANGE, change_rows)
            conn.execute("INSERT INTO facts_fts (rowid, text) SELECT rid, text FROM facts WHERE rid >= ?", (first,))
        if tag_rows:
            conn.executemany("INSERT INTO fact_tags (fact_id, key, value) VALUES (?, ?, ?)", tag_rows)
        return seqs, first

    def update(self, conn: sqlite3.Connection, row: tuple, *, text: str, tags: dict[str, str], source: str | None,
               vector: np.ndarray | None, fingerprint: str | None, now: str) -> tuple[int, int | None]:
        """Change one fact; a new vector gets a new label (R8). Returns (seq, label_removed or None)."""
        rid, fid, old_text, old_label = row[0], row[1], row[2], row[8]
        seq = self.max_seq(conn) + 1
        tj = tags_json(tags)
        if vector is not None:
            conn.execute(
                "UPDATE facts SET text = ?, tags = ?, source = ?, updated_at = ?, vector = ?, fingerprint = ?, "
                "label = ?, seq = ? WHERE rid = ?",
                (text, tj, source, now, vector.astype("<f4").tobytes(), fingerprint, seq, seq, rid),
            )
        else:
            conn.execute("UPDATE facts SET text = ?, tags = ?, source = ?, updated_at = ?, seq = ? WHERE rid = ?",
                         (text, tj, source, now, seq, rid))
        if text != old_text:
            conn.execute("INSERT INTO facts_fts (facts_fts, rowid, text) VALUES ('delete', ?, ?)", (rid, old_text))
            conn.execute("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", (rid, text))
        conn.execute("DELETE FROM fact_tags WHERE fact_id = ?", (fid,))
        conn.executemany("INSERT INTO fact_tags (fact_id, key, value) VALUES (?, ?, ?)", [(fid, k, v) for k, v in tags.items()])
        removed = old_label if vector is not None else None
        self._log(conn, seq, fid, "update", now, text, tj, source, vector is not None, removed)
        return seq, removed

    def delete(self, conn: sqlite3.Connection, rows: Iterable[tuple], now: str) -> list[int]:
        """Forget facts, leaving tombstones in the change log (R3). Returns the labels removed."""
        removed: list[int] = []
        seq = self.max_seq(conn)
        for row in rows:
            rid, fid, text, label = row[0], row[1], row[2], row[8]
            seq += 1
            conn.execute("DELETE FROM fact_tags WHERE fact_id = ?", (fid,))
            conn.execute("DELETE FROM feedback WHERE fact_id = ?", (fid,))  # a forgotten fact leaves no trace there
            conn.execute("INSERT INTO facts_fts (facts_fts, rowid, text) VALUES ('delete', ?, ?)", (rid, text))
            conn.execute("DELETE FROM facts WHERE rid = ?", (rid,))
            self._log(conn, seq, fid, "forget", now, None, None, None, False, label)
            if label is not None:
                removed.append(label)
        return removed

    def set_vectors(self, conn: sqlite3.Connection, rows: Sequence[tuple[int, str, int | None]], vectors: np.ndarray,
                    fingerprint: str, now: str) -> list[tuple[int, int | None]]:
        """Re-embed: give each (rid, id, old_label) a new vector and label. Returns [(new_label, old_label)]."""
        seq = self.max_seq(conn)
        out = []
        for (rid, fid, old_label), vec in zip(rows, vectors):
            seq += 1
            conn.execute("UPDATE facts SET vector = ?, fingerprint = ?, label = ?, seq = ? WHERE rid = ?",
                         (vec.astype("<f4").tobytes(), fingerprint, seq, seq, rid))
            self._log(conn, seq, fid, "reembed", now, None, None, None, True, old_label)
            out.append((seq, old_label))
        return out

    @staticmethod
    def still_waiting(conn: sqlite3.Connection, rids: Sequence[int]) -> dict[int, str]:
        """rid -> text of those facts in rids that still have no vector (not forgotten, not updated since)."""
        out: dict[int, str] = {}
        for chunk in _chunks(list(rids)):
            marks = ",".join("?" * len(chunk))
            out.update(conn.execute(f"SELECT rid, text FROM facts WHERE vector IS NULL AND rid IN ({marks})", chunk))
        return out

    @staticmethod
    def count_waiting(conn: sqlite3.Connection) -> int:
        """Facts with no vector yet (remembered with background embedding, not embedded so far)."""
        return int(conn.execute("SELECT COUNT(*) FROM facts WHERE vector IS NULL").fetchone()[0])

    @staticmethod
    def count_foreign(conn: sqlite3.Connection, fingerprint: str) -> int:
        """Facts with a vector made by another embedder (a model mismatch, unlike facts waiting for one)."""
        return int(conn.execute(
            "SELECT COUNT(*) FROM facts WHERE vector IS NOT NULL AND fingerprint IS NOT ?", (fingerprint,)
        ).fetchone()[0])
