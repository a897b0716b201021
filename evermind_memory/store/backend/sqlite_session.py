"""The SQLite queries of a store: one `SQLiteSession` per connection answers backend.Reads and backend.Writes.

Plain parameterised SQL (R19: never a value in the text); long IN lists go in chunks of _IN_CHUNK. Rows come
back as the named tuples of backend/base.py. Which facts a read sees is a `Selection`, compiled by
backend/filter_sql.py into one condition on `facts f`; other indexed equalities next to it carry a unary plus
(`+f.fingerprint = ?`) so that SQLite drives from the selection's own index (with no ANALYZE statistics it
would otherwise start from the fingerprint index and probe every fact: 94 ms against 0.09 ms at 50k facts,
benchmarks/filter_speed.py). Full-text matching is planned by store/lexical.py (which FTS5 terms to match, from
the vocabulary's document frequencies) and run here.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from typing import Iterable, Iterator, Sequence

from ..._lazy import lazy_import
from ..lexical import bm25_scores, choose, document_frequencies, plan, stem_terms, varint, word_postings
from ..records import Change
from ..timing import time_text
from . import vector_blobs
from .base import ChangeRow, FactRow, GenerationRows, Integrity, LeaseRow, NewFact, Selection, StaleRow, WaitingRow
from .codec import tags_json
from .filter_sql import INSERT_TAG_SQL, SQLITE, scope_condition, selection_sql, tag_row

np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

FACT_COLS = "rid, id, text, tags, source, created_at, updated_at, fingerprint, label, seq, expires_at, pinned, scope"
_F_COLS = ", ".join("f." + c for c in FACT_COLS.split(", "))
GEN_TABLE = "adapt_vectors"  # the vectors of the generation being built, keyed by label (one text version)
_IN_CHUNK = 500
_INSTANCES = "temp.facts_fts_instances"  # fts5vocab 'instance' table: (term, doc, col, offset) of each posting
UNIT_TOLERANCE = vector_blobs.UNIT_TOLERANCE
_INSERT_FACT = (
    "INSERT INTO facts (id, text, tags, source, created_at, updated_at, vector, fingerprint, label, seq, expires_at, "
    "pinned, scope, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_CHANGE = (
    "INSERT INTO changes (seq, fact_id, op, at, text, tags, source, vector_added, label_removed, scope, link) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_GEN_JOIN = (f"SELECT f.label, CASE WHEN g.vector IS NULL THEN f.text END, g.vector FROM facts f LEFT JOIN "
             f"{GEN_TABLE} g ON g.label = f.label AND g.fingerprint = ? WHERE ")


def vectors_from_blobs(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """Row vectors (float16, or float32 from before schema 5) as one (N, dim) float32 matrix."""
    return vector_blobs.decode(blobs, dim)  # (N, D)


def usable_rows(matrix: np.ndarray) -> np.ndarray:
    """(N,) bool: rows of an (N, D) float32 matrix that are stored vectors as the store writes them: finite and of
    unit length (R10; every vector is normalised before it is stored, so a damaged one shows in its norm)."""
    if not len(matrix):
        return np.zeros(0, dtype=bool)
    with np.errstate(over="ignore", invalid="ignore"):
        norms = np.einsum("nd,nd->n", matrix, matrix, dtype=np.float64)  # (N,) squared norms
    return np.isfinite(norms) & (np.abs(norms - 1.0) < UNIT_TOLERANCE)


def _blob(vector: np.ndarray) -> bytes:
    return vector_blobs.encode(vector)


def _stale_sql(include_waiting: bool) -> str:
    """The WHERE condition (one `?`: the current fingerprint) for stale vectors, with or without missing ones."""
    if include_waiting:
        return "(fingerprint IS NOT ? OR vector IS NULL)"
    return "(vector IS NOT NULL AND fingerprint IS NOT ?)"


def _chunks(items: Sequence, size: int = _IN_CHUNK) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _fact_rows(rows: Iterable[tuple]) -> list[tuple[FactRow, float]]:
    """(FACT_COLS..., rank) rows -> (FactRow, -rank): FTS5's rank is lower-is-better."""
    return [(FactRow._make(row[:-1]), -float(row[-1])) for row in rows]


