"""The PostgreSQL side of a store's queries: one `PostgresSession` per pooled connection answers backend.Reads and
backend.Writes, the queries both engines share through backend/session.py and the rest (full text, inserts) here.

Plain parameterised SQL (psycopg `%s`; R19); lists travel as one array parameter (`= ANY(%s)`). Times are
`timestamptz` columns, read back as the canonical UTC text every FactRow holds (the Dialect's `time_column`), so the
front parses one format whatever the backend. Vectors are int8 components and a float32 scale in a `bytea`
(backend/vector_blobs.py), as in SQLite, read with binary cursors.

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

from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from ..lexical import BM25_B, BM25_K1, choose, idf
from . import vector_blobs
from .base import FactRow, Integrity, NewFact, Selection
from .dialect import POSTGRES, when
from .filter_sql import compile_selection, tag_row
from .codec import tags_json
from .session import GEN_TABLE, Session, fact_columns

if TYPE_CHECKING:
    from psycopg import Connection, Cursor

RANKING = "bm25"  # or "ts_rank_cd" (benchmarks/pg_speed.py --lexical compares them)
FTS_CONFIG = "evermind"


FACT_COLS = fact_columns(POSTGRES)
_F_COLS = fact_columns(POSTGRES, "f")
# remember: the facts, their change rows and their tag rows in one statement (one round trip). The seqs follow the
# head read by this statement, which starts after the transaction took the store's advisory lock (READ COMMITTED:
# it sees every earlier commit), so they are in commit order. A data-modifying CTE runs whether or not it is read.
_INSERT = (
    "WITH s AS (SELECT COALESCE(MAX(seq), 0) AS head FROM changes), "
    "n AS (SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::timestamptz[], %s::timestamptz[], "
    "%s::bytea[], %s::timestamptz[], %s::smallint[], %s::text[], %s::text[]) WITH ORDINALITY "
    "AS n(id, text, tags, source, created_at, updated_at, vector, expires_at, pinned, scope, link, o)), "
    "f AS (INSERT INTO facts (id, text, tags, source, created_at, updated_at, vector, fingerprint_id, label, seq, "
    "expires_at, pinned, scope, owner) SELECT n.id, n.text, n.tags, n.source, n.created_at, n.updated_at, n.vector, "
    "%s::bigint, CASE WHEN n.vector IS NULL THEN NULL ELSE s.head + n.o END, s.head + n.o, n.expires_at, n.pinned, "
    "n.scope, %s FROM n, s ORDER BY n.o RETURNING rid), "
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
    "u AS (UPDATE facts f SET vector = v.vector, fingerprint_id = %s, label = s.head + v.o, seq = s.head + v.o, "
    "owner = NULL FROM v, s WHERE f.rid = v.rid RETURNING f.rid, f.scope), "
    "c AS (INSERT INTO changes (seq, fact_id, op, at, text, tags, source, vector_added, label_removed, scope, link) "
    "SELECT s.head + v.o, v.fid, 'reembed', %s, NULL, NULL, NULL, 1, v.old, COALESCE(u.scope, ''), NULL "
    "FROM v CROSS JOIN s LEFT JOIN u ON u.rid = v.rid) "
    "SELECT head FROM s"
)
def _blob(vector: np.ndarray) -> bytes:
    return vector_blobs.encode(vector)


def selection(sel: Selection) -> tuple[str, list]:
    """A Selection as a PostgreSQL condition on `facts f` (backend/filter_sql.py)."""
    return compile_selection(sel, POSTGRES, "f")


class PostgresSession(Session):
    """Queries over one connection (backend.Reads and backend.Writes: the shared ones in backend/session.py); see
    PostgresBackend for the transactions.

    Args:
        conn: a psycopg connection (autocommit; the backend opens and ends the transactions).
    """

    dialect = POSTGRES
    _cols, _f_cols = FACT_COLS, _F_COLS
    _encode = staticmethod(_blob)

    def __init__(self, conn: Connection, begin: tuple[str, Sequence] | None = None) -> None:
        self._conn = conn
        self._begin = begin  # a write transaction's lock statement, sent with BEGIN ahead of its first statement
        self.changed = False  # a write touched the change feed or meta: followers are notified at commit

    @property
    def conn(self) -> Connection:
        """The connection, inside the transaction when this session writes (BEGIN and the lock sent first)."""
        if self._begin is not None:
            self._start()
        return self._conn

    @property
    def started(self) -> bool:
        """Whether a statement was sent (a write session that sent none has no transaction to end)."""
        return self._begin is None

    def _start(self, sql: str | None = None, params: Sequence = ()) -> Cursor | None:
        """BEGIN, the lock and `sql` in one round trip (pipelined); returns the cursor of `sql`."""
        if self._begin is None:
            raise RuntimeError("PostgresSession._start: the transaction was begun already")
        lock, lock_params = self._begin
        self._begin = None
        with self._conn.pipeline():
            self._conn.execute("BEGIN")
            self._conn.execute(lock, lock_params)
            cur = None if sql is None else self._conn.execute(sql, params)
        return cur

    # ---- running statements (Session's primitives; `?` becomes psycopg's `%s`) -----------------------------
    def _one(self, sql: str, params: Sequence = ()):
        sql = POSTGRES.statement(sql)
        if self._begin is not None:  # (a remember's or the worker's first statement: one round trip with the lock)
            cur = self._start(sql, params)
            return None if cur is None else cur.fetchone()
        return self._conn.execute(sql, params).fetchone()

    def _all(self, sql: str, params: Sequence = (), *, binary: bool = False) -> list:
        with self.conn.cursor(binary=binary) as cur:
            return cur.execute(POSTGRES.statement(sql), params).fetchall()

    def _iter(self, sql: str, params: Sequence = ()) -> Iterator:
        with self.conn.cursor() as cur:
            yield from cur.execute(POSTGRES.statement(sql), params)

    def _run(self, sql: str, params: Sequence = ()):
        return self.conn.execute(POSTGRES.statement(sql), params)

    def _many(self, sql: str, rows: Sequence[Sequence]) -> None:
        self.conn.cursor().executemany(POSTGRES.statement(sql), rows)

    def _storage_bytes(self) -> tuple[int, int]:
        tables = ["facts", "fingerprints", "fact_tags", "changes", "feedback", "leases", "meta", GEN_TABLE, "fts_terms",
                  "fts_stats", "adapters"]
        return self._scalar("SELECT COALESCE(SUM(pg_total_relation_size(to_regclass(t))), 0) FROM unnest(?::text[]) t",
                            (tables,)), 0

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
            bad_vectors=self._scalar("SELECT COUNT(*) FROM facts WHERE vector IS NOT NULL AND octet_length(vector) "
                                     "NOT IN (%s, %s, %s)", vector_blobs.blob_lengths(dim)),
            fts_rows=self._scalar("SELECT COUNT(*) FROM facts WHERE tsv IS NOT NULL"),
            tags_out_of_sync=self._scalar(
                "SELECT COUNT(*) FROM facts f WHERE (SELECT COUNT(*) FROM fact_tags t WHERE t.fact_id = f.id) != "
                "(SELECT COUNT(*) FROM jsonb_object_keys(evermind_json_object(f.tags)))"),
        )

    # ---- writes (inside a transaction) ---------------------------------------------------------------------
    def insert(self, items: Sequence[NewFact], vectors: np.ndarray | None, fingerprint: str | None,
               owner: str | None = None) -> tuple[list[int], int]:
        has_vec = vectors is not None
        cols: list[list] = [[] for _ in range(11)]  # the columns of _INSERT's `n`, one list each
        tag_cols: list[list] = [[] for _ in range(5)]
        tag_texts: dict[int, str] = {}
        blobs = vector_blobs.encode_many(vectors) if vectors is not None else [None] * len(items)  # (one pass)
        for item, blob in zip(items, blobs):
            fid, text, tags, source, created, updated, expires, pinned, scope, replaces = item
            tj = tag_texts.get(id(tags))
            if tj is None:
                tj = tag_texts[id(tags)] = tags_json(tags) if tags else "{}"
            for col, value in zip(cols, (fid, text, tj, source, when(created), when(updated), blob, when(expires),
                                         int(pinned), scope, replaces)):
                col.append(value)
            for k, v in tags.items():
                for col, part in zip(tag_cols, tag_row(fid, k, v)):
                    col.append(part)
        fp = self._fingerprint_id(fingerprint) if has_vec and fingerprint is not None else None
        head, first = self._one(_INSERT, [*cols, fp, None if has_vec else owner, int(has_vec), *tag_cols])
        self.changed = True
        return list(range(head + 1, head + 1 + len(items))), int(first)

    def set_vectors(self, rows: Sequence[tuple[int, str, int | None]], vectors: np.ndarray, fingerprint: str,
                    now: str) -> list[tuple[int, int | None]]:
        if not len(rows):
            return []
        rids = [int(r) for r, _, _ in rows]
        ids = [fid for _, fid, _ in rows]
        old = [None if label is None else int(label) for _, _, label in rows]
        head = self._scalar(_SET_VECTORS,
                            (rids, ids, old, vector_blobs.encode_many(vectors), self._fingerprint_id(fingerprint),
                                            when(now)))
        self.changed = True
        return [(head + i, label) for i, label in enumerate(old, start=1)]

    # ---- the generation being built (adaptation, rollback) -------------------------------------------------
    def generation_drop(self) -> None:
        self.conn.execute(f"DELETE FROM {GEN_TABLE}")

