"""Embedding rows: gather by id, and the scatter-add of their gradients.
"""

from __future__ import annotations

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import get_device
from evermind_memory.gpu.ops.support import BufferScope, dispatch_1d, check_f32, check_ids, binding_tiles

__all__ = ["embedding_gather_numpy", "embedding_gather", "embedding_scatter_add_numpy", "embedding_scatter_add"]


def gather_rows(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Row gather out[i] = table[ids[i]] with vocabulary tiles and row tiles as the binding limit needs."""
    v, c = table.shape
    n = ids.shape[0]
    dev = get_device()
    out = np.zeros((n, c), dtype=np.float32)  # (N, C)
    if n == 0 or c == 0:
        return out
    vocab_tiles = list(binding_tiles(v, c * 4, dev, "table row"))
    with BufferScope(dev) as s:
        table_bufs = [s.up(table[v0:v1]) for v0, v1 in vocab_tiles]
        for r0, r1 in binding_tiles(n, c * 4, dev, "output row"):
            k = r1 - r0
            batch = dev.batch()
            o_buf = s.empty(k * c * 4)
            id_buf = s.up(ids[r0:r1])
            for (v0, v1), t_buf in zip(vocab_tiles, table_bufs):
                params = batch.uniform([("u", k), ("u", c), ("i", v0), ("i", v1)])
                dispatch_1d(batch, "gather_rows", "main", {0: params, 1: t_buf, 2: id_buf, 3: o_buf}, k * c)
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
    check_f32("table", table, 2)
    if not isinstance(ids, np.ndarray):
        raise InvalidInput(f"ids must be a numpy.ndarray of integers, got {type(ids).__name__}")
    flat = check_ids("ids", ids.reshape(-1), 1, 0, table.shape[0])  # (N,)
    return gather_rows(table, flat).reshape(ids.shape + (table.shape[1],))


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
    check_f32("dy", dy, min_ndim=1)
    if not isinstance(ids, np.ndarray) or dy.shape[:-1] != ids.shape:
        got = getattr(ids, "shape", ids)
        raise InvalidInput(f"dy must have shape ids.shape + (C,), got ids {got} and dy {dy.shape}")
    c = dy.shape[-1]
    flat_ids = check_ids("ids", ids.reshape(-1), 1, 0, int(vocab_size))  # (N,)
    flat_dy = dy.reshape(-1, c)  # (N, C)
    dev = get_device()
    out = np.zeros((int(vocab_size), c), dtype=np.float32)  # (V, C)
    if flat_ids.size == 0 or c == 0:
        return out
    row_tiles = list(binding_tiles(flat_ids.size, c * 4, dev, "gradient row"))
    with BufferScope(dev) as s:
        for v0, v1 in binding_tiles(int(vocab_size), c * 4, dev, "table row"):
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
                dispatch_1d(batch, "embedding_scatter_add", "main",
                                {0: params, 1: s.up(flat_dy[r0:r1]), 2: s.up(uniq.astype(np.int32)),
                                 3: s.up(offsets), 4: s.up(order), 5: d_buf},
                                uniq.size * c, {"ACCUMULATE": True})
                any_work = True
            batch.submit()
            if any_work:
                out[v0:v1] = dev.read(d_buf, np.float32, (v1 - v0, c))
    return out