class SQLiteSession:
    """Queries over one connection (backend.Reads and backend.Writes); see SQLiteBackend for the transactions."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._sizes: dict[tuple, tuple[int, int, int]] = {}  # selection key -> (change seq, facts, tokens)
        self._last_postings: tuple[tuple, tuple] | None = None  # (words, selection key, seq) -> _postings' answer

    # ---- meta ----------------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                          (key, value))

    def delete_meta(self, *keys: str) -> None:
        self.conn.execute(f"DELETE FROM meta WHERE key IN ({','.join('?' * len(keys))})", keys)

    # ---- leases --------------------------------------------------------------------------------------------
    def lease(self, name: str) -> LeaseRow | None:
        row = self.conn.execute("SELECT owner, expires FROM leases WHERE name = ?", (name,)).fetchone()
        return None if row is None else LeaseRow(row[0], float(row[1]))

    def set_lease(self, name: str, owner: str, expires: float) -> None:
        self.conn.execute("INSERT INTO leases (name, owner, expires) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE "
                          "SET owner = excluded.owner, expires = excluded.expires", (name, owner, expires))

    def drop_lease(self, name: str, owner: str) -> None:
        self.conn.execute("DELETE FROM leases WHERE name = ? AND owner = ?", (name, owner))

    # ---- the change feed -----------------------------------------------------------------------------------
    def max_seq(self) -> int:
        return int(self.conn.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0])

    def changes_after(self, seq: int, upto: int) -> list[ChangeRow]:
        return [ChangeRow(s, bool(added), removed) for s, added, removed in self.conn.execute(
            "SELECT seq, vector_added, label_removed FROM changes WHERE seq > ? AND seq <= ? ORDER BY seq", (seq, upto))]

    def remembered_since(self, seq: int) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM changes WHERE seq > ? AND op = 'remember'", (seq,)).fetchone()[0])

    def history(self, fact_id: str, scope: str) -> list[Change]:
        # The arrival of a first vector (a 'reembed' that removed no label: background embedding of a remembered
        # fact) is part of remembering it, so a history reads the same whether it was embedded before or after.
        params: list = [fact_id]
        in_scope = scope_condition("scope", scope, True, SQLITE, params)
        rows = self.conn.execute(
            "SELECT seq, op, at, text, tags, source, link FROM changes WHERE fact_id = ? "
            f"AND NOT (op = 'reembed' AND label_removed IS NULL){' AND ' + in_scope if in_scope else ''} ORDER BY seq",
            params,
        ).fetchall()
        return [Change(seq=r[0], op=r[1], at=datetime.fromisoformat(r[2]), text=r[3], tags=None if r[4] is None else json.loads(r[4]),
                       source=r[5], replaces=r[6] if r[1] == "remember" else None,
                       replaced_by=r[6] if r[1] == "forget" else None) for r in rows]

    # ---- facts ---------------------------------------------------------------------------------------------
    def count(self, fingerprint: str | None = None) -> int:
        if fingerprint is None:
            return int(self.conn.execute("SELECT COUNT(*) FROM facts").fetchone()[0])
        return int(self.conn.execute("SELECT COUNT(*) FROM facts WHERE fingerprint = ?", (fingerprint,)).fetchone()[0])

    def fetch(self, fact_id: str) -> FactRow | None:
        row = self.conn.execute(f"SELECT {FACT_COLS} FROM facts WHERE id = ?", (fact_id,)).fetchone()
        return None if row is None else FactRow._make(row)

    def fetch_where(self, column: str, values: Sequence) -> dict:
        if column not in ("rid", "id", "label"):
            raise ValueError(f"fetch_where() expected rid, id or label, got {column!r}")
        out: dict = {}
        for chunk in _chunks(list(values)):
            marks = ",".join("?" * len(chunk))
            for row in self.conn.execute(f"SELECT {FACT_COLS} FROM facts WHERE {column} IN ({marks})", list(chunk)):
                fact = FactRow._make(row)
                out[getattr(fact, column)] = fact
        return out

    def list_rows(self, limit: int, offset: int, sel: Selection) -> list[FactRow]:
        where, params = selection_sql(sel)
        sql = f"SELECT {_F_COLS} FROM facts f WHERE {where} ORDER BY f.rid LIMIT ? OFFSET ?"
        return [FactRow._make(r) for r in self.conn.execute(sql, [*params, limit, offset])]

    def count_selected(self, sel: Selection, fingerprint: str | None = None) -> int:
        where, params = selection_sql(sel)
        if fingerprint is None:
            return int(self.conn.execute(f"SELECT COUNT(*) FROM facts f WHERE {where}", params).fetchone()[0])
        return int(self.conn.execute(f"SELECT COUNT(*) FROM facts f WHERE +f.fingerprint = ? AND {where}",
                                     [fingerprint, *params]).fetchone()[0])

    def expired_rows(self, now: datetime, scope: str, limit: int) -> list[FactRow]:
        params: list = [time_text(now)]
        in_scope = scope_condition("f.scope", scope, True, SQLITE, params)
        sql = (f"SELECT {_F_COLS} FROM facts f WHERE f.expires_at <= ?{' AND ' + in_scope if in_scope else ''} "
               "ORDER BY f.expires_at, f.rid LIMIT ?")
        return [FactRow._make(r) for r in self.conn.execute(sql, [*params, limit])]

    def recent_selected(self, sel: Selection, seq: int) -> list[FactRow]:
        # Driven from the few recent changes and waiting facts (the change feed's key, the waiting index), then
        # filtered: never a scan of the scope's facts.
        where, params = selection_sql(sel)
        return [FactRow._make(r) for r in self.conn.execute(
            f"SELECT {_F_COLS} FROM (SELECT fact_id AS id FROM changes WHERE seq > ? UNION "
            f"SELECT id FROM facts WHERE vector IS NULL) r CROSS JOIN facts f ON f.id = r.id WHERE {where} ORDER BY f.rid",
            [seq, *params])]

    def _count_expired(self, now: datetime) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM facts WHERE expires_at <= ?", (time_text(now),)).fetchone()[0])

    def sizes(self) -> dict:
        conn = self.conn
        now = datetime.now(timezone.utc)
        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
        return {
            "facts": self.count(), "expired": self._count_expired(now),
            "pinned": int(conn.execute("SELECT COUNT(*) FROM facts WHERE pinned = 1").fetchone()[0]),
            "changes": int(conn.execute("SELECT COUNT(*) FROM changes").fetchone()[0]),
            "forgotten": int(conn.execute(
                "SELECT COUNT(DISTINCT c.fact_id) FROM changes c WHERE NOT EXISTS (SELECT 1 FROM facts f WHERE f.id = c.fact_id)"
            ).fetchone()[0]),
            "page_bytes": page * int(conn.execute("PRAGMA page_count").fetchone()[0]),
            "free_bytes": page * int(conn.execute("PRAGMA freelist_count").fetchone()[0]),
        }

    def export_rows(self) -> Iterator[FactRow]:
        for row in self.conn.execute(f"SELECT {FACT_COLS} FROM facts ORDER BY rid"):
            yield FactRow._make(row)

    # ---- vectors -------------------------------------------------------------------------------------------
    def vectors(self, fingerprint: str, dim: int, *, labels: Sequence[int] | None = None,
                sel: Selection | None = None) -> tuple[np.ndarray, np.ndarray]:
        out_labels: list[int] = []
        blobs: list[bytes] = []
        if labels is not None:
            for chunk in _chunks(list(labels)):
                marks = ",".join("?" * len(chunk))
                for label, blob in self.conn.execute(
                    f"SELECT label, vector FROM facts WHERE fingerprint = ? AND label IN ({marks})", [fingerprint, *chunk]
                ):
                    out_labels.append(label)
                    blobs.append(blob)
        else:
            if sel is None:  # every vector (the index holds expired facts too, until they are swept)
                sql, params = "SELECT f.label, f.vector FROM facts f WHERE f.fingerprint = ? ORDER BY f.label", [fingerprint]
            else:
                where, params = selection_sql(sel)
                sql = f"SELECT f.label, f.vector FROM facts f WHERE +f.fingerprint = ? AND {where} ORDER BY f.label"
                params = [fingerprint, *params]
            for label, blob in self.conn.execute(sql, params):
                out_labels.append(label)
                blobs.append(blob)
        good = [i for i, b in enumerate(blobs) if isinstance(b, bytes) and vector_blobs.readable(b, dim)]
        if len(good) != len(blobs):
            out_labels = [out_labels[i] for i in good]
            blobs = [blobs[i] for i in good]
        labels_arr, matrix = np.array(out_labels, dtype=np.int64), vectors_from_blobs(blobs, dim)  # (N,), (N, D)
        usable = usable_rows(matrix)  # (N,) a damaged vector (NaN, Inf, zero) is left out like a short one
        if not usable.all():
            return labels_arr[usable], matrix[usable]
        return labels_arr, matrix

    def labels(self, fingerprint: str | None) -> set[int]:
        if fingerprint is None:
            return {r[0] for r in self.conn.execute("SELECT label FROM facts WHERE label IS NOT NULL")}
        return {r[0] for r in self.conn.execute("SELECT label FROM facts WHERE fingerprint = ?", (fingerprint,))}

    def selected_labels(self, sel: Selection, fingerprint: str) -> np.ndarray:
        where, params = selection_sql(sel)
        rows = self.conn.execute(f"SELECT f.label FROM facts f WHERE +f.fingerprint = ? AND {where}", [fingerprint, *params])
        return np.array([r[0] for r in rows], dtype=np.int64)  # (N,)

    def expired_labels(self, fingerprint: str, now: datetime) -> set[int]:
        return {r[0] for r in self.conn.execute("SELECT label FROM facts WHERE expires_at <= ? AND +fingerprint = ?",
                                                (time_text(now), fingerprint))}

    def memory_texts(self, fingerprint: str, dim: int) -> tuple[np.ndarray, list[str]]:
        rows = self.conn.execute(
            "SELECT label, text FROM facts WHERE fingerprint = ? AND label IS NOT NULL AND vector IS NOT NULL "
            "AND length(vector) IN (?, ?) ORDER BY label", (fingerprint, *vector_blobs.blob_lengths(dim)),
        ).fetchall()
        return np.array([r[0] for r in rows], dtype=np.int64), [r[1] for r in rows]  # (N,), N texts

    def stale(self, fingerprint: str | None, limit: int, *, after_rid: int = 0,
              include_waiting: bool = True) -> list[StaleRow]:
        if fingerprint is None:
            rows = self.conn.execute("SELECT rid, id, text, label FROM facts WHERE rid > ? ORDER BY rid LIMIT ?",
                                     (after_rid, limit))
        else:
            rows = self.conn.execute(
                f"SELECT rid, id, text, label FROM facts WHERE {_stale_sql(include_waiting)} AND rid > ? "
                "ORDER BY rid LIMIT ?", (fingerprint, after_rid, limit),
            )
        return [StaleRow._make(r) for r in rows]

    def count_stale(self, fingerprint: str, include_waiting: bool = True) -> int:
        return int(self.conn.execute(f"SELECT COUNT(*) FROM facts WHERE {_stale_sql(include_waiting)}",
                                     (fingerprint,)).fetchone()[0])

    def count_foreign(self, fingerprint: str) -> int:
        return int(self.conn.execute(
            "SELECT COUNT(*) FROM facts WHERE vector IS NOT NULL AND fingerprint IS NOT ?", (fingerprint,)
        ).fetchone()[0])

    def waiting(self) -> list[WaitingRow]:
        return [WaitingRow._make(r) for r in
                self.conn.execute("SELECT rid, id, text FROM facts WHERE vector IS NULL ORDER BY rid")]

    def waiting_owners(self) -> dict[str | None, int]:
        return dict(self.conn.execute("SELECT owner, COUNT(*) FROM facts WHERE vector IS NULL GROUP BY owner").fetchall())

    def adopt_waiting(self, old_owner: str | None, new_owner: str) -> list[WaitingRow]:
        rows = self.conn.execute(
            "UPDATE facts SET owner = ? WHERE vector IS NULL AND owner IS ? RETURNING rid, id, text", (new_owner, old_owner)
        ).fetchall()
        return sorted(WaitingRow._make(r) for r in rows)

    def still_waiting(self, rids: Sequence[int]) -> dict[int, str]:
        out: dict[int, str] = {}
        for chunk in _chunks(list(rids)):
            marks = ",".join("?" * len(chunk))
            out.update(self.conn.execute(f"SELECT rid, text FROM facts WHERE vector IS NULL AND rid IN ({marks})", chunk))
        return out

    def count_waiting(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM facts WHERE vector IS NULL").fetchone()[0])

    # ---- full-text search ----------------------------------------------------------------------------------
    def lexical(self, words: list[str], limit: int, sel: Selection) -> list[tuple[FactRow, float]]:
        if not words:
            return []
        if sel.narrows:  # BM25 with the statistics of the selected facts (store/lexical.py)
            return self._lexical_selected(words, limit, sel)
        chosen = plan(self.conn, words, self.count())
        if chosen.all_words is not None:  # many postings: the rows holding every word, when there are enough
            hits = self._match(chosen.all_words, limit, sel)
            if len(hits) >= limit:
                return hits
        return [] if chosen.any_word is None else self._match(chosen.any_word, limit, sel)

    def document_frequencies(self, words: list[str], sel: Selection | None = None) -> list[int]:
        if sel is not None and sel.narrows:
            return self._postings(words, sel)[0]
        return document_frequencies(self.conn, words)

    def _postings(self, words: list[str], sel: Selection) -> tuple[list[int], dict[int, list[int]]]:
        """(per word, how many selected facts hold it; rid -> per word, its count in that fact), over the facts
        `sel` selects that hold any of `words`: read from FTS5's instance vocabulary, not from the texts."""
        key = (tuple(words), (sel.scope, sel.below, repr(sel.where)), self.max_seq())
        if self._last_postings is not None and self._last_postings[0] == key:  # hybrid asks twice: lexical, then df
            return self._last_postings[1]
        stems = stem_terms(words)
        terms = sorted({t for st in stems for t in st})
        term_tf: dict[int, dict[str, int]] = {}
        if terms:
            self.conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {_INSTANCES} USING fts5vocab(main, facts_fts, instance)")
            where, params = selection_sql(sel)
            sql = (f"SELECT i.doc, i.term, COUNT(*) FROM {_INSTANCES} i JOIN facts f ON f.rid = i.doc "
                   f"WHERE i.term IN ({','.join('?' * len(terms))}) AND {where} GROUP BY i.doc, i.term")
            for rid, term, n in self.conn.execute(sql, [*terms, *params]):
                term_tf.setdefault(rid, {})[term] = n
        found = word_postings(stems, term_tf)
        self._last_postings = (key, found)
        return found

    def selection_size(self, sel: Selection) -> tuple[int, int]:
        """(facts, tokens) that `sel` selects, kept per selection until the next change. (A fact that expires
        between two changes still counts until the sweeper removes it: its one change then refreshes this.)"""
        key = (sel.scope, sel.below, repr(sel.where))
        seq = self.max_seq()
        hit = self._sizes.get(key)
        if hit is not None and hit[0] == seq:
            return hit[1], hit[2]
        where, params = selection_sql(sel)
        n = tokens = 0
        for (size,) in self.conn.execute(f"SELECT d.sz FROM facts f JOIN facts_fts_docsize d ON d.id = f.rid "
                                         f"WHERE {where}", params):
            n += 1
            tokens += varint(size)
        if len(self._sizes) >= 256:
            self._sizes.clear()
        self._sizes[key] = (seq, n, tokens)
        return n, tokens

    def _lexical_selected(self, words: list[str], limit: int, sel: Selection) -> list[tuple[FactRow, float]]:
        df, tf = self._postings(words, sel)
        n, tokens = self.selection_size(sel)
        kept, _ = choose(words, df, n)
        if not kept:
            return []
        chosen = set(kept)
        keep = [i for i, w in enumerate(words) if w in chosen]
        lengths: dict[int, int] = {}
        for chunk in _chunks(list(tf)):
            lengths.update((rid, varint(size)) for rid, size in self.conn.execute(
                f"SELECT id, sz FROM facts_fts_docsize WHERE id IN ({','.join('?' * len(chunk))})", list(chunk)))
        scores = bm25_scores(tf, lengths, df, keep, n, tokens)
        best = sorted(scores, key=lambda rid: (-scores[rid], rid))[:limit]
        rows = self.fetch_where("rid", best)
        return [(rows[rid], scores[rid]) for rid in best if rid in rows]

    def _match(self, match: str, limit: int, sel: Selection) -> list[tuple[FactRow, float]]:
        """FTS5 BM25 search: [(row, score)] with score = -bm25 (higher is better), best first."""
        where, params = selection_sql(sel)
        if not sel.narrows:  # let FTS5 sort by rank (bm25) itself and join only the top rows
            # Expired facts not swept yet are dropped after the ranking: ask FTS5 for that many more rows.
            slack = self._count_expired(sel.now)
            sql = (
                f"SELECT {_F_COLS}, r.rank FROM (SELECT rowid, rank FROM facts_fts WHERE facts_fts MATCH ? "
                f"ORDER BY rank LIMIT ?) r JOIN facts f ON f.rid = r.rowid WHERE {where} ORDER BY r.rank, f.rid LIMIT ?"
            )
            return _fact_rows(self.conn.execute(sql, [match, limit + slack, *params, limit]))
        sql = (
            f"SELECT {_F_COLS}, bm25(facts_fts) AS b FROM facts_fts "
            f"JOIN facts f ON f.rid = facts_fts.rowid WHERE facts_fts MATCH ? AND {where} ORDER BY b, f.rid LIMIT ?"
        )
        return _fact_rows(self.conn.execute(sql, [match, *params, limit]))

    # ---- feedback ------------------------------------------------------------------------------------------
    def add_feedback(self, at: str, query: str, fact_id: str, useful: bool, limit: int) -> None:
        cur = self.conn.execute("INSERT INTO feedback (at, query, fact_id, useful) VALUES (?, ?, ?, ?)",
                                (at, query, fact_id, int(useful)))
        self.conn.execute("DELETE FROM feedback WHERE id <= ?", (cur.lastrowid - limit,))

    def feedback_pairs(self, fingerprint: str) -> list[tuple[str, int]]:
        return self.conn.execute(
            "SELECT f.query, facts.label FROM feedback f JOIN facts ON facts.id = f.fact_id "
            "WHERE facts.fingerprint = ? AND facts.label IS NOT NULL AND f.id = "
            "(SELECT MAX(g.id) FROM feedback g WHERE g.query = f.query AND g.fact_id = f.fact_id) AND f.useful = 1 "
            "ORDER BY f.id",
            (fingerprint,),
        ).fetchall()

    def count_feedback(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0])

    # ---- checks --------------------------------------------------------------------------------------------
    def integrity(self, dim: int) -> Integrity:
        conn = self.conn
        return Integrity(
            messages=[r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()],
            foreign_key_violations=len(conn.execute("PRAGMA foreign_key_check").fetchall()),
            bad_vectors=conn.execute("SELECT COUNT(*) FROM facts WHERE vector IS NOT NULL AND length(vector) NOT IN "
                                     "(?, ?)", vector_blobs.blob_lengths(dim)).fetchone()[0],
            fts_rows=conn.execute("SELECT COUNT(*) FROM facts_fts_docsize").fetchone()[0],
            tags_out_of_sync=conn.execute(  # (unreadable tags JSON counts as out of sync, without failing the query)
                "SELECT COUNT(*) FROM facts f WHERE NOT json_valid(f.tags) OR (SELECT COUNT(*) FROM fact_tags t "
                "WHERE t.fact_id = f.id) != (SELECT COUNT(*) FROM json_each(CASE WHEN json_valid(f.tags) THEN f.tags "
                "ELSE '{}' END))"
            ).fetchone()[0],
        )

    # ---- writes (inside a transaction) ---------------------------------------------------------------------
    def _log(self, seq: int, fact_id: str, op: str, at: str, text: str | None, tags: str | None, source: str | None,
             vector_added: bool, label_removed: int | None, scope: str, link: str | None = None) -> None:
        self.conn.execute(_INSERT_CHANGE, (seq, fact_id, op, at, text, tags, source, int(vector_added), label_removed,
                                           scope, link))

    def insert(self, items: Sequence[NewFact], vectors: np.ndarray | None, fingerprint: str | None,
               owner: str | None = None) -> tuple[list[int], int]:
        conn = self.conn
        base = self.max_seq()
        seqs = list(range(base + 1, base + 1 + len(items)))
        fact_rows, change_rows, tag_rows = [], [], []
        tag_texts: dict[int, str] = {}  # one JSON text per tags dict (remember_many shares one among all items)
        has_vec = vectors is not None
        for i, (seq, item) in enumerate(zip(seqs, items)):
            fid, text, tags, source, created, updated, expires, pinned, scope, replaces = item
            tj = tag_texts.get(id(tags))
            if tj is None:
                tj = tag_texts[id(tags)] = tags_json(tags) if tags else "{}"
            blob = _blob(vectors[i]) if has_vec else None
            fact_rows.append((fid, text, tj, source, created, updated, blob, fingerprint, seq if has_vec else None, seq,
                              expires, int(pinned), scope, None if has_vec else owner))
            change_rows.append((seq, fid, "remember", updated, text, tj, source, int(has_vec), None, scope, replaces))
            tag_rows.extend(tag_row(fid, k, v) for k, v in tags.items())
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
            conn.executemany(INSERT_TAG_SQL, tag_rows)
        return seqs, first

    def update(self, row: FactRow, *, text: str, tags: dict, source: str | None, vector: np.ndarray | None,
               fingerprint: str | None, now: str, expires_at: str | None, pinned: bool) -> tuple[int, int | None]:
        conn = self.conn
        seq = self.max_seq() + 1
        tj = tags_json(tags)
        if vector is not None:
            conn.execute(
                "UPDATE facts SET text = ?, tags = ?, source = ?, updated_at = ?, vector = ?, fingerprint = ?, "
                "label = ?, seq = ?, expires_at = ?, pinned = ? WHERE rid = ?",
                (text, tj, source, now, _blob(vector), fingerprint, seq, seq, expires_at, int(pinned), row.rid),
            )
        else:
            conn.execute("UPDATE facts SET text = ?, tags = ?, source = ?, updated_at = ?, seq = ?, expires_at = ?, "
                         "pinned = ? WHERE rid = ?", (text, tj, source, now, seq, expires_at, int(pinned), row.rid))
        if text != row.text:
            conn.execute("INSERT INTO facts_fts (facts_fts, rowid, text) VALUES ('delete', ?, ?)", (row.rid, row.text))
            conn.execute("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", (row.rid, text))
        conn.execute("DELETE FROM fact_tags WHERE fact_id = ?", (row.id,))
        conn.executemany(INSERT_TAG_SQL, [tag_row(row.id, k, v) for k, v in tags.items()])
        removed = row.label if vector is not None else None
        self._log(seq, row.id, "update", now, text, tj, source, vector is not None, removed, row.scope)
        return seq, removed

    def delete(self, rows: Sequence[FactRow], now: str, replaced_by: str | None = None) -> list[int]:
        conn = self.conn
        removed: list[int] = []
        seq = self.max_seq()
        for row in rows:
            seq += 1
            conn.execute("DELETE FROM fact_tags WHERE fact_id = ?", (row.id,))
            conn.execute("DELETE FROM feedback WHERE fact_id = ?", (row.id,))  # a forgotten fact leaves no trace there
            conn.execute("INSERT INTO facts_fts (facts_fts, rowid, text) VALUES ('delete', ?, ?)", (row.rid, row.text))
            conn.execute("DELETE FROM facts WHERE rid = ?", (row.rid,))
            self._log(seq, row.id, "forget", now, None, None, None, False, row.label, row.scope, replaced_by)
            if row.label is not None:
                removed.append(row.label)
        return removed

    def set_vectors(self, rows: Sequence[tuple[int, str, int | None]], vectors: np.ndarray, fingerprint: str,
                    now: str) -> list[tuple[int, int | None]]:
        seq = self.max_seq()
        scopes: dict[int, str] = {}
        for chunk in _chunks([rid for rid, _, _ in rows]):
            scopes.update(self.conn.execute(f"SELECT rid, scope FROM facts WHERE rid IN ({','.join('?' * len(chunk))})",
                                            list(chunk)))
        out = []
        for (rid, fid, old_label), vec in zip(rows, vectors):
            seq += 1
            self.conn.execute("UPDATE facts SET vector = ?, fingerprint = ?, label = ?, seq = ?, owner = NULL WHERE rid = ?",
                              (_blob(vec), fingerprint, seq, seq, rid))
            self._log(seq, fid, "reembed", now, None, None, None, True, old_label, scopes.get(rid, ""))
            out.append((seq, old_label))
        return out

    def prune_history(self, before: str, upto: int) -> int:
        # Every change of a fact up to (and with) a forget older than `before`: the history of an incarnation
        # that ended long ago. The newest change row is never deleted (upto: the current max seq), so max_seq()
        # and the labels it hands out keep growing.
        conn = self.conn
        doomed = (
            "SELECT c.seq FROM changes c JOIN (SELECT fact_id, MAX(seq) AS last FROM changes "
            "WHERE op = 'forget' AND at < ? AND seq < ? GROUP BY fact_id) g ON c.fact_id = g.fact_id AND c.seq <= g.last"
        )
        top = conn.execute(f"SELECT MAX(seq) FROM ({doomed})", (before, upto)).fetchone()[0]
        if top is None:
            return 0
        cur = conn.execute(f"DELETE FROM changes WHERE seq IN ({doomed})", (before, upto))
        self.set_meta("history_pruned", str(max(int(top), int(self.meta("history_pruned") or 0))))
        return cur.rowcount

    # ---- the generation being built (adaptation, rollback) -------------------------------------------------
    def generation_begin(self, fingerprint: str, labels: np.ndarray | None, vectors: np.ndarray | None) -> None:
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS {GEN_TABLE} (label INTEGER PRIMARY KEY, "
                          "fingerprint TEXT NOT NULL, vector BLOB NOT NULL)")
        self.conn.execute(f"DELETE FROM {GEN_TABLE} WHERE fingerprint != ?", (fingerprint,))
        if labels is not None:
            self.generation_store(fingerprint, labels.tolist(), vectors)

    def generation_store(self, fingerprint: str, labels: Sequence[int], vectors: np.ndarray) -> None:
        self.conn.executemany(f"INSERT OR REPLACE INTO {GEN_TABLE} (label, fingerprint, vector) VALUES (?, ?, ?)",
                              [(int(lab), fingerprint, _blob(v)) for lab, v in zip(labels, vectors)])

    def generation_missing(self, fingerprint: str, after: int, limit: int) -> list[tuple[int, str]]:
        return self.conn.execute(
            f"SELECT f.label, f.text FROM facts f WHERE f.label > ? AND NOT EXISTS (SELECT 1 FROM "
            f"{GEN_TABLE} g WHERE g.label = f.label AND g.fingerprint = ?) ORDER BY f.label LIMIT ?",
            (after, fingerprint, limit),
        ).fetchall()

    def generation_rows(self, fingerprint: str, dim: int, labels: Sequence[int] | None = None) -> GenerationRows:
        if labels is None:
            rows = self.conn.execute(_GEN_JOIN + "f.label IS NOT NULL ORDER BY f.label", (fingerprint,)).fetchall()
        else:
            rows = []
            for chunk in _chunks(list(labels)):
                rows += self.conn.execute(_GEN_JOIN + f"f.label IN ({','.join('?' * len(chunk))})",
                                          [fingerprint, *chunk]).fetchall()
        out = np.array([r[0] for r in rows], dtype=np.int64)  # (N,)
        vectors = np.zeros((len(rows), dim), dtype=np.float32)  # (N, D)
        have = [i for i, r in enumerate(rows) if isinstance(r[2], bytes) and vector_blobs.readable(r[2], dim)]
        if have:
            got = vectors_from_blobs([rows[i][2] for i in have], dim)  # (H, D)
            usable = usable_rows(got)  # (H,) a damaged one is made again, like a missing one
            have = [i for i, ok in zip(have, usable.tolist()) if ok]
            vectors[have] = got[usable]
        have_set = set(have)
        return GenerationRows(out, vectors, [(i, rows[i][1]) for i in range(len(rows)) if i not in have_set])

    def generation_count_missing(self, fingerprint: str) -> int:
        return int(self.conn.execute(
            f"SELECT COUNT(*) FROM facts f WHERE f.label IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "
            f"{GEN_TABLE} g WHERE g.label = f.label AND g.fingerprint = ?)", (fingerprint,),
        ).fetchone()[0])

    def generation_adopt(self, fingerprint: str) -> None:
        self.conn.execute(
            f"UPDATE facts SET vector = (SELECT g.vector FROM {GEN_TABLE} g WHERE g.label = facts.label "
            "AND g.fingerprint = ?1), fingerprint = ?1", (fingerprint,),
        )

    def generation_drop(self) -> None:
        self.conn.execute(f"DROP TABLE IF EXISTS {GEN_TABLE}")
