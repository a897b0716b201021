"""Bidirectional multi-head self-attention: the embedder's long-range mixing block.

EvermindLM's conv layers see only a short causal window; before pooling, the embedder lets every real
position attend to every other real position once. This file holds that block's forward/backward pair and the
pooling block built from it (norm, attention, residual, norm, mean). Shape letters as in model.py, plus N
heads and D = C // N.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import numpy as np

from evermind_memory.lm.layers import rmsnorm_backward, rmsnorm_forward

_MASKED = -1e9  # added to scores of padded keys; exp() underflows to exactly 0 in float32 and float64


class AttentionCache(NamedTuple):
    x: np.ndarray  # (B, T, C) block input
    q: np.ndarray  # (B, N, T, D)
    k: np.ndarray  # (B, N, T, D)
    v: np.ndarray  # (B, N, T, D)
    p: np.ndarray  # (B, N, T, T) attention probabilities
    o: np.ndarray  # (B, T, C) heads concatenated, before the output projection


def key_mask(lengths: np.ndarray, T: int, dtype) -> np.ndarray:
    """Additive score mask: 0 for real keys, a large negative number for padded keys."""
    real = np.arange(T)[None, :] < lengths[:, None]  # (B, T)
    return np.where(real, 0.0, _MASKED).astype(dtype)[:, None, None, :]  # (B, 1, 1, T)


def attention_forward(x, wqkv, wo, lengths, n_heads):
    """Self-attention over real positions: softmax(q kᵀ / sqrt(D)) v, then the output projection.

    Args:
        x: (B, T, C) input (already normalised by the caller).
        wqkv: (C, 3C) joint query/key/value projection; columns [0:C] are q, [C:2C] k, [2C:3C] v.
        wo: (C, C) output projection.
        lengths: (B,) number of real positions per row (right padding).
        n_heads: N, which must divide C.

    Returns:
        (y, cache): y (B, T, C), and the cache for `attention_backward`.
    """
    B, T, C = x.shape
    D = C // n_heads
    qkv = (x.reshape(B * T, C) @ wqkv).reshape(B, T, 3, n_heads, D)  # (B, T, 3, N, D)
    q = np.ascontiguousarray(qkv[:, :, 0].transpose(0, 2, 1, 3))  # (B, N, T, D)
    k = np.ascontiguousarray(qkv[:, :, 1].transpose(0, 2, 1, 3))  # (B, N, T, D)
    v = np.ascontiguousarray(qkv[:, :, 2].transpose(0, 2, 1, 3))  # (B, N, T, D)
    scale = x.dtype.type(1.0 / np.sqrt(D))
    s = (q @ k.transpose(0, 1, 3, 2)) * scale + key_mask(lengths, T, x.dtype)  # (B, N, T, T)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)  # (B, N, T, T)
    p /= p.sum(axis=-1, keepdims=True)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(B, T, C)  # (B, T, C)
    y = (o.reshape(B * T, C) @ wo).reshape(B, T, C)  # (B, T, C)
    return y, AttentionCache(x, q, k, v, p, o)


def attention_backward(dy, cache: AttentionCache, wqkv, wo, n_heads):
    """Exact backward of `attention_forward`.

    Returns:
        (dx, dwqkv, dwo) with the shapes of x, wqkv and wo.
    """
    x, q, k, v, p, o = cache
    B, T, C = x.shape
    D = C // n_heads
    scale = x.dtype.type(1.0 / np.sqrt(D))
    dy2 = dy.reshape(B * T, C)  # (B*T, C)
    dwo = o.reshape(B * T, C).T @ dy2  # (C, C)
    do = (dy2 @ wo.T).reshape(B, T, n_heads, D).transpose(0, 2, 1, 3)  # (B, N, T, D)
    dp = do @ v.transpose(0, 1, 3, 2)  # (B, N, T, T)
    dv = p.transpose(0, 1, 3, 2) @ do  # (B, N, T, D)
    # Softmax backward row by row: ds = p * (dp - sum(dp * p)). Masked keys have p == 0, so no gradient.
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))  # (B, N, T, T)
    ds *= scale
    dq = ds @ k  # (B, N, T, D)
    dk = ds.transpose(0, 1, 3, 2) @ q  # (B, N, T, D)
    dqkv = np.stack([dq, dk, dv], axis=2)  # (B, N, 3, T, D)
    dqkv = dqkv.transpose(0, 3, 2, 1, 4).reshape(B * T, 3 * C)  # (B*T, 3C)
    dwqkv = x.reshape(B * T, C).T @ dqkv  # (C, 3C)
    dx = (dqkv @ wqkv.T).reshape(B, T, C)  # (B, T, C)
    return dx, dwqkv, dwo


# ── the embedder's pooling block: [h += attn(norm(h)); h = norm(h)] when heads, then mean ──────────────


def pool_forward(
    params: Mapping[str, np.ndarray], h: np.ndarray, lengths: np.ndarray, heads: int, keep_cache: bool
) -> tuple[np.ndarray, Any]:
    """The embedder's pooling over final hidden states; heads=0 means a plain mean over real positions.

    h is (B, T, C) with zeros at padded positions; returns the unnormalised (B, C) mean and a cache
    (None for the inner block unless keep_cache).
    """
    b, t, c = h.shape
    real = np.arange(t)[None, :] < lengths[:, None]  # (B, T)
    if not heads:
        return h.sum(axis=1) / lengths[:, None].astype(h.dtype), (real, None)  # (B, C)
    a, norm1 = rmsnorm_forward(h.reshape(b * t, c), params["pool.attn_norm"])  # (B*T, C)
    y, attn = attention_forward(a.reshape(b, t, c), params["pool.wqkv"], params["pool.wo"], lengths,
                                heads)  # (B, T, C)
    o, norm2 = rmsnorm_forward((h + y).reshape(b * t, c), params["pool.out_norm"])  # (B*T, C)
    o = o.reshape(b, t, c) * real[..., None]  # (B, T, C): padded queries never reach the mean
    pooled = o.sum(axis=1) / lengths[:, None].astype(h.dtype)  # (B, C)
    return pooled, ((real, (norm1, attn, norm2)) if keep_cache else (real, None))


def pool_backward(
    params: Mapping[str, np.ndarray], dpooled: np.ndarray, lengths: np.ndarray, cache: Any, heads: int,
    grads: dict, need: frozenset[str] | None = None,
) -> np.ndarray:
    """Backward of `pool_forward`: fills the pool.* grads (those in need, when given); returns dh (B, T, C)."""
    real, inner = cache
    b, t = real.shape
    c = dpooled.shape[1]
    do = (dpooled / lengths[:, None].astype(dpooled.dtype))[:, None, :] * real[..., None]  # (B, T, C)
    if not heads:
        return do
    norm1, attn, norm2 = inner
    found = {}
    dz, found["pool.out_norm"] = rmsnorm_backward(
        do.reshape(b * t, c), norm2, gain_grad=need is None or "pool.out_norm" in need)  # (B*T, C)
    da, found["pool.wqkv"], found["pool.wo"] = attention_backward(
        dz.reshape(b, t, c), attn, params["pool.wqkv"], params["pool.wo"], heads)  # (B, T, C)
    dh, found["pool.attn_norm"] = rmsnorm_backward(
        da.reshape(b * t, c), norm1, gain_grad=need is None or "pool.attn_norm" in need)  # (B*T, C)
    grads.update({n: g for n, g in found.items() if need is None or n in need})
    return (dh + dz).reshape(b, t, c)  # residual: z = h + y
