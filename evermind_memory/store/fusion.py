"""Hybrid fusion: lexical (BM25) and vector (cosine) evidence for the same candidates -> one score each.

Pure functions over plain dicts, no store state, so the rule can be studied offline (recipe/, benchmarks/) on
exactly the candidates the store would fuse, and swapped without touching the store.
"""

from __future__ import annotations

from typing import Hashable, Mapping

RRF_K = 60
# BM25 below this is no evidence: FTS5 clamps the idf of a word held by half the facts or more to 1e-6, so a row
# matched by such words alone scores ~1e-6, and normalising by the best BM25 would stretch that to a full 1.0.
LEXICAL_EVIDENCE = 1e-3


def fuse_scores(lexical: Mapping[Hashable, float], vector: Mapping[Hashable, float],
                weight: float) -> dict[Hashable, float]:
    """BM25 over the best BM25, plus weight x cosine, for every candidate of either list.

    Min-max would score the weakest lexical match as no match at all, which on a small store lets a noise-level
    idf difference decide between two facts; over-the-best keeps its share.

    Args:
        lexical: candidate -> BM25 (higher is better; FTS5's rank negated).
        vector: candidate -> cosine, for every candidate whose vector is known.
        weight: the vector side's weight.
    Returns:
        candidate -> fused score.
    """
    bm = {c: s for c, s in lexical.items() if s > LEXICAL_EVIDENCE}
    hi = max(bm.values(), default=0.0)
    return {c: (bm[c] / hi if c in bm else 0.0) + weight * vector.get(c, 0.0) for c in {*lexical, *vector}}


def fuse_rrf(lexical_order: list[Hashable], vector_order: list[Hashable], k: int = RRF_K) -> dict[Hashable, float]:
    """Reciprocal-rank fusion of two rankings (best first): sum of 1 / (k + rank)."""
    fused: dict[Hashable, float] = {}
    for ranked in (vector_order, lexical_order):
        for rank, c in enumerate(ranked, start=1):
            fused[c] = fused.get(c, 0.0) + 1.0 / (k + rank)
    return fused
