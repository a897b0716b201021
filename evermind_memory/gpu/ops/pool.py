"""The embedder's pooling kernels: attention over each sequence's real tokens, and the masked mean.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import get_device
from evermind_memory.gpu.ops.support import BufferScope, check_f32, check_fits, fold_groups, check_ids, check_shape

__all__ = ["pool_attention_numpy", "pool_attention", "mean_pool_numpy", "mean_pool"]


_POOL_ATTENTION_MAX_T = 1024  # pool_attention.wgsl keeps one query's scores in workgroup memory


def _check_lengths(lengths: Any, b: int, t: int) -> np.ndarray:
    lens = check_ids("lengths", np.asarray(lengths), 1, 1, t + 1)
    check_shape("lengths", lens, (b,))
    return lens.astype(np.uint32)


def pool_attention_numpy(qkv: np.ndarray, lengths: np.ndarray, n_heads: int) -> np.ndarray:
    """Numpy twin of `pool_attention`: per-head softmax(q k^T / sqrt(D)) v over real keys; padded queries 0."""
    b, t, c3 = qkv.shape
    c = c3 // 3
    d = c // n_heads
    heads = qkv.reshape(b, t, 3, n_heads, d).transpose(2, 0, 3, 1, 4)  # (3, B, N, T, D)
    q, k, v = heads[0], heads[1], heads[2]  # (B, N, T, D) each
    real = np.arange(t)[None, :] < np.asarray(lengths)[:, None]  # (B, T)
    s = (q @ k.transpose(0, 1, 3, 2)) * qkv.dtype.type(1.0 / np.sqrt(d))  # (B, N, T, T)
    s = np.where(real[:, None, None, :], s, -np.inf)  # (B, N, T, T)
    p = np.exp(s - s.max(axis=-1, keepdims=True))  # (B, N, T, T)
    p /= p.sum(axis=-1, keepdims=True)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(b, t, c)  # (B, T, C)
    return (o * real[..., None]).astype(qkv.dtype, copy=False)


def pool_attention(qkv: np.ndarray, lengths: np.ndarray, n_heads: int) -> np.ndarray:
    """The embedder's bidirectional attention (between its projections) on the GPU.

    Args:
        qkv: float32 (B, T, 3C): q, k and v column blocks, head h in columns [hD, (h+1)D) of each.
        lengths: integer (B,) real positions per sequence, 1 <= lengths[b] <= T.
        n_heads: heads N, dividing C.

    Returns:
        (B, T, C) float32 attention output; rows at padded positions are 0.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, lengths out of range, T > 1024, or heads
            not dividing C.
        GpuUnavailable: no GPU device.
    """
    check_f32("qkv", qkv, 3)
    b, t, c3 = qkv.shape
    if c3 % 3 or not isinstance(n_heads, (int, np.integer)) or n_heads < 1 or (c3 // 3) % n_heads:
        raise InvalidInput(f"qkv must be (B, T, 3C) with n_heads dividing C, got {qkv.shape}, n_heads={n_heads!r}")
    if t > _POOL_ATTENTION_MAX_T:
        raise InvalidInput(f"pool_attention supports T <= {_POOL_ATTENTION_MAX_T}, got T = {t}")
    lens = _check_lengths(lengths, b, t)
    c = c3 // 3
    dev = get_device()
    if qkv.size == 0:
        return np.zeros((b, t, c), dtype=np.float32)
    check_fits(dev, qkv.nbytes, "pool_attention")
    with BufferScope(dev) as s:
        batch = dev.batch()
        out = s.empty(b * t * c * 4)
        params = batch.uniform([("u", b), ("u", t), ("u", c), ("u", int(n_heads)),
                                ("f", 1.0 / np.sqrt(c // n_heads)), ("u", 0), ("u", 0), ("u", 0)])
        batch.dispatch("pool_attention", "main", {0: params, 1: s.up(qkv), 2: s.up(lens), 3: out},
                       fold_groups(dev, b * int(n_heads) * t))
        batch.submit()
        return dev.read(out, np.float32, (b, t, c))


def mean_pool_numpy(x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Numpy twin of `mean_pool`: the mean over real positions, L2-normalised (zero stays zero)."""
    b, t, _ = x.shape
    lens = np.asarray(lengths)
    real = np.arange(t)[None, :] < lens[:, None]  # (B, T)
    pooled = (x * real[..., None]).sum(axis=1) / lens[:, None].astype(x.dtype)  # (B, C)
    norms = np.sqrt(np.einsum("bc,bc->b", pooled, pooled))  # (B,)
    return (pooled / np.maximum(norms, x.dtype.type(1e-12))[:, None]).astype(x.dtype, copy=False)


def mean_pool(x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Mean over each sequence's real positions, L2-normalised, on the GPU (the embedding's last step).

    Args:
        x: float32 (B, T, C) hidden states.
        lengths: integer (B,) real positions per sequence, 1 <= lengths[b] <= T.

    Returns:
        (B, C) float32 unit rows (an exactly zero mean stays zero).

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, or lengths out of range.
        GpuUnavailable: no GPU device.
    """
    check_f32("x", x, 3)
    b, t, c = x.shape
    lens = _check_lengths(lengths, b, t)
    dev = get_device()
    if x.size == 0:
        return np.zeros((b, c), dtype=np.float32)
    check_fits(dev, x.nbytes, "mean_pool")
    with BufferScope(dev) as s:
        batch = dev.batch()
        out = s.empty(b * c * 4)
        params = batch.uniform([("u", b), ("u", t), ("u", c), ("u", 0)])
        batch.dispatch("mean_pool", "main", {0: params, 1: s.up(x), 2: s.up(lens), 3: out}, fold_groups(dev, b))
        batch.submit()
        return dev.read(out, np.float32, (b, c))
