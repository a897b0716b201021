"""GPU ops: each WGSL kernel behind a numpy-in, numpy-out function, beside its numpy twin `<op>_numpy`.

Ops check dtype (float32), shape and contiguity (InvalidInput), tile work past the device's binding limit,
and dispatch; twins share the signature and keep their inputs' dtype (float64 gradient checks). The model
resident on the device is not here: `record_matmul` and the device's `Batch` are its building blocks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import Batch, GpuBuffer, GpuDevice, get_device

if TYPE_CHECKING:
    from evermind_memory.training.optim import AdamWStep

__all__ = [
    "matmul", "matmul_numpy", "record_matmul",
    "linear", "linear_numpy", "linear_backward", "linear_backward_numpy",
    "column_sum", "column_sum_numpy",
    "conv1d_causal", "conv1d_causal_numpy", "conv1d_causal_backward", "conv1d_causal_backward_numpy",
    "rmsnorm", "rmsnorm_numpy", "rmsnorm_backward", "rmsnorm_backward_numpy",
    "relu", "relu_numpy", "relu_backward", "relu_backward_numpy",
    "silu", "silu_numpy", "silu_backward", "silu_backward_numpy",
    "gelu", "gelu_numpy", "gelu_backward", "gelu_backward_numpy",
    "softmax", "softmax_numpy",
    "cross_entropy", "cross_entropy_numpy",
    "embedding_gather", "embedding_gather_numpy",
    "embedding_scatter_add", "embedding_scatter_add_numpy",
    "moe_route", "moe_route_numpy",
    "moe_dispatch", "moe_dispatch_numpy",
    "moe_combine", "moe_combine_numpy", "moe_combine_backward", "moe_combine_backward_numpy",
    "column_slice", "column_slice_numpy",
    "adamw_update_", "adamw_update_numpy",
]

_MAX_EXPERTS = 64  # moe_route keeps a 64-bit "taken" mask per row


# ==== validation and dispatch helpers ====================================================================

def _f32(name: str, arr: Any, ndim: int | None = None, *, min_ndim: int = 0) -> np.ndarray:
    """Check that `arr` is a C-contiguous float32 ndarray of the given rank; return it."""
    if not isinstance(arr, np.ndarray):
        raise InvalidInput(f"{name} must be a numpy.ndarray of float32, got {type(arr).__name__}")
    if arr.dtype != np.float32:
        raise InvalidInput(f"{name} must be float32, got {arr.dtype}; convert with arr.astype(np.float32)")
    if ndim is not None and arr.ndim != ndim:
        raise InvalidInput(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if arr.ndim < min_ndim:
        raise InvalidInput(f"{name} must have at least {min_ndim} dimension(s), got shape {arr.shape}")
    if not arr.flags.c_contiguous:
        raise InvalidInput(f"{name} must be C-contiguous; pass np.ascontiguousarray({name})")
    return arr


def _ids(name: str, arr: Any, ndim: int, lo: int, hi: int) -> np.ndarray:
    """Check an integer index array (rank, range [lo, hi)); return it as contiguous int32."""
    if not isinstance(arr, np.ndarray) or not np.issubdtype(arr.dtype, np.integer):
        got = arr.dtype if isinstance(arr, np.ndarray) else type(arr).__name__
        raise InvalidInput(f"{name} must be a numpy.ndarray of integers, got {got}")
    if arr.ndim != ndim:
        raise InvalidInput(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if arr.size and (int(arr.min()) < lo or int(arr.max()) >= hi):
        raise InvalidInput(
            f"{name} values must lie in [{lo}, {hi}), got range [{int(arr.min())}, {int(arr.max())}]"
        )
    return np.ascontiguousarray(arr, dtype=np.int32)


def _shape_eq(name: str, arr: np.ndarray, shape: tuple[int, ...]) -> None:
    if arr.shape != tuple(shape):
        raise InvalidInput(f"{name} must have shape {tuple(shape)}, got {arr.shape}")


def _fold(dev: GpuDevice, n_groups: int) -> tuple[int, int]:
    """Fold a 1-D workgroup count into (x, y) under the per-dimension limit (kernels guard the excess)."""
    lim = dev.max_groups_per_dim
    if n_groups <= lim:
        return (n_groups, 1)
    return (lim, -(-n_groups // lim))


def _tiles(n: int, per_item_bytes: int, dev: GpuDevice, what: str) -> Iterator[tuple[int, int]]:
    """Split range(n) into [start, stop) tiles whose binding (per_item_bytes each) fits the device limit."""
    if per_item_bytes > dev.max_binding_bytes:
        raise InvalidInput(
            f"one {what} needs {per_item_bytes} bytes in a single binding but the device allows "
            f"{dev.max_binding_bytes}; use smaller inner dimensions or the numpy path"
        )
    step = max(1, dev.max_binding_bytes // max(per_item_bytes, 1))
    for start in range(0, n, step):
        yield start, min(n, start + step)


class _Scope:
    """Buffers acquired for one op call, all released together at the end."""

    def __init__(self, dev: GpuDevice) -> None:
        self.dev = dev
        self.bufs: list[GpuBuffer] = []

    def up(self, arr: np.ndarray) -> GpuBuffer:
        buf = self.dev.upload(np.ascontiguousarray(arr))
        self.bufs.append(buf)
        return buf

    def empty(self, nbytes: int) -> GpuBuffer:
        buf = self.dev.storage(nbytes)
        self.bufs.append(buf)
        return buf

    def __enter__(self) -> "_Scope":
        return self

    def __exit__(self, *exc: object) -> None:
        for buf in self.bufs:
            self.dev.release(buf)
        self.bufs.clear()


def _elementwise_1d(batch: Batch, kernel: str, entry: str, bindings: dict, n: int,
                    constants: dict | None = None, per_group: int = 256) -> None:
    groups = _fold(batch._dev, -(-n // per_group))
    batch.dispatch(kernel, entry, bindings, groups, constants)


# ==== matmul / linear ====================================================================================

def matmul_numpy(a: np.ndarray, b: np.ndarray, *, trans_a: bool = False, trans_b: bool = False,
                 bias: np.ndarray | None = None) -> np.ndarray:
    """Numpy twin of `matmul`: op(a) @ op(b) [+ bias], in the inputs' dtype.

    Args:
        a: (M, K), or (K, M) when trans_a.
        b: (K, N), or (N, K) when trans_b.
        trans_a: use a.T.
        trans_b: use b.T.
        bias: optional (N,) added to every row.

    Returns:
        (M, N), the inputs' dtype (float32 for float32 inputs).
    """
    x = a.T if trans_a else a
    w = b.T if trans_b else b
    out = x @ w  # (M, N)
    if bias is not None:
        out = out + bias  # (M, N)
    return out


def _matmul_dims(a: np.ndarray, b: np.ndarray, trans_a: bool, trans_b: bool) -> tuple[int, int, int]:
    m, ka = (a.shape[1], a.shape[0]) if trans_a else a.shape
    kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if ka != kb:
        raise InvalidInput(
            f"matmul inner dimensions differ: op(a) is ({m}, {ka}) and op(b) is ({kb}, {n}) "
            f"(trans_a={trans_a}, trans_b={trans_b})"
        )
    return int(m), int(n), int(ka)


def record_matmul(batch: Batch, a: GpuBuffer, b: GpuBuffer, c: GpuBuffer, m: int, n: int, k: int, *,
                  trans_a: bool = False, trans_b: bool = False, bias: GpuBuffer | None = None,
                  accumulate: bool = False, vec4: bool | None = None) -> None:
    """Record C = op(A) op(B) [+ bias] [+ C] on device buffers into a batch (no copies, no checks of data).

    Args:
        batch: the command batch to record into.
        a: A's buffer, (M, K) or (K, M) row-major when trans_a.
        b: B's buffer, (K, N) or (N, K) when trans_b.
        c: C's buffer, (M, N) row-major.
        m: rows of C.
        n: columns of C.
        k: the shared inner dimension.
        trans_a: A is stored transposed.
        trans_b: B is stored transposed.
        bias: optional (N,) buffer.
        accumulate: add into C instead of overwriting it.
        vec4: force the vec4 kernel (True) or the general one (False); None picks vec4 when m, n, k are
            multiples of 4.

    Raises:
        InvalidInput: vec4 forced with sizes that are not multiples of 4, or the grid is over the limit.
    """
    aligned = m % 4 == 0 and n % 4 == 0 and k % 4 == 0
    use_vec4 = aligned if vec4 is None else vec4
    if use_vec4 and not aligned:
        raise InvalidInput(f"the vec4 matmul needs M, N, K multiples of 4, got ({m}, {n}, {k})")
    if m == 0 or n == 0:
        return
    if k == 0:
        raise InvalidInput("record_matmul needs K >= 1 (an empty product is zeros + bias: do it on the host)")
    has_bias = bias is not None
    if bias is None:
        bias = batch.scratch(16)
        batch.clear(bias)
    dims = batch.uniform([("u", m), ("u", n), ("u", k), ("u", 0)])
    tile = 128 if use_vec4 else 64
    consts = {"TRANS_A": bool(trans_a), "TRANS_B": bool(trans_b), "HAS_BIAS": has_bias,
              "ACCUMULATE": bool(accumulate)}
    batch.dispatch(
        "matmul_vec4" if use_vec4 else "matmul", "main",
        {0: dims, 1: a, 2: b, 3: bias, 4: c},
        (-(-n // tile), -(-m // tile), 1), consts,
    )


def _halve(v: int) -> int:
    return max(4, (v // 2 + 3) // 4 * 4)


def matmul(a: np.ndarray, b: np.ndarray, *, trans_a: bool = False, trans_b: bool = False,
           bias: np.ndarray | None = None) -> np.ndarray:
    """op(a) @ op(b) [+ bias] on the GPU (tiled when an operand exceeds one storage binding).

    Args:
        a: float32 (M, K), or (K, M) when trans_a.
        b: float32 (K, N), or (N, K) when trans_b.
        trans_a: use a.T (e.g. dW = X^T dY).
        trans_b: use b.T (e.g. dX = dY W^T).
        bias: optional float32 (N,).

    Returns:
        (M, N) float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or mismatched inner dimensions.
        GpuUnavailable: no GPU device.
    """
    _f32("a", a, 2)
    _f32("b", b, 2)
    m, n, k = _matmul_dims(a, b, trans_a, trans_b)
    if bias is not None:
        _f32("bias", bias, 1)
        _shape_eq("bias", bias, (n,))
    dev = get_device()
    out = np.zeros((m, n), dtype=np.float32)  # (M, N)
    if m == 0 or n == 0 or k == 0:
        return out + bias if bias is not None else out
    lim = dev.max_binding_bytes // 4
    mt, nt, kt = m, n, k
    mt = min(mt, 64 * dev.max_groups_per_dim)
    nt = min(nt, 64 * dev.max_groups_per_dim)
    while mt * kt > lim or kt * nt > lim or mt * nt > lim:
        # Shrink the biggest dimension that takes part in an oversized operand.
        cands = []
        if mt * kt > lim:
            cands += [mt, kt]
        if kt * nt > lim:
            cands += [kt, nt]
        if mt * nt > lim:
            cands += [mt, nt]
        big = max(cands)
        if big <= 4:
            raise InvalidInput(f"matmul cannot be tiled under a binding limit of {dev.max_binding_bytes} bytes")
        if mt == big:
            mt = _halve(mt)
        elif nt == big:
            nt = _halve(nt)
        else:
            kt = _halve(kt)
    with _Scope(dev) as s:
        for m0 in range(0, m, mt):
            m1 = min(m, m0 + mt)
            for n0 in range(0, n, nt):
                n1 = min(n, n0 + nt)
                batch = dev.batch()
                c_buf = s.empty((m1 - m0) * (n1 - n0) * 4)
                bias_buf = s.up(bias[n0:n1]) if bias is not None else None
                for k0 in range(0, k, kt):
                    k1 = min(k, k0 + kt)
                    a_piece = a[k0:k1, m0:m1] if trans_a else a[m0:m1, k0:k1]
                    b_piece = b[n0:n1, k0:k1] if trans_b else b[k0:k1, n0:n1]
                    record_matmul(batch, s.up(a_piece), s.up(b_piece), c_buf, m1 - m0, n1 - n0, k1 - k0,
                                  trans_a=trans_a, trans_b=trans_b,
                                  bias=bias_buf if k0 == 0 else None, accumulate=k0 > 0)
                batch.submit()
                out[m0:m1, n0:n1] = dev.read(c_buf, np.float32, (m1 - m0, n1 - n0))
    return out


def linear_numpy(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Numpy twin of `linear`: x @ w [+ b] with x (M, K), w (K, N), b (N,); returns (M, N)."""
    return matmul_numpy(x, w, bias=b)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x @ w [+ b] on the GPU.

    Args:
        x: float32 (M, K).
        w: float32 (K, N) (the layout of the model's w1/w2/router weights).
        b: optional float32 (N,).

    Returns:
        (M, N) float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes.
        GpuUnavailable: no GPU device.
    """
    return matmul(x, w, bias=b)


def linear_backward_numpy(x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Numpy twin of `linear_backward`: (dx = dy w^T, dw = x^T dy, db = dy summed over rows)."""
    dx = dy @ w.T  # (M, K)
    dw = x.T @ dy  # (K, N)
    db = dy.sum(axis=0)  # (N,)
    return dx, dw, db


def linear_backward(x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of y = x @ w + b on the GPU.

    Args:
        x: float32 (M, K), the layer input.
        w: float32 (K, N).
        dy: float32 (M, N), gradient of the output.

    Returns:
        (dx (M, K), dw (K, N), db (N,)), all float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes.
        GpuUnavailable: no GPU device.
    """
    _f32("x", x, 2)
    _f32("w", w, 2)
    _f32("dy", dy, 2)
    if x.shape[1] != w.shape[0] or dy.shape != (x.shape[0], w.shape[1]):
        raise InvalidInput(
            f"linear_backward expects x (M, K), w (K, N), dy (M, N); got {x.shape}, {w.shape}, {dy.shape}"
        )
    dx = matmul(dy, w, trans_b=True)  # (M, K)
    dw = matmul(x, dy, trans_a=True)  # (K, N)
    db = column_sum(dy)  # (N,)
    return dx, dw, db


def column_sum_numpy(x: np.ndarray) -> np.ndarray:
    """Numpy twin of `column_sum`: x (M, N) summed over rows -> (N,)."""
    return x.sum(axis=0)


def column_sum(x: np.ndarray) -> np.ndarray:
    """Sum a float32 (M, N) matrix over its rows on the GPU (deterministic order).

    Args:
        x: float32 (M, N).

    Returns:
        (N,) float32.

    Raises:
        InvalidInput: wrong dtype, rank or contiguity.
        GpuUnavailable: no GPU device.
    """
    _f32("x", x, 2)
    m, n = x.shape
    dev = get_device()
    if n == 0:
        return np.zeros((0,), dtype=np.float32)
    with _Scope(dev) as s:
        out_buf = s.empty(n * 4)
        batch = dev.batch()
        batch.clear(out_buf)
        for r0, r1 in _tiles(m, n * 4, dev, "row"):
            dims = batch.uniform([("u", r1 - r0), ("u", n), ("u", 0), ("u", 0)])
            batch.dispatch("column_sum", "main", {0: dims, 1: s.up(x[r0:r1]), 2: out_buf},
                           (-(-n // 64), 1, 1), {"ACCUMULATE": True})
        batch.submit()
        return dev.read(out_buf, np.float32, (n,))


# ==== depthwise causal conv1d =============================================================================

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
    _f32("x", x, 3)
    _f32("w", w, 2)
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
        _f32("bias", bias, 1)
        _shape_eq("bias", bias, (c,))
    dev = get_device()
    out = np.empty_like(x)  # (B, T, C)
    if x.size == 0:
        return out
    with _Scope(dev) as s:
        w_buf = s.up(w)
        bias_buf = s.up(bias if bias is not None else np.zeros(c, dtype=np.float32))
        for b0, b1 in _tiles(b, t * c * 4, dev, "sequence"):
            batch = dev.batch()
            y_buf = s.empty((b1 - b0) * t * c * 4)
            _elementwise_1d(batch, "conv1d_causal", "main",
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
    _f32("dy", dy, 3)
    _shape_eq("dy", dy, x.shape)
    dev = get_device()
    dx = np.empty_like(x)  # (B, T, C)
    with _Scope(dev) as s:
        w_buf = s.up(w)
        dw_buf = s.empty(k * c * 4)
        db_buf = s.empty(c * 4)
        batch = dev.batch()
        batch.clear(dw_buf)
        batch.clear(db_buf)
        for b0, b1 in _tiles(b, t * c * 4, dev, "sequence"):
            nb = b1 - b0
            params = _conv_params(batch, nb, t, c, k)
            x_buf, dy_buf, dx_buf = s.up(x[b0:b1]), s.up(dy[b0:b1]), s.empty(nb * t * c * 4)
            _elementwise_1d(batch, "conv1d_causal_backward", "dx_main",
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


# ==== RMSNorm ==============================================================================================

def rmsnorm_numpy(x: np.ndarray, weight: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Numpy twin of `rmsnorm`: x / sqrt(mean(x^2, last axis) + eps) * weight."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(eps))  # (..., 1)
    return x * r * weight


def _rows_of(name: str, x: np.ndarray) -> tuple[int, int]:
    _f32(name, x, min_ndim=1)
    c = x.shape[-1]
    return (x.size // c if c else 0), c


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
    rows, c = _rows_of("x", x)
    _f32("weight", weight, 1)
    _shape_eq("weight", weight, (c,))
    if not eps > 0:
        raise InvalidInput(f"eps must be > 0, got {eps}")
    dev = get_device()
    out = np.empty_like(x)  # (..., C)
    flat_out = out.reshape(rows, c)  # (N, C)
    flat_x = x.reshape(rows, c)  # (N, C)
    with _Scope(dev) as s:
        w_buf = s.up(weight)
        for r0, r1 in _tiles(rows, c * 4, dev, "row"):
            n = r1 - r0
            batch = dev.batch()
            y_buf = s.empty(n * c * 4)
            params = batch.uniform([("u", n), ("u", c), ("f", eps), ("u", 0)])
            batch.dispatch("rmsnorm", "main", {0: params, 1: s.up(flat_x[r0:r1]), 2: w_buf, 3: y_buf,
                                                4: s.empty(n * 4)}, _fold(dev, n))
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
    rows, c = _rows_of("x", x)
    _f32("weight", weight, 1)
    _shape_eq("weight", weight, (c,))
    _f32("dy", dy)
    _shape_eq("dy", dy, x.shape)
    if not eps > 0:
        raise InvalidInput(f"eps must be > 0, got {eps}")
    dev = get_device()
    dx = np.empty_like(x)  # (..., C)
    flat_dx = dx.reshape(rows, c)  # (N, C)
    flat_x, flat_dy = x.reshape(rows, c), dy.reshape(rows, c)  # (N, C)
    with _Scope(dev) as s:
        w_buf = s.up(weight)
        dw_buf = s.empty(c * 4)
        batch = dev.batch()
        batch.clear(dw_buf)
        for r0, r1 in _tiles(rows, c * 4, dev, "row"):
            n = r1 - r0
            params = batch.uniform([("u", n), ("u", c), ("f", eps), ("u", 0)])
            x_buf, dy_buf, dx_buf, r_buf = s.up(flat_x[r0:r1]), s.up(flat_dy[r0:r1]), s.empty(n * c * 4), s.empty(n * 4)
            batch.dispatch("rmsnorm_backward", "dx_main",
                           {0: params, 1: x_buf, 2: w_buf, 3: dy_buf, 4: dx_buf, 5: r_buf}, _fold(dev, n))
            batch.dispatch("rmsnorm_backward", "dw_main",
                           {0: params, 1: x_buf, 3: dy_buf, 5: r_buf, 6: dw_buf},
                           (-(-c // 64), 1, 1), {"ACCUMULATE": True})
            batch.submit()
            flat_dx[r0:r1] = dev.read(dx_buf, np.float32, (n, c))
            batch = dev.batch()
        batch.submit()
        dweight = dev.read(dw_buf, np.float32, (c,))
    return dx, dweight


# ==== activations =========================================================================================

_ACT = {"relu": 0, "silu": 1, "gelu": 2}
_GELU_K = 0.7978845608028654  # sqrt(2 / pi); a Python float keeps float32 inputs float32
_GELU_A = 0.044715


def _act(kind: str, x: np.ndarray, dy: np.ndarray | None) -> np.ndarray:
    _f32("x", x)
    if dy is not None:
        _f32("dy", dy)
        _shape_eq("dy", dy, x.shape)
    dev = get_device()
    out = np.empty_like(x)  # (...)
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)  # (n,)
    flat_dy = dy.reshape(-1) if dy is not None else None  # (n,)
    with _Scope(dev) as s:
        for i0, i1 in _tiles(x.size, 4, dev, "element"):
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
            _elementwise_1d(batch, "activation", entry, bindings, n, {"ACT": _ACT[kind]})
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


# ==== softmax and cross-entropy ===========================================================================

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
    rows, v = _rows_of("x", x)
    if v == 0:
        raise InvalidInput("softmax needs a non-empty last axis, got shape " + str(x.shape))
    dev = get_device()
    out = np.empty_like(x)  # (..., V)
    flat_x, flat_out = x.reshape(rows, v), out.reshape(rows, v)  # (N, V)
    with _Scope(dev) as s:
        for r0, r1 in _tiles(rows, v * 4, dev, "row"):
            n = r1 - r0
            batch = dev.batch()
            y_buf = s.empty(n * v * 4)
            params = batch.uniform([("u", n), ("u", v), ("u", 0), ("u", 0)])
            batch.dispatch("softmax", "main", {0: params, 1: s.up(flat_x[r0:r1]), 2: y_buf}, _fold(dev, n))
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
    _f32("logits", logits, 2)
    n, v = logits.shape
    if v == 0:
        raise InvalidInput("cross_entropy needs V >= 1 columns of logits")
    wts = _ce_weights(n, valid)  # (N,)
    if not isinstance(targets, np.ndarray) or not np.issubdtype(targets.dtype, np.integer) or targets.shape != (n,):
        got = getattr(targets, "shape", targets)
        raise InvalidInput(f"targets must be an integer numpy array of shape ({n},), got {got}")
    tg = np.where(wts > 0, targets, 0)  # (N,)
    tg = _ids("targets", tg, 1, 0, v)
    dev = get_device()
    grad = np.empty_like(logits)  # (N, V)
    total = 0.0
    with _Scope(dev) as s:
        for r0, r1 in _tiles(n, v * 4, dev, "row"):
            k = r1 - r0
            batch = dev.batch()
            g_buf, l_buf = s.empty(k * v * 4), s.empty(k * 4)
            params = batch.uniform([("u", k), ("u", v), ("u", 0), ("u", 0)])
            batch.dispatch("cross_entropy", "main",
                           {0: params, 1: s.up(logits[r0:r1]), 2: s.up(tg[r0:r1]), 3: s.up(wts[r0:r1]),
                            4: g_buf, 5: l_buf}, _fold(dev, k))
            batch.submit()
            grad[r0:r1] = dev.read(g_buf, np.float32, (k, v))
            total += float(dev.read(l_buf, np.float32, (k,)).sum(dtype=np.float64))
    return total, grad


# ==== embedding gather / scatter-add, MoE dispatch and combine ============================================

def _gather(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Row gather out[i] = table[ids[i]] with vocabulary tiles and row tiles as the binding limit needs."""
    v, c = table.shape
    n = ids.shape[0]
    dev = get_device()
    out = np.zeros((n, c), dtype=np.float32)  # (N, C)
    if n == 0 or c == 0:
        return out
    vocab_tiles = list(_tiles(v, c * 4, dev, "table row"))
    with _Scope(dev) as s:
        table_bufs = [s.up(table[v0:v1]) for v0, v1 in vocab_tiles]
        for r0, r1 in _tiles(n, c * 4, dev, "output row"):
            k = r1 - r0
            batch = dev.batch()
            o_buf = s.empty(k * c * 4)
            id_buf = s.up(ids[r0:r1])
            for (v0, v1), t_buf in zip(vocab_tiles, table_bufs):
                params = batch.uniform([("u", k), ("u", c), ("i", v0), ("i", v1)])
                _elementwise_1d(batch, "gather_rows", "main", {0: params, 1: t_buf, 2: id_buf, 3: o_buf}, k * c)
            batch.submit()
            out[r0:r1] = dev.read(o_buf, np.float32, (k, c))
    return out


def embedding_gather_numpy(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Numpy twin of `embedding_gather`: table[ids] with shape ids.shape + (C,)."""
    return table[ids]


def embedding_gather(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Embedding lookup on the GPU.

    Args:
        table: float32 (V, C).
        ids: integer array of any shape, values in [0, V).

    Returns:
        float32 array of shape ids.shape + (C,).

    Raises:
        InvalidInput: wrong dtype, rank or contiguity, or an id out of range.
        GpuUnavailable: no GPU device.
    """
    _f32("table", table, 2)
    if not isinstance(ids, np.ndarray):
        raise InvalidInput(f"ids must be a numpy.ndarray of integers, got {type(ids).__name__}")
    flat = _ids("ids", ids.reshape(-1), 1, 0, table.shape[0])  # (N,)
    return _gather(table, flat).reshape(ids.shape + (table.shape[1],))


def embedding_scatter_add_numpy(ids: np.ndarray, dy: np.ndarray, vocab_size: int) -> np.ndarray:
    """Numpy twin of `embedding_scatter_add`: dtable (V, C) with dtable[ids[n]] += dy[n]."""
    c = dy.shape[-1]
    out = np.zeros((vocab_size, c), dtype=dy.dtype)  # (V, C)
    np.add.at(out, ids.reshape(-1), dy.reshape(-1, c))
    return out


def embedding_scatter_add(ids: np.ndarray, dy: np.ndarray, vocab_size: int) -> np.ndarray:
    """Gradient of an embedding lookup on the GPU (deterministic: no atomics).

    Args:
        ids: integer array of any shape, values in [0, vocab_size).
        dy: float32 of shape ids.shape + (C,).
        vocab_size: V, rows of the returned table gradient.

    Returns:
        (V, C) float32 where row v is the sum of dy over the positions holding v.

    Raises:
        InvalidInput: wrong dtype or contiguity, mismatched shapes, or an id out of range.
        GpuUnavailable: no GPU device.
    """
    if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 0:
        raise InvalidInput(f"vocab_size must be a non-negative int, got {vocab_size!r}")
    _f32("dy", dy, min_ndim=1)
    if not isinstance(ids, np.ndarray) or dy.shape[:-1] != ids.shape:
        got = getattr(ids, "shape", ids)
        raise InvalidInput(f"dy must have shape ids.shape + (C,), got ids {got} and dy {dy.shape}")
    c = dy.shape[-1]
    flat_ids = _ids("ids", ids.reshape(-1), 1, 0, int(vocab_size))  # (N,)
    flat_dy = dy.reshape(-1, c)  # (N, C)
    dev = get_device()
    out = np.zeros((int(vocab_size), c), dtype=np.float32)  # (V, C)
    if flat_ids.size == 0 or c == 0:
        return out
    row_tiles = list(_tiles(flat_ids.size, c * 4, dev, "gradient row"))
    with _Scope(dev) as s:
        for v0, v1 in _tiles(int(vocab_size), c * 4, dev, "table row"):
            batch = dev.batch()
            d_buf = s.empty((v1 - v0) * c * 4)
            batch.clear(d_buf)
            any_work = False
            for r0, r1 in row_tiles:
                tile_ids = flat_ids[r0:r1]  # (n,)
                keep = np.nonzero((tile_ids >= v0) & (tile_ids < v1))[0]  # (n_keep,)
                if keep.size == 0:
                    continue
                sel = tile_ids[keep]  # (n_keep,)
                order = keep[np.argsort(sel, kind="stable")].astype(np.uint32)  # (n_keep,)
                uniq, counts = np.unique(sel, return_counts=True)  # (U,)
                offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)  # (U + 1,)
                params = batch.uniform([("u", uniq.size), ("u", c), ("i", v0), ("u", 0)])
                _elementwise_1d(batch, "embedding_scatter_add", "main",
                                {0: params, 1: s.up(flat_dy[r0:r1]), 2: s.up(uniq.astype(np.int32)),
                                 3: s.up(offsets), 4: s.up(order), 5: d_buf},
                                uniq.size * c, {"ACCUMULATE": True})
                any_work = True
            batch.submit()
            if any_work:
                out[v0:v1] = dev.read(d_buf, np.float32, (v1 - v0, c))
    return out


def moe_route_numpy(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Numpy twin of `moe_route`: (idx (N, k) int64 highest logit first, gates (N, k))."""
    idx = np.argsort(-logits, axis=1, kind="stable")[:, :k]  # (N, k)
    sel = np.take_along_axis(logits, idx, axis=1)  # (N, k)
    e = np.exp(sel - sel[:, :1])  # (N, k)
    return idx.astype(np.int64), e / e.sum(axis=1, keepdims=True)


def moe_route(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k expert routing on the GPU: the k largest router logits and a softmax over just those.

    Args:
        logits: float32 (N, E) router logits, E <= 64, all finite.
        k: experts per token, 1 <= k <= E.

    Returns:
        (idx (N, k) int64, experts by decreasing logit, ties to the lower index; gates (N, k) float32,
        each row summing to 1).

    Raises:
        InvalidInput: wrong dtype, rank or contiguity, E > 64, k out of range, or a non-finite logit.
        GpuUnavailable: no GPU device.
    """
    _f32("logits", logits, 2)
    n, e = logits.shape
    if e > _MAX_EXPERTS:
        raise InvalidInput(f"moe_route supports at most {_MAX_EXPERTS} experts, got E = {e}")
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= e:
        raise InvalidInput(f"k must be an int in [1, E = {e}], got {k!r}")
    if not np.isfinite(logits).all():
        raise InvalidInput("router logits must be finite (NaN/Inf found); check the model's weights")
    dev = get_device()
    idx = np.empty((n, k), dtype=np.int64)  # (N, k)
    gates = np.empty((n, k), dtype=np.float32)  # (N, k)
    with _Scope(dev) as s:
        for r0, r1 in _tiles(n, e * 4, dev, "row"):
            m = r1 - r0
            batch = dev.batch()
            i_buf, g_buf = s.empty(m * k * 4), s.empty(m * k * 4)
            params = batch.uniform([("u", m), ("u", e), ("u", int(k)), ("u", 0)])
            batch.dispatch("moe_route", "main", {0: params, 1: s.up(logits[r0:r1]), 2: i_buf, 3: g_buf},
                           _fold(dev, -(-m // 64)))
            batch.submit()
            idx[r0:r1] = dev.read(i_buf, np.int32, (m, k))
            gates[r0:r1] = dev.read(g_buf, np.float32, (m, k))
    return idx, gates


def moe_dispatch_numpy(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Numpy twin of `moe_dispatch`: x[rows] (R, C)."""
    return x[rows]


def moe_dispatch(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Gather the token rows routed to one expert on the GPU.

    Args:
        x: float32 (N, C) token activations.
        rows: integer (R,) token indices in [0, N).

    Returns:
        (R, C) float32.

    Raises:
        InvalidInput: wrong dtype, rank or contiguity, or a row index out of range.
        GpuUnavailable: no GPU device.
    """
    _f32("x", x, 2)
    return _gather(x, _ids("rows", rows, 1, 0, x.shape[0]))


def _check_combine(out: np.ndarray, ye: np.ndarray, rows: np.ndarray, gates: np.ndarray,
                   out_name: str) -> np.ndarray:
    _f32(out_name, out, 2)
    _f32("ye", ye, 2)
    _f32("gates", gates, 1)
    r = ye.shape[0]
    if ye.shape[1] != out.shape[1]:
        raise InvalidInput(f"ye must be (R, C = {out.shape[1]}), got {ye.shape}")
    _shape_eq("gates", gates, (r,))
    rr = _ids("rows", rows, 1, 0, out.shape[0])
    _shape_eq("rows", rr, (r,))
    if np.unique(rr).size != rr.size:
        raise InvalidInput("rows must not repeat a token within one expert (top-k picks distinct experts)")
    return rr


def moe_combine_numpy(out: np.ndarray, ye: np.ndarray, rows: np.ndarray, gates: np.ndarray) -> np.ndarray:
    """Numpy twin of `moe_combine`: a copy of out with out[rows] += gates[:, None] * ye."""
    res = out.copy()  # (N, C)
    res[rows] += gates[:, None] * ye
    return res


def moe_combine(out: np.ndarray, ye: np.ndarray, rows: np.ndarray, gates: np.ndarray) -> np.ndarray:
    """Add one expert's gated output back into its tokens' rows on the GPU.

    Args:
        out: float32 (N, C), the running MoE output (not modified).
        ye: float32 (R, C), the expert's output for its R tokens.
        rows: integer (R,), distinct token indices in [0, N).
        gates: float32 (R,), each token's gate for this expert.

    Returns:
        (N, C) float32: out with out[rows[r]] += gates[r] * ye[r].

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, a row out of range or repeated.
        GpuUnavailable: no GPU device.
    """
    rr = _check_combine(out, ye, rows, gates, "out")
    n, c = out.shape
    dev = get_device()
    res = out.copy()  # (N, C)
    if rr.size == 0 or c == 0:
        return res
    with _Scope(dev) as s:
        for n0, n1 in _tiles(n, c * 4, dev, "output row"):
            sel_all = np.nonzero((rr >= n0) & (rr < n1))[0]  # (R_tile,)
            if sel_all.size == 0:
                continue
            o_buf = s.up(res[n0:n1])
            batch = dev.batch()
            for j0, j1 in _tiles(sel_all.size, c * 4, dev, "expert row"):
                sel = sel_all[j0:j1]
                params = batch.uniform([("u", sel.size), ("u", c), ("u", 0), ("u", 0)])
                _elementwise_1d(batch, "moe_combine", "main",
                                {0: params, 1: s.up(ye[sel]), 2: s.up(rr[sel] - n0), 3: s.up(gates[sel]),
                                 4: o_buf}, sel.size * c)
            batch.submit()
            res[n0:n1] = dev.read(o_buf, np.float32, (n1 - n0, c))
    return res


def moe_combine_backward_numpy(dout: np.ndarray, ye: np.ndarray, rows: np.ndarray,
                               gates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numpy twin of `moe_combine_backward`: (dye (R, C), dgates (R,))."""
    d = dout[rows]  # (R, C)
    return gates[:, None] * d, np.sum(d * ye, axis=1)


def moe_combine_backward(dout: np.ndarray, ye: np.ndarray, rows: np.ndarray,
                         gates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of `moe_combine` for one expert on the GPU.

    Args:
        dout: float32 (N, C), gradient of the MoE output.
        ye: float32 (R, C), the expert's forward output.
        rows: integer (R,), distinct token indices in [0, N).
        gates: float32 (R,).

    Returns:
        (dye (R, C) = gates * dout[rows], dgates (R,) = rowwise dot(dout[rows], ye)), float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, a row out of range or repeated.
        GpuUnavailable: no GPU device.
    """
    rr = _check_combine(dout, ye, rows, gates, "dout")
    n, c = dout.shape
    r = rr.size
    dev = get_device()
    dye = np.zeros((r, c), dtype=np.float32)  # (R, C)
    dgates = np.zeros((r,), dtype=np.float32)  # (R,)
    if r == 0:
        return dye, dgates
    with _Scope(dev) as s:
        for n0, n1 in _tiles(n, c * 4, dev, "gradient row"):
            sel_all = np.nonzero((rr >= n0) & (rr < n1))[0]  # (R_tile,)
            if sel_all.size == 0:
                continue
            d_buf = s.up(dout[n0:n1])
            for j0, j1 in _tiles(sel_all.size, c * 4, dev, "expert row"):
                sel = sel_all[j0:j1]
                m = sel.size
                batch = dev.batch()
                dye_buf, dg_buf = s.empty(m * c * 4), s.empty(m * 4)
                params = batch.uniform([("u", m), ("u", c), ("u", 0), ("u", 0)])
                batch.dispatch("moe_combine_backward", "main",
                               {0: params, 1: d_buf, 2: s.up(ye[sel]), 3: s.up(rr[sel] - n0),
                                4: s.up(gates[sel]), 5: dye_buf, 6: dg_buf}, _fold(dev, m))
                batch.submit()
                dye[sel] = dev.read(dye_buf, np.float32, (m, c))
                dgates[sel] = dev.read(dg_buf, np.float32, (m,))
    return dye, dgates


# ==== column slice ========================================================================================

def column_slice_numpy(x: np.ndarray, start: int, width: int) -> np.ndarray:
    """Numpy twin of `column_slice`: a contiguous copy of x[:, start:start + width]."""
    return np.ascontiguousarray(x[:, start:start + width])


def column_slice(x: np.ndarray, start: int, width: int) -> np.ndarray:
    """Strided column gather (seed-001): split a row-major projection output into column ranges.

    Args:
        x: float32 (M, S).
        start: first column, 0 <= start.
        width: number of columns, start + width <= S.

    Returns:
        (M, width) float32, contiguous.

    Raises:
        InvalidInput: wrong dtype, rank or contiguity, or a column range outside x.
        GpuUnavailable: no GPU device.
    """
    _f32("x", x, 2)
    m, stride = x.shape
    if not (isinstance(start, (int, np.integer)) and isinstance(width, (int, np.integer))) or start < 0 \
            or width < 0 or start + width > stride:
        raise InvalidInput(f"column range [{start}, {start}+{width}) must lie inside the {stride} columns of x")
    dev = get_device()
    out = np.empty((m, int(width)), dtype=np.float32)  # (M, width)
    if m == 0 or width == 0:
        return out
    with _Scope(dev) as s:
        for r0, r1 in _tiles(m, stride * 4, dev, "row"):
            n = r1 - r0
            batch = dev.batch()
            o_buf = s.empty(n * width * 4)
            params = batch.uniform([("u", n), ("u", stride), ("u", int(start)), ("u", int(width))])
            _elementwise_1d(batch, "column_slice", "main", {0: params, 1: s.up(x[r0:r1]), 2: o_buf}, n * width)
            batch.submit()
            out[r0:r1] = dev.read(o_buf, np.float32, (n, int(width)))
    return out


# ==== AdamW =================================================================================================

def adamw_update_numpy(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, hp: "AdamWStep") -> bool:
    """Numpy twin of `adamw_update_`: `evermind_memory.training.optim.adamw_update_` itself."""
    from evermind_memory.training.optim import adamw_update_ as _twin  # noqa: PLC0415

    return _twin(param, grad, m, v, hp)


def adamw_update_(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, hp: "AdamWStep") -> bool:
    """One AdamW step on the GPU, written back into param, m and v in place (the training twin's maths).

    Trust region (|step| <= hp.max_delta when > 0), decoupled weight decay, a global grad scale, and the
    NaN guard: when any second moment or step element is not finite, the whole step is dropped and
    param, m and v stay unchanged.

    Args:
        param: float32 weights (any shape), updated in place.
        grad: float32 gradient, param's shape; read only.
        m: float32 first moment, param's shape, updated in place.
        v: float32 second moment, param's shape, updated in place.
        hp: `evermind_memory.training.optim.AdamWStep` (lr, betas, eps, weight_decay, beta^t, max_delta,
            grad_scale).

    Returns:
        True if the step was applied, False if it was dropped as non-finite.

    Raises:
        InvalidInput: wrong dtype, contiguity or shapes.
        GpuUnavailable: no GPU device.
    """
    _f32("param", param)
    for name, arr in (("grad", grad), ("m", m), ("v", v)):
        _f32(name, arr)
        _shape_eq(name, arr, param.shape)
    dev = get_device()
    views = [a.reshape(-1) for a in (param, grad, m, v)]  # (n,) each
    tiles = list(_tiles(param.size, 4, dev, "element"))
    with _Scope(dev) as s:
        flag = s.empty(16)
        batch = dev.batch()
        batch.clear(flag)
        staged = []
        for i0, i1 in tiles:
            n = i1 - i0
            bufs = [s.up(a[i0:i1]) for a in views]
            uni = batch.uniform([
                ("u", n), ("f", hp.lr), ("f", hp.beta1), ("f", hp.beta2), ("f", hp.eps), ("f", hp.weight_decay),
                ("f", hp.beta1_t), ("f", hp.beta2_t), ("f", hp.max_delta), ("f", hp.grad_scale),
                ("f", 0.0), ("f", 0.0),
            ])
            staged.append((i0, i1, bufs, uni))
            _elementwise_1d(batch, "adamw_update", "check",
                            {0: uni, 2: bufs[1], 3: bufs[2], 4: bufs[3], 5: flag}, n)
        for i0, i1, bufs, uni in staged:
            _elementwise_1d(batch, "adamw_update", "apply",
                            {0: uni, 1: bufs[0], 2: bufs[1], 3: bufs[2], 4: bufs[3], 5: flag}, i1 - i0)
        # Uniforms go back to the pool only after submit; reading waits for the work.
        batch.submit()
        if int(dev.read(flag, np.uint32, (1,))[0]):
            return False
        for i0, i1, bufs, _ in staged:
            n = i1 - i0
            views[0][i0:i1] = dev.read(bufs[0], np.float32, (n,))
            views[2][i0:i1] = dev.read(bufs[2], np.float32, (n,))
            views[3][i0:i1] = dev.read(bufs[3], np.float32, (n,))
    return True


# ==== the resident model's kernels (gpu/model.py): residual add, gradient clip, dense MoE, pooling ==========
# Each op runs its whole input in one binding (the model keeps these sizes small); past the device's
# binding limit it raises InvalidInput rather than tiling.

__all__ += [
    "axpy", "axpy_numpy",
    "clip_grads", "clip_grads_numpy",
    "moe_gates_dense", "moe_gates_dense_numpy", "moe_gates_backward", "moe_gates_backward_numpy",
    "moe_hidden", "moe_hidden_numpy", "moe_hidden_backward", "moe_hidden_backward_numpy",
    "pool_attention", "pool_attention_numpy",
    "mean_pool", "mean_pool_numpy",
]

_SUMSQ_CHUNK = 4096  # elements per workgroup of sum_squares.partial


def _fits(dev: GpuDevice, nbytes: int, what: str) -> None:
    if nbytes > dev.max_binding_bytes:
        raise InvalidInput(
            f"{what} needs {nbytes} bytes in one binding but the device allows {dev.max_binding_bytes}; "
            "pass smaller inputs or use the numpy twin"
        )


def axpy_numpy(y: np.ndarray, x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """Numpy twin of `axpy`: y + alpha * x (a new array)."""
    return y + y.dtype.type(alpha) * x


def axpy(y: np.ndarray, x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """y + alpha * x on the GPU (the residual add of the resident model).

    Args:
        y: float32 array (any shape).
        x: float32 array of y's shape.
        alpha: scalar multiplier of x.

    Returns:
        A new float32 array of y's shape.

    Raises:
        InvalidInput: wrong dtype, contiguity or shapes, or an array over one binding.
        GpuUnavailable: no GPU device.
    """
    _f32("y", y)
    _f32("x", x)
    _shape_eq("x", x, y.shape)
    dev = get_device()
    if y.size == 0:
        return y.copy()
    _fits(dev, y.nbytes, "axpy")
    with _Scope(dev) as s:
        batch = dev.batch()
        y_buf = s.up(y)
        params = batch.uniform([("u", y.size), ("f", alpha), ("u", 0), ("u", 0)])
        _elementwise_1d(batch, "axpy", "main", {0: params, 1: s.up(x), 2: y_buf}, y.size)
        batch.submit()
        return dev.read(y_buf, np.float32, y.shape)


def clip_grads_numpy(grads: list[np.ndarray], clip: float,
                     unscale: float = 1.0) -> tuple[list[np.ndarray], float, bool]:
    """Numpy twin of `clip_grads`: (grads * scale, norm, finite) with training/optim.py's clip_factor."""
    from evermind_memory.training.optim import clip_factor  # noqa: PLC0415

    total = sum(float(np.dot(g.reshape(-1), g.reshape(-1))) for g in grads)
    norm = float(np.sqrt(total)) * unscale
    ok = bool(np.isfinite(norm))
    scale = unscale * clip_factor(norm, clip)
    return [g * g.dtype.type(scale) for g in grads], norm, ok


def clip_grads(grads: list[np.ndarray], clip: float,
               unscale: float = 1.0) -> tuple[list[np.ndarray], float, bool]:
    """Global gradient norm and clipping on the GPU (kernel sum_squares: partial, finish, scale).

    norm = sqrt(sum of every squared element) * unscale; scale = unscale * clip / (norm + 1e-6) when
    clip > 0 and the norm is finite and above clip, else unscale.

    Args:
        grads: float32 arrays (any shapes), e.g. every parameter's gradient.
        clip: the largest allowed norm; <= 0 disables clipping.
        unscale: multiplies the norm and the scale (averaging or loss-scale undo).

    Returns:
        (each gradient times scale, norm, whether the norm is finite).

    Raises:
        InvalidInput: wrong dtype or contiguity, or a gradient over one binding.
        GpuUnavailable: no GPU device.
    """
    for i, g in enumerate(grads):
        _f32(f"grads[{i}]", g)
    dev = get_device()
    sizes = [int(g.size) for g in grads]
    n_part = [-(-n // _SUMSQ_CHUNK) for n in sizes]
    slots = np.concatenate([[0], np.cumsum(n_part)]).astype(int)  # (len + 1,)
    with _Scope(dev) as s:
        batch = dev.batch()
        part = s.empty(max(int(slots[-1]), 1) * 4)
        batch.clear(part)
        ctl, flag = s.empty(16), s.empty(16)
        bufs = []
        for g, n, slot in zip(grads, sizes, slots):
            _fits(dev, g.nbytes, "a gradient")
            buf = s.up(g) if n else None
            bufs.append(buf)
            if n:
                params = batch.uniform([("u", n), ("u", int(slot)), ("u", 0), ("u", 0),
                                        ("f", 0.0), ("f", 0.0), ("f", 0.0), ("f", 0.0)])
                batch.dispatch("sum_squares", "partial", {0: params, 1: buf, 2: part},
                               _fold(dev, -(-n // _SUMSQ_CHUNK)))
        fin = batch.uniform([("u", 0), ("u", 0), ("u", int(slots[-1])), ("u", 0),
                             ("f", unscale), ("f", clip), ("f", 0.0), ("f", 0.0)])
        batch.dispatch("sum_squares", "finish", {0: fin, 2: part, 3: ctl, 4: flag}, (1, 1, 1))
        for buf, n in zip(bufs, sizes):
            if n:
                params = batch.uniform([("u", n), ("u", 0), ("u", 0), ("u", 0),
                                        ("f", 0.0), ("f", 0.0), ("f", 0.0), ("f", 0.0)])
                _elementwise_1d(batch, "sum_squares", "scale", {0: params, 3: ctl, 5: buf}, n)
        batch.submit()
        out = [dev.read(buf, np.float32, g.shape) if n else g.copy() for buf, g, n in zip(bufs, grads, sizes)]
        norm = float(dev.read(ctl, np.float32, (4,))[1])
        ok = int(dev.read(flag, np.uint32, (4,))[0]) == 0
    return out, norm, ok


def _check_routing(idx: np.ndarray, gates: np.ndarray, n_experts: int) -> tuple[np.ndarray, int, int]:
    _f32("gates", gates, 2)
    n, k = gates.shape
    rr = _ids("idx", idx, 2, 0, n_experts)
    _shape_eq("idx", rr, (n, k))
    if n and k > 1 and (np.sort(rr, axis=1)[:, 1:] == np.sort(rr, axis=1)[:, :-1]).any():
        raise InvalidInput("idx must name distinct experts within a row (top-k picks distinct experts)")
    return rr, n, k


def moe_gates_dense_numpy(idx: np.ndarray, gates: np.ndarray, n_experts: int) -> np.ndarray:
    """Numpy twin of `moe_gates_dense`: (N, E + 1), column 0 = 1 (shared), 1 + idx[n, j] = gates[n, j]."""
    n = gates.shape[0]
    out = np.zeros((n, n_experts + 1), dtype=gates.dtype)  # (N, E + 1)
    out[:, 0] = 1
    np.put_along_axis(out, idx + 1, gates, axis=1)
    return out


def moe_gates_dense(idx: np.ndarray, gates: np.ndarray, n_experts: int) -> np.ndarray:
    """Top-k routing as a dense gate matrix on the GPU (shared expert in column 0 with gate 1).

    Args:
        idx: integer (N, k) chosen experts, distinct within a row, in [0, n_experts).
        gates: float32 (N, k) their gates.
        n_experts: E, routed experts.

    Returns:
        (N, E + 1) float32: column 0 is 1, column 1 + idx[n, j] is gates[n, j], the rest 0.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, an expert out of range or repeated in a row.
        GpuUnavailable: no GPU device.
    """
    rr, n, k = _check_routing(idx, gates, n_experts)
    dev = get_device()
    g = n_experts + 1
    if n == 0:
        return np.zeros((0, g), dtype=np.float32)
    _fits(dev, n * g * 4, "moe_gates_dense")
    with _Scope(dev) as s:
        batch = dev.batch()
        out = s.empty(n * g * 4)
        params = batch.uniform([("u", n), ("u", n_experts), ("u", k), ("u", 0)])
        batch.dispatch("moe_gates", "dense", {0: params, 1: s.up(rr), 2: s.up(gates), 3: out},
                       _fold(dev, -(-n // 64)))
        batch.submit()
        return dev.read(out, np.float32, (n, g))


def moe_gates_backward_numpy(dgmat: np.ndarray, idx: np.ndarray, gates: np.ndarray) -> np.ndarray:
    """Numpy twin of `moe_gates_backward`: dlogits (N, E) through the softmax over the chosen logits."""
    n, g = dgmat.shape
    dg = np.take_along_axis(dgmat, idx + 1, axis=1)  # (N, k)
    dot = np.einsum("nk,nk->n", gates, dg)  # (N,)
    dlogits = np.zeros((n, g - 1), dtype=dgmat.dtype)  # (N, E)
    np.put_along_axis(dlogits, idx, gates * (dg - dot[:, None]), axis=1)
    return dlogits


def moe_gates_backward(dgmat: np.ndarray, idx: np.ndarray, gates: np.ndarray) -> np.ndarray:
    """The router's logit gradient from the dense gate gradient, on the GPU.

    Args:
        dgmat: float32 (N, E + 1), gradient of the dense gate matrix (column 0, the shared expert, unused).
        idx: integer (N, k) chosen experts, distinct within a row.
        gates: float32 (N, k) their gates.

    Returns:
        (N, E) float32: gates_j (dg_j - sum_i gates_i dg_i) at the chosen experts, 0 elsewhere.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, an expert out of range or repeated in a row.
        GpuUnavailable: no GPU device.
    """
    _f32("dgmat", dgmat, 2)
    n, g = dgmat.shape
    rr, _, k = _check_routing(idx, gates, g - 1)
    _shape_eq("gates", gates, (n, k))
    dev = get_device()
    if n == 0:
        return np.zeros((0, g - 1), dtype=np.float32)
    _fits(dev, dgmat.nbytes, "moe_gates_backward")
    with _Scope(dev) as s:
        batch = dev.batch()
        out = s.empty(n * (g - 1) * 4)
        params = batch.uniform([("u", n), ("u", g - 1), ("u", k), ("u", 0)])
        batch.dispatch("moe_gates", "backward", {0: params, 1: s.up(rr), 2: s.up(gates), 4: s.up(dgmat), 5: out},
                       _fold(dev, -(-n // 64)))
        batch.submit()
        return dev.read(out, np.float32, (n, g - 1))


def moe_hidden_numpy(pre: np.ndarray, gmat: np.ndarray, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """Numpy twin of `moe_hidden`: (h = relu(pre), hs = h * gate of each column's group)."""
    n, width = pre.shape
    h = np.maximum(pre, 0)  # (N, G*H)
    hs = (h.reshape(n, width // hidden, hidden) * gmat[:, :, None]).reshape(n, width)  # (N, G*H)
    return h, hs


def _check_hidden(name: str, arr: np.ndarray, gmat: np.ndarray, hidden: int) -> tuple[int, int]:
    _f32(name, arr, 2)
    _f32("gmat", gmat, 2)
    n, g = gmat.shape
    if not isinstance(hidden, (int, np.integer)) or hidden < 1:
        raise InvalidInput(f"hidden must be an int >= 1, got {hidden!r}")
    _shape_eq(name, arr, (n, g * int(hidden)))
    return n, g


def moe_hidden(pre: np.ndarray, gmat: np.ndarray, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """ReLU and gating of every expert's hidden layer at once, on the GPU.

    Args:
        pre: float32 (N, G * H), the stacked first-layer pre-activations (group g in columns [gH, (g+1)H)).
        gmat: float32 (N, G) gates per row and group.
        hidden: H, the hidden width of one expert.

    Returns:
        (h (N, G*H) = relu(pre), hs (N, G*H) = h times its group's gate), float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, or an input over one binding.
        GpuUnavailable: no GPU device.
    """
    n, g = _check_hidden("pre", pre, gmat, hidden)
    dev = get_device()
    if pre.size == 0:
        return pre.copy(), pre.copy()
    _fits(dev, pre.nbytes, "moe_hidden")
    with _Scope(dev) as s:
        batch = dev.batch()
        h_buf, hs_buf = s.up(pre), s.empty(pre.nbytes)
        params = batch.uniform([("u", n), ("u", g), ("u", int(hidden)), ("u", 0)])
        _elementwise_1d(batch, "moe_hidden", "forward", {0: params, 1: h_buf, 2: s.up(gmat), 3: hs_buf}, pre.size)
        batch.submit()
        return dev.read(h_buf, np.float32, pre.shape), dev.read(hs_buf, np.float32, pre.shape)


def moe_hidden_backward_numpy(dhs: np.ndarray, h: np.ndarray, gmat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numpy twin of `moe_hidden_backward`: (dpre (N, G*H), dgmat (N, G))."""
    n, g = gmat.shape
    d3 = dhs.reshape(n, g, -1)  # (N, G, H)
    h3 = h.reshape(n, g, -1)  # (N, G, H)
    dgmat = np.einsum("ngh,ngh->ng", d3, h3)  # (N, G)
    dpre = np.where(h3 > 0, d3 * gmat[:, :, None], 0).reshape(dhs.shape)  # (N, G*H)
    return dpre.astype(dhs.dtype, copy=False), dgmat


def moe_hidden_backward(dhs: np.ndarray, h: np.ndarray, gmat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of `moe_hidden` on the GPU.

    Args:
        dhs: float32 (N, G*H), gradient of the gated hidden hs.
        h: float32 (N, G*H), the forward's relu output.
        gmat: float32 (N, G), the gates.

    Returns:
        (dpre (N, G*H) = gate * dhs where h > 0 else 0, dgmat (N, G) = per-group sums of dhs * h), float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, or an input over one binding.
        GpuUnavailable: no GPU device.
    """
    _f32("gmat", gmat, 2)
    _f32("dhs", dhs, 2)
    n, g = gmat.shape
    if g == 0 or dhs.shape[0] != n or dhs.shape[1] % g or dhs.shape[1] == 0:
        raise InvalidInput(f"dhs must be (N, G * H) for gmat (N, G) = {gmat.shape}, got {dhs.shape}")
    hidden = dhs.shape[1] // g
    _f32("h", h, 2)
    _shape_eq("h", h, dhs.shape)
    dev = get_device()
    if dhs.size == 0:
        return dhs.copy(), np.zeros((n, g), dtype=np.float32)
    _fits(dev, dhs.nbytes, "moe_hidden_backward")
    with _Scope(dev) as s:
        batch = dev.batch()
        d_buf, dg_buf = s.up(dhs), s.empty(n * g * 4)
        params = batch.uniform([("u", n), ("u", g), ("u", hidden), ("u", 0)])
        batch.dispatch("moe_hidden", "backward", {0: params, 2: s.up(gmat), 4: s.up(h), 5: d_buf, 6: dg_buf},
                       _fold(dev, n * g))
        batch.submit()
        return dev.read(d_buf, np.float32, dhs.shape), dev.read(dg_buf, np.float32, (n, g))


_POOL_ATTENTION_MAX_T = 1024  # pool_attention.wgsl keeps one query's scores in workgroup memory


def _check_lengths(lengths: Any, b: int, t: int) -> np.ndarray:
    lens = _ids("lengths", np.asarray(lengths), 1, 1, t + 1)
    _shape_eq("lengths", lens, (b,))
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
    _f32("qkv", qkv, 3)
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
    _fits(dev, qkv.nbytes, "pool_attention")
    with _Scope(dev) as s:
        batch = dev.batch()
        out = s.empty(b * t * c * 4)
        params = batch.uniform([("u", b), ("u", t), ("u", c), ("u", int(n_heads)),
                                ("f", 1.0 / np.sqrt(c // n_heads)), ("u", 0), ("u", 0), ("u", 0)])
        batch.dispatch("pool_attention", "main", {0: params, 1: s.up(qkv), 2: s.up(lens), 3: out},
                       _fold(dev, b * int(n_heads) * t))
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
    _f32("x", x, 3)
    b, t, c = x.shape
    lens = _check_lengths(lengths, b, t)
    dev = get_device()
    if x.size == 0:
        return np.zeros((b, c), dtype=np.float32)
    _fits(dev, x.nbytes, "mean_pool")
    with _Scope(dev) as s:
        batch = dev.batch()
        out = s.empty(b * c * 4)
        params = batch.uniform([("u", b), ("u", t), ("u", c), ("u", 0)])
        batch.dispatch("mean_pool", "main", {0: params, 1: s.up(x), 2: s.up(lens), 3: out}, _fold(dev, b))
        batch.submit()
        return dev.read(out, np.float32, (b, c))
