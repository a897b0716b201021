"""The gate: may a candidate embedder replace the serving one? Held-out memories queried by short views of
themselves must be found better than before (a paired gain in reciprocal rank beyond noise; a tie is refused),
no worse at recall@k, and the candidate's vectors must be finite and not collapsed.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .fit import query_view, word_weights
from .policy import AdaptationPolicy
from .report import GateResult


def text_span(text: str, rng: np.random.Generator) -> str:
    """A probe query: a contiguous run of about half of a memory's words (short memories whole)."""
    words = text.split()
    if len(words) <= 4:
        return text
    length = max(3, len(words) // 2)
    start = int(rng.integers(0, len(words) - length + 1))
    return " ".join(words[start : start + length])


def probe_queries(probe_texts: Sequence[str], corpus: Sequence[str], policy: AdaptationPolicy
                  ) -> tuple[list[str], np.ndarray]:
    """policy.probe_views query-like views of each probe memory (seeded by policy.seed), and (Q,) the row of
    each query's memory in the corpus (the probes come first). The views are the training kind (policy.views,
    idf over the corpus); "two-spans" training gets text_span views."""
    rng = np.random.default_rng([policy.seed, 7])
    words = [t.split() for t in corpus]
    idf = word_weights(words) if policy.views != "two-spans" else []
    queries, rows = [], []
    for i, text in enumerate(probe_texts):
        for _ in range(policy.probe_views):
            if policy.views == "two-spans" or not words[i]:
                queries.append(text_span(text, rng))
            else:
                queries.append(query_view(words[i], idf[i], rng, policy))
            rows.append(i)
    return queries, np.asarray(rows, dtype=np.intp)


def _ranks(queries: np.ndarray, docs: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Rank (0 = best) of doc rows[q] for query q among all docs; ties count against the target."""
    scores = queries @ docs.T  # (Q, N)
    own = scores[np.arange(len(queries)), rows]  # (Q,)
    return (scores >= own[:, None]).sum(axis=1) - 1  # (Q,)


def _mean_cosine(vectors: np.ndarray, limit: int = 512) -> float:
    v = vectors[:limit].astype(np.float64)  # (n, D)
    n = len(v)
    if n < 2:
        return 0.0
    gram = v @ v.T  # (n, n)
    return float((gram.sum() - np.trace(gram)) / (n * (n - 1)))


def gate_candidate(current: Any, candidate: Any, probe_texts: Sequence[str], distractor_texts: Sequence[str],
                   policy: AdaptationPolicy, *, current_doc_vectors: np.ndarray | None = None,
                   corpus_labels: np.ndarray | None = None,
                   round_docs: Callable[[np.ndarray], np.ndarray] | None = None) -> GateResult:
    """Decide whether a candidate embedder may replace the current one.

    The corpus is the probe memories followed by the distractors; each probe is queried by policy.probe_views
    short views of itself (probe_queries) and each query scores the reciprocal rank of its memory. The candidate
    passes when every vector is finite with norm > 1e-6, its vectors are not collapsed (mean pairwise cosine),
    its recall@probe_k is at least the current model's minus policy.gate_tolerance, and (policy.require_gain)
    there are at least policy.min_probe_queries queries and the mean paired gain in reciprocal rank is > 0 and
    > policy.gate_margin standard errors (over the held-out memories, each the mean of its views): a candidate
    that ties or wins within noise is refused.

    Args:
        current: the serving embedder.
        candidate: the embedder to judge.
        probe_texts: held-out memories (never trained on).
        distractor_texts: other memories searched alongside them.
        policy: probe_k, gate_tolerance, max_mean_cosine, seed.
        current_doc_vectors: (N, D) the current model's vectors of the corpus if already known (e.g. stored).
        corpus_labels: (N,) store labels of the corpus, kept in the result with the candidate's vectors.
        round_docs: applied to the candidate's corpus vectors, so that they compare with current_doc_vectors as
            a database row rounds them (the store passes backend/vector_blobs.as_stored: a candidate with the
            current model's weights then ties exactly).
    Returns:
        GateResult.
    """
    corpus = list(probe_texts) + list(distractor_texts)
    k = min(policy.probe_k, max(1, len(corpus)))
    result = GateResult(passed=False, reason="", finite=False, probes=len(probe_texts), corpus=len(corpus), k=k)
    if not probe_texts:
        result.reason = "no probe memories"
        return result
    queries, rows = probe_queries(probe_texts, corpus, policy)
    result.queries = len(queries)
    with np.errstate(all="ignore"):
        cand_docs = np.asarray(candidate.embed_many(corpus), dtype=np.float32)  # (N, D)
        cand_q = np.asarray(candidate.embed_many(queries), dtype=np.float32)  # (Q, D)
        finite = bool(np.isfinite(cand_docs).all() and np.isfinite(cand_q).all())
        norms_ok = finite and bool((np.linalg.norm(cand_docs, axis=1) > 1e-6).all()
                                   and (np.linalg.norm(cand_q, axis=1) > 1e-6).all())
    result.finite = finite
    if not finite:
        result.reason = "the candidate's vectors are not finite (NaN or Inf)"
        return result
    if not norms_ok:
        result.reason = "the candidate produced zero vectors"
        return result
    if round_docs is not None:  # (only finite, non-zero vectors reach the rounding)
        cand_docs = round_docs(cand_docs)
    cur_docs = (np.asarray(current.embed_many(corpus), dtype=np.float32) if current_doc_vectors is None
                else np.asarray(current_doc_vectors, dtype=np.float32))  # (N, D)
    cur_q = np.asarray(current.embed_many(queries), dtype=np.float32)  # (Q, D)
    r_cur, r_cand = _ranks(cur_q, cur_docs, rows), _ranks(cand_q, cand_docs, rows)  # (Q,) each
    result.recall_current = float((r_cur < k).mean())
    result.recall_candidate = float((r_cand < k).mean())
    rr_cur, rr_cand = 1.0 / (1.0 + r_cur), 1.0 / (1.0 + r_cand)  # (Q,) each
    result.mrr_current = float(rr_cur.mean())
    result.mrr_candidate = float(rr_cand.mean())
    # paired gain per held-out memory (the mean over its views: views of one memory are not independent), and
    # the standard error of its mean over the memories
    gain = np.bincount(rows, weights=rr_cand - rr_cur, minlength=len(probe_texts)) / np.maximum(
        np.bincount(rows, minlength=len(probe_texts)), 1)  # (P,)
    result.mrr_gain = float(gain.mean())
    result.mrr_gain_se = float(gain.std(ddof=1) / np.sqrt(len(gain))) if len(gain) > 1 else float("inf")
    figures = (f"probe MRR {result.mrr_current:.4f} -> {result.mrr_candidate:.4f} (gain {result.mrr_gain:+.4f}, "
               f"SE {result.mrr_gain_se:.4f}, {len(queries)} queries on {len(probe_texts)} held-out memories), "
               f"recall@{k} {result.recall_current:.4f} -> {result.recall_candidate:.4f}")
    result.mean_cosine_current = _mean_cosine(cur_docs)
    result.mean_cosine_candidate = _mean_cosine(cand_docs)
    if result.mean_cosine_candidate > 0.999 or (
            result.mean_cosine_candidate > policy.max_mean_cosine
            and result.mean_cosine_candidate > result.mean_cosine_current + 0.02):
        result.reason = (f"the candidate's vectors are degenerate (mean pairwise cosine "
                         f"{result.mean_cosine_candidate:.4f}, current {result.mean_cosine_current:.4f})")
        return result
    if result.recall_candidate < result.recall_current - policy.gate_tolerance:
        result.reason = f"probe recall@{k} would drop more than {policy.gate_tolerance}: {figures}"
        return result
    if policy.require_gain:
        if len(queries) < policy.min_probe_queries:
            result.reason = (f"too few held-out memories to judge a gain ({len(queries)} probe queries, fewer than "
                             f"min_probe_queries={policy.min_probe_queries}): {figures}")
            return result
        if not (result.mrr_gain > 0 and result.mrr_gain > policy.gate_margin * result.mrr_gain_se):
            result.reason = (f"not better than the current model beyond noise (needs gain > 0 and > "
                             f"{policy.gate_margin:g} SE): {figures}")
            return result
    result.passed = True
    result.reason = f"better on its probe: {figures}"
    if corpus_labels is not None:
        result.candidate_labels = np.asarray(corpus_labels, dtype=np.int64)  # (N,)
        result.candidate_vectors = cand_docs
    return result


def probe_size(count: int, policy: AdaptationPolicy) -> int:
    """How many of `count` memories split_probe holds out for the gate."""
    n_probe = int(round(count * policy.probe_fraction))
    return min(max(n_probe, policy.min_probe), policy.max_probe, count // 2)


def split_probe(count: int, policy: AdaptationPolicy) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of `count` memories into (train indices, probe indices)."""
    order = np.random.default_rng([policy.seed, 11]).permutation(count)  # (N,)
    n_probe = probe_size(count, policy)
    return np.sort(order[n_probe:]), np.sort(order[:n_probe])


def too_small_to_judge(count: int, policy: AdaptationPolicy) -> str | None:
    """Why a store of `count` memories is too small for the gate to judge a gain, or None when it is not (or the
    policy does not ask for a gain). Known before training: the gate asks policy.probe_views queries of each
    held-out memory and refuses fewer than policy.min_probe_queries, so a round on such a store would train for
    nothing."""
    if not policy.require_gain:
        return None
    queries = probe_size(count, policy) * policy.probe_views
    if queries >= policy.min_probe_queries:
        return None
    need = -(-policy.min_probe_queries // policy.probe_views)  # held-out memories the gate needs
    if need > policy.max_probe:
        enough = None
    else:  # the fewest memories whose split holds out `need` (probe_size never falls as count grows)
        low = high = count + 1
        while probe_size(high, policy) < need and high < 10**9:
            high *= 2
        while low < high:
            mid = (low + high) // 2
            low, high = (mid + 1, high) if probe_size(mid, policy) < need else (low, mid)
        enough = low if probe_size(low, policy) >= need else None
    at_least = (f"a store needs at least {enough} memories for a round under this policy" if enough is not None
                else f"no store size reaches that under this policy (max_probe={policy.max_probe})")
    return (f"too small to judge: {count} memories hold out {probe_size(count, policy)} for the gate, "
            f"{queries} probe queries ({policy.probe_views} per memory), fewer than "
            f"min_probe_queries={policy.min_probe_queries}; {at_least}. Nothing was trained.")
