"""Validation and dispatch helpers shared by every GPU op: dtype/shape checks, workgroup folding, tiling
past the binding limit, and a scope that releases an op's buffers together.

Public to gpu/ (the op modules, gpu/blocks, the resident model and its trainer import these names), not part
of the package's user-facing API: `evermind_memory.gpu.ops` re-exports the ops, not these helpers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import Batch, GpuBuffer, GpuDevice


MAX_EXPERTS = 64  # moe_route keeps a 64-bit "taken" mask per row



def check_f32(name: str, arr: Any, ndim: int | None = None, *, min_ndim: int = 0) -> np.ndarray:
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


def check_ids(name: str, arr: Any, ndim: int, lo: int, hi: int) -> np.ndarray:
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


def check_shape(name: str, arr: np.ndarray, shape: tuple[int, ...]) -> None:
    if arr.shape != tuple(shape):
        raise InvalidInput(f"{name} must have shape {tuple(shape)}, got {arr.shape}")


def fold_groups(dev: GpuDevice, n_groups: int) -> tuple[int, int]:
    """Fold a 1-D workgroup count into (x, y) under the per-dimension limit (kernels guard the excess)."""
    lim = dev.max_groups_per_dim
    if n_groups <= lim:
        return (n_groups, 1)
    return (lim, -(-n_groups // lim))


def binding_tiles(n: int, per_item_bytes: int, dev: GpuDevice, what: str) -> Iterator[tuple[int, int]]:
    """Split range(n) into [start, stop) tiles whose binding (per_item_bytes each) fits the device limit."""
    if per_item_bytes > dev.max_binding_bytes:
        raise InvalidInput(
            f"one {what} needs {per_item_bytes} bytes in a single binding but the device allows "
            f"{dev.max_binding_bytes}; use smaller inner dimensions or the numpy path"
        )
    step = max(1, dev.max_binding_bytes // max(per_item_bytes, 1))
    for start in range(0, n, step):
        yield start, min(n, start + step)


class BufferScope:
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

    def __enter__(self) -> "BufferScope":
        return self

    def __exit__(self, *exc: object) -> None:
        for buf in self.bufs:
            self.dev.release(buf)
        self.bufs.clear()


def dispatch_1d(batch: Batch, kernel: str, entry: str, bindings: dict, n: int,
                    constants: dict | None = None, per_group: int = 256) -> None:
    groups = fold_groups(batch.device, -(-n // per_group))
    batch.dispatch(kernel, entry, bindings, groups, constants)

SUMSQ_CHUNK = 4096  # elements per workgroup of sum_squares.partial


def check_fits(dev: GpuDevice, nbytes: int, what: str) -> None:
    if nbytes > dev.max_binding_bytes:
        raise InvalidInput(
            f"{what} needs {nbytes} bytes in one binding but the device allows {dev.max_binding_bytes}; "
            "pass smaller inputs or use the numpy twin"
        )

def rows_of(name: str, x: np.ndarray) -> tuple[int, int]:
    check_f32(name, x, min_ndim=1)
    c = x.shape[-1]
    return (x.size // c if c else 0), c
