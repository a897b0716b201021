"""Fitting a LoRA adapter on a store's memories: the losses (retrieval, in-batch contrastive, anchor), the short
query-like views of a memory, and fit_adapter, the training loop over a frozen base embedder.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..embedder.base import is_adaptable
from ..errors import InvalidInput
from ..lm.adapter import LoRAWeights
from ..lm.sequence import SequenceBackbone
from ..training.lora import LoRAAdapter
from ..training.optim import AdamW, clip_grad_norm_
from .policy import AdaptationPolicy

_EPS = 1e-12
_EDGE_PUNCT = "\"'`.,;:!?()[]{}<>"


def default_targets(config: Any) -> tuple[str, ...]:
    """The default LoRA targets for an LMConfig: the tied embedding and the pooling attention if present."""
    if getattr(config, "attn_heads", 0):
        return ("emb", "pool.wqkv", "pool.wo")
    return ("emb", f"layers.{config.n_layers - 1}.shared.w2")


def pad_batch(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token lists into (tokens (B, T) intp, lengths (B,) intp); padding is token 0."""
    lens = np.array([len(s) for s in seqs], dtype=np.intp)  # (B,)
    t = int(lens.max())
    mask = np.arange(t)[None, :] < lens[:, None]  # (B, T)
    tokens = np.zeros((len(seqs), t), dtype=np.intp)  # (B, T)
    tokens[mask] = np.concatenate([np.asarray(s, dtype=np.intp) for s in seqs])
    return tokens, lens


def contrastive_loss_and_grad(pooled: np.ndarray, temperature: float) -> tuple[float, np.ndarray]:
    """Symmetric in-batch InfoNCE between two views, and its gradient w.r.t. the unnormalised pooled rows.

    Rows [0, B) are view one of B memories, rows [B, 2B) view two of the same memories in the same order;
    z = pooled / |pooled|, S = z1 @ z2^T / temperature, loss = (CE(S, diag) + CE(S^T, diag)) / 2.

    Args:
        pooled: (2B, C) pooled vectors (float32 in training, float64 in gradient checks).
        temperature: softmax temperature (> 0).
    Returns:
        (loss, dpooled (2B, C) in pooled's dtype).
    """
    b = pooled.shape[0] // 2
    norms = np.maximum(np.sqrt(np.einsum("nc,nc->n", pooled, pooled)), _EPS)  # (2B,)
    z = pooled / norms[:, None]  # (2B, C)
    z1, z2 = z[:b], z[b:]  # (B, C) each
    s = (z1 @ z2.T) / temperature  # (B, B)
    row = s - s.max(axis=1, keepdims=True)  # (B, B)
    p_row = np.exp(row)  # (B, B)
    p_row /= p_row.sum(axis=1, keepdims=True)
    col = s - s.max(axis=0, keepdims=True)  # (B, B)
    p_col = np.exp(col)  # (B, B)
    p_col /= p_col.sum(axis=0, keepdims=True)
    diag = np.arange(b)  # (B,)
    loss = -0.5 * (np.log(np.maximum(p_row[diag, diag], 1e-30)).mean()
                   + np.log(np.maximum(p_col[diag, diag], 1e-30)).mean())
    eye = np.eye(b, dtype=pooled.dtype)  # (B, B)
    ds = ((p_row - eye) + (p_col - eye)) * (0.5 / b)  # (B, B)
    dz1 = (ds @ z2) / temperature  # (B, C)
    dz2 = (ds.T @ z1) / temperature  # (B, C)
    dz = np.concatenate([dz1, dz2], axis=0)  # (2B, C)
    dpooled = (dz - z * np.einsum("nc,nc->n", z, dz)[:, None]) / norms[:, None]  # (2B, C)
    return float(loss), dpooled.astype(pooled.dtype, copy=False)


