"""Dense kernels: matmul (and `record_matmul`, the resident model's building block), linear and its
backward, column sums, column slices and the residual axpy.
"""

from __future__ import annotations

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import Batch, GpuBuffer, get_device
from evermind_memory.gpu.ops.support import BufferScope, dispatch_1d, check_f32, check_fits, check_shape, binding_tiles

__all__ = [
    "matmul_numpy", "record_matmul", "matmul", "linear_numpy", "linear", "linear_backward_numpy",
    "linear_backward", "column_sum_numpy", "column_sum", "column_slice_numpy", "column_slice", "axpy_numpy",
    "axpy",
]


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
    check_f32("a", a, 2)
    check_f32("b", b, 2)
    m, n, k = _matmul_dims(a, b, trans_a, trans_b)
    if bias is not None:
        check_f32("bias", bias, 1)
        check_shape("bias", bias, (n,))
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
    with BufferScope(dev) as s:
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
    check_f32("x", x, 2)
    check_f32("w", w, 2)
    check_f32("dy", dy, 2)
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
    check_f32("x", x, 2)
    m, n = x.shape
    dev = get_device()
    if n == 0:
        return np.zeros((0,), dtype=np.float32)
    with BufferScope(dev) as s:
        out_buf = s.empty(n * 4)
        batch = dev.batch()
        batch.clear(out_buf)
        for r0, r1 in binding_tiles(m, n * 4, dev, "row"):
            dims = batch.uniform([("u", r1 - r0), ("u", n), ("u", 0), ("u", 0)])
            batch.dispatch("column_sum", "main", {0: dims, 1: s.up(x[r0:r1]), 2: out_buf},
                           (-(-n // 64), 1, 1), {"ACCUMULATE": True})
        batch.submit()
        return dev.read(out_buf, np.float32, (n,))


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
    check_f32("x", x, 2)
    m, stride = x.shape
    if not (isinstance(start, (int, np.integer)) and isinstance(width, (int, np.integer))) or start < 0 \
            or width < 0 or start + width > stride:
        raise InvalidInput(f"column range [{start}, {start}+{width}) must lie inside the {stride} columns of x")
    dev = get_device()
    out = np.empty((m, int(width)), dtype=np.float32)  # (M, width)
    if m == 0 or width == 0:
        return out
    with BufferScope(dev) as s:
        for r0, r1 in binding_tiles(m, stride * 4, dev, "row"):
            n = r1 - r0
            batch = dev.batch()
            o_buf = s.empty(n * width * 4)
            params = batch.uniform([("u", n), ("u", stride), ("u", int(start)), ("u", int(width))])
            dispatch_1d(batch, "column_slice", "main", {0: params, 1: s.up(x[r0:r1]), 2: o_buf}, n * width)
            batch.submit()
            out[r0:r1] = dev.read(o_buf, np.float32, (n, int(width)))
    return out

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
    check_f32("y", y)
    check_f32("x", x)
    check_shape("x", x, y.shape)
    dev = get_device()
    if y.size == 0:
        return y.copy()
    check_fits(dev, y.nbytes, "axpy")
    with BufferScope(dev) as s:
        batch = dev.batch()
        y_buf = s.up(y)
        params = batch.uniform([("u", y.size), ("f", alpha), ("u", 0), ("u", 0)])
        dispatch_1d(batch, "axpy", "main", {0: params, 1: s.up(x), 2: y_buf}, y.size)
        batch.submit()
        return dev.read(y_buf, np.float32, y.shape)
