"""Depthwise causal conv1d, forward and backward.
"""

from __future__ import annotations

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import Batch, GpuBuffer, get_device
from evermind_memory.gpu.ops.support import BufferScope, dispatch_1d, check_f32, check_shape, binding_tiles

__all__ = ["conv1d_causal_numpy", "conv1d_causal", "conv1d_causal_backward_numpy", "conv1d_causal_backward"]


def conv1d_causal_numpy(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Numpy twin of `conv1d_causal`: y[b, t, c] = bias[c] + sum_k w[k, c] * x[b, t - k, c]."""
    _, t_len, _ = x.shape
    y = np.zeros_like(x)  # (B, T, C)
    for k in range(w.shape[0]):  # loop over taps
        if k < t_len:
            y[:, k:, :] += w[k] * x[:, : t_len - k, :]
    if bias is not None:
        y += bias
    return y


def _conv_params(batch: Batch, b: int, t: int, c: int, k: int) -> GpuBuffer:
    return batch.uniform([("u", t), ("u", c), ("u", k), ("u", b), ("u", 1)])


def _check_conv(x: np.ndarray, w: np.ndarray) -> tuple[int, int, int, int]:
    check_f32("x", x, 3)
    check_f32("w", w, 2)
    b, t, c = x.shape
    if w.shape[1] != c or w.shape[0] < 1:
        raise InvalidInput(f"conv weight must be (K, C) with K >= 1 and C = {c}, got {w.shape}")
    return b, t, c, w.shape[0]


def conv1d_causal(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Depthwise causal conv over time on the GPU; tap k multiplies the input k steps back.

    Args:
        x: float32 (B, T, C).
        w: float32 (K, C).
        bias: optional float32 (C,).

    Returns:
        (B, T, C) float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes.
        GpuUnavailable: no GPU device.
    """
    b, t, c, k = _check_conv(x, w)
    if bias is not None:
        check_f32("bias", bias, 1)
        check_shape("bias", bias, (c,))
    dev = get_device()
    out = np.empty_like(x)  # (B, T, C)
    if x.size == 0:
        return out
    with BufferScope(dev) as s:
        w_buf = s.up(w)
        bias_buf = s.up(bias if bias is not None else np.zeros(c, dtype=np.float32))
        for b0, b1 in binding_tiles(b, t * c * 4, dev, "sequence"):
            batch = dev.batch()
            y_buf = s.empty((b1 - b0) * t * c * 4)
            dispatch_1d(batch, "conv1d_causal", "main",
                            {0: _conv_params(batch, b1 - b0, t, c, k), 1: s.up(x[b0:b1]), 2: w_buf,
                             3: bias_buf, 4: y_buf},
                            (b1 - b0) * t * c, {"HAS_BIAS": bias is not None})
            batch.submit()
            out[b0:b1] = dev.read(y_buf, np.float32, (b1 - b0, t, c))
    return out


def conv1d_causal_backward_numpy(x: np.ndarray, w: np.ndarray,
                                 dy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Numpy twin of `conv1d_causal_backward`: (dx (B, T, C), dw (K, C), db (C,))."""
    _, t_len, c = x.shape
    dx = np.zeros_like(x)  # (B, T, C)
    dw = np.zeros(w.shape, dtype=x.dtype)  # (K, C)
    for k in range(w.shape[0]):  # loop over taps
        if k < t_len:
            dx[:, : t_len - k, :] += w[k] * dy[:, k:, :]
            dw[k] = np.einsum("btc,btc->c", dy[:, k:, :], x[:, : t_len - k, :])
    db = dy.sum(axis=(0, 1))  # (C,)
    return dx, dw, db


def conv1d_causal_backward(x: np.ndarray, w: np.ndarray,
                           dy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of `conv1d_causal` on the GPU.

    Args:
        x: float32 (B, T, C), the forward input.
        w: float32 (K, C).
        dy: float32 (B, T, C).

    Returns:
        (dx (B, T, C), dw (K, C), db (C,)), all float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes.
        GpuUnavailable: no GPU device.
    """
    b, t, c, k = _check_conv(x, w)
    check_f32("dy", dy, 3)
    check_shape("dy", dy, x.shape)
    dev = get_device()
    dx = np.empty_like(x)  # (B, T, C)
    with BufferScope(dev) as s:
        w_buf = s.up(w)
        dw_buf = s.empty(k * c * 4)
        db_buf = s.empty(c * 4)
        batch = dev.batch()
        batch.clear(dw_buf)
        batch.clear(db_buf)
        for b0, b1 in binding_tiles(b, t * c * 4, dev, "sequence"):
            nb = b1 - b0
            params = _conv_params(batch, nb, t, c, k)
            x_buf, dy_buf, dx_buf = s.up(x[b0:b1]), s.up(dy[b0:b1]), s.empty(nb * t * c * 4)
            dispatch_1d(batch, "conv1d_causal_backward", "dx_main",
                            {0: params, 2: w_buf, 3: dy_buf, 4: dx_buf}, nb * t * c)
            batch.dispatch("conv1d_causal_backward", "dw_main",
                           {0: params, 1: x_buf, 3: dy_buf, 5: dw_buf, 6: db_buf},
                           (-(-c // 64), k, 1), {"ACCUMULATE": True})
            batch.submit()
            if x.size:
                dx[b0:b1] = dev.read(dx_buf, np.float32, (nb, t, c))
            batch = dev.batch()
        batch.submit()
        dw = dev.read(dw_buf, np.float32, (k, c))
        db = dev.read(db_buf, np.float32, (c,))
    return dx, dw, db
