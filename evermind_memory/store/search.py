"""Recall's three ways to find facts: lexical (FTS5 BM25), vector (HNSW, or exact when a selection is small or
the index cannot answer) and hybrid (both, fused by store/fusion.py), each among the facts a `Selection`
selects (scope, alive now, where-filter), plus the opt-in recency weight. Everything here reads one
generation, passed in by the caller, who holds it for the whole recall.

Vector recall is exact under any selection: a selection of at most EXACT_FILTER_MAX facts (or under a tenth of
the index) is searched exhaustively; a larger one through hnswlib's filtered search, whose graph walk skips the
facts the selection leaves out (so none of the k slots goes to them); if that cannot fill k, exhaustively.
Without a selection, facts that expired but were not swept yet are skipped the same way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable

import numpy as np

from .._blas import single_blas
from .backend import Backend, FactRow, Selection
from .fusion import fuse_rrf, fuse_scores
from .index import SearchFailed, VectorIndex, exact_search
from .lexical import MAX_TERMS, phrase_query, query_words
from .timing import apply_recency
from .validate import K_MAX
from .vectors import Generation

DEFAULT_HYBRID_WEIGHT = 2.0  # the vector side's weight in hybrid recall for an embedder that names none
EXACT_FILTER_MAX = 4096  # a selection of at most this many facts is searched exactly (R9)

Hit = tuple[FactRow, float]


def fts_match(query: str, max_terms: int = MAX_TERMS) -> str | None:
    """Turn free text into a safe FTS5 query: each word quoted, OR-joined (None when no words). Recall itself
    matches fewer words on large stores: see store/lexical.py."""
    return phrase_query(query_words(query, max_terms))


def hybrid_weight(embedder: Any) -> float:
    """The embedder's own `hybrid_weight` when it is a finite number, else DEFAULT_HYBRID_WEIGHT."""
    weight = getattr(embedder, "hybrid_weight", DEFAULT_HYBRID_WEIGHT)
    return float(weight) if isinstance(weight, (int, float)) and np.isfinite(weight) else DEFAULT_HYBRID_WEIGHT


