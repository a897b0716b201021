"""Forward/backward pairs for the EvermindLM layers, in batched numpy.

Shapes: B batch, T time, C channels (d_model), V vocab, E experts, K conv width, H expert hidden width,
N flattened real rows, M predicted rows. Each `*_forward` returns `(y, cache)`, each `*_backward` takes
`(dy, cache)`; the maths follow the dtype of the inputs (float32 in product use, float64 in gradient checks).
The mixture of experts that combines `ffn_*` and `router_*` lives in `moe.py`.
"""

from __future__ import annotations

from typing import Container, NamedTuple

import numpy as np

RMS_EPS = 1e-5  # inside the sqrt, so an all-zero row normalises to zero instead of dividing by zero


# ── embedding lookup ──────────────────────────────────────────────────────────


class EmbedCache(NamedTuple):
    tokens: np.ndarray  # (N,) int, the ids that were looked up


def embed_forward(emb: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, EmbedCache]:
    """Look up token rows of the embedding table.

    Args:
        emb: (V, C) embedding table.
        tokens: (N,) integer ids in [0, V) (validated by the caller).

    Returns:
        x: (N, C) rows, and the cache for `embed_backward`.
    """
    x = np.take(emb, tokens, axis=0)  # (N, C)
    return x, EmbedCache(tokens)


def embed_backward(dx: np.ndarray, cache: EmbedCache, d_emb: np.ndarray) -> np.ndarray:
    """Add the lookup's gradient into `d_emb` (tied weights: never assign, always add).

    Args:
        dx: (N, C) gradient of the looked-up rows.
        cache: from `embed_forward`.
        d_emb: (V, C) gradient accumulator, updated in place.

    Returns:
        `d_emb`.
    """
    tokens = cache.tokens
    if tokens.size == 0:
        return d_emb
    # Sort + reduceat sums repeated ids in one pass; about twice as fast as np.add.at on (N, C) rows.
    order = np.argsort(tokens, kind="stable")  # (N,)
    sorted_tokens = tokens[order]  # (N,)
    starts = np.flatnonzero(np.concatenate(([True], sorted_tokens[1:] != sorted_tokens[:-1])))  # (U,)
    sums = np.add.reduceat(dx[order], starts, axis=0)  # (U, C)
    d_emb[sorted_tokens[starts]] += sums  # ids in `starts` are unique, so fancy += adds once each
    return d_emb


# ── RMSNorm ───────────────────────────────────────────────────────────────────


class RMSNormCache(NamedTuple):
    xhat: np.ndarray  # (N, C) x / rms
    rinv: np.ndarray  # (N, 1) 1 / rms
    gain: np.ndarray  # (C,)


def rmsnorm_forward(x: np.ndarray, gain: np.ndarray) -> tuple[np.ndarray, RMSNormCache]:
    """RMSNorm over the last axis: y = gain * x / sqrt(mean(x^2) + eps).

    Args:
        x: (N, C) rows.
        gain: (C,) per-channel gain.

    Returns:
        y: (N, C), and the cache for `rmsnorm_backward`.
    """
    c = x.shape[-1]
    ms = np.einsum("nc,nc->n", x, x) / c  # (N,)
    rinv = 1.0 / np.sqrt(ms + RMS_EPS)  # (N,)
    rinv = rinv[:, None]  # (N, 1)
    xhat = x * rinv  # (N, C)
    y = xhat * gain  # (N, C)
    return y, RMSNormCache(xhat, rinv, gain)


