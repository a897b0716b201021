"""Elementwise activations (ReLU, SiLU, GELU), forward and backward.
"""

from __future__ import annotations

import numpy as np

from evermind_memory.gpu.device import get_device
from evermind_memory.gpu.ops.support import BufferScope, dispatch_1d, check_f32, check_shape, binding_tiles

__all__ = [
    "relu_numpy", "relu_backward_numpy", "silu_numpy", "silu_backward_numpy", "gelu_numpy",
    "gelu_backward_numpy", "relu", "relu_backward", "silu", "silu_backward", "gelu", "gelu_backward",
]


_ACT = {"relu": 0, "silu": 1, "gelu": 2}
_GELU_K = 0.7978845608028654  # sqrt(2 / pi); a Python float keeps float32 inputs float32
_GELU_A = 0.044715


def _act(kind: str, x: np.ndarray, dy: np.ndarray | None) -> np.ndarray:
    check_f32("x", x)
    if dy is not None:
        check_f32("dy", dy)
        check_shape("dy", dy, x.shape)
    dev = get_device()
    out = np.empty_like(x)  # (...)
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)  # (n,)
    flat_dy = dy.reshape(-1) if dy is not None else None  # (n,)
    with BufferScope(dev) as s:
        for i0, i1 in binding_tiles(x.size, 4, dev, "element"):
            n = i1 - i0
            batch = dev.batch()
            o_buf = s.empty(n * 4)
            params = batch.uniform([("u", n), ("u", 0), ("u", 0), ("u", 0)])
            if flat_dy is None:
                bindings = {0: params, 1: s.up(flat_x[i0:i1]), 3: o_buf}
                entry = "forward"
            else:
                bindings = {0: params, 1: s.up(flat_x[i0:i1]), 2: s.up(flat_dy[i0:i1]), 3: o_buf}
                entry = "backward"
            dispatch_1d(batch, "activation", entry, bindings, n, {"ACT": _ACT[kind]})
            batch.submit()
            flat_out[i0:i1] = dev.read(o_buf, np.float32, (n,))
    return out


def relu_numpy(x: np.ndarray) -> np.ndarray:
    """Numpy twin of `relu`: max(x, 0)."""
    return np.maximum(x, 0)


def relu_backward_numpy(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Numpy twin of `relu_backward`: dy where x > 0, else 0."""
    return np.where(x > 0, dy, 0)


def _sigmoid_numpy(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # (...) never overflows
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype)


def silu_numpy(x: np.ndarray) -> np.ndarray:
    """Numpy twin of `silu`: x * sigmoid(x)."""
    return x * _sigmoid_numpy(x)


def silu_backward_numpy(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Numpy twin of `silu_backward`: dy * sigmoid(x) * (1 + x * (1 - sigmoid(x)))."""
    s = _sigmoid_numpy(x)
    return dy * s * (1 + x * (1 - s))


def gelu_numpy(x: np.ndarray) -> np.ndarray:
    """Numpy twin of `gelu` (tanh form): 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3)."""
    return x * _sigmoid_numpy(2 * _GELU_K * (x + _GELU_A * x ** 3))


def gelu_backward_numpy(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Numpy twin of `gelu_backward`: dy times the derivative of the tanh-form GELU (sigmoid form, no cancellation)."""
    u2 = 2 * _GELU_K * (x + _GELU_A * x ** 3)  # (...)
    s = _sigmoid_numpy(u2)  # (...)
    return dy * (s + 2 * x * s * _sigmoid_numpy(-u2) * _GELU_K * (1 + 3 * _GELU_A * x * x))


def relu(x: np.ndarray) -> np.ndarray:
    """ReLU on the GPU. Args: x float32 (any shape). Returns: float32 of x's shape.

    Raises:
        InvalidInput: wrong dtype or contiguity.
        GpuUnavailable: no GPU device.
    """
    return _act("relu", x, None)


def relu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """ReLU's input gradient on the GPU. Args: x, dy float32 of one shape. Returns: dx float32.

    Raises:
        InvalidInput: wrong dtype, contiguity or shapes.
        GpuUnavailable: no GPU device.
    """
    return _act("relu", x, dy)


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU on the GPU. Args: x float32 (any shape). Returns: float32 of x's shape.

    Raises:
        InvalidInput: wrong dtype or contiguity.
        GpuUnavailable: no GPU device.
    """
    return _act("silu", x, None)


def silu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """SiLU's input gradient on the GPU. Args: x, dy float32 of one shape. Returns: dx float32.

    Raises:
        InvalidInput: wrong dtype, contiguity or shapes.
        GpuUnavailable: no GPU device.
    """
    return _act("silu", x, dy)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU (tanh form) on the GPU. Args: x float32 (any shape). Returns: float32 of x's shape.

    Raises:
        InvalidInput: wrong dtype or contiguity.
        GpuUnavailable: no GPU device.
    """
    return _act("gelu", x, None)


def gelu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """GELU's input gradient on the GPU. Args: x, dy float32 of one shape. Returns: dx float32.

    Raises:
        InvalidInput: wrong dtype, contiguity or shapes.
        GpuUnavailable: no GPU device.
    """
    return _act("gelu", x, dy)
