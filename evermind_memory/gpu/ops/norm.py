"""RMSNorm, forward and backward.
"""

from __future__ import annotations

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import get_device
from evermind_memory.gpu.ops.support import BufferScope, check_f32, fold_groups, rows_of, check_shape, binding_tiles

__all__ = ["rmsnorm_numpy", "rmsnorm", "rmsnorm_backward_numpy", "rmsnorm_backward"]


def rmsnorm_numpy(x: np.ndarray, weight: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Numpy twin of `rmsnorm`: x / sqrt(mean(x^2, last axis) + eps) * weight."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(eps))  # (..., 1)
    return x * r * weight

def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """RMSNorm over the last axis on the GPU.

    Args:
        x: float32 (..., C).
        weight: float32 (C,).
        eps: added to the mean square before the square root (1e-5, as lm.layers.RMS_EPS).

    Returns:
        float32 array of x's shape.

    Raises:
        InvalidInput: wrong dtype, contiguity or shapes, or eps <= 0.
        GpuUnavailable: no GPU device.
    """
    rows, c = rows_of("x", x)
    check_f32("weight", weight, 1)
    check_shape("weight", weight, (c,))
    if not eps > 0:
        raise InvalidInput(f"eps must be > 0, got {eps}")
    dev = get_device()
    out = np.empty_like(x)  # (..., C)
    flat_out = out.reshape(rows, c)  # (N, C)
    flat_x = x.reshape(rows, c)  # (N, C)
    with BufferScope(dev) as s:
        w_buf = s.up(weight)
        for r0, r1 in binding_tiles(rows, c * 4, dev, "row"):
            n = r1 - r0
            batch = dev.batch()
            y_buf = s.empty(n * c * 4)
            params = batch.uniform([("u", n), ("u", c), ("f", eps), ("u", 0)])
            batch.dispatch("rmsnorm", "main", {0: params, 1: s.up(flat_x[r0:r1]), 2: w_buf, 3: y_buf,
                                                4: s.empty(n * 4)}, fold_groups(dev, n))
            batch.submit()
            flat_out[r0:r1] = dev.read(y_buf, np.float32, (n, c))
    return out


def rmsnorm_backward_numpy(x: np.ndarray, weight: np.ndarray, dy: np.ndarray,
                           eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """Numpy twin of `rmsnorm_backward`: (dx of x's shape, dweight (C,))."""
    c = x.shape[-1]
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(eps))  # (..., 1)
    g = dy * weight  # (..., C)
    dx = r * g - (r ** 3) * x * (np.sum(g * x, axis=-1, keepdims=True) / c)  # (..., C)
    dweight = np.sum((dy * x * r).reshape(-1, c), axis=0)  # (C,)
    return dx, dweight


def rmsnorm_backward(x: np.ndarray, weight: np.ndarray, dy: np.ndarray,
                     eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of `rmsnorm` on the GPU.

    Args:
        x: float32 (..., C), the forward input.
        weight: float32 (C,).
        dy: float32 of x's shape.
        eps: as in the forward.

    Returns:
        (dx of x's shape, dweight (C,)), float32.

    Raises:
        InvalidInput: wrong dtype, contiguity or shapes, or eps <= 0.
        GpuUnavailable: no GPU device.
    """
    rows, c = rows_of("x", x)
    check_f32("weight", weight, 1)
    check_shape("weight", weight, (c,))
    check_f32("dy", dy)
    check_shape("dy", dy, x.shape)
    if not eps > 0:
        raise InvalidInput(f"eps must be > 0, got {eps}")
    dev = get_device()
    dx = np.empty_like(x)  # (..., C)
    flat_dx = dx.reshape(rows, c)  # (N, C)
    flat_x, flat_dy = x.reshape(rows, c), dy.reshape(rows, c)  # (N, C)
    with BufferScope(dev) as s:
        w_buf = s.up(weight)
        dw_buf = s.empty(c * 4)
        batch = dev.batch()
        batch.clear(dw_buf)
        for r0, r1 in binding_tiles(rows, c * 4, dev, "row"):
            n = r1 - r0
            params = batch.uniform([("u", n), ("u", c), ("f", eps), ("u", 0)])
            x_buf, dy_buf, dx_buf, r_buf = s.up(flat_x[r0:r1]), s.up(flat_dy[r0:r1]), s.empty(n * c * 4), s.empty(n * 4)
            batch.dispatch("rmsnorm_backward", "dx_main",
                           {0: params, 1: x_buf, 2: w_buf, 3: dy_buf, 4: dx_buf, 5: r_buf}, fold_groups(dev, n))
            batch.dispatch("rmsnorm_backward", "dw_main",
                           {0: params, 1: x_buf, 3: dy_buf, 5: r_buf, 6: dw_buf},
                           (-(-c // 64), 1, 1), {"ACCUMULATE": True})
            batch.submit()
            flat_dx[r0:r1] = dev.read(dx_buf, np.float32, (n, c))
            batch = dev.batch()
        batch.submit()
        dweight = dev.read(dw_buf, np.float32, (c,))
    return dx, dweight