def rmsnorm_backward(
    dy: np.ndarray, cache: RMSNormCache, *, gain_grad: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """Backward of `rmsnorm_forward`.

    dx = rinv * (g*dy - xhat * mean(g*dy*xhat)), dgain = sum_rows dy * xhat.

    Args:
        dy: (N, C) upstream gradient.
        cache: from `rmsnorm_forward`.
        gain_grad: False skips dgain (a frozen gain) and returns None in its place.

    Returns:
        dx: (N, C), dgain: (C,) or None.
    """
    xhat, rinv, gain = cache
    c = xhat.shape[-1]
    dgain = np.einsum("nc,nc->c", dy, xhat) if gain_grad else None  # (C,)
    gdy = dy * gain  # (N, C)
    proj = np.einsum("nc,nc->n", gdy, xhat) / c  # (N,)
    dx = gdy - xhat * proj[:, None]  # (N, C)
    dx *= rinv
    return dx, dgain


# ── causal depthwise convolution ──────────────────────────────────────────────


class ConvCache(NamedTuple):
    x: np.ndarray  # (B, T, C) conv input
    w: np.ndarray  # (K, C) taps


def conv_forward(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, ConvCache]:
    """Causal depthwise convolution: y[:, t] = sum_k w[k] * x[:, t - k] (zero before t = 0).

    Right padding is safe: no output at t reads an input after t.

    Args:
        x: (B, T, C) input.
        w: (K, C) taps; tap k multiplies the input k steps back.

    Returns:
        y: (B, T, C), and the cache for `conv_backward`.
    """
    t_len = x.shape[1]
    y = x * w[0]  # (B, T, C)
    for k in range(1, min(w.shape[0], t_len)):
        y[:, k:] += x[:, : t_len - k] * w[k]
    return y, ConvCache(x, w)


def conv_backward(
    dy: np.ndarray, cache: ConvCache, *, weight_grad: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """Backward of `conv_forward`.

    Args:
        dy: (B, T, C) upstream gradient.
        cache: from `conv_forward`.
        weight_grad: False skips dw (frozen taps) and returns None in its place.

    Returns:
        dx: (B, T, C), dw: (K, C) or None.
    """
    x, w = cache
    t_len = x.shape[1]
    dw = None
    if weight_grad:
        dw = np.zeros_like(w)  # (K, C)
        dw[0] = np.einsum("btc,btc->c", dy, x)
    dx = dy * w[0]  # (B, T, C)
    for k in range(1, min(w.shape[0], t_len)):
        if weight_grad:
            dw[k] = np.einsum("btc,btc->c", dy[:, k:], x[:, : t_len - k])
        dx[:, : t_len - k] += dy[:, k:] * w[k]
    return dx, dw


# ── expert feed-forward ───────────────────────────────────────────────────────


class FFNCache(NamedTuple):
    x: np.ndarray  # (N, C) input rows
    h: np.ndarray  # (N, H) relu activations (h > 0 is the relu mask, so pre-activations are not kept)
    w1: np.ndarray  # (C, H)
    w2: np.ndarray  # (H, C)


def ffn_forward(
    x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray
) -> tuple[np.ndarray, FFNCache]:
    """Two-layer ReLU expert: y = relu(x @ w1 + b1) @ w2 + b2.

    Args:
        x: (N, C) rows; w1: (C, H); b1: (H,); w2: (H, C); b2: (C,).

    Returns:
        y: (N, C), and the cache for `ffn_backward`.
    """
    h = x @ w1  # (N, H)
    h += b1
    np.maximum(h, 0, out=h)
    y = h @ w2  # (N, C)
    y += b2
    return y, FFNCache(x, h, w1, w2)


def ffn_backward(
    dy: np.ndarray, cache: FFNCache, *, weights: Container[str] | None = None
) -> tuple[np.ndarray, tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray | None]]:
    """Backward of `ffn_forward`.

    Args:
        dy: (N, C) upstream gradient.
        cache: from `ffn_forward`.
        weights: which of "w1", "b1", "w2", "b2" to compute gradients for (None: all); the others are
            skipped (no matmul) and returned as None. dx is always computed.

    Returns:
        dx: (N, C), and (dw1 (C, H), db1 (H,), dw2 (H, C), db2 (C,)), each None when skipped.
    """
    x, h, w1, w2 = cache
    dw1 = db1 = dw2 = db2 = None
    if weights is None or "w2" in weights:
        dw2 = h.T @ dy  # (H, C)
    if weights is None or "b2" in weights:
        db2 = dy.sum(axis=0)  # (C,)
    dpre = dy @ w2.T  # (N, H)
    dpre *= h > 0  # relu'(pre) = 1 where pre > 0, which is where h > 0
    if weights is None or "w1" in weights:
        dw1 = x.T @ dpre  # (C, H)
    if weights is None or "b1" in weights:
        db1 = dpre.sum(axis=0)  # (H,)
    dx = dpre @ w1.T  # (N, C)
    return dx, (dw1, db1, dw2, db2)


# ── top-k router ──────────────────────────────────────────────────────────────


class RouterCache(NamedTuple):
    x: np.ndarray  # (N, C) router input
    w: np.ndarray  # (C, E)
    experts: np.ndarray  # (N, k) selected expert ids, highest logit first
    gates: np.ndarray  # (N, k) softmax over the selected logits


def router_forward(x: np.ndarray, w: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray, RouterCache]:
    """Pick the top-k experts per row by router logit; gates are a softmax over the chosen logits only.

    Ties go to the lower expert id (a stable sort), as in the reference.

    Args:
        x: (N, C) rows; w: (C, E) router weights; top_k: experts per row (1 <= top_k <= E).

    Returns:
        experts: (N, k) int ids, gates: (N, k), and the cache for `router_backward`.
    """
    logits = x @ w  # (N, E)
    experts = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]  # (N, k)
    sel = np.take_along_axis(logits, experts, axis=1)  # (N, k)
    gates = np.exp(sel - sel[:, :1])  # (N, k) column 0 holds the row max
    gates /= gates.sum(axis=1, keepdims=True)
    return experts, gates, RouterCache(x, w, experts, gates)


