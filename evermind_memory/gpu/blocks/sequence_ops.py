"""GPU ops for sequence mixing: selective scan (Mamba-1, forward and backward), SSD (Mamba-2), complex SSD
(Mamba-3) and causal attention, each numpy-in/numpy-out beside its twin in `lm/sequence.py`
(re-exported by `reference.py`).

`record_*` functions put one kernel's dispatches on device buffers into a `Batch` (no copies, no data
checks); the blocks chain them into one submit. Tiling past the binding limit is by time windows (scans)
or query-row windows (three-pass attention; flash attention needs no scratch). No backward for SSD,
complex SSD or attention yet.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu import ops
from evermind_memory.gpu.blocks.reference import (
    causal_attention_numpy,
    complex_ssd_numpy,
    selective_scan_backward_numpy,
    selective_scan_numpy,
    ssd_numpy,
)
from evermind_memory.gpu.device import Batch, GpuBuffer, GpuDevice, get_device
from evermind_memory.gpu.ops.support import BufferScope, fold_groups
from evermind_memory.lm.sequence import MAX_STATE  # the WGSL's per-lane state array; lm's configs keep to it

__all__ = [
    "selective_scan", "selective_scan_numpy",
    "selective_scan_backward", "selective_scan_backward_numpy",
    "ssd", "ssd_numpy",
    "complex_ssd", "complex_ssd_numpy",
    "causal_attention", "causal_attention_numpy",
    "record_rmsnorm", "record_conv1d", "record_column_slice", "record_silu", "record_linear",
    "record_selective_scan", "record_ssd", "record_complex_ssd", "record_causal_attention",
    "FLASH_MAX_HEAD_DIM",
]

_SCAN_TILE = 64  # time steps per Kogge-Stone tile in selective_scan.wgsl
_ATTN_TILE = 16  # query rows per tile in the three-pass attention kernels
FLASH_MAX_HEAD_DIM = 64  # widest head attention_flash.wgsl keeps in registers (four mat4x4)
# attention_flash.wgsl's shape: invocations per workgroup (64, 128 or 256) and lanes per query row (a power
# of two <= threads); rows per workgroup = threads / lanes. None picks _flash_shape's default; a benchmark
# may rebind these to time kernel variants (results are the same up to float rounding).
FLASH_THREADS: int | None = None
FLASH_LANES: int | None = None


# ==== small helpers ======================================================================================

def _f32(name: str, arr: Any, shape: tuple[int, ...] | None = None, ndim: int | None = None) -> np.ndarray:
    if not isinstance(arr, np.ndarray) or arr.dtype != np.float32:
        got = arr.dtype if isinstance(arr, np.ndarray) else type(arr).__name__
        raise InvalidInput(f"{name} must be a float32 numpy.ndarray, got {got}; convert with .astype(np.float32)")
    if not arr.flags.c_contiguous:
        raise InvalidInput(f"{name} must be C-contiguous; pass np.ascontiguousarray({name})")
    if ndim is not None and arr.ndim != ndim:
        raise InvalidInput(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if shape is not None and arr.shape != tuple(shape):
        raise InvalidInput(f"{name} must have shape {tuple(shape)}, got {arr.shape}")
    return arr


def _window(length: int, per_step_bytes: int, dev: GpuDevice, multiple: int, what: str) -> int:
    """Steps per window so that one window's scratch binding (per_step_bytes each) fits the device limit."""
    steps = dev.max_binding_bytes // max(per_step_bytes, 1)
    steps = steps // multiple * multiple
    if steps < min(length, multiple):
        raise InvalidInput(
            f"{what} needs {per_step_bytes * multiple} bytes per {multiple}-step window but the device allows "
            f"{dev.max_binding_bytes} per binding; use a smaller batch or width, or the numpy twin"
        )
    return max(1, min(length, steps))


# ==== recorders for the existing kernels (gpu/kernels) ===================================================

def record_rmsnorm(batch: Batch, x: GpuBuffer, weight: GpuBuffer, y: GpuBuffer, rows: int, dim: int,
                   eps: float) -> None:
    """Record y = rmsnorm(x) * weight over rows of width dim (rmsnorm.wgsl)."""
    params = batch.uniform([("u", rows), ("u", dim), ("f", eps), ("u", 0)])
    batch.dispatch("rmsnorm", "main", {0: params, 1: x, 2: weight, 3: y, 4: batch.scratch(max(rows, 1) * 4)},
                   fold_groups(batch.device, rows))


