"""The gate: may a candidate embedder replace the serving one? Held-out memories queried by spans of themselves
must be found as well as before, and the candidate's vectors must be finite and not collapsed.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

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


def _ranks(queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Rank (0 = best) of doc i for query i among all docs; ties count against the target."""
    scores = queries @ docs.T  # (Q, N)
    own = scores[np.arange(len(queries)), np.arange(len(queries))]  # (Q,)
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
                   corpus_labels: np.ndarray | None = None) -> GateResult:
    """Decide whether a candidate embedder may replace the current one.

    The corpus is the probe memories followed by the distractors; each probe is queried by a span of its own
    words (seeded by policy.seed) and counts when it ranks in the top probe_k. The candidate passes when every
    vector is finite with norm > 1e-6, its vectors are not collapsed (mean pairwise cosine), and its recall is
    at least the current model's minus policy.gate_tolerance.

    Args:
        current: the serving embedder.
        candidate: the embedder to judge.
        probe_texts: held-out memories (never trained on).
        distractor_texts: other memories searched alongside them.
        policy: probe_k, gate_tolerance, max_mean_cosine, seed.
        current_doc_vectors: (N, D) the current model's vectors of the corpus if already known (e.g. stored).
        corpus_labels: (N,) store labels of the corpus, kept in the result with the candidate's vectors.
    Returns:
        GateResult.
    """
    corpus = list(probe_texts) + list(distractor_texts)
    k = min(policy.probe_k, max(1, len(corpus)))
    result = GateResult(passed=False, reason="", finite=False, probes=len(probe_texts), corpus=len(corpus), k=k)
    if not probe_texts:
        result.reason = "no probe memories"
        return result
    rng = np.random.default_rng([policy.seed, 7])
    queries = [text_span(t, rng) for t in probe_texts]
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
    cur_docs = (np.asarray(current.embed_many(corpus), dtype=np.float32) if current_doc_vectors is None
                else np.asarray(current_doc_vectors, dtype=np.float32))  # (N, D)
    cur_q = np.asarray(current.embed_many(queries), dtype=np.float32)  # (Q, D)
    r_cur, r_cand = _ranks(cur_q, cur_docs), _ranks(cand_q, cand_docs)  # (Q,) each
    result.recall_current = float((r_cur < k).mean())
    result.recall_candidate = float((r_cand < k).mean())
    result.mrr_current = float((1.0 / (1 + r_cur)).mean())
    result.mrr_candidate = float((1.0 / (1 + r_cand)).mean())
    result.mean_cosine_current = _mean_cosine(cur_docs)
    result.mean_cosine_candidate = _mean_cosine(cand_docs)
    if result.mean_cosine_candidate > 0.999 or (
            result.mean_cosine_candidate > policy.max_mean_cosine
            and result.mean_cosine_candidate > result.mean_cosine_current + 0.02):
        result.reason = (f"the candidate's vectors are degenerate (mean pairwise cosine "
                         f"{result.mean_cosine_candidate:.4f}, current {result.mean_cosine_current:.4f})")
        return result
    if result.recall_candidate < result.recall_current - policy.gate_tolerance:
        result.reason = (f"probe recall@{k} would drop from {result.recall_current:.4f} to "
                         f"{result.recall_candidate:.4f} (tolerance {policy.gate_tolerance})")
        return result
    result.passed = True
    result.reason = f"probe recall@{k} {result.recall_current:.4f} -> {result.recall_candidate:.4f}"
    if corpus_labels is not None:
        result.candidate_labels = np.asarray(corpus_labels, dtype=np.int64)  # (N,)
        result.candidate_vectors = cand_docs
    return result


def split_probe(count: int, policy: AdaptationPolicy) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of `count` memories into (train indices, probe indices)."""
    order = np.random.default_rng([policy.seed, 11]).permutation(count)  # (N,)
    n_probe = int(round(count * policy.probe_fraction))
    n_probe = min(max(n_probe, policy.min_probe), policy.max_probe, count // 2)
    return np.sort(order[n_probe:]), np.sort(order[:n_probe])
