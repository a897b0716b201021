"""The SQLite side of a store's queries: one `SQLiteSession` per connection answers backend.Reads and
backend.Writes, the queries both engines share through backend/session.py (SQLite's Dialect: `?`, IN lists in
chunks, text times) and the rest here: FTS5 search and upkeep, inserts, integrity, the generation table's life.

Plain parameterised SQL (R19: never a value in the text). Rows come back as the named tuples of
backend/base.py. Which facts a read sees is a `Selection`, compiled by backend/filter_sql.py into one condition
on `facts f`; other indexed equalities next to it carry a unary plus (`+f.fingerprint_id = ?`, the Dialect's
`hint`) so that SQLite drives from the selection's own index (with no ANALYZE statistics it would otherwise
start from the fingerprint index and probe every fact: 94 ms against 0.09 ms at 50k facts,
benchmarks/filter_speed.py). Full-text matching is planned by store/lexical.py (which FTS5 terms to match, from
the vocabulary's document frequencies) and run here; a whole-store recall is ranked from the query terms' postings,
which a session keeps until the next change (_term_postings), rather than by FTS5 scoring every match.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from ..._lazy import lazy_import
from ..lexical import (
    TermPostings, bm25_scores, bm25_top, choose, document_frequencies, patch_postings, plan, postings_from_instances,
    stem_terms, table_totals, term_counts, text_postings, varint, word_postings,
)
from .. import postings_file
from . import vector_blobs
from .base import FactRow, Integrity, NewFact, Selection
from .codec import tags_json
from .dialect import IN_CHUNK, SQLITE
from .filter_sql import INSERT_TAG_SQL, selection_sql, tag_row
from .session import GEN_TABLE, INSERT_CHANGE, Session, fact_columns

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

FACT_COLS = fact_columns(SQLITE)
_F_COLS = fact_columns(SQLITE, "f")
_INSTANCES = "temp.facts_fts_instances"  # fts5vocab 'instance' table: (term, doc, col, offset) of each posting
TERM_CACHE_MAX = 2_000_000  # postings a session keeps for lexical recall (16 bytes each: 32 MB); least recent out
TERM_CACHE_TERMS = 512  # and terms (a catch-up patches every kept term)
CATCH_UP_MAX = 5_000  # changes the cached postings are brought up to date over; after more, they are read afresh
_INSERT_FACT = (
    "INSERT INTO facts (id, text, tags, source, created_at, updated_at, vector, fingerprint_id, label, seq, "
    "expires_at, pinned, scope, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
def _blob(vector: np.ndarray) -> bytes:
    return vector_blobs.encode(vector)


def _chunks(items: Sequence, size: int = IN_CHUNK) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _tokenised(changed: dict[int, str]) -> tuple[np.ndarray, dict, np.ndarray]:
    """Facts changed (rid -> text now) as FTS5 indexes them: (rids (C,) ascending, term -> (indices into rids (H,),
    occurrences (H,)), token counts (C,))."""
    rids = np.array(sorted(changed), dtype=np.int64)  # (C,)
    return (rids, *text_postings([changed[rid] for rid in rids.tolist()]))


def _patched(p: TermPostings, term: str, delta: tuple[np.ndarray, dict, np.ndarray]) -> TermPostings:
    """A term's postings `p` with the changed facts of `delta` (_tokenised) put in as they are now."""
    rids, by_term, lengths = delta
    idx, tf = by_term.get(term, (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)))
    return patch_postings(p, rids, rids[idx], tf, lengths[idx])


def _fact_rows(rows: Iterable[tuple]) -> list[tuple[FactRow, float]]:
    """(FACT_COLS..., rank) rows -> (FactRow, -rank): FTS5's rank is lower-is-better."""
    return [(FactRow._make(row[:-1]), -float(row[-1])) for row in rows]