def _unit_backward(z: np.ndarray, dz: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """Gradient w.r.t. the unnormalised rows p of dL/dz where z = p / |p|."""
    return (dz - z * np.einsum("nc,nc->n", z, dz)[:, None]) / norms[:, None]  # (B, C)


def retrieval_loss_and_grad(pooled: np.ndarray, targets: np.ndarray, positives: np.ndarray,
                            temperature: float, weights: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """InfoNCE of query vectors against fixed memory vectors, and its gradient w.r.t. the query rows.

    z = pooled / |pooled|, S = z @ targets^T / temperature, loss = mean_b w_b CE(S[b], positives[b]): each
    query against every memory of the store, its own memory the positive.

    Args:
        pooled: (B, C) unnormalised query vectors.
        targets: (N, C) unit memory vectors (constants).
        positives: (B,) row of each query's memory in targets.
        temperature: softmax temperature (> 0).
        weights: (B,) per-query weights (None: all 1), e.g. the confidence of a pseudo-label.
    Returns:
        (loss, dpooled (B, C) in pooled's dtype).
    """
    b = pooled.shape[0]
    norms = np.maximum(np.sqrt(np.einsum("bc,bc->b", pooled, pooled)), _EPS)  # (B,)
    z = pooled / norms[:, None]  # (B, C)
    s = (z @ targets.T) / temperature  # (B, N)
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)  # (B, N)
    p /= p.sum(axis=1, keepdims=True)
    rows = np.arange(b)  # (B,)
    w = np.ones(b, dtype=pooled.dtype) if weights is None else np.asarray(weights, dtype=pooled.dtype)  # (B,)
    loss = -float((w * np.log(np.maximum(p[rows, positives], 1e-30))).mean())
    p[rows, positives] -= 1.0
    dz = ((p * w[:, None]) @ targets) / (b * temperature)  # (B, C)
    return loss, _unit_backward(z, dz, norms).astype(pooled.dtype, copy=False)


def anchor_loss_and_grad(pooled: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """mean_b (1 - cos(pooled[b], targets[b])) and its gradient w.r.t. pooled; targets are unit (B, C) rows."""
    b = pooled.shape[0]
    norms = np.maximum(np.sqrt(np.einsum("bc,bc->b", pooled, pooled)), _EPS)  # (B,)
    z = pooled / norms[:, None]  # (B, C)
    loss = float(1.0 - np.einsum("bc,bc->b", z, targets).mean())
    return loss, _unit_backward(z, -targets / b, norms).astype(pooled.dtype, copy=False)


def token_span(tokens: Sequence[int], rng: np.random.Generator) -> list[int]:
    """A random contiguous span of a memory's tokens (a quarter to all of it; short memories whole)."""
    n = len(tokens)
    if n < 4:
        return list(tokens)
    length = int(rng.integers(max(2, n // 4), n + 1))
    start = int(rng.integers(0, n - length + 1))
    return list(tokens[start : start + length])


def word_weights(word_lists: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """Per memory, the idf of each of its words over all the memories given (0 for words with no letter or digit).

    Words are compared lowercased with edge punctuation stripped; idf = log((N + 1) / (df + 0.5)).
    """
    keys = [[w.strip(_EDGE_PUNCT).lower() for w in words] for words in word_lists]
    df: dict[str, int] = {}
    for ks in keys:
        for k in set(ks):
            df[k] = df.get(k, 0) + 1
    n = len(keys)
    return [np.array([math.log((n + 1) / (df[k] + 0.5)) if any(ch.isalnum() for ch in k) else 0.0 for k in ks],
                     dtype=np.float64) for ks in keys]  # (words,) each


def sentence_bounds(words: Sequence[str]) -> list[tuple[int, int]]:
    """[start, end) word ranges of the sentences of a memory: a word ending in . ! ? or : closes one."""
    bounds, start = [], 0
    for i, w in enumerate(words):
        if w[-1:] in ".!?:" or i == len(words) - 1:
            bounds.append((start, i + 1))
            start = i + 1
    return bounds


def query_view(words: Sequence[str], weights: np.ndarray, rng: np.random.Generator, policy: AdaptationPolicy) -> str:
    """A short query-like view of a memory: a few of its words (see AdaptationPolicy.views).

    k is drawn from query_min_words..query_max_words. "rare-span-memory": a contiguous run of k words holding a
    word drawn with probability proportional to `weights` ** policy.query_idf_power (weights: idf);
    "span-memory": a contiguous run of k words anywhere; "words-memory": k words drawn by that probability
    without replacement, kept in their order, edge punctuation stripped. A memory of k words or fewer gives
    them all.
    """
    n = len(words)
    if policy.views == "sentence-or-span" and rng.random() < policy.sentence_share:
        sentences = [(a, b) for a, b in sentence_bounds(words) if b - a >= 3] or [(0, n)]
        a, b = sentences[int(rng.integers(0, len(sentences)))]
        return " ".join(words[a : min(b, a + policy.sentence_max_words)])
    k = min(n, int(rng.integers(policy.query_min_words, policy.query_max_words + 1)))
    if policy.views == "span-memory" or k >= n:
        start = int(rng.integers(0, n - k + 1))
        return " ".join(words[start : start + k])
    w = np.asarray(weights, dtype=np.float64)  # (n,)
    w = np.where(w > 0, w ** policy.query_idf_power, 0.0)  # (n,)
    live = int((w > 0).sum())
    if live == 0:
        w, live = np.ones(n), n
    if policy.views in ("rare-span-memory", "sentence-or-span"):  # a contiguous run around a word drawn by rarity
        centre = int(rng.choice(n, p=w / w.sum()))
        start = min(max(0, centre - int(rng.integers(0, k))), n - k)
        return " ".join(words[start : start + k])
    pick = np.sort(rng.choice(n, size=min(k, live), replace=False, p=w / w.sum()))  # (k,)
    return " ".join(words[i].strip(_EDGE_PUNCT) or words[i] for i in pick.tolist())


@dataclass
class FitResult:
    """What `fit_adapter` produced."""

    weights: LoRAWeights
    steps: int
    losses: list  # [(step, lm_loss, contrastive_loss)]
    seconds: float
    cpu_seconds: float
    stopped: bool


def _check_lm_embedder(embedder: Any, what: str) -> None:
    model = getattr(embedder, "model", None)
    if isinstance(model, SequenceBackbone):
        raise InvalidInput(
            f"{what}: LoRA adaptation is EvermindLM-only, and this embedder ({embedder.fingerprint}) runs a "
            "sequence backbone (Mamba / attention blocks). Adapt a store opened with an LMEmbedder, or keep "
            "this one unadapted."
        )
    if not is_adaptable(embedder):
        raise InvalidInput(
            f"{what} needs an LMEmbedder (an EvermindLM with a tokenizer) to adapt; got {type(embedder).__name__}. "
            "Open the store with embedder=LMEmbedder(model, tokenizer)."
        )


def fit_adapter(base: Any, texts: Sequence[str], policy: AdaptationPolicy, *, init: LoRAWeights | None = None,
                should_stop: Callable[[], bool] | None = None, vectors: np.ndarray | None = None,
                pairs: Sequence[tuple[str, int, float]] | None = None) -> FitResult:
    """Fit LoRA tensors over a frozen LMEmbedder on memories: retrieval + anchor (+ lm_weight * next-token).

    Each step draws batch_size memories, cuts a short query-like view of each (policy.views) and trains it to
    find its memory among the current vectors of every training memory ("store" negatives), while
    anchor_batch whole memories are pulled to their current vectors, so that the index built from the
    adapted model keeps its layout and only what short queries reach changes. Without vectors the two views
    of each memory meet in-batch negatives instead, both through the model.

    The base model is never written; a private copy runs with W + s * B @ A on each target, and the gradient G
    of a target's effective weight (for the tied embedding: lookup plus head) is projected onto the adapter as
    gA = s * B^T @ G, gB = s * G @ A^T.

    Args:
        base: the base LMEmbedder (model, tokenizer, max_tokens).
        texts: the training memories.
        policy: rank, alpha, targets, lr, steps, batch sizes, weights, CPU budget, seed.
        init: start from this adapter (same targets and rank) instead of zero.
        should_stop: polled before each step; True ends training early.
        vectors: (N, D) the current vectors of `texts` (e.g. stored): the fixed targets of "store" negatives
            and of the anchor term; without them training uses "batch" negatives and no anchor.
        pairs: (query, index into texts, weight) from the store's query log: real queries, each with the memory
            it found (a pseudo-label) or was told was useful. With "store" negatives, each step also trains
            query_batch of them to retrieve their memory, weighted by weight * policy.query_weight.
    Returns:
        FitResult (weights carry base_fingerprint = base.fingerprint).
    Raises:
        InvalidInput: base is not an LMEmbedder, a target is not a 2-D weight, or no text has any token.
    """
    _check_lm_embedder(base, "fit_adapter()")
    model, tok = base.model, base.tokenizer
    targets = policy.targets or default_targets(model.config)
    for t in targets:
        if t not in model.params or np.ndim(model.params[t]) != 2:
            raise InvalidInput(f"fit_adapter() target {t!r} is not a 2-D weight of the model.")
    encoded = [list(tok.encode(t))[: base.max_tokens] for t in texts]
    keep = [i for i, t in enumerate(encoded) if t]
    token_lists = [encoded[i] for i in keep]
    if len(token_lists) < 2:
        raise InvalidInput(f"fit_adapter() expected at least 2 non-empty texts, got {len(token_lists)}.")
    current = None
    if vectors is not None:
        current = np.asarray(vectors, dtype=np.float32)
        if current.ndim != 2 or len(current) != len(texts):
            raise InvalidInput(f"fit_adapter() expected vectors of shape ({len(texts)}, D), got {current.shape}.")
        current = current[keep]  # (N, D)
        split = getattr(base, "model_dimensions", None)
        if split is not None:  # the model's part of each vector (it has a lexicon part, which is not adapted)
            current = current[:, :split]  # (N, C)
        current = current / np.maximum(np.linalg.norm(current, axis=1, keepdims=True), _EPS)  # (N, D) unit
    to_store = current is not None and policy.negatives == "store"
    where = {orig: pos for pos, orig in enumerate(keep)}
    logged = []  # (query tokens, row in token_lists, weight)
    for query, idx, weight in pairs or ():
        q = list(tok.encode(query))[: policy.train_tokens]
        if q and int(idx) in where and weight > 0:
            logged.append((q, where[int(idx)], float(weight)))
    anchored = current is not None and policy.anchor_weight > 0
    asymmetric = policy.views != "two-spans"
    word_lists = [texts[i].split() for i in keep] if asymmetric else []
    rare = policy.views in ("words-memory", "rare-span-memory", "sentence-or-span")
    idf = word_weights(word_lists) if rare else [np.ones(len(w)) for w in word_lists]
    rng = np.random.default_rng(policy.seed)
    shapes = {t: tuple(int(d) for d in np.shape(model.params[t])) for t in targets}  # 2-D: (rows, cols)
    adapters = {t: LoRAAdapter(shapes[t][0], shapes[t][1], rank=min(policy.rank, *shapes[t]), alpha=float(policy.alpha),
                               seed=[policy.seed, i]) for i, t in enumerate(targets)}
    if init is not None and tuple(init.tensors) == tuple(targets) and all(
            adapters[t].rank == init.rank and float(init.alpha) == adapters[t].alpha for t in targets):
        for t, (a_init, b_init) in init.tensors.items():
            adapters[t].A[...] = a_init
            adapters[t].B[...] = b_init
    params = {}
    for t, ad in adapters.items():
        params[f"{t}.A"], params[f"{t}.B"] = ad.A, ad.B
    opt = AdamW(params, lr=float(policy.lr), weight_decay=0.0)
    base_w = {t: np.asarray(model.params[t], dtype=np.float32) for t in targets}
    work = type(model).from_params(model.config, model.params)  # private copy; the serving model is never touched
    # the pooling block never reaches the next-token loss: with only pool.* targets that term is skipped
    lm_ok = ([i for i, t in enumerate(token_lists) if len(t) >= 2]
             if any(not t.startswith("pool.") for t in targets) else [])
    n = len(token_lists)
    b = min(policy.batch_size, n)
    losses: list = []
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    stopped = False
    for step in range(policy.steps):
        if should_stop is not None and should_stop():
            stopped = True
            break
        spent = time.thread_time() - cpu0
        if spent >= policy.max_cpu_seconds:
            break
        progress = max(step / max(policy.steps, 1),
                       spent / policy.max_cpu_seconds if policy.max_cpu_seconds > 0 else 1.0)
        lr = float(policy.lr) * (0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) if policy.lr_schedule == "cosine"
                                 else 1.0)
        for t, ad in adapters.items():
            work.params[t] = base_w[t] + ad.delta()  # (rows, cols)
        pick = rng.choice(n, size=b, replace=False)  # (B,)
        if asymmetric:  # a short query-like view of each memory
            views = [list(tok.encode(query_view(word_lists[i], idf[i], rng, policy)))[: policy.train_tokens]
                     or token_lists[i][:1] for i in pick]
        else:
            views = [token_span(token_lists[i], rng) for i in pick]
        grads_w = {t: np.zeros_like(base_w[t]) for t in targets}  # (rows, cols) each
        con_loss = lm_loss = 0.0
        if policy.contrastive_weight > 0:
            if to_store and current is not None:  # the short views against the fixed vectors of every memory
                tokens, lengths = pad_batch(views)  # (B, T), (B,)
                pooled, cache = work.pooled_forward(tokens, lengths)  # (B, C)
                con_loss, dpooled = retrieval_loss_and_grad(pooled, current, pick, float(policy.temperature))
            else:  # two views of each memory through the model, in-batch negatives
                second = ([token_lists[i][: policy.train_tokens] for i in pick] if asymmetric
                          else [token_span(token_lists[i], rng) for i in pick])
                tokens, lengths = pad_batch(views + second)  # (2B, T), (2B,)
                pooled, cache = work.pooled_forward(tokens, lengths)  # (2B, C)
                con_loss, dpooled = contrastive_loss_and_grad(pooled, float(policy.temperature))
            g = work.pooled_backward(dpooled, cache, grads_for=targets)
            for t in targets:
                grads_w[t] += np.float32(policy.contrastive_weight) * g[t]
        # real queries to the memory they found
        if to_store and current is not None and logged and policy.query_weight > 0:
            sub = rng.choice(len(logged), size=min(policy.query_batch, len(logged)), replace=False)  # (Q,)
            tokens, lengths = pad_batch([logged[i][0] for i in sub])  # (Q, T), (Q,)
            pooled, cache = work.pooled_forward(tokens, lengths)  # (Q, C)
            q_loss, dpooled = retrieval_loss_and_grad(
                pooled, current, np.array([logged[i][1] for i in sub], dtype=np.intp), float(policy.temperature),
                weights=np.array([logged[i][2] for i in sub], dtype=np.float32))
            con_loss += float(policy.query_weight) * q_loss
            g = work.pooled_backward(dpooled, cache, grads_for=targets)
            for t in targets:
                grads_w[t] += np.float32(policy.query_weight) * g[t]
        if anchored and current is not None:  # whole memories keep their current vectors
            sub = rng.choice(n, size=min(policy.anchor_batch, n), replace=False)  # (A,)
            tokens, lengths = pad_batch([token_lists[i] for i in sub])  # (A, T), (A,)
            pooled, cache = work.pooled_forward(tokens, lengths)  # (A, C)
            _, dpooled = anchor_loss_and_grad(pooled, current[sub])
            g = work.pooled_backward(dpooled, cache, grads_for=targets)
            for t in targets:
                grads_w[t] += np.float32(policy.anchor_weight) * g[t]
        if policy.lm_weight > 0 and lm_ok:
            sub = rng.choice(len(lm_ok), size=min(policy.lm_batch, len(lm_ok)), replace=False)  # (b,)
            seq_tokens, seq_lengths = pad_batch([token_lists[lm_ok[i]] for i in sub])  # (b, T), (b,)
            lm_loss, g = work.loss_and_grads(seq_tokens, seq_lengths, grads_for=targets)
            for t in targets:
                grads_w[t] += np.float32(policy.lm_weight) * g[t]
        grads = {}
        for t, ad in adapters.items():
            grads[f"{t}.A"], grads[f"{t}.B"] = ad.project_grad(grads_w[t])
        if policy.max_grad_norm > 0:
            clip_grad_norm_(grads, float(policy.max_grad_norm))
        opt.step(grads, lr=lr)
        losses.append((step, float(lm_loss), float(con_loss)))
    done = len(losses)
    weights = LoRAWeights(
        rank=next(iter(adapters.values())).rank, alpha=float(policy.alpha),
        tensors={t: (ad.A.copy(), ad.B.copy()) for t, ad in adapters.items()}, base_fingerprint=base.fingerprint,
    )
    return FitResult(weights, done, losses, time.perf_counter() - wall0, time.thread_time() - cpu0, stopped)