def router_backward(
    dgates: np.ndarray, cache: RouterCache, *, weight_grad: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """Backward of `router_forward` through the softmax over the selected logits.

    Unselected logits get no gradient (top-k selection is piecewise constant).

    Args:
        dgates: (N, k) gradient of the gates.
        cache: from `router_forward`.
        weight_grad: False skips dw (a frozen router) and returns None in its place.

    Returns:
        dx: (N, C), dw: (C, E) or None.
    """
    x, w, experts, gates = cache
    dot = np.einsum("nk,nk->n", gates, dgates)  # (N,)
    dsel = gates * (dgates - dot[:, None])  # (N, k)
    dlogits = np.zeros((x.shape[0], w.shape[1]), dtype=dsel.dtype)  # (N, E)
    np.put_along_axis(dlogits, experts, dsel, axis=1)
    dw = x.T @ dlogits if weight_grad else None  # (C, E)
    dx = dlogits @ w.T  # (N, C)
    return dx, dw


# ── tied head and cross-entropy ───────────────────────────────────────────────


class UnembedCache(NamedTuple):
    h: np.ndarray  # (M, C) hidden rows fed to the head
    emb: np.ndarray  # (V, C) tied embedding


def unembed_forward(h: np.ndarray, emb: np.ndarray) -> tuple[np.ndarray, UnembedCache]:
    """Tied output head: logits = h @ emb.T.

    Args:
        h: (M, C) hidden rows; emb: (V, C) embedding table.

    Returns:
        logits: (M, V), and the cache for `unembed_backward`.
    """
    logits = h @ emb.T  # (M, V)
    return logits, UnembedCache(h, emb)


def unembed_backward(
    dlogits: np.ndarray, cache: UnembedCache, d_emb: np.ndarray | None = None, *, weight_grad: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """Backward of `unembed_forward`; the head's weight gradient is added into `d_emb`.

    Args:
        dlogits: (M, V) upstream gradient.
        cache: from `unembed_forward`.
        d_emb: optional (V, C) accumulator, updated in place; a new one is made when None.
        weight_grad: False skips the (V, C) weight gradient (a frozen embedding); `d_emb` is returned
            untouched.

    Returns:
        dh: (M, C), and `d_emb`.
    """
    h, emb = cache
    dh = dlogits @ emb  # (M, C)
    if not weight_grad:
        return dh, d_emb
    if d_emb is None:
        d_emb = dlogits.T @ h  # (V, C)
    else:
        d_emb += dlogits.T @ h  # (V, C)
    return dh, d_emb


class CrossEntropyCache(NamedTuple):
    probs: np.ndarray  # (M, V) softmax of the logits (may share memory with them)
    targets: np.ndarray  # (M,) int


def cross_entropy_forward(
    logits: np.ndarray, targets: np.ndarray, *, inplace: bool = False
) -> tuple[float, CrossEntropyCache]:
    """Mean cross-entropy of `targets` under softmax(`logits`), row-wise.

    Args:
        logits: (M, V) scores, M >= 1.
        targets: (M,) integer ids in [0, V).
        inplace: overwrite `logits` with the softmax probabilities (saves one (M, V) buffer, which
            dominates memory for a large V).

    Returns:
        loss (float, the mean over rows), and the cache for `cross_entropy_backward`.
    """
    probs = logits if inplace else logits.copy()  # (M, V)
    rows = np.arange(probs.shape[0])  # (M,)
    probs -= probs.max(axis=1, keepdims=True)  # stability: exp never overflows
    target_logit = probs[rows, targets]  # (M,)
    np.exp(probs, out=probs)
    total = probs.sum(axis=1)  # (M,)
    probs /= total[:, None]
    loss = float(np.mean(np.log(total) - target_logit, dtype=np.float64))  # float64 sum over M rows
    return loss, CrossEntropyCache(probs, targets)


def cross_entropy_backward(cache: CrossEntropyCache, dloss: float = 1.0) -> np.ndarray:
    """Backward of `cross_entropy_forward`: (softmax - onehot) * dloss / M.

    Reuses (overwrites) the cached probabilities, so call it once per cache.

    Args:
        cache: from `cross_entropy_forward`.
        dloss: gradient of the final objective with respect to the mean loss.

    Returns:
        dlogits: (M, V).
    """
    probs, targets = cache
    m = probs.shape[0]
    dlogits = probs  # (M, V) in place
    dlogits[np.arange(m), targets] -= 1.0
    dlogits *= dloss / m
    return dlogits