def record_conv1d(batch: Batch, x: GpuBuffer, w: GpuBuffer, bias: GpuBuffer, y: GpuBuffer, b: int, t: int,
                  c: int, k: int) -> None:
    """Record the depthwise causal conv y (B, T, C) of x with w (K, C) and bias (conv1d_causal.wgsl).

    The uniform has the five fields the kernel's struct declares (seq_len, channels, kernel, batch, groups):
    a four-field uniform is below the struct's minimum binding size and is rejected (seed-001).
    """
    params = batch.uniform([("u", t), ("u", c), ("u", k), ("u", b), ("u", 1)])
    batch.dispatch("conv1d_causal", "main", {0: params, 1: x, 2: w, 3: bias, 4: y},
                   fold_groups(batch.device, -(-b * t * c // 256)), {"HAS_BIAS": True})


def record_column_slice(batch: Batch, x: GpuBuffer, out: GpuBuffer, rows: int, stride: int, start: int,
                        width: int) -> None:
    """Record out (rows, width) = x[:, start:start + width] for row-major x (rows, stride) (seed-001).

    A projection's outputs are column ranges inside every row, so the split is a strided gather; copying
    the first rows * width floats (a prefix copy) is right only when rows == 1.
    """
    params = batch.uniform([("u", rows), ("u", stride), ("u", start), ("u", width)])
    batch.dispatch("column_slice", "main", {0: params, 1: x, 2: out},
                   fold_groups(batch.device, -(-rows * width // 256)))


def record_silu(batch: Batch, x: GpuBuffer, y: GpuBuffer, n: int) -> None:
    """Record y = silu(x) over n elements (activation.wgsl)."""
    params = batch.uniform([("u", n), ("u", 0), ("u", 0), ("u", 0)])
    batch.dispatch("activation", "forward", {0: params, 1: x, 3: y}, fold_groups(batch.device, -(-n // 256)),
                   {"ACT": 1})


def record_linear(batch: Batch, x: GpuBuffer, w: GpuBuffer, bias: GpuBuffer | None, y: GpuBuffer, m: int,
                  k: int, n: int, *, accumulate: bool = False) -> None:
    """Record y (M, N) [+]= x (M, K) @ w (K, N) [+ bias] (matmul kernels)."""
    ops.record_matmul(batch, x, w, y, m, n, k, bias=bias, accumulate=accumulate)


# ==== selective scan (Mamba-1) ===========================================================================

def _scan_params(batch: Batch, b: int, length: int, d: int, n: int, t0: int, t_len: int) -> GpuBuffer:
    return batch.uniform([("u", length), ("u", n), ("u", d), ("u", b), ("u", t0), ("u", t_len), ("u", 0), ("u", 0)])


def _scan_window(dev: GpuDevice, b: int, length: int, d: int, n: int, planes: int = 1) -> int:
    """Time steps per selective-scan window: `planes` (B, window, D, N) float32 scratch tensors fit one binding."""
    return _window(length, planes * b * d * n * 4, dev, _SCAN_TILE, "the selective scan")


def record_selective_scan(batch: Batch, u: GpuBuffer, delta: GpuBuffer, a_log: GpuBuffer, bm: GpuBuffer,
                          cm: GpuBuffer, d_skip: GpuBuffer, z: GpuBuffer | None, y: GpuBuffer, b: int,
                          length: int, d: int, n: int) -> None:
    """Record the Mamba-1 scan y (B, L, D) on device buffers, window by window over time.

    Each window dispatches `scan` on a D x N x B grid (one 64-lane workgroup per (d, n, b): seed-001's grid)
    and then `reduce`; the state (B, D, N) carries from one window to the next.
    """
    dev = batch.device
    win = _scan_window(dev, b, length, d, n)
    part = batch.scratch(b * win * d * n * 4)
    state = batch.scratch(b * d * n * 4)
    batch.clear(state)
    gate = z if z is not None else u  # bound but unread without HAS_GATE
    for t0 in range(0, length, win):
        t_len = min(win, length - t0)
        params = _scan_params(batch, b, length, d, n, t0, t_len)
        batch.dispatch("selective_scan", "scan",
                       {0: params, 1: u, 2: delta, 3: a_log, 4: bm, 5: cm, 9: part, 10: state}, (d, n, b))
        batch.dispatch("selective_scan", "reduce",
                       {0: params, 1: u, 6: d_skip, 7: gate, 8: y, 9: part},
                       fold_groups(dev, -(-b * t_len * d // 256)), {"HAS_GATE": z is not None})


def _check_scan(u, delta, a_log, b, c, d) -> tuple[int, int, int, int]:
    _f32("u", u, ndim=3)
    bsz, length, dim = u.shape
    _f32("delta", delta, u.shape)
    _f32("a_log", a_log, ndim=2)
    if a_log.shape[0] != dim:
        raise InvalidInput(f"a_log must be (D = {dim}, N), got {a_log.shape}")
    n = a_log.shape[1]
    _f32("b", b, (bsz, length, n))
    _f32("c", c, (bsz, length, n))
    _f32("d", d, (dim,))
    return bsz, length, dim, n


def selective_scan(u: np.ndarray, delta: np.ndarray, a_log: np.ndarray, b: np.ndarray, c: np.ndarray,
                   d: np.ndarray, z: np.ndarray | None = None) -> np.ndarray:
    """The Mamba-1 selective scan on the GPU (see `selective_scan_numpy` for the maths).

    Args:
        u: float32 (B, L, D) input after conv and SiLU.
        delta: float32 (B, L, D) time steps before softplus.
        a_log: float32 (D, N) log decay rates.
        b: float32 (B, L, N).
        c: float32 (B, L, N).
        d: float32 (D,) skip scale.
        z: optional float32 (B, L, D) gate: the output is multiplied by silu(z).

    Returns:
        (B, L, D) float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes.
        GpuUnavailable: no GPU device.
    """
    bsz, length, dim, n = _check_scan(u, delta, a_log, b, c, d)
    if z is not None:
        _f32("z", z, u.shape)
    dev = get_device()
    if u.size == 0 or n == 0:
        return selective_scan_numpy(u, delta, a_log, b, c, d, z)
    with BufferScope(dev) as s:
        y = s.empty(u.nbytes)
        batch = dev.batch()
        record_selective_scan(batch, s.up(u), s.up(delta), s.up(a_log), s.up(b), s.up(c), s.up(d),
                              s.up(z) if z is not None else None, y, bsz, length, dim, n)
        batch.submit()
        return dev.read(y, np.float32, u.shape)


def selective_scan_backward(u: np.ndarray, delta: np.ndarray, a_log: np.ndarray, b: np.ndarray,
                            c: np.ndarray, d: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, ...]:
    """Gradients of the ungated selective scan on the GPU.

    A forward pass over time windows keeps only each window's entry state; the backward pass then walks
    the windows last to first, recomputing the window's states and carrying dL/dh between windows.

    Args:
        u, delta, a_log, b, c, d: the forward inputs, float32 (see `selective_scan`).
        dy: float32 (B, L, D), gradient of the scan output.

    Returns:
        (du (B, L, D), ddelta (B, L, D), da_log (D, N), db (B, L, N), dc (B, L, N), dd (D,)), float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes.
        GpuUnavailable: no GPU device.
    """
    bsz, length, dim, n = _check_scan(u, delta, a_log, b, c, d)
    _f32("dy", dy, u.shape)
    dev = get_device()
    if u.size == 0 or n == 0:
        return selective_scan_backward_numpy(u, delta, a_log, b, c, d, dy)
    win = _scan_window(dev, bsz, length, dim, n, planes=4)
    starts = list(range(0, length, win))
    sbytes = bsz * dim * n * 4
    with BufferScope(dev) as s:
        bufs = {name: s.up(arr) for name, arr in
                (("u", u), ("delta", delta), ("a_log", a_log), ("b", b), ("c", c), ("d", d), ("dy", dy))}
        hs, parts = s.empty(bsz * win * dim * n * 4), s.empty(4 * bsz * win * dim * n * 4)
        state, h0, dh, da = s.empty(sbytes), s.empty(sbytes), s.empty(sbytes), s.empty(sbytes)
        snaps = s.empty(len(starts) * sbytes)
        du, ddelta = s.empty(u.nbytes), s.empty(u.nbytes)
        db, dc = s.empty(b.nbytes), s.empty(b.nbytes)
        batch = dev.batch()
        for buf in (state, dh, da):
            batch.clear(buf)
        scan_in = {1: bufs["u"], 2: bufs["delta"], 3: bufs["a_log"], 4: bufs["b"], 5: bufs["c"]}
        for w, t0 in enumerate(starts):  # forward: keep the state entering each window
            t_len = min(win, length - t0)
            batch.copy(state, 0, snaps, w * sbytes, sbytes)
            params = _scan_params(batch, bsz, length, dim, n, t0, t_len)
            batch.dispatch("selective_scan", "scan", {0: params, **scan_in, 9: hs, 10: state}, (dim, n, bsz),
                           {"WRITE_STATES": True})
        for w in reversed(range(len(starts))):
            t0 = starts[w]
            t_len = min(win, length - t0)
            params = _scan_params(batch, bsz, length, dim, n, t0, t_len)
            batch.copy(snaps, w * sbytes, state, 0, sbytes)
            batch.copy(snaps, w * sbytes, h0, 0, sbytes)
            batch.dispatch("selective_scan", "scan", {0: params, **scan_in, 9: hs, 10: state}, (dim, n, bsz),
                           {"WRITE_STATES": True})
            batch.dispatch("selective_scan_backward", "scan",
                           {0: params, **scan_in, 6: bufs["dy"], 7: hs, 8: h0, 9: dh, 10: da, 11: parts},
                           (-(-dim // 64), n, bsz))
            batch.dispatch("selective_scan_backward", "reduce_n",
                           {0: params, 6: bufs["dy"], 11: parts, 12: bufs["d"], 13: du, 14: ddelta},
                           fold_groups(dev, -(-bsz * t_len * dim // 256)))
            batch.dispatch("selective_scan_backward", "reduce_d",
                           {0: params, 11: parts, 15: db, 16: dc}, fold_groups(dev, -(-bsz * t_len * n // 256)))
        batch.submit()
        out_du = dev.read(du, np.float32, u.shape)
        out_ddelta = dev.read(ddelta, np.float32, u.shape)
        # Two small reductions over the batch axis finish on the host.
        out_da = dev.read(da, np.float32, (bsz, dim, n)).sum(axis=0)  # (D, N)
        out_db = dev.read(db, np.float32, b.shape)
        out_dc = dev.read(dc, np.float32, c.shape)
    dd = np.einsum("bld,bld->d", dy, u)  # (D,)
    return out_du, out_ddelta, out_da, out_db, out_dc, dd


# ==== SSD (Mamba-2) and complex SSD (Mamba-3) ============================================================

def _ssd_params(batch: Batch, b: int, length: int, heads: int, p: int, groups: int, n: int,
                chunk_len: int) -> GpuBuffer:
    n_chunks = -(-length // chunk_len)
    return batch.uniform([("u", length), ("u", heads * p), ("u", heads), ("u", p), ("u", groups), ("u", n),
                          ("u", chunk_len), ("u", n_chunks), ("u", b), ("u", 0), ("u", 0), ("u", 0)])


def _record_chunked(kernel: str, batch: Batch, x: GpuBuffer, dt: GpuBuffer, bm: GpuBuffer, cm: GpuBuffer,
                    a_log: GpuBuffer, dt_bias: GpuBuffer, d_skip: GpuBuffer, y: GpuBuffer, b: int, length: int,
                    heads: int, p: int, groups: int, n: int, chunk_len: int, width: int) -> None:
    dev = batch.device
    n_chunks = -(-length // chunk_len)
    states = batch.scratch(n_chunks * b * heads * n * p * width * 4)
    cum = batch.scratch(b * length * heads * width * 4)
    params = _ssd_params(batch, b, length, heads, p, groups, n, chunk_len)
    binds = {0: params, 1: x, 2: dt, 3: bm, 4: cm, 5: a_log, 6: dt_bias, 7: d_skip, 8: y, 9: states, 10: cum}
    batch.dispatch(kernel, "chunk", binds, (n_chunks, heads, b))
    batch.dispatch(kernel, "carry", {0: params, 9: states, 10: cum}, fold_groups(dev, -(-b * heads * n * p // 256)))
    batch.dispatch(kernel, "output", {0: params, 4: cm, 8: y, 9: states, 10: cum},
                   fold_groups(dev, -(-b * length * heads * p // 256)))


def record_ssd(batch: Batch, x: GpuBuffer, dt: GpuBuffer, bm: GpuBuffer, cm: GpuBuffer, a_log: GpuBuffer,
               dt_bias: GpuBuffer, d_skip: GpuBuffer, y: GpuBuffer, b: int, length: int, heads: int, p: int,
               groups: int, n: int, chunk_len: int) -> None:
    """Record the chunked Mamba-2 scan y (B, L, H * P): chunks from zero state, the carry, the correction."""
    _record_chunked("ssd", batch, x, dt, bm, cm, a_log, dt_bias, d_skip, y, b, length, heads, p, groups, n,
                    chunk_len, 1)


def record_complex_ssd(batch: Batch, x: GpuBuffer, dt: GpuBuffer, bm: GpuBuffer, cm: GpuBuffer,
                       a_log: GpuBuffer, dt_bias: GpuBuffer, d_skip: GpuBuffer, y: GpuBuffer, b: int, length: int,
                       heads: int, p: int, groups: int, nc: int, chunk_len: int) -> None:
    """Record the chunked Mamba-3 complex scan y (B, L, H * P)."""
    _record_chunked("complex_ssd", batch, x, dt, bm, cm, a_log, dt_bias, d_skip, y, b, length, heads, p, groups,
                    nc, chunk_len, 2)


def _check_ssd(x, dt, a_log, dt_bias, b, c, d, n_groups, chunk_len, complex_: bool) -> tuple[int, ...]:
    _f32("x", x, ndim=3)
    bsz, length, dim = x.shape
    _f32("a_log", a_log, ndim=2 if complex_ else 1)
    heads = a_log.shape[0]
    if complex_ and a_log.shape[1] != 2:
        raise InvalidInput(f"a_log must be (H, 2) (real, imaginary parts), got {a_log.shape}")
    if heads < 1 or dim % heads:
        raise InvalidInput(f"x's width {dim} must be a multiple of the number of heads {heads} (a_log's rows)")
    if not isinstance(n_groups, (int, np.integer)) or n_groups < 1 or heads % n_groups:
        raise InvalidInput(f"n_groups must be a positive divisor of the {heads} heads, got {n_groups!r}")
    if not isinstance(chunk_len, (int, np.integer)) or chunk_len < 1:
        raise InvalidInput(f"chunk_len must be a positive int, got {chunk_len!r}")
    per = 2 * n_groups if complex_ else n_groups
    _f32("b", b, ndim=3)
    if b.shape[:2] != (bsz, length) or b.shape[2] % per or b.shape[2] == 0:
        raise InvalidInput(f"b must be (B, L, G * N{' * 2' if complex_ else ''}) with G = {n_groups}, got {b.shape}")
    n = b.shape[2] // per
    if n > MAX_STATE:
        raise InvalidInput(f"the GPU scan keeps at most {MAX_STATE} states per head, got {n}; use the numpy twin")
    _f32("c", c, b.shape)
    _f32("dt", dt, (bsz, length, heads))
    _f32("dt_bias", dt_bias, (heads,))
    _f32("d", d, (heads,))
    return bsz, length, heads, dim // heads, n


def _run_chunked(kernel: str, x, dt, a_log, dt_bias, b, c, d, n_groups, chunk_len, complex_: bool) -> np.ndarray:
    bsz, length, heads, p, n = _check_ssd(x, dt, a_log, dt_bias, b, c, d, n_groups, chunk_len, complex_)
    dev = get_device()
    if x.size == 0:
        return np.zeros_like(x)
    with BufferScope(dev) as s:
        y = s.empty(x.nbytes)
        batch = dev.batch()
        _record_chunked(kernel, batch, s.up(x), s.up(dt), s.up(b), s.up(c), s.up(a_log), s.up(dt_bias), s.up(d), y,
                        bsz, length, heads, p, int(n_groups), n, int(chunk_len), 2 if complex_ else 1)
        batch.submit()
        return dev.read(y, np.float32, x.shape)


def ssd(x: np.ndarray, dt: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray, b: np.ndarray, c: np.ndarray,
        d: np.ndarray, *, n_groups: int = 1, chunk_len: int = 64) -> np.ndarray:
    """The chunked Mamba-2 scan on the GPU (see `ssd_numpy` for the maths).

    Args:
        x: float32 (B, L, H * P).
        dt: float32 (B, L, H).
        a_log: float32 (H,).
        dt_bias: float32 (H,).
        b: float32 (B, L, G * N), N <= 64.
        c: float32 (B, L, G * N).
        d: float32 (H,).
        n_groups: G, a divisor of H.
        chunk_len: time steps per chunk (any positive value gives the same result).

    Returns:
        (B, L, H * P) float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, or N > 64.
        GpuUnavailable: no GPU device.
    """
    return _run_chunked("ssd", x, dt, a_log, dt_bias, b, c, d, n_groups, chunk_len, False)


def complex_ssd(x: np.ndarray, dt: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray, b: np.ndarray,
                c: np.ndarray, d: np.ndarray, *, n_groups: int = 1, chunk_len: int = 64) -> np.ndarray:
    """The chunked Mamba-3 complex scan on the GPU (see `complex_ssd_numpy` for the maths).

    Args:
        x: float32 (B, L, H * P).
        dt: float32 (B, L, H).
        a_log: float32 (H, 2), (real, imaginary) parts of A.
        dt_bias: float32 (H,).
        b: float32 (B, L, G * Nc * 2), (re, im) pairs, Nc <= 64.
        c: float32 (B, L, G * Nc * 2).
        d: float32 (H,).
        n_groups: G, a divisor of H.
        chunk_len: time steps per chunk (any positive value gives the same result).

    Returns:
        (B, L, H * P) float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, or Nc > 64.
        GpuUnavailable: no GPU device.
    """
    return _run_chunked("complex_ssd", x, dt, a_log, dt_bias, b, c, d, n_groups, chunk_len, True)


# ==== causal attention ===================================================================================

def _flash_shape(p: int, threads: int | None, lanes: int | None) -> tuple[int, int, int]:
    """(threads, lanes, key tile) of attention_flash.wgsl for head width p <= FLASH_MAX_HEAD_DIM.

    Defaults: 256 invocations, 4 lanes a row (the fastest of five variants on an H200 at head dim 32:
    benchmarks/results/attn_variants_h200.txt). The K (and V) tile holds 2 * threads vec4s of keys padded to 16 dims.
    """
    threads = threads if threads is not None else FLASH_THREADS if FLASH_THREADS is not None else 256
    lanes = lanes if lanes is not None else FLASH_LANES if FLASH_LANES is not None else 4
    if threads not in (64, 128, 256):
        raise InvalidInput(f"flash attention threads per workgroup must be 64, 128 or 256, got {threads!r}")
    if not isinstance(lanes, (int, np.integer)) or lanes < 1 or lanes > threads or lanes & (lanes - 1):
        raise InvalidInput(f"flash attention lanes per row must be a power of two in 1..{threads}, got {lanes!r}")
    key_tile = threads // 2 // -(-p // 16) // 4 * 4
    return int(threads), int(lanes), key_tile


def record_causal_attention(batch: Batch, q: GpuBuffer, k: GpuBuffer, v: GpuBuffer, out: GpuBuffer, b: int,
                            length: int, heads: int, p: int, *, row_stride: int | None = None,
                            offsets: tuple[int, int, int] = (0, 0, 0), threads: int | None = None,
                            lanes: int | None = None) -> None:
    """Record out (B, L, H * P) = causal softmax attention of q, k, v.

    Head widths P <= FLASH_MAX_HEAD_DIM take one flash-attention dispatch (attention_flash.wgsl: online
    softmax over key tiles in workgroup memory, O(L) memory, causal tiles skipped; each query row's keys
    split over `lanes` invocations whose partial softmaxes are merged at the end). q, k, v are then rows
    of `row_stride` floats (default H * P) whose heads start `offsets` floats in, so a fused (B * L, 3C)
    projection is read in place with row_stride 3C and offsets (0, C, 2C) (strided column slices, seed-001).
    `threads` (64, 128 or 256 invocations a workgroup) and `lanes` (invocations a query row, a power of two
    up to threads) only change speed; defaults in `_flash_shape`. Wider heads take the three-pass path
    (`_record_attention_three_pass`), which needs dense (B, L, H * P) q, k, v (row_stride H * P, offsets 0).
    """
    c = heads * p
    stride = c if row_stride is None else row_stride
    if p > FLASH_MAX_HEAD_DIM:
        if stride != c or any(offsets):
            raise InvalidInput(f"attention with head width {p} > {FLASH_MAX_HEAD_DIM} needs dense q, k, v "
                               "(no row_stride or offsets); split a fused projection with record_column_slice")
        _record_attention_three_pass(batch, q, k, v, out, b, length, heads, p)
        return
    n_threads, n_lanes, key_tile = _flash_shape(p, threads, lanes)
    params = batch.uniform([("u", length), ("u", heads), ("u", b), ("u", stride), ("u", offsets[0]),
                            ("u", offsets[1]), ("u", offsets[2]), ("u", 0)])
    batch.dispatch("attention_flash", "main", {0: params, 1: q, 2: k, 3: v, 4: out},
                   (-(-length // (n_threads // n_lanes)), heads, b),
                   {"HEAD_DIM": p, "THREADS": n_threads, "LANES": n_lanes, "KEY_TILE": key_tile})


def _record_attention_three_pass(batch: Batch, q: GpuBuffer, k: GpuBuffer, v: GpuBuffer, out: GpuBuffer,
                                 b: int, length: int, heads: int, p: int) -> None:
    """Record causal attention as scores, softmax, values, in windows of query rows sized to the binding limit.

    Per window: scores (attention_scores), the causal softmax in place (attention_softmax), then the
    probability-weighted values (attention_values); one scores buffer is reused by every window. O(L^2)
    scratch and three passes: the path for heads wider than the flash kernel holds in registers.
    """
    dev = batch.device
    rows = _window(length, b * heads * length * 4, dev, _ATTN_TILE, "causal attention's score rows")
    scores = batch.scratch(b * heads * rows * length * 4)
    for row0 in range(0, length, rows):
        r = min(rows, length - row0)
        params = batch.uniform([("u", length), ("u", heads), ("u", p), ("u", row0), ("u", r), ("u", b),
                                ("u", 0), ("u", 0)])
        batch.dispatch("attention_scores", "main", {0: params, 1: q, 2: k, 3: scores},
                       (-(-length // 16), -(-r // 16), b * heads))
        batch.dispatch("attention_softmax", "main", {0: params, 3: scores}, fold_groups(dev, b * heads * r))
        batch.dispatch("attention_values", "main", {0: params, 3: scores, 4: v, 5: out},
                       (-(-p // 16), -(-r // 16), b * heads))


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_heads: int, *, threads: int | None = None,
                     lanes: int | None = None) -> np.ndarray:
    """Causal multi-head softmax attention on the GPU (see `causal_attention_numpy`).

    Args:
        q: float32 (B, L, H * P) queries, heads side by side in each row.
        k: float32 (B, L, H * P).
        v: float32 (B, L, H * P).
        n_heads: H, a divisor of the width.
        threads: invocations per workgroup of the flash kernel (see `record_causal_attention`); speed only.
        lanes: invocations per query row of the flash kernel; speed only.

    Returns:
        (B, L, H * P) float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, or a flash kernel shape it does not have.
        GpuUnavailable: no GPU device.
    """
    _f32("q", q, ndim=3)
    _f32("k", k, q.shape)
    _f32("v", v, q.shape)
    bsz, length, dim = q.shape
    if not isinstance(n_heads, (int, np.integer)) or n_heads < 1 or dim % n_heads:
        raise InvalidInput(f"n_heads must be a positive divisor of the width {dim}, got {n_heads!r}")
    dev = get_device()
    if q.size == 0:
        return np.zeros_like(q)
    with BufferScope(dev) as s:
        out = s.empty(q.nbytes)
        batch = dev.batch()
        record_causal_attention(batch, s.up(q), s.up(k), s.up(v), out, bsz, length, int(n_heads), dim // n_heads,
                                threads=threads, lanes=lanes)
        batch.submit()
        return dev.read(out, np.float32, q.shape)