class SQLiteSession(Session):
    """Queries over one connection (backend.Reads and backend.Writes: the shared ones in backend/session.py); see
    SQLiteBackend for the transactions."""

    dialect = SQLITE
    _cols, _f_cols = FACT_COLS, _F_COLS
    _encode = staticmethod(_blob)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._sizes: dict[tuple, tuple[int, int, int]] = {}  # selection key -> (change seq, facts, tokens)
        self._last_postings: tuple[tuple, tuple] | None = None  # (words, selection key, seq) -> _postings' answer
        self._last_selected: tuple[tuple, list[TermPostings]] | None = None  # the same for _selected_postings
        self._terms: dict[str, TermPostings] = {}  # term -> its postings over the whole table, as of _terms_seq
        self._terms_seq = -1
        self._terms_size = 0  # postings held in _terms
        self._terms_checked: dict[str, int] = {}  # kept term -> the change seq its count was last checked against FTS5
        self._count_at: tuple[int, int] | None = None  # (change seq, facts): count() as of that seq
        self._file: postings_file.PostingsFile | None = None  # the store's saved postings (postings_file.py)
        self._file_refused: tuple | None = None  # the key of a postings file refused, not opened again
        self._file_delta: tuple | None = None  # ((file key, seq), (rids, by_term, lengths)): the facts changed since
        self._file_forgot: tuple | None = None  # ((file key, seq), whether a fact was forgotten since the file)
        self._file_path: Path | None = None  # where this connection's database keeps its postings file

    # ---- running statements (Session's primitives) ---------------------------------------------------------
    def _all(self, sql: str, params: Sequence = (), *, binary: bool = False) -> list:
        return self.conn.execute(sql, params).fetchall()

    def _one(self, sql: str, params: Sequence = ()) -> tuple | None:
        rows = self.conn.execute(sql, params).fetchall()  # (all of them: a RETURNING statement finishes)
        return rows[0] if rows else None

    def _iter(self, sql: str, params: Sequence = ()) -> Iterable:
        return self.conn.execute(sql, params)

    def _run(self, sql: str, params: Sequence = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def _many(self, sql: str, rows: Sequence[Sequence]) -> None:
        self.conn.executemany(sql, rows)

    def _storage_bytes(self) -> tuple[int, int]:
        page = int(self.conn.execute("PRAGMA page_size").fetchone()[0])
        return (page * int(self.conn.execute("PRAGMA page_count").fetchone()[0]),
                page * int(self.conn.execute("PRAGMA freelist_count").fetchone()[0]))

    def _text_changed(self, row: FactRow, text: str) -> None:
        self.conn.execute("INSERT INTO facts_fts (facts_fts, rowid, text) VALUES ('delete', ?, ?)", (row.rid, row.text))
        self.conn.execute("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", (row.rid, text))

    def _texts_removed(self, rows: Sequence[FactRow]) -> None:
        self.conn.executemany("INSERT INTO facts_fts (facts_fts, rowid, text) VALUES ('delete', ?, ?)",
                              [(row.rid, row.text) for row in rows])

    def _generation_table(self) -> None:
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS {GEN_TABLE} (label INTEGER PRIMARY KEY, "
                          "fingerprint TEXT NOT NULL, vector BLOB NOT NULL)")

    # ---- full-text search ----------------------------------------------------------------------------------
    def lexical(self, words: list[str], limit: int, sel: Selection) -> list[tuple[FactRow, float]]:
        if not words:
            return []
        stems = stem_terms(words)
        # Every word one term: ranked here from the kept postings, in a process that has numpy already. One that
        # has not (a CLI lexical recall: one query, rows only, no numpy import: tests/test_imports.py) keeps
        # FTS5's ranking; for a single query, reading the postings would cost about what FTS5's ranking does.
        if "numpy" in sys.modules and all(len(st) == 1 for st in stems):
            return self._lexical_ranked(words, [st[0] for st in stems], limit, sel)
        if sel.narrows:  # BM25 with the statistics of the selected facts (store/lexical.py)
            return self._lexical_selected(words, limit, sel)
        chosen = plan(self.conn, words, self.count())  # a word FTS5 splits into a phrase: FTS5 ranks it
        if chosen.all_words is not None:  # many postings: the rows holding every word, when there are enough
            hits = self._match(chosen.all_words, limit, sel)
            if len(hits) >= limit:
                return hits
        return [] if chosen.any_word is None else self._match(chosen.any_word, limit, sel)

    def _lexical_ranked(self, words: list[str], terms: list[str], limit: int,
                        sel: Selection) -> list[tuple[FactRow, float]]:
        """FTS5's bm25() ranking of the OR of `terms` (one per word), computed by lexical.bm25_top from the terms'
        postings: the same words kept (lexical.choose), the same scores and order as `ORDER BY rank, rid`, without
        FTS5 scoring every match one row at a time. Whole store: expired facts not swept yet are dropped after the
        ranking, as in _match. A narrowing selection: the postings of the facts it selects, ranked with its own
        statistics (selection_size), as _lexical_selected scores them."""
        if sel.narrows:
            n, tokens = self.selection_size(sel)
            postings, slack = self._selected_postings(terms, sel), 0
        else:
            (n, tokens), postings = self._table_totals(), self._term_postings(terms)
            slack = self._count_expired(sel.now)
        kept, _ = choose(words, [len(p.rids) for p in postings], n)
        if not kept:
            return []
        chosen = set(kept)
        rids, scores = bm25_top([p for w, p in zip(words, postings) if w in chosen], n, tokens, limit + slack)
        rows = self._selected_rows(rids.tolist(), sel)
        return [(rows[rid], score) for rid, score in zip(rids.tolist(), scores.tolist()) if rid in rows][:limit]

    def _catch_up(self, seq: int) -> None:
        """Bring the kept postings from change _terms_seq to `seq`: the facts remembered or updated since are
        tokenised as FTS5 does (lexical.text_postings) and patched in. Forgotten facts are found by the count check
        in _term_postings. A gap in the feed (pruned history), going back, or a long way: read afresh."""
        old, self._terms_seq = self._terms_seq, seq
        if not self._terms:
            return
        changed = self._changed_texts(old, seq, CATCH_UP_MAX)
        if changed is None:
            self._terms, self._terms_size, self._terms_checked = {}, 0, {}
            return
        if not changed:
            return
        delta = _tokenised(changed)
        for term, p in self._terms.items():  # (the kept terms: a few hundred at most)
            patched = _patched(p, term, delta)
            self._terms_size += len(patched.rids) - len(p.rids)
            self._terms[term] = patched

    def _changed_texts(self, old: int, seq: int, most: int) -> dict[int, str] | None:
        """rid -> text now of the facts remembered or updated by changes old+1 .. seq (as FTS5 holds them); None
        when the feed cannot say (a gap: pruned history; going back; more than `most` changes)."""
        if seq < old or seq - old > most:
            return None
        rows = self.conn.execute("SELECT c.op, f.rid, f.text FROM changes c LEFT JOIN facts f ON f.id = c.fact_id "
                                 "WHERE c.seq > ? AND c.seq <= ?", (old, seq)).fetchall()
        if len(rows) != seq - old:
            return None
        return {rid: text for op, rid, text in rows if rid is not None and op != "reembed"}

    def _postings_file(self) -> postings_file.PostingsFile | None:
        """The store's postings file, opened and checked once per version of it (None: none, or refused: another
        store's, another history's, or unreadable)."""
        if self._file_path is None:  # (asked once: a connection's database file does not change)
            name = next((row[2] for row in self.conn.execute("PRAGMA database_list") if row[1] == "main"), "")
            if not name:
                return None
            self._file_path = postings_file.path_for(name)
        path = self._file_path
        try:
            key = postings_file.file_key(os.stat(path))
        except OSError:
            self._file = None
            return None
        if self._file is not None and self._file.key == key:
            return self._file
        self._file, self._file_delta = None, None
        if key == self._file_refused:
            return None
        try:
            found = postings_file.PostingsFile.open(path)
            if found.store_id != (self.meta("store_id") or "") or found.anchor != postings_file.anchor(self.conn,
                                                                                                      found.seq):
                raise postings_file.Rejected("the postings file is of another store or history")
        except (OSError, postings_file.Rejected):
            self._file_refused = key
            return None
        self._file = found
        return found

    def _saved_postings(self, term: str, seq: int) -> TermPostings | None:
        """The term's postings over the whole table from the postings file, patched with the facts changed since
        it was written (postings_file.py); None where it cannot answer: no file, too far behind, the term not in
        it, or a count FTS5's vocabulary disagrees with (a fact forgotten since: FTS5 is read instead)."""
        f = self._postings_file()
        if f is None or term not in f.terms or not 0 <= seq - f.seq <= postings_file.REPLAY_MAX:
            return None
        if self._file_delta is None or self._file_delta[0] != (f.key, seq):
            changed = self._changed_texts(f.seq, seq, postings_file.REPLAY_MAX)
            if changed is None:
                return None
            self._file_delta = ((f.key, seq), _tokenised(changed))
        try:
            saved = f.read(term)
        except (OSError, postings_file.Rejected):
            self._file, self._file_refused = None, f.key
            return None
        if saved is None:
            return None
        patched = _patched(saved, term, self._file_delta[1])
        if self._file_forgets(f, seq) and len(patched.rids) != term_counts(self.conn, [term]).get(term, 0):
            return None  # (FTS5's count costs about what a read from the file does: asked only after a forget)
        return patched

    def _file_forgets(self, f: postings_file.PostingsFile, seq: int) -> bool:
        """Whether a fact was forgotten after the file was written (up to `seq`): then a term's patched postings
        may hold it, and only FTS5's count tells. Without one, the file's postings patched with every remember and
        update since are FTS5's (the anchor ties the file to this history)."""
        key = (f.key, seq)
        if self._file_forgot is None or self._file_forgot[0] != key:
            row = self.conn.execute("SELECT 1 FROM changes WHERE seq > ? AND seq <= ? AND op = 'forget' LIMIT 1",
                                    (f.seq, seq)).fetchone()
            self._file_forgot = (key, row is not None)
        return self._file_forgot[1]

    def _selected_postings(self, terms: list[str], sel: Selection) -> list[TermPostings]:
        """Each term's postings among the facts a narrowing `sel` selects (the whole-store postings, masked by the
        selected rids: those of the selection, or of the matching facts, whichever are fewer)."""
        key = (tuple(terms), (sel.scope, sel.below, repr(sel.where)), self.max_seq())
        if self._last_selected is not None and self._last_selected[0] == key:  # hybrid asks twice: lexical, then df
            return self._last_selected[1]
        whole = self._term_postings(terms)
        matching = np.unique(np.concatenate([p.rids for p in whole]))  # (U,)
        where, params = selection_sql(sel)
        if not len(matching):
            chunks: list[list] = []
        elif self.selection_size(sel)[0] <= len(matching):
            chunks = [self.conn.execute(f"SELECT f.rid FROM facts f WHERE {where}", params).fetchall()]
        else:
            chunks = [self.conn.execute(f"SELECT f.rid FROM facts f WHERE f.rid IN ({','.join('?' * len(chunk))}) "
                                        f"AND {where}", [*chunk, *params]).fetchall()
                      for chunk in _chunks(matching.tolist())]
        keep = np.concatenate([np.zeros(0, dtype=np.int64)] + [np.array(c, dtype=np.int64).reshape(-1)
                                                               for c in chunks])  # (S,) the selected rids
        found = []
        for p in whole:  # one per query term
            mask = np.isin(p.rids, keep)  # (P,)
            found.append(TermPostings(p.rids[mask], p.tf[mask], p.lengths[mask]))
        self._last_selected = (key, found)
        return found

    def _table_totals(self) -> tuple[int, int]:
        """(rows, tokens) of facts_fts, from FTS5's own averages record."""
        row = self.conn.execute("SELECT block FROM facts_fts_data WHERE id = 1").fetchone()
        return table_totals(row[0]) if row is not None and row[0] else (0, 0)

    def _term_postings(self, terms: list[str]) -> list[TermPostings]:
        """Each term's postings over the whole table: read from FTS5's instance vocabulary at first use, then kept
        up to date from the change feed (_catch_up). A kept term whose count FTS5's vocabulary disagrees with (a
        fact that held it was forgotten, or the index was rebuilt) is read again, so what is ranked is what FTS5
        holds."""
        seq = self.max_seq()
        if seq != self._terms_seq:
            self._catch_up(seq)
        wanted = list(dict.fromkeys(terms))
        held = [t for t in wanted if t in self._terms and self._terms_checked.get(t) != seq]  # (checked at this seq:
        if held:  # no fact changed since, so its count still agrees)
            df = term_counts(self.conn, held)
            for term in held:
                if len(self._terms[term].rids) != df.get(term, 0):
                    self._terms_size -= len(self._terms.pop(term).rids)
                else:
                    self._terms_checked[term] = seq
        missing = [t for t in wanted if t not in self._terms]
        if missing:
            self.conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {_INSTANCES} USING fts5vocab(main, facts_fts, "
                              "instance)")
        for term in missing:
            saved = self._saved_postings(term, seq)
            if saved is not None:
                self._terms[term] = saved
            else:
                rows = self.conn.execute(f"SELECT i.doc, d.sz FROM {_INSTANCES} i JOIN facts_fts_docsize d ON "
                                         "d.id = i.doc WHERE i.term = ?", (term,)).fetchall()
                docs, sizes = zip(*rows) if rows else ((), ())
                self._terms[term] = postings_from_instances(docs, sizes)
            self._terms_size += len(self._terms[term].rids)
            self._terms_checked[term] = seq
        for term in wanted:  # the most recently used last
            self._terms[term] = self._terms.pop(term)
        found = [self._terms[t] for t in terms]
        self._evict(len(wanted))
        return found

    def _evict(self, keep: int) -> None:
        """Drop the least recently used terms while more postings or terms are kept than the caps allow, but never
        the `keep` most recent (the query being ranked). Before, the whole cache started afresh at the cap: with a
        million facts, whose common words hold 100,000 postings or more, a long-lived process read them again
        every few questions."""
        while len(self._terms) > keep and (self._terms_size > TERM_CACHE_MAX or len(self._terms) > TERM_CACHE_TERMS):
            oldest = next(iter(self._terms))
            self._terms_size -= len(self._terms.pop(oldest).rids)
            self._terms_checked.pop(oldest, None)

    def _selected_rows(self, rids: list[int], sel: Selection) -> dict[int, FactRow]:
        """rid -> FactRow for those of `rids` that `sel` selects."""
        where, params = selection_sql(sel)
        out: dict[int, FactRow] = {}
        for chunk in _chunks(rids):
            for row in self.conn.execute(f"SELECT {_F_COLS} FROM facts f WHERE f.rid IN ({','.join('?' * len(chunk))}) "
                                         f"AND {where}", [*chunk, *params]):
                fact = FactRow._make(row)
                out[fact.rid] = fact
        return out

    def document_frequencies(self, words: list[str], sel: Selection | None = None) -> list[int]:
        if sel is not None and sel.narrows:
            stems = stem_terms(words)
            if "numpy" in sys.modules and all(len(st) == 1 for st in stems):  # as lexical() ranks it
                return [len(p.rids) for p in self._selected_postings([st[0] for st in stems], sel)]
            return self._postings(words, sel)[0]
        stems = stem_terms(words)
        if self._terms and all(len(st) == 1 and self._terms_checked.get(st[0]) == self._terms_seq
                               and st[0] in self._terms for st in stems) and self.max_seq() == self._terms_seq:
            return [len(self._terms[st[0]].rids) for st in stems]  # (hybrid asks right after ranking the same words)
        return document_frequencies(self.conn, words)

    def count(self, fingerprint: str | None = None) -> int:
        if fingerprint is not None:
            return super().count(fingerprint)
        seq = self.max_seq()  # (every change of the facts table is a change row: the count of one seq is fixed)
        if self._count_at is None or self._count_at[0] != seq:
            self._count_at = (seq, super().count())
        return self._count_at[1]

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
            self.conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {_INSTANCES} USING fts5vocab(main, facts_fts, "
                              "instance)")
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

    # ---- checks --------------------------------------------------------------------------------------------
    def integrity(self, dim: int) -> Integrity:
        conn = self.conn
        return Integrity(
            messages=[r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()],
            foreign_key_violations=len(conn.execute("PRAGMA foreign_key_check").fetchall()),
            bad_vectors=conn.execute("SELECT COUNT(*) FROM facts WHERE vector IS NOT NULL AND length(vector) NOT IN "
                                     "(?, ?, ?)", vector_blobs.blob_lengths(dim)).fetchone()[0],
            fts_rows=conn.execute("SELECT COUNT(*) FROM facts_fts_docsize").fetchone()[0],
            tags_out_of_sync=conn.execute(  # (unreadable tags JSON counts as out of sync, without failing the query)
                "SELECT COUNT(*) FROM facts f WHERE NOT json_valid(f.tags) OR (SELECT COUNT(*) FROM fact_tags t "
                "WHERE t.fact_id = f.id) != (SELECT COUNT(*) FROM json_each(CASE WHEN json_valid(f.tags) THEN f.tags "
                "ELSE '{}' END))"
            ).fetchone()[0],
        )

    # ---- writes (inside a transaction) ---------------------------------------------------------------------
    def insert(self, items: Sequence[NewFact], vectors: np.ndarray | None, fingerprint: str | None,
               owner: str | None = None) -> tuple[list[int], int]:
        conn = self.conn
        base = self.max_seq()
        seqs = list(range(base + 1, base + 1 + len(items)))
        fact_rows: list[tuple] = []
        change_rows: list[tuple] = []
        tag_rows: list[tuple] = []
        tag_texts: dict[int, str] = {}  # one JSON text per tags dict (remember_many shares one among all items)
        has_vec = vectors is not None
        fp = self._fingerprint_id(fingerprint) if has_vec and fingerprint is not None else None
        blobs = vector_blobs.encode_many(vectors) if vectors is not None else [None] * len(items)  # (one pass)
        for seq, item, blob in zip(seqs, items, blobs):
            fid, text, tags, source, created, updated, expires, pinned, scope, replaces = item
            tj = tag_texts.get(id(tags))
            if tj is None:
                tj = tag_texts[id(tags)] = tags_json(tags) if tags else "{}"
            fact_rows.append((fid, text, tj, source, created, updated, blob, fp, seq if has_vec else None, seq,
                              expires, int(pinned), scope, None if has_vec else owner))
            change_rows.append((seq, fid, "remember", updated, text, tj, source, int(has_vec), None, scope, replaces))
            tag_rows.extend(tag_row(fid, k, v) for k, v in tags.items())
        if len(fact_rows) == 1:  # one fact (remember): plain statements, and the FTS row straight from its rid
            rid = conn.execute(_INSERT_FACT, fact_rows[0]).lastrowid
            assert rid is not None  # (an INSERT's cursor has it)
            first = rid
            conn.execute(INSERT_CHANGE, change_rows[0])
            conn.execute("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", (first, fact_rows[0][1]))
        else:
            first = int(conn.execute("SELECT COALESCE(MAX(rid), 0) FROM facts").fetchone()[0]) + 1
            conn.executemany(_INSERT_FACT, fact_rows)
            conn.executemany(INSERT_CHANGE, change_rows)
            conn.execute("INSERT INTO facts_fts (rowid, text) SELECT rid, text FROM facts WHERE rid >= ?", (first,))
        if tag_rows:
            conn.executemany(INSERT_TAG_SQL, tag_rows)
        return seqs, first

    def set_vectors(self, rows: Sequence[tuple[int, str, int | None]], vectors: np.ndarray, fingerprint: str,
                    now: str) -> list[tuple[int, int | None]]:
        seq = self.max_seq()
        fp = self._fingerprint_id(fingerprint)
        scopes: dict[int, str] = {}
        for cond, params in SQLITE.in_list("rid", [rid for rid, _, _ in rows]):
            scopes.update(self._all(f"SELECT rid, scope FROM facts WHERE {cond}", params))
        out, changes = [], []
        for (rid, fid, old_label), blob in zip(rows, vector_blobs.encode_many(vectors)):
            seq += 1
            self.conn.execute("UPDATE facts SET vector = ?, fingerprint_id = ?, label = ?, seq = ?, owner = NULL WHERE "
                              "rid = ?",
                              (blob, fp, seq, seq, rid))
            changes.append((seq, fid, "reembed", now, None, None, None, 1, old_label, scopes.get(rid, ""), None))
            out.append((seq, old_label))
        self.log_changes(changes)
        return out

    # ---- the generation being built (adaptation, rollback) -------------------------------------------------
    def generation_drop(self) -> None:
        self.conn.execute(f"DROP TABLE IF EXISTS {GEN_TABLE}")