class Search:
    """Recall's searches over one store.

    Args:
        db: the backend.
        dim: vector length.
    """

    def __init__(self, db: Backend, dim: int) -> None:
        self._db = db
        self._dim = dim

    @single_blas
    def run(self, gen: Generation, query: str, qv: np.ndarray | None, k: int, sel: Selection, mode: str,
            fusion: str, weight: float) -> list[Hit]:
        """(row, score) best first, at most k (validated arguments; qv (D,) is None for lexical mode)."""
        if mode == "lexical":
            return self.lexical(query, k, sel)
        if mode == "vector":
            return self.rows_for(self.vector(gen, qv, k, sel))
        return self.hybrid(gen, query, qv, k, sel, fusion, weight)

    def lexical(self, query: str, k: int, sel: Selection) -> list[Hit]:
        """FTS5 BM25 over the words of `query` (see store/lexical.py for which words are matched)."""
        words = query_words(query)
        if not words:
            return []
        with self._db.reading() as r:
            return r.lexical(words, k, sel)

    def vector(self, gen: Generation, qv: np.ndarray, k: int, sel: Selection) -> list[tuple[int, float]]:
        """(label, cosine) best first among the facts `sel` selects: exactly, or by filtered HNSW (see above)."""
        index, fp, dim = gen.index, gen.fingerprint, self._dim
        if sel.narrows:
            with self._db.reading() as r:
                matching = r.count_selected(sel, fp)
                if matching == 0:
                    return []
                if matching <= EXACT_FILTER_MAX or matching * 10 <= index.live_count:
                    return self._exact(r, gen, qv, k, sel)
                allowed = set(r.selected_labels(sel, fp).tolist())
            hits = _query(index, qv, min(k, len(allowed)), allowed.__contains__)
        else:
            with self._db.reading() as r:
                expired = r.expired_labels(fp, sel.now)  # usually none: then a plain search
            live = index.live_count - sum(1 for label in expired if label in index)
            hits = _query(index, qv, min(k, live), (lambda label: label not in expired) if expired else None)
        if hits is not None:
            return hits
        with self._db.reading() as r:  # the index could not fill k (a failed search, or it lags): exactly
            return self._exact(r, gen, qv, k, sel)

    def _exact(self, r: Any, gen: Generation, qv: np.ndarray, k: int, sel: Selection) -> list[tuple[int, float]]:
        labels, vecs = r.vectors(gen.fingerprint, self._dim, sel=sel)
        return list(zip(*[a.tolist() for a in exact_search(vecs, labels, qv, k)]))

    def rows_for(self, hits: list[tuple[int, float]]) -> list[Hit]:
        """The fact rows of (label, score) hits, in order (a label forgotten meanwhile is dropped)."""
        if not hits:
            return []
        with self._db.reading() as r:
            rows = r.fetch_where("label", [label for label, _ in hits])
        return [(rows[label], score) for label, score in hits if label in rows]

    def hybrid(self, gen: Generation, query: str, qv: np.ndarray, k: int, sel: Selection, fusion: str,
               weight: float) -> list[Hit]:
        """Lexical and vector candidates (a pool of max(50, 4k)) fused by `fusion` ("score" or "rrf")."""
        pool = candidate_pool(k)
        vec = self.rows_for(self.vector(gen, qv, pool, sel))
        lex = self.lexical(query, pool, sel)
        rows = {row.rid: row for row, _ in vec}
        rows.update({row.rid: row for row, _ in lex})
        lexical = {row.rid: s for row, s in lex}
        cos = {row.rid: s for row, s in vec}
        missing = [row.label for row, _ in lex if row.rid not in cos and row.label is not None]
        if missing:  # lexical candidates the vector pool missed: their cosine, exactly
            with self._db.reading() as r:
                labels, vecs = r.vectors(gen.fingerprint, self._dim, labels=missing)
            by_label = dict(zip(labels.tolist(), (vecs @ qv).tolist()))
            for row, _ in lex:
                if row.rid not in cos and row.label in by_label:
                    cos[row.rid] = by_label[row.label]
        # A fact with no vector in this generation yet (another process is still embedding it, or its vector was
        # damaged) is fused on its lexical evidence alone: its words stand in for the vector side it lacks. Scored
        # as cosine 0 beside facts that have one, an exact match on a rare word fell out of the top k for as long
        # as its vector was pending.
        vectorless = [rid for rid in lexical if rid not in cos]
        if fusion == "rrf":
            fused = fuse_rrf(list(lexical), [row.rid for row, _ in vec])
            if vectorless:  # its lexical rank stands in for the vector rank it does not have
                alone = fuse_rrf(list(lexical), list(lexical))
                fused.update({rid: alone[rid] for rid in vectorless})
        else:
            if vectorless:  # its lexical share stands in for the cosine it does not have
                alone = fuse_scores(lexical, {}, weight)
                cos.update({rid: alone[rid] for rid in vectorless})
            fused = fuse_scores(lexical, cos, weight)
        order = sorted(rows, key=lambda rid: (-fused[rid], rid))
        return [(rows[rid], fused[rid]) for rid in order[:k]]


def candidate_pool(k: int) -> int:
    """How many candidates a ranking step draws to return k: hybrid fusion and the recency weight."""
    return min(K_MAX, max(50, 4 * k))


def _query(index: VectorIndex, qv: np.ndarray, want: int, allow: Callable[[int], bool] | None) -> list[tuple[int, float]] | None:
    """The index's top `want` (among the allowed labels), or None when it cannot return that many."""
    if want <= 0:
        return []
    try:
        labels, scores = index.query(qv, want, allow)
    except SearchFailed:
        return None
    return list(zip(labels.tolist(), scores.tolist())) if len(labels) >= want else None


def rerank_by_recency(scored: list[Hit], now: datetime, half_life_s: float) -> list[Hit]:
    """Scores decayed by the age of each fact's last change (timing.apply_recency), best first; pinned facts keep
    their score. Ties keep the order they came in."""
    if not scored:
        return scored
    rows = [row for row, _ in scored]
    decayed = apply_recency([s for _, s in scored], [datetime.fromisoformat(row.updated_at) for row in rows], now,
                            half_life_s)  # (N,)
    final = [float(s) if row.pinned else float(d) for (row, s), d in zip(scored, decayed.tolist())]
    order = sorted(range(len(rows)), key=lambda i: -final[i])
    return [(rows[i], final[i]) for i in order]
