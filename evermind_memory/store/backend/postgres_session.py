"""The PostgreSQL queries of a store: one `PostgresSession` per pooled connection answers backend.Reads and
backend.Writes, with the same rows and meanings as backend/sqlite_session.py.

Plain parameterised SQL (psycopg `%s`; R19); lists travel as one array parameter (`= ANY(%s)`). Times are
`timestamptz` columns, read back as the canonical UTC text every FactRow holds (`_ts`), so the front parses one
format whatever the backend. Vectors are little-endian float16 `bytea` (backend/vector_blobs.py), as in SQLite, read with
binary cursors.

Full-text search. `facts.tsv` is the fact's text through the `evermind` text search configuration (English
Snowball stems, no stop words: like FTS5's `porter unicode61`, which indexes every word), after ASCII
punctuation is turned into spaces (`evermind_fts_text`: so `/etc/apache2/sites-available` is four words, as
FTS5 reads it, not one file name); a GIN index serves `@@`. Triggers keep `fts_terms` (each stem's document
frequency) and `fts_stats` (documents, tokens) with every write, so ranking is BM25 as FTS5 computes it (k1
1.2, b 0.75, idf log((N - df + 0.5) / (df + 0.5)), a non-positive idf counted as 1e-6), over each matched
fact's term frequencies read from its tsvector. `ts_rank_cd` (cover density, no idf) is there too
(RANKING = "ts_rank_cd"): benchmarks/pg_speed.py --lexical compares both with FTS5 on the dev sources. Which
words are matched is planned as for SQLite (store/lexical.choose), from the same document frequencies.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Iterator, Sequence

import numpy as np

from ..lexical import BM25_B, BM25_K1, choose, idf
from ..records import Change
from . import vector_blobs
from .base import ChangeRow, FactRow, GenerationRows, Integrity, LeaseRow, NewFact, Selection, StaleRow, WaitingRow
from .filter_sql import POSTGRES, compile_selection, scope_condition, tag_row
from .codec import tags_json
from .sqlite_session import usable_rows, vectors_from_blobs

GEN_TABLE = "adapt_vectors"
RANKING = "bm25"  # or "ts_rank_cd" (benchmarks/pg_speed.py --lexical compares them)
FTS_CONFIG = "evermind"


def _ts(column: str) -> str:
    """A timestamptz column as the canonical text (time_text): UTC, microseconds, "+00:00"."""
    return (f"to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')")


def _cols(alias: str) -> str:
    a = f"{alias}." if alias else ""
    return (f"{a}rid, {a}id, {a}text, {a}tags, {a}source, {_ts(a + 'created_at')}, {_ts(a + 'updated_at')}, "
            f"{a}fingerprint, {a}label, {a}seq, {_ts(a + 'expires_at')}, {a}pinned, {a}scope")


FACT_COLS = _cols("")
_F_COLS = _cols("f")
# remember: the facts, their change rows and their tag rows in one statement (one round trip). The seqs follow the
# head read by this statement, which starts after the transaction took the store's advisory lock (READ COMMITTED:
# it sees every earlier commit), so they are in commit order. A data-modifying CTE runs whether or not it is read.
_INSERT = (
    "WITH s AS (SELECT COALESCE(MAX(seq), 0) AS head FROM changes), "
    "n AS (SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::timestamptz[], %s::timestamptz[], "
    "%s::bytea[], %s::timestamptz[], %s::smallint[], %s::text[], %s::text[]) WITH ORDINALITY "
    "AS n(id, text, tags, source, created_at, updated_at, vector, expires_at, pinned, scope, link, o)), "
    "f AS (INSERT INTO facts (id, text, tags, source, created_at, updated_at, vector, fingerprint, label, seq, "
    "expires_at, pinned, scope, owner) SELECT n.id, n.text, n.tags, n.source, n.created_at, n.updated_at, n.vector, "
    "%s, CASE WHEN n.vector IS NULL THEN NULL ELSE s.head + n.o END, s.head + n.o, n.expires_at, n.pinned, n.scope, "
    "%s FROM n, s ORDER BY n.o RETURNING rid), "
    "c AS (INSERT INTO changes (seq, fact_id, op, at, text, tags, source, vector_added, label_removed, scope, link) "
    "SELECT s.head + n.o, n.id, 'remember', n.updated_at, n.text, n.tags, n.source, %s, NULL, n.scope, n.link "
    "FROM n, s), "
    "t AS (INSERT INTO fact_tags (fact_id, key, value, vtype, num) "
    "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::float8[])) "
    "SELECT s.head, (SELECT MIN(rid) FROM f) FROM s"
)
# the background worker's (and reembed's) vectors: the facts and their "reembed" change rows in one statement
_SET_VECTORS = (
    "WITH s AS (SELECT COALESCE(MAX(seq), 0) AS head FROM changes), "
    "v AS (SELECT * FROM unnest(%s::bigint[], %s::text[], %s::bigint[], %s::bytea[]) WITH ORDINALITY "
    "AS v(rid, fid, old, vector, o)), "
    "u AS (UPDATE facts f SET vector = v.vector, fingerprint = %s, label = s.head + v.o, seq = s.head + v.o, "
    "owner = NULL FROM v, s WHERE f.rid = v.rid RETURNING f.rid, f.scope), "
    "c AS (INSERT INTO changes (seq, fact_id, op, at, text, tags, source, vector_added, label_removed, scope, link) "
    "SELECT s.head + v.o, v.fid, 'reembed', %s, NULL, NULL, NULL, 1, v.old, COALESCE(u.scope, ''), NULL "
    "FROM v CROSS JOIN s LEFT JOIN u ON u.rid = v.rid) "
    "SELECT head FROM s"
)
_INSERT_CHANGE = (
    "INSERT INTO changes (seq, fact_id, op, at, text, tags, source, vector_added, label_removed, scope, link) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_INSERT_TAG = "INSERT INTO fact_tags (fact_id, key, value, vtype, num) VALUES (%s, %s, %s, %s, %s)"
_GEN_JOIN = (f"SELECT f.label, CASE WHEN g.vector IS NULL THEN f.text END, g.vector FROM facts f LEFT JOIN "
             f"{GEN_TABLE} g ON g.label = f.label AND g.fingerprint = %s WHERE ")


def when(text: str | None) -> datetime | None:
    """An ISO 8601 text time (as the front passes them) as an aware datetime parameter."""
    return None if text is None else datetime.fromisoformat(text)


def _blob(vector: np.ndarray) -> bytes:
    return vector_blobs.encode(vector)


def selection(sel: Selection) -> tuple[str, list]:
    """A Selection as a PostgreSQL condition on `facts f` (backend/filter_sql.py)."""
    return compile_selection(sel, POSTGRES, "f")


class PostgresSession:
    """Queries over one connection (backend.Reads and backend.Writes); see PostgresBackend for the transactions.

    Args:
        conn: a psycopg connection (autocommit; the backend opens and ends the transactions).
    """

    def __init__(self, conn, begin: tuple[str, Sequence] | None = None) -> None:
        self._conn = conn
        self._begin = begin  # a write transaction's lock statement, sent with BEGIN ahead of its first statement
        self.changed = False  # a write touched the change feed or meta: followers are notified at commit

    @property
    def conn(self):
        """The connection, inside the transaction when this session writes (BEGIN and the lock sent first)."""
        if self._begin is not None:
            self._start()
        return self._conn

    @property
    def started(self) -> bool:
        """Whether a statement was sent (a write session that sent none has no transaction to end)."""
        return self._begin is None

    def _start(self, sql: str | None = None, params: Sequence = ()):
        """BEGIN, the lock and `sql` in one round trip (pipelined); returns the cursor of `sql`."""
        lock, lock_params = self._begin
        self._begin = None
        with self._conn.pipeline():
            self._conn.execute("BEGIN")
            self._conn.execute(lock, lock_params)
            cur = None if sql is None else self._conn.execute(sql, params)
        return cur

    def _one(self, sql: str, params: Sequence = ()):
        if self._begin is not None:  # (a remember's or the worker's first statement: one round trip with the lock)
            return self._start(sql, params).fetchone()
        return self._conn.execute(sql, params).fetchone()

    def _all(self, sql: str, params: Sequence = (), *, binary: bool = False) -> list:
        with self.conn.cursor(binary=binary) as cur:
            return cur.execute(sql, params).fetchall()

    def _scalar(self, sql: str, params: Sequence = ()) -> int:
        return int(self._one(sql, params)[0])

    # ---- meta ----------------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = %s", (key,))
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = "
                          "excluded.value", (key, value))
        self.changed = True

    def delete_meta(self, *keys: str) -> None:
        self.conn.execute("DELETE FROM meta WHERE key = ANY(%s)", (list(keys),))
        self.changed = True

    # ---- leases --------------------------------------------------------------------------------------------
    def lease(self, name: str) -> LeaseRow | None:
        row = self._one("SELECT owner, expires FROM leases WHERE name = %s", (name,))
        return None if row is None else LeaseRow(row[0], float(row[1]))

    def set_lease(self, name: str, owner: str, expires: float) -> None:
        self.conn.execute("INSERT INTO leases (name, owner, expires) VALUES (%s, %s, %s) ON CONFLICT (name) DO UPDATE "
                          "SET owner = excluded.owner, expires = excluded.expires", (name, owner, expires))

    def drop_lease(self, name: str, owner: str) -> None:
        self.conn.execute("DELETE FROM leases WHERE name = %s AND owner = %s", (name, owner))

    # ---- the change feed -----------------------------------------------------------------------------------
    def max_seq(self) -> int:
        return self._scalar("SELECT COALESCE(MAX(seq), 0) FROM changes")

    def changes_after(self, seq: int, upto: int) -> list[ChangeRow]:
        return [ChangeRow(s, bool(added), removed) for s, added, removed in self._all(
            "SELECT seq, vector_added, label_removed FROM changes WHERE seq > %s AND seq <= %s ORDER BY seq", (seq, upto))]

    def remembered_since(self, seq: int) -> int:
        return self._scalar("SELECT COUNT(*) FROM changes WHERE seq > %s AND op = 'remember'", (seq,))

    def history(self, fact_id: str, scope: str) -> list[Change]:
        params: list = [fact_id]
        in_scope = scope_condition("scope", scope, True, POSTGRES, params)
        rows = self._all(
            "SELECT seq, op, at, text, tags, source, link FROM changes WHERE fact_id = %s "
            f"AND NOT (op = 'reembed' AND label_removed IS NULL){' AND ' + in_scope if in_scope else ''} ORDER BY seq",
            params)
        return [Change(seq=r[0], op=r[1], at=r[2].astimezone(timezone.utc), text=r[3],
                       tags=None if r[4] is None else json.loads(r[4]), source=r[5],
                       replaces=r[6] if r[1] == "remember" else None,
                       replaced_by=r[6] if r[1] == "forget" else None) for r in rows]

    # ---- facts ---------------------------------------------------------------------------------------------
    def count(self, fingerprint: str | None = None) -> int:
        if fingerprint is None:
            return self._scalar("SELECT COUNT(*) FROM facts")
        return self._scalar("SELECT COUNT(*) FROM facts WHERE fingerprint = %s", (fingerprint,))

    def fetch(self, fact_id: str) -> FactRow | None:
        row = self._one(f"SELECT {FACT_COLS} FROM facts WHERE id = %s", (fact_id,))
        return None if row is None else FactRow._make(row)

    def fetch_where(self, column: str, values: Sequence) -> dict:
        if column not in ("rid", "id", "label"):
            raise ValueError(f"fetch_where() expected rid, id or label, got {column!r}")
        values = [v if column == "id" else int(v) for v in values]
        out: dict = {}
        for row in self._all(f"SELECT {FACT_COLS} FROM facts WHERE {column} = ANY(%s)", (values,)):
            fact = FactRow._make(row)
            out[getattr(fact, column)] = fact
        return out

    def list_rows(self, limit: int, offset: int, sel: Selection) -> list[FactRow]:
        where, params = selection(sel)
        sql = f"SELECT {_F_COLS} FROM facts f WHERE {where} ORDER BY f.rid LIMIT %s OFFSET %s"
        return [FactRow._make(r) for r in self._all(sql, [*params, None if limit < 0 else limit, offset])]

    def count_selected(self, sel: Selection, fingerprint: str | None = None) -> int:
        where, params = selection(sel)
        if fingerprint is None:
            return self._scalar(f"SELECT COUNT(*) FROM facts f WHERE {where}", params)
        return self._scalar(f"SELECT COUNT(*) FROM facts f WHERE f.fingerprint = %s AND {where}", [fingerprint, *params])

    def expired_rows(self, now: datetime, scope: str, limit: int) -> list[FactRow]:
        params: list = [now]
        in_scope = scope_condition("f.scope", scope, True, POSTGRES, params)
        sql = (f"SELECT {_F_COLS} FROM facts f WHERE f.expires_at <= %s{' AND ' + in_scope if in_scope else ''} "
               "ORDER BY f.expires_at, f.rid LIMIT %s")
        return [FactRow._make(r) for r in self._all(sql, [*params, limit])]

    def recent_selected(self, sel: Selection, seq: int) -> list[FactRow]:
        where, params = selection(sel)
        return [FactRow._make(r) for r in self._all(
            f"SELECT {_F_COLS} FROM (SELECT fact_id AS id FROM changes WHERE seq > %s UNION "
            f"SELECT id FROM facts WHERE vector IS NULL) r JOIN facts f ON f.id = r.id WHERE {where} ORDER BY f.rid",
            [seq, *params])]

    def _count_expired(self, now: datetime) -> int:
        return self._scalar("SELECT COUNT(*) FROM facts WHERE expires_at <= %s", (now,))

    def sizes(self) -> dict:
        now = datetime.now(timezone.utc)
        tables = ["facts", "fact_tags", "changes", "feedback", "leases", "meta", GEN_TABLE, "fts_terms", "fts_stats",
                  "adapters"]
        return {
            "facts": self.count(), "expired": self._count_expired(now),
            "pinned": self._scalar("SELECT COUNT(*) FROM facts WHERE pinned = 1"),
            "changes": self._scalar("SELECT COUNT(*) FROM changes"),
            "forgotten": self._scalar("SELECT COUNT(DISTINCT c.fact_id) FROM changes c WHERE NOT EXISTS "
                                      "(SELECT 1 FROM facts f WHERE f.id = c.fact_id)"),
            "page_bytes": self._scalar("SELECT COALESCE(SUM(pg_total_relation_size(to_regclass(t))), 0) "
                                       "FROM unnest(%s::text[]) t", (tables,)),
            "free_bytes": 0,
        }

    def export_rows(self) -> Iterator[FactRow]:
        with self.conn.cursor(name=None) as cur:
            for row in cur.execute(f"SELECT {FACT_COLS} FROM facts ORDER BY rid"):
                yield FactRow._make(row)

    # ---- vectors -------------------------------------------------------------------------------------------
    def vectors(self, fingerprint: str, dim: int, *, labels: Sequence[int] | None = None,
                sel: Selection | None = None) -> tuple[np.ndarray, np.ndarray]:
        if labels is not None:
            sql, params = ("SELECT label, vector FROM facts WHERE fingerprint = %s AND label = ANY(%s)",
                           [fingerprint, [int(x) for x in labels]])
        elif sel is None:  # every vector (the index holds expired facts too, until they are swept)
            sql, params = "SELECT f.label, f.vector FROM facts f WHERE f.fingerprint = %s ORDER BY f.label", [fingerprint]
        else:
            where, params = selection(sel)
            sql = f"SELECT f.label, f.vector FROM facts f WHERE f.fingerprint = %s AND {where} ORDER BY f.label"
            params = [fingerprint, *params]
        rows = self._all(sql, params, binary=True)
        good = [(label, bytes(blob)) for label, blob in rows if vector_blobs.readable(blob, dim)]
        labels_arr = np.array([g[0] for g in good], dtype=np.int64)  # (N,)
        matrix = vectors_from_blobs([g[1] for g in good], dim)  # (N, D)
        usable = usable_rows(matrix)  # (N,) a damaged vector (NaN, Inf, zero) is left out like a short one
        if not usable.all():
            return labels_arr[usable], matrix[usable]
        return labels_arr, matrix

    def labels(self, fingerprint: str | None) -> set[int]:
        if fingerprint is None:
            return {r[0] for r in self._all("SELECT label FROM facts WHERE label IS NOT NULL")}
        return {r[0] for r in self._all("SELECT label FROM facts WHERE fingerprint = %s", (fingerprint,))}

    def selected_labels(self, sel: Selection, fingerprint: str) -> np.ndarray:
        where, params = selection(sel)
        rows = self._all(f"SELECT f.label FROM facts f WHERE f.fingerprint = %s AND {where}", [fingerprint, *params])
        return np.array([r[0] for r in rows], dtype=np.int64)  # (N,)

    def expired_labels(self, fingerprint: str, now: datetime) -> set[int]:
        return {r[0] for r in self._all("SELECT label FROM facts WHERE expires_at <= %s AND fingerprint = %s",
                                        (now, fingerprint))}

    def memory_texts(self, fingerprint: str, dim: int) -> tuple[np.ndarray, list[str]]:
        rows = self._all("SELECT label, text FROM facts WHERE fingerprint = %s AND label IS NOT NULL AND vector IS NOT "
                         "NULL AND octet_length(vector) IN (%s, %s) ORDER BY label",
                         (fingerprint, *vector_blobs.blob_lengths(dim)))
        return np.array([r[0] for r in rows], dtype=np.int64), [r[1] for r in rows]  # (N,), N texts

    def stale(self, fingerprint: str | None, limit: int, *, after_rid: int = 0,
              include_waiting: bool = True) -> list[StaleRow]:
        if fingerprint is None:
            rows = self._all("SELECT rid, id, text, label FROM facts WHERE rid > %s ORDER BY rid LIMIT %s",
                             (after_rid, limit))
        else:
            rows = self._all(f"SELECT rid, id, text, label FROM facts WHERE {_stale_sql(include_waiting)} AND rid > %s "
                             "ORDER BY rid LIMIT %s", (fingerprint, after_rid, limit))
        return [StaleRow._make(r) for r in rows]

    def count_stale(self, fingerprint: str, include_waiting: bool = True) -> int:
        return self._scalar(f"SELECT COUNT(*) FROM facts WHERE {_stale_sql(include_waiting)}", (fingerprint,))

    def count_foreign(self, fingerprint: str) -> int:
        return self._scalar("SELECT COUNT(*) FROM facts WHERE vector IS NOT NULL AND fingerprint IS DISTINCT FROM %s",
                            (fingerprint,))

    def waiting(self) -> list[WaitingRow]:
        return [WaitingRow._make(r) for r in self._all("SELECT rid, id, text FROM facts WHERE vector IS NULL ORDER BY rid")]

    def waiting_owners(self) -> dict[str | None, int]:
        return dict(self._all("SELECT owner, COUNT(*) FROM facts WHERE vector IS NULL GROUP BY owner"))

    def adopt_waiting(self, old_owner: str | None, new_owner: str) -> list[WaitingRow]:
        rows = self._all("UPDATE facts SET owner = %s WHERE vector IS NULL AND owner IS NOT DISTINCT FROM %s "
                         "RETURNING rid, id, text", (new_owner, old_owner))
        return sorted(WaitingRow._make(r) for r in rows)

    def still_waiting(self, rids: Sequence[int]) -> dict[int, str]:
        return dict(self._all("SELECT rid, text FROM facts WHERE vector IS NULL AND rid = ANY(%s)",
                              ([int(r) for r in rids],)))

    def count_waiting(self) -> int:
        return self._scalar("SELECT COUNT(*) FROM facts WHERE vector IS NULL")

    # ---- full-text search ----------------------------------------------------------------------------------
    def _stems(self, words: list[str]) -> list[list[str]]:
        """Each word's stems, as the facts' tsvectors hold them."""
        rows = self._all(
            f"SELECT o, ARRAY(SELECT lexeme FROM unnest(to_tsvector('{FTS_CONFIG}', evermind_fts_text(w))) "
            "ORDER BY positions[1]) FROM unnest(%s::text[]) WITH ORDINALITY AS t(w, o) ORDER BY o", (words,))
        return [list(r[1]) for r in rows]

    def lexical(self, words: list[str], limit: int, sel: Selection) -> list[tuple[FactRow, float]]:
        if not words:
            return []
        stems = self._stems(words)
        terms = sorted({t for s in stems for t in s})
        docs, tokens, df = self._term_stats(terms, sel)
        word_df = [min((df.get(t, 0) for t in s), default=0) for s in stems]
        kept, all_first = choose(words, word_df, int(docs))
        if not kept:
            return []
        weights = {t: idf(int(df.get(t, 0)), int(docs)) for t in terms}
        avg = max(1.0, float(tokens) / max(1, int(docs)))
        if all_first:  # many postings: the rows holding every word, when there are enough
            hits = self._match(kept, "&&", weights, avg, limit, sel)
            if len(hits) >= limit:
                return hits
        return self._match(kept, "||", weights, avg, limit, sel)

    def _term_stats(self, terms: list[str], sel: Selection | None) -> tuple[int, int, dict[str, int]]:
        """(documents, tokens, term -> document frequency) of the whole store (the trigger-kept fts_stats and
        fts_terms), or of the facts a narrowing `sel` selects (counted over them: store/lexical.py). One statement,
        one snapshot: read apart, a commit in between could give a term more documents than counted (a negative
        idf)."""
        if sel is None or not sel.narrows:
            docs, tokens, found, counts = self._one(
                "SELECT s.docs, s.tokens, ARRAY(SELECT term FROM fts_terms WHERE term = ANY(%s) ORDER BY term), "
                "ARRAY(SELECT df FROM fts_terms WHERE term = ANY(%s) ORDER BY term) FROM fts_stats s", (terms, terms))
        else:
            where, params = selection(sel)
            docs, tokens, found, counts = self._one(
                f"WITH s AS MATERIALIZED (SELECT f.tsv, f.ntok FROM facts f WHERE {where}), "
                "t AS (SELECT u AS term, COUNT(*) AS df FROM s, unnest(tsvector_to_array(s.tsv)) u "
                "WHERE u = ANY(%s) GROUP BY u) "
                "SELECT (SELECT COUNT(*) FROM s), (SELECT COALESCE(SUM(ntok), 0) FROM s), "
                "ARRAY(SELECT term FROM t ORDER BY term), ARRAY(SELECT df FROM t ORDER BY term)", [*params, terms])
        return int(docs), int(tokens), dict(zip(found, (int(c) for c in counts)))

    def document_frequencies(self, words: list[str], sel: Selection | None = None) -> list[int]:
        stems = self._stems(words)
        _, _, df = self._term_stats(sorted({t for s in stems for t in s}), sel)
        return [min((df.get(t, 0) for t in s), default=0) for s in stems]

    def selection_size(self, sel: Selection) -> tuple[int, int]:
        docs, tokens, _ = self._term_stats([], sel)
        return docs, tokens

    def _match(self, words: list[str], glue: str, weights: dict[str, float], avg: float, limit: int,
               sel: Selection) -> list[tuple[FactRow, float]]:
        """The facts matching `words` (each a phrase; joined by || or &&), ranked, best first."""
        query = f" {glue} ".join([f"phraseto_tsquery('{FTS_CONFIG}', evermind_fts_text(%s))"] * len(words))
        where, params = selection(sel)
        if RANKING == "ts_rank_cd":
            sql = (f"SELECT {_F_COLS}, ts_rank_cd(f.tsv, q.q) AS score FROM facts f, (SELECT {query} AS q) q "
                   f"WHERE f.tsv @@ q.q AND {where} ORDER BY score DESC, f.rid LIMIT %s")
            rows = self._all(sql, [*words, *params, limit])
        else:
            sql = (
                f"WITH w(term, idf) AS (SELECT * FROM unnest(%s::text[], %s::float8[])), q AS (SELECT {query} AS q), "
                f"s AS (SELECT f.rid, SUM(w.idf * (u.tf * {BM25_K1 + 1}) / (u.tf + {BM25_K1} * "
                f"({1 - BM25_B} + {BM25_B} * f.ntok / %s::float8))) AS score "
                "FROM q, facts f CROSS JOIN LATERAL (SELECT lexeme, COALESCE(cardinality(positions), 1) AS tf "
                "FROM unnest(f.tsv)) u JOIN w ON w.term = u.lexeme "
                f"WHERE f.tsv @@ q.q AND {where} GROUP BY f.rid ORDER BY score DESC, f.rid LIMIT %s) "
                f"SELECT {_F_COLS}, s.score FROM s JOIN facts f ON f.rid = s.rid ORDER BY s.score DESC, f.rid"
            )
            rows = self._all(sql, [list(weights), list(weights.values()), *words, avg, *params, limit])
        return [(FactRow._make(r[:-1]), float(r[-1])) for r in rows]

    # ---- feedback ------------------------------------------------------------------------------------------
    def add_feedback(self, at: str, query: str, fact_id: str, useful: bool, limit: int) -> None:
        new = self._scalar("INSERT INTO feedback (at, query, fact_id, useful) VALUES (%s, %s, %s, %s) RETURNING id",
                           (when(at), query, fact_id, int(useful)))
        self.conn.execute("DELETE FROM feedback WHERE id <= %s", (new - limit,))

    def feedback_pairs(self, fingerprint: str) -> list[tuple[str, int]]:
        return [tuple(r) for r in self._all(
            "SELECT f.query, facts.label FROM feedback f JOIN facts ON facts.id = f.fact_id "
            "WHERE facts.fingerprint = %s AND facts.label IS NOT NULL AND f.id = "
            "(SELECT MAX(g.id) FROM feedback g WHERE g.query = f.query AND g.fact_id = f.fact_id) AND f.useful = 1 "
            "ORDER BY f.id", (fingerprint,))]

    def count_feedback(self) -> int:
        return self._scalar("SELECT COUNT(*) FROM feedback")

    # ---- checks --------------------------------------------------------------------------------------------
    def integrity(self, dim: int) -> Integrity:
        docs, _ = self._one("SELECT docs, tokens FROM fts_stats")
        messages = ["ok"]
        facts = self.count()
        if int(docs) != facts:
            messages = [f"fts_stats counts {docs} documents for {facts} facts"]
        return Integrity(
            messages=messages,
            foreign_key_violations=0,  # enforced by the server on every write
            bad_vectors=self._scalar("SELECT COUNT(*) FROM facts WHERE vector IS NOT NULL AND octet_length(vector) NOT IN "
                                     "(%s, %s)", vector_blobs.blob_lengths(dim)),
            fts_rows=self._scalar("SELECT COUNT(*) FROM facts WHERE tsv IS NOT NULL"),
            tags_out_of_sync=self._scalar(
                "SELECT COUNT(*) FROM facts f WHERE (SELECT COUNT(*) FROM fact_tags t WHERE t.fact_id = f.id) != "
                "(SELECT COUNT(*) FROM jsonb_object_keys(evermind_json_object(f.tags)))"),
        )

    # ---- writes (inside a transaction) ---------------------------------------------------------------------
    def _log(self, rows: list[tuple]) -> None:
        if rows:
            self.conn.cursor().executemany(_INSERT_CHANGE, rows)
            self.changed = True

    def insert(self, items: Sequence[NewFact], vectors: np.ndarray | None, fingerprint: str | None,
               owner: str | None = None) -> tuple[list[int], int]:
        has_vec = vectors is not None
        cols: list[list] = [[] for _ in range(11)]  # the columns of _INSERT's `n`, one list each
        tag_cols: list[list] = [[] for _ in range(5)]
        tag_texts: dict[int, str] = {}
        for i, item in enumerate(items):
            fid, text, tags, source, created, updated, expires, pinned, scope, replaces = item
            tj = tag_texts.get(id(tags))
            if tj is None:
                tj = tag_texts[id(tags)] = tags_json(tags) if tags else "{}"
            for col, value in zip(cols, (fid, text, tj, source, when(created), when(updated),
                                         _blob(vectors[i]) if has_vec else None, when(expires), int(pinned), scope,
                                         replaces)):
                col.append(value)
            for k, v in tags.items():
                for col, value in zip(tag_cols, tag_row(fid, k, v)):
                    col.append(value)
        head, first = self._one(_INSERT, [*cols, fingerprint if has_vec else None, None if has_vec else owner,
                                          int(has_vec), *tag_cols])
        self.changed = True
        return list(range(head + 1, head + 1 + len(items))), int(first)

    def update(self, row: FactRow, *, text: str, tags: dict, source: str | None, vector: np.ndarray | None,
               fingerprint: str | None, now: str, expires_at: str | None, pinned: bool) -> tuple[int, int | None]:
        seq = self.max_seq() + 1
        tj = tags_json(tags)
        text_set = "text = %s, " if text != row.text else ""  # (an unchanged text keeps its tsvector: no trigger)
        params = [text] if text_set else []
        if vector is not None:
            self.conn.execute(
                f"UPDATE facts SET {text_set}tags = %s, source = %s, updated_at = %s, vector = %s, fingerprint = %s, "
                "label = %s, seq = %s, expires_at = %s, pinned = %s WHERE rid = %s",
                [*params, tj, source, when(now), _blob(vector), fingerprint, seq, seq, when(expires_at), int(pinned),
                 row.rid])
        else:
            self.conn.execute(f"UPDATE facts SET {text_set}tags = %s, source = %s, updated_at = %s, seq = %s, "
                              "expires_at = %s, pinned = %s WHERE rid = %s",
                              [*params, tj, source, when(now), seq, when(expires_at), int(pinned), row.rid])
        self.conn.execute("DELETE FROM fact_tags WHERE fact_id = %s", (row.id,))
        if tags:
            self.conn.cursor().executemany(_INSERT_TAG, [tag_row(row.id, k, v) for k, v in tags.items()])
        removed = row.label if vector is not None else None
        self._log([(seq, row.id, "update", when(now), text, tj, source, int(vector is not None), removed, row.scope,
                    None)])
        return seq, removed

    def delete(self, rows: Sequence[FactRow], now: str, replaced_by: str | None = None) -> list[int]:
        if not rows:
            return []
        ids = [row.id for row in rows]
        self.conn.execute("DELETE FROM fact_tags WHERE fact_id = ANY(%s)", (ids,))
        self.conn.execute("DELETE FROM feedback WHERE fact_id = ANY(%s)", (ids,))  # a forgotten fact leaves no trace
        self.conn.execute("DELETE FROM facts WHERE rid = ANY(%s)", ([row.rid for row in rows],))
        seq, at = self.max_seq(), when(now)
        self._log([(seq + i, row.id, "forget", at, None, None, None, 0, row.label, row.scope, replaced_by)
                   for i, row in enumerate(rows, start=1)])
        return [row.label for row in rows if row.label is not None]

    def set_vectors(self, rows: Sequence[tuple[int, str, int | None]], vectors: np.ndarray, fingerprint: str,
                    now: str) -> list[tuple[int, int | None]]:
        if not len(rows):
            return []
        rids = [int(r) for r, _, _ in rows]
        ids = [fid for _, fid, _ in rows]
        old = [None if label is None else int(label) for _, _, label in rows]
        head = self._scalar(_SET_VECTORS, (rids, ids, old, [_blob(v) for v in vectors], fingerprint, when(now)))
        self.changed = True
        return [(head + i, label) for i, label in enumerate(old, start=1)]

    def prune_history(self, before: str, upto: int) -> int:
        doomed = (
            "SELECT c.seq FROM changes c JOIN (SELECT fact_id, MAX(seq) AS last FROM changes "
            "WHERE op = 'forget' AND at < %s AND seq < %s GROUP BY fact_id) g ON c.fact_id = g.fact_id AND c.seq <= g.last"
        )
        top = self._one(f"SELECT MAX(seq) FROM ({doomed}) d", (when(before), upto))[0]
        if top is None:
            return 0
        cur = self.conn.execute(f"DELETE FROM changes WHERE seq IN ({doomed})", (when(before), upto))
        self.set_meta("history_pruned", str(max(int(top), int(self.meta("history_pruned") or 0))))
        return cur.rowcount

    # ---- the generation being built (adaptation, rollback) -------------------------------------------------
    def generation_begin(self, fingerprint: str, labels: np.ndarray | None, vectors: np.ndarray | None) -> None:
        self.conn.execute(f"DELETE FROM {GEN_TABLE} WHERE fingerprint != %s", (fingerprint,))
        if labels is not None:
            self.generation_store(fingerprint, labels.tolist(), vectors)

    def generation_store(self, fingerprint: str, labels: Sequence[int], vectors: np.ndarray) -> None:
        self.conn.cursor().executemany(
            f"INSERT INTO {GEN_TABLE} (label, fingerprint, vector) VALUES (%s, %s, %s) ON CONFLICT (label) DO UPDATE "
            "SET fingerprint = excluded.fingerprint, vector = excluded.vector",
            [(int(lab), fingerprint, _blob(v)) for lab, v in zip(labels, vectors)])

    def generation_missing(self, fingerprint: str, after: int, limit: int) -> list[tuple[int, str]]:
        return [tuple(r) for r in self._all(
            f"SELECT f.label, f.text FROM facts f WHERE f.label > %s AND NOT EXISTS (SELECT 1 FROM "
            f"{GEN_TABLE} g WHERE g.label = f.label AND g.fingerprint = %s) ORDER BY f.label LIMIT %s",
            (after, fingerprint, limit))]

    def generation_rows(self, fingerprint: str, dim: int, labels: Sequence[int] | None = None) -> GenerationRows:
        if labels is None:
            rows = self._all(_GEN_JOIN + "f.label IS NOT NULL ORDER BY f.label", (fingerprint,), binary=True)
        else:
            rows = self._all(_GEN_JOIN + "f.label = ANY(%s) ORDER BY f.label", (fingerprint, [int(x) for x in labels]),
                             binary=True)
        out = np.array([r[0] for r in rows], dtype=np.int64)  # (N,)
        vectors = np.zeros((len(rows), dim), dtype=np.float32)  # (N, D)
        have = [i for i, r in enumerate(rows) if vector_blobs.readable(r[2], dim)]
        if have:
            got = vectors_from_blobs([bytes(rows[i][2]) for i in have], dim)  # (H, D)
            usable = usable_rows(got)  # (H,)
            have = [i for i, ok in zip(have, usable.tolist()) if ok]
            vectors[have] = got[usable]
        have_set = set(have)
        return GenerationRows(out, vectors, [(i, rows[i][1]) for i in range(len(rows)) if i not in have_set])

    def generation_count_missing(self, fingerprint: str) -> int:
        return self._scalar(
            f"SELECT COUNT(*) FROM facts f WHERE f.label IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "
            f"{GEN_TABLE} g WHERE g.label = f.label AND g.fingerprint = %s)", (fingerprint,))

    def generation_adopt(self, fingerprint: str) -> None:
        self.conn.execute(
            f"UPDATE facts SET vector = (SELECT g.vector FROM {GEN_TABLE} g WHERE g.label = facts.label "
            "AND g.fingerprint = %s), fingerprint = %s", (fingerprint, fingerprint))
        self.changed = True

    def generation_drop(self) -> None:
        self.conn.execute(f"DELETE FROM {GEN_TABLE}")


def _stale_sql(include_waiting: bool) -> str:
    """The WHERE condition (one `%s`: the current fingerprint) for stale vectors, with or without missing ones."""
    if include_waiting:
        return "(fingerprint IS DISTINCT FROM %s OR vector IS NULL)"
    return "(vector IS NOT NULL AND fingerprint IS DISTINCT FROM %s)"
