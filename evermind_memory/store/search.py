"""Recall's three ways to find facts: lexical (FTS5 BM25), vector (HNSW, or exact when a tag filter is small or
the index cannot answer) and hybrid (both, fused by store/fusion.py). Everything here reads one generation,
passed in by the caller, who holds it for the whole recall.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._blas import single_blas
from .backend import Backend, FactRow
from .fusion import fuse_rrf, fuse_scores
from .index import SearchFailed, exact_search
from .lexical import MAX_TERMS, phrase_query, query_words
from .validate import K_MAX
from .vectors import Generation

DEFAULT_HYBRID_WEIGHT = 2.0  # the vector side's weight in hybrid recall for an embedder that names none
EXACT_FILTER_MAX = 4096  # a tag filter matching at most this many facts is searched exactly (R9)

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
    def run(self, gen: Generation, query: str, qv: np.ndarray | None, k: int, tags: dict[str, str], mode: str,
            fusion: str, weight: float) -> list[Hit]:
        """(row, score) best first, at most k (validated arguments; qv (D,) is None for lexical mode)."""
        if mode == "lexical":
            return self.lexical(query, k, tags)
        if mode == "vector":
            return self.rows_for(self.vector(gen, qv, k, tags))
        return self.hybrid(gen, query, qv, k, tags, fusion, weight)

    def lexical(self, query: str, k: int, tags: dict[str, str]) -> list[Hit]:
        """FTS5 BM25 over the words of `query` (see store/lexical.py for which words are matched)."""
        words = query_words(query)
        if not words:
            return []
        with self._db.reading() as r:
            return r.lexical(words, k, tags)

    def vector(self, gen: Generation, qv: np.ndarray, k: int, tags: dict[str, str]) -> list[tuple[int, float]]:
        """(label, cosine) best first, from the index or exactly (small filters, failed searches)."""
        index, fp, dim = gen.index, gen.fingerprint, self._dim
        if tags:
            with self._db.reading() as r:
                matching = r.count_tagged(tags, fp)
                if matching == 0:
                    return []
                if matching <= EXACT_FILTER_MAX or matching * 10 <= index.live_count:
                    labels, vecs = r.vectors(fp, dim, tags=tags)
                    return list(zip(*[a.tolist() for a in exact_search(vecs, labels, qv, k)]))
                allowed, _ = r.vectors(fp, dim, tags=tags)
            allowed_set = set(allowed.tolist())
            want = min(k, len(allowed_set))
            wide = min(index.live_count, K_MAX * 4, k * max(2, 2 * index.live_count // max(1, len(allowed_set))))
            try:
                labels, scores = index.query(qv, wide)
                hits = [(lab, s) for lab, s in zip(labels.tolist(), scores.tolist()) if lab in allowed_set]
            except SearchFailed:
                hits = []
            if len(hits) >= want:
                return hits[:k]
            with self._db.reading() as r:
                labels, vecs = r.vectors(fp, dim, tags=tags)
            return list(zip(*[a.tolist() for a in exact_search(vecs, labels, qv, k)]))
        want = min(k, index.live_count)
        try:
            labels, scores = index.query(qv, k)
            if len(labels) >= want:
                return list(zip(labels.tolist(), scores.tolist()))
        except SearchFailed:
            pass
        with self._db.reading() as r:
            labels, vecs = r.vectors(fp, dim)
        return list(zip(*[a.tolist() for a in exact_search(vecs, labels, qv, k)]))

    def rows_for(self, hits: list[tuple[int, float]]) -> list[Hit]:
        """The fact rows of (label, score) hits, in order (a label forgotten meanwhile is dropped)."""
        if not hits:
            return []
        with self._db.reading() as r:
            rows = r.fetch_where("label", [label for label, _ in hits])
        return [(rows[label], score) for label, score in hits if label in rows]

    def hybrid(self, gen: Generation, query: str, qv: np.ndarray, k: int, tags: dict[str, str], fusion: str,
               weight: float) -> list[Hit]:
        """Lexical and vector candidates (a pool of max(50, 4k)) fused by `fusion` ("score" or "rrf")."""
        pool = min(K_MAX, max(50, 4 * k))
        vec = self.rows_for(self.vector(gen, qv, pool, tags))
        lex = self.lexical(query, pool, tags)
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
