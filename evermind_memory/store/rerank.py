"""The second stage of hybrid recall: the best hits reread word by word. On by default for short notes.

A text's vector sums its words into one direction, which blurs a question's words against a memory's ("what gives
Ada headaches?" against "Ada gets migraines every spring"). The second stage takes the hybrid top RERANK_POOL and,
for each question word, the best cosine with any of the memory's words over the lexicon's word vectors
(lm/lexicon.py: each word as the teacher encoder sees it, shipped beside the model), averaged with the words'
lexicon weights (frequent words count less): MaxSim, as late-interaction rankers compute it over tokens. A hit's new
score is its hybrid score min-max scaled over the pool (its scale moves with the store) plus RERANK_WEIGHT x that
match, and the pool is ordered by it. Nothing is trained; it costs microseconds a candidate.

`recall(rerank=None)`, the default, reranks when the hits are short notes (their median under NOTES_CHARS: what
agents store) and the store's embedder has a lexicon and its fitted rule fuses; True always (an error where it
cannot), False never. Measured through the store (benchmarks/rerank_lexicon.py, benchmarks/results/
rerank_lexicon.txt): with the weight chosen on the personal-memory dev protocol (right first 568 -> 594 of 820
questions), the validation set it was not chosen on goes from 131 to 138 of 180; on manual sections the mean is flat
but single sources lose up to 0.014 ndcg@10 (statsmodels, nodejs). Their hybrid pools' median length is 182
characters or more (every dev question), personal facts' at most 76: the default gate at NOTES_CHARS never fires on
the manuals (benchmarks/rerank_gate.py).
"""

from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING, Any, Sequence

from .._lazy import lazy_import
from ..errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

RERANK_POOL = 30  # hybrid hits the second stage reorders
RERANK_WEIGHT = 0.5  # the word match's weight against the scaled hybrid score (chosen on the personal dev protocol)
NOTES_CHARS = 150  # a pool of hits whose median length is under this is reranked by default (a sentence or two)


def auto_lexicon(embedder: object, fusion: str) -> Any:
    """The lexicon a default recall (rerank=None) may rerank with: the embedder's, when it has one and `fusion` is
    the fitted rule's "score"; else None (no second stage)."""
    return getattr(embedder, "lexicon", None) if fusion == "score" else None


def short_notes(hits: Sequence) -> bool:
    """Whether hits (FactRow, score, detail) are short notes: the median length of the first RERANK_POOL under
    NOTES_CHARS."""
    pool = hits[:RERANK_POOL]
    return bool(pool) and float(np.median([len(hit[0].text) for hit in pool])) < NOTES_CHARS


def lexicon_of(embedder: object) -> Any:
    """The embedder's lexicon, which the second stage reads; InvalidInput for an embedder without one."""
    lexicon = getattr(embedder, "lexicon", None)
    if lexicon is None:
        raise InvalidInput("recall: rerank reads the lexicon of the shipped embedder; this store's embedder has "
                           "none (call recall without rerank).")
    return lexicon


def unit_rows(lexicon: Any, ids: Sequence[int]) -> np.ndarray:
    """(n, D) float32 unit rows of the lexicon's words `ids`."""
    rows = lexicon.table[np.asarray(ids, dtype=np.intp)].astype(np.float32)  # (n, D)
    rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return rows


def word_match(lexicon: Any, query: str, texts: Sequence[str]) -> np.ndarray:
    """(N,) float64: for each text, the query words' best cosines with the text's words, averaged with the query
    words' lexicon weights (0 when the query or the text holds no word the lexicon knows)."""
    out = np.zeros(len(texts))  # (N,)
    q_ids = lexicon.word_ids(query)
    if not q_ids:
        return out
    weight = lexicon.weight[np.asarray(q_ids, dtype=np.intp)].astype(np.float64)  # (Q,)
    if weight.sum() <= 0:
        return out
    per_text = [lexicon.word_ids(t) for t in texts]
    counts = np.array([len(ids) for ids in per_text], dtype=np.intp)  # (N,)
    has = counts > 0
    if not has.any():
        return out
    words = unit_rows(lexicon, list(chain.from_iterable(per_text)))  # (W, D) every text's words, text after text
    sims = unit_rows(lexicon, q_ids) @ words.T  # (Q, W)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[has]  # (n,) each text's first word
    best = np.maximum.reduceat(sims, starts, axis=1)  # (Q, n) each query word's best match in each text
    out[has] = (weight / weight.sum()) @ best  # (n,)
    return out


def rerank(hits: list, query: str, lexicon: Any, candidates: Sequence | None = None) -> list:
    """The hits (FactRow, score, detail), best first, with their first RERANK_POOL reordered by min-max-scaled
    score + RERANK_WEIGHT x word_match, which becomes their score; hits past the pool keep their place, scaled the
    same way (at most 0), so the scores still fall.

    `candidates` ((FactRow, score, ...), best first): the list the hits were filtered from (by min_score or
    min_relevance); the scaling is taken from its first RERANK_POOL, so a fact's reranked score and order do not
    change with how many of its neighbours a floor dropped. None: from the hits themselves.
    """
    if not hits:
        return hits
    pool = hits[:RERANK_POOL]
    scores = np.array([hit[1] for hit in hits], dtype=np.float64)  # (H,)
    basis = scores[:len(pool)] if candidates is None else np.array([c[1] for c in candidates[:RERANK_POOL]])
    low = basis.min()
    span = basis.max() - low
    scaled = (scores - low) / (span if span > 0 else 1.0)  # (H,) the pool in [0, 1], the rest at most 0
    match = word_match(lexicon, query, [hit[0].text for hit in pool])  # (P,)
    new = scaled[:len(pool)] + RERANK_WEIGHT * match  # (P,)
    order = np.argsort(-new, kind="stable").tolist()  # ties keep the hybrid order
    return ([(pool[i][0], float(new[i]), _explained(pool[i][2], float(match[i]))) for i in order]
            + [(row, float(s), detail) for (row, _, detail), s in zip(hits[len(pool):], scaled[len(pool):].tolist())])


def _explained(detail: Any, match: float) -> Any:
    """A reranked hit's Detail (relevance, explain): its Explain, when asked for, with the word match filled in."""
    if getattr(detail, "explain", None) is None:
        return detail
    from dataclasses import replace

    return detail._replace(explain=replace(detail.explain, word_match=match))
