"""Row softmax and token cross-entropy.
"""

from __future__ import annotations

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import get_device
from evermind_memory.gpu.ops.support import BufferScope, check_f32, fold_groups, check_ids, rows_of, binding_tiles

__all__ = ["softmax_numpy", "softmax", "cross_entropy_numpy", "cross_entropy"]


def softmax_numpy(x: np.ndarray) -> np.ndarray:
    """Numpy twin of `softmax` over the last axis."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))  # (..., V)
    return e / e.sum(axis=-1, keepdims=True)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis on the GPU.

    Args:
        x: float32 (..., V) with V >= 1.

    Returns:
        float32 of x's shape; each last-axis row sums to 1.

    Raises:
        InvalidInput: wrong dtype or contiguity, or an empty last axis.
        GpuUnavailable: no GPU device.
    """
    rows, v = rows_of("x", x)
    if v == 0:
        raise InvalidInput("softmax needs a non-empty last axis, got shape " + str(x.shape))
    dev = get_device()
    out = np.empty_like(x)  # (..., V)
    flat_x, flat_out = x.reshape(rows, v), out.reshape(rows, v)  # (N, V)
    with BufferScope(dev) as s:
        for r0, r1 in binding_tiles(rows, v * 4, dev, "row"):
            n = r1 - r0
            batch = dev.batch()
            y_buf = s.empty(n * v * 4)
            params = batch.uniform([("u", n), ("u", v), ("u", 0), ("u", 0)])
            batch.dispatch("softmax", "main", {0: params, 1: s.up(flat_x[r0:r1]), 2: y_buf}, fold_groups(dev, n))
            batch.submit()
            flat_out[r0:r1] = dev.read(y_buf, np.float32, (n, v))
    return out


def _ce_weights(n: int, valid: np.ndarray | None) -> np.ndarray:
    if valid is None:
        mask = np.ones(n, dtype=bool)  # (N,)
    else:
        if not isinstance(valid, np.ndarray) or valid.shape != (n,):
            raise InvalidInput(f"valid must be a numpy array of shape ({n},), got {getattr(valid, 'shape', valid)}")
        mask = valid.astype(bool)  # (N,)
    count = int(mask.sum())
    return (mask / max(count, 1)).astype(np.float32)  # (N,)


def cross_entropy_numpy(logits: np.ndarray, targets: np.ndarray,
                        valid: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """Numpy twin of `cross_entropy`: (mean loss over valid rows, dlogits (N, V))."""
    n, _ = logits.shape
    wts = _ce_weights(n, valid)  # (N,)
    m = logits.max(axis=1, keepdims=True)  # (N, 1)
    e = np.exp(logits - m)  # (N, V)
    total = e.sum(axis=1, keepdims=True)  # (N, 1)
    tgt = np.where(wts > 0, targets, 0)  # (N,)
    rows = np.arange(n)  # (N,)
    loss_rows = (np.log(total[:, 0]) + m[:, 0] - logits[rows, tgt]) * wts  # (N,)
    grad = e / total  # (N, V)
    grad[rows, tgt] -= 1.0
    grad *= wts[:, None]
    return float(loss_rows.sum(dtype=np.float64)), grad


def cross_entropy(logits: np.ndarray, targets: np.ndarray,
                  valid: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """Softmax cross-entropy, averaged over the valid rows, and its gradient, on the GPU.

    Args:
        logits: float32 (N, V).
        targets: integer (N,), each in [0, V) where valid (padded rows may hold anything).
        valid: optional (N,) bool mask of rows that count; all rows count when None.

    Returns:
        (loss, dlogits): loss is the mean over valid rows (0.0 when none), dlogits (N, V) float32 is
        (softmax - onehot) / n_valid on valid rows and 0 elsewhere.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, or a valid target out of range.
        GpuUnavailable: no GPU device.
    """
    check_f32("logits", logits, 2)
    n, v = logits.shape
    if v == 0:
        raise InvalidInput("cross_entropy needs V >= 1 columns of logits")
    wts = _ce_weights(n, valid)  # (N,)
    if not isinstance(targets, np.ndarray) or not np.issubdtype(targets.dtype, np.integer) or targets.shape != (n,):
        got = getattr(targets, "shape", targets)
        raise InvalidInput(f"targets must be an integer numpy array of shape ({n},), got {got}")
    tg = np.where(wts > 0, targets, 0)  # (N,)
    tg = check_ids("targets", tg, 1, 0, v)
    dev = get_device()
    grad = np.empty_like(logits)  # (N, V)
    total = 0.0
    with BufferScope(dev) as s:
        for r0, r1 in binding_tiles(n, v * 4, dev, "row"):
            k = r1 - r0
            batch = dev.batch()
            g_buf, l_buf = s.empty(k * v * 4), s.empty(k * 4)
            params = batch.uniform([("u", k), ("u", v), ("u", 0), ("u", 0)])
            batch.dispatch("cross_entropy", "main",
                           {0: params, 1: s.up(logits[r0:r1]), 2: s.up(tg[r0:r1]), 3: s.up(wts[r0:r1]),
                            4: g_buf, 5: l_buf}, fold_groups(dev, k))
            batch.submit()
            grad[r0:r1] = dev.read(g_buf, np.float32, (k, v))
            total += float(dev.read(l_buf, np.float32, (k,)).sum(dtype=np.float64))
    return total, grad
