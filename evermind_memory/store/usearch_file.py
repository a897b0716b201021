"""A usearch 2.26.6 index file, read without trusting it (R6): every count, size, level, neighbour count and
neighbour slot that usearch would follow is bounded here first, so a damaged or hostile file is refused
(IndexRejected) before `Index.load` or `Index.view` sees it, instead of making the C++ read out of bounds.

usearch checks almost nothing itself: its loader takes the node levels, the graph header and the neighbour lists as
written (a negative level wraps the size arithmetic, a neighbour slot past the node count indexes past its node
array, a neighbour list longer than its capacity reads into the next node), and a view maps the file as is.

The layout, as `index_dense_gt::save_to_stream` then `index_gt::save_to_stream` write it (little-endian, packed, no
alignment; checked byte for byte against files saved by the installed 2.26.6):

    offset               size            field
    0                    4               rows: u32 slots (nodes), removed ones included
    4                    4               cols: u32 bytes a vector (= dim for i8)
    8                    rows * cols     the vectors, slot order
    V = 8 + rows*cols    64              dense header (DENSE), at V +: 0 "usearch", 7 version u16 x3 (2, 26, 6),
                                         13 metric u8 (99 'c' = cos), 14 scalar u8 (23 = i8), 15 key u8
                                         (14 = u64), 16 slot u8 (15 = u32), 17 count_present u64, 25
                                         count_deleted u64 (present + deleted = rows), 33 dimensions u64, 41 multi
                                         u8, 42-63 zero
    G = V + 64           40              graph header (GRAPH): size, connectivity, connectivity_base, max_level,
                                         entry_slot, each u64 (an empty graph: max_level 2**64-1, that is -1)
    G + 40               2 * size        each slot's level, i16
    N = G + 40 + 2*size  sum(node)       the nodes, slot order; node i takes 10 + B + U * level[i] bytes:
                                           key u64 (a removed slot: 2**64-1, usearch's free key), level i16,
                                           level 0: u32 count + connectivity_base u32 slots  (B bytes),
                                           levels 1..level: u32 count + connectivity u32 slots (U bytes each)

A list's count says how many of its slots are used; the rest is padding that usearch never reads (zeros in every
file we saw; not checked, since a list that shrank may leave stale slots). remove() compacts nothing: a removed slot
keeps its vector, level and links (others still link to it; search walks through it and filters it out), only its
key becomes the free key, and a later add() reuses the slot.

After the parse, hand usearch the very bytes parsed (a path re-read later is another file): `Index.load(buffer)`
copies them; `Index.view(buffer)` does not keep the buffer alive (free the bytes or close the mmap while the index
lives and the next search reads freed memory), and a viewed index must never be added to: with removed slots in the
file, add() reuses one and writes into the mapped bytes (a segfault on a read-only map, a silently mutated `bytes`).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)


class IndexRejected(Exception):
    """An index file or manifest failed validation; the caller discards it and rebuilds from SQLite."""


__all__ = ["IndexRejected", "UsearchInfo", "parse_usearch_file", "VERSION", "FREE_KEY"]

MATRIX = struct.Struct("<II")  # rows, cols of the vectors matrix
DENSE = struct.Struct("<7s3H4B3QB22s")  # index_dense_head_t, 64 bytes
GRAPH = struct.Struct("<5Q")  # index_serialized_header_t, 40 bytes
MAGIC = b"usearch"
VERSION = (2, 26, 6)  # the only version accepted: the one whose bytes this parser was checked against
METRIC_COS = 99  # metric_kind_t::cos_k ('c')
SCALAR_I8 = 23  # scalar_kind_t::i8_k
KEY_U64 = 14  # scalar_kind_t::u64_k: the Python Index's key type
SLOT_U32 = 15  # scalar_kind_t::u32_k: its compressed slot type (4-byte neighbour slots)
FREE_KEY = 2**64 - 1  # the key usearch writes into a removed slot (-1 as int64)
NO_LEVEL = 2**64 - 1  # the max_level of an empty graph (level_t -1, widened)
MAX_LEVEL = 64  # highest node level accepted: a level is -log(U)/log(M) with U a double, so < 54 for any M >= 2
NODE_HEAD = 10  # key u64, level i16
CHUNK = 1 << 16  # neighbour lists gathered at a time (bounds the temporary copies: ~9 MB at M = 16)

FileData = bytes | memoryview | mmap.mmap


@dataclass(frozen=True)
class UsearchInfo:
    """What parsing a usearch file tells us. `keys` and `removed` are copies; `vectors` is a read-only view into
    the parsed bytes (keep the bytes alive while you use it; copy the rows you keep)."""

    dim: int
    connectivity: int
    connectivity_base: int
    count: int  # slots (nodes) stored, removed ones included
    max_level: int  # -1 when count is 0
    entry_slot: int
    keys: np.ndarray  # (count,) int64 each slot's key; a removed slot holds usearch's free key, -1 here
    removed: np.ndarray  # (count,) bool the slot was removed (its key is the free key)
    vectors: np.ndarray  # (count, dim) int8 each slot's vector (a removed slot's too: usearch keeps it)

    @property
    def live(self) -> int:
        """Slots not removed: what `len(index)` reports once usearch has loaded the file."""
        return self.count - int(self.removed.sum())


def node_bytes(connectivity: int, connectivity_base: int) -> tuple[int, int]:
    """(bytes a node takes at level 0, bytes each upper level adds), as index_gt lays nodes out: a u32 count then
    the slot capacity of u32 slots per level, after the 10-byte head."""
    return NODE_HEAD + 4 + 4 * connectivity_base, 4 + 4 * connectivity


def parse_usearch_file(data: FileData, dim: int, connectivity: int) -> UsearchInfo:
    """Parse and check a file saved by usearch 2.26.6's `Index.save` without trusting it.

    Our indexes are always `Index(ndim=dim, metric="cos", dtype="i8", connectivity=connectivity)` with
    non-negative int64 keys, so everything else is refused. Checked, in the order usearch would read it: the
    matrix shape, the dense header (magic, exact version, kinds, dims, multi, counts), the graph header
    (size = rows, connectivity, connectivity_base = 2 * connectivity, levels and entry slot in range), every
    node's level (in [0, max_level], agreeing with the level its node repeats, the entry slot on max_level), the
    exact file length those levels imply, every neighbour list's count (at most its capacity) and used slots
    (< count, and on an upper level only nodes that reach that level: greedy search reads a neighbour's list on
    the level it was found at), the removed count and the live keys (non-negative, distinct).

    Vectorised: the nodes vary in size, so their offsets come from a cumulative sum of the levels, and their
    heads and lists are gathered CHUNK at a time through a sliding-window view of the bytes; no Python loop runs
    per node.

    Args:
        data: the whole file (bytes, a read-only mmap, or a flat memoryview).
        dim: the dimension it must have.
        connectivity: the M it must have been built with.
    Returns:
        UsearchInfo.
    Raises:
        IndexRejected: anything above disagrees; the message says what.
    """
    size = memoryview(data).nbytes
    if size < MATRIX.size:
        raise IndexRejected(f"usearch file is {size} bytes, shorter than its {MATRIX.size}-byte matrix shape")
    rows, cols = MATRIX.unpack_from(data, 0)
    if cols != dim:
        raise IndexRejected(f"usearch vectors are {cols} bytes wide, expected {dim} (i8 x {dim})")
    dense_at = MATRIX.size + rows * cols
    graph_at = dense_at + DENSE.size
    if size < graph_at + GRAPH.size:
        raise IndexRejected(f"usearch file is {size} bytes, too short for {rows} vectors and its headers")
    deleted = _check_dense(DENSE.unpack_from(data, dense_at), rows, dim)
    count, conn, conn_base, max_level, entry = GRAPH.unpack_from(data, graph_at)
    if count != rows:
        raise IndexRejected(f"usearch graph holds {count} nodes but the matrix {rows} vectors")
    if conn != connectivity or conn_base != 2 * connectivity:
        raise IndexRejected(f"usearch connectivity is ({conn}, base {conn_base}), expected ({connectivity}, base "
                            f"{2 * connectivity})")
    head_end = graph_at + GRAPH.size
    # (N, D) no copy. np.frombuffer, not np.ndarray(buffer=): only frombuffer holds a buffer export on the map,
    # so that closing the map while a view of it lives raises BufferError (index_files.close_quietly) instead
    # of unmapping memory the view still reads (a crash: the verify pass hashing rows as the process exited).
    vectors = np.frombuffer(data, dtype=np.int8, count=rows * dim, offset=MATRIX.size).reshape(rows, dim)
    vectors.flags.writeable = False
    if count == 0:
        if max_level != NO_LEVEL:
            raise IndexRejected(f"usearch empty graph has max_level {max_level}")
        if size != head_end:
            raise IndexRejected(f"usearch empty index has {size - head_end} bytes after its headers")
        empty = np.zeros(0, dtype=np.int64)
        return UsearchInfo(dim, conn, conn_base, 0, -1, int(entry), empty, np.zeros(0, dtype=bool), vectors)
    if max_level > MAX_LEVEL:
        raise IndexRejected(f"usearch max_level {max_level} is out of range (at most {MAX_LEVEL})")
    if entry >= count:
        raise IndexRejected(f"usearch entry slot {entry} is not below the node count {count}")
    base, upper = node_bytes(conn, conn_base)
    nodes_at = head_end + 2 * count
    if size < nodes_at + base * count:
        raise IndexRejected(f"usearch file is {size} bytes, too short for {count} nodes")
    levels = np.frombuffer(data, dtype="<i2", count=count, offset=head_end).astype(np.int64)  # (N,)
    bad = (levels < 0) | (levels > max_level)  # (N,)
    if bad.any():
        slot = int(np.argmax(bad))
        raise IndexRejected(f"usearch node {slot} has level {levels[slot]}, outside [0, {max_level}]")
    if levels[entry] != max_level:
        raise IndexRejected(f"usearch entry slot {entry} is on level {levels[entry]}, not the top {max_level}")
    sizes = base + upper * levels  # (N,) each node's bytes
    ends = nodes_at + np.cumsum(sizes)  # (N,)
    if int(ends[-1]) != size:
        raise IndexRejected(f"usearch file is {size} bytes, its nodes end at {int(ends[-1])}")
    starts = ends - sizes  # (N,)
    raw = np.frombuffer(data, dtype=np.uint8)  # (size,)
    keys = _check_heads(raw, starts, levels)
    _check_lists(raw, starts + NODE_HEAD, conn_base, count, levels, 0)
    owners = np.flatnonzero(levels)  # (U,) nodes with upper levels (about 1 in M)
    per = levels[owners]  # (U,) how many upper levels each has
    first = np.repeat(np.cumsum(per) - per, per)  # (L,) where each node's run of blocks begins
    block_level = np.arange(len(first)) - first + 1  # (L,) 1..level for each node
    block_at = np.repeat(starts[owners] + base, per) + upper * (block_level - 1)  # (L,)
    _check_lists(raw, block_at, conn, count, levels, block_level)
    return _keys_info(keys, deleted, dim, conn, conn_base, int(max_level), int(entry), vectors)


def _check_dense(head: tuple, rows: int, dim: int) -> int:
    """Check index_dense_head_t: the file is what `Index(ndim=dim, metric="cos", dtype="i8")` of 2.26.6 saves.
    Returns its count of removed slots (checked against the nodes' keys later)."""
    magic, major, minor, patch, metric, scalar, key, slot, present, deleted, dims, multi, reserved = head
    if magic != MAGIC:
        raise IndexRejected(f"usearch header magic is {magic!r}, expected {MAGIC!r}")
    if (major, minor, patch) != VERSION:
        raise IndexRejected(f"usearch file version is {major}.{minor}.{patch}, only "
                            f"{'.'.join(map(str, VERSION))} is accepted")
    if metric != METRIC_COS:
        raise IndexRejected(f"usearch metric kind is {metric}, expected {METRIC_COS} (cos)")
    if scalar != SCALAR_I8:
        raise IndexRejected(f"usearch scalar kind is {scalar}, expected {SCALAR_I8} (i8)")
    if key != KEY_U64 or slot != SLOT_U32:
        raise IndexRejected(f"usearch key/slot kinds are {key}/{slot}, expected {KEY_U64}/{SLOT_U32} (u64/u32)")
    if dims != dim:
        raise IndexRejected(f"usearch dimensions are {dims}, expected {dim}")
    if multi != 0:
        raise IndexRejected(f"usearch multi flag is {multi}: several vectors a key are not ours")
    if any(reserved):
        raise IndexRejected("usearch header has non-zero reserved bytes")
    if present + deleted != rows:
        raise IndexRejected(f"usearch counts do not add up: {present} present + {deleted} removed != {rows} slots")
    return int(deleted)


def _gather(raw: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """(len(at), width) copies of the bytes at each offset in `at` (all already known to lie inside `raw`)."""
    return np.lib.stride_tricks.sliding_window_view(raw, width)[at]


def _check_heads(raw: np.ndarray, starts: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Read each node's head (key, level), CHUNK at a time: (N,) uint64 keys.

    Raises:
        IndexRejected: a node's own level differs from the levels array (usearch sizes the node by one and walks
            its lists by the other).
    """
    keys = np.empty(len(starts), dtype=np.uint64)  # (N,)
    for lo in range(0, len(starts), CHUNK):
        heads = _gather(raw, starts[lo:lo + CHUNK], NODE_HEAD)  # (C, 10)
        keys[lo:lo + CHUNK] = np.ascontiguousarray(heads[:, :8]).view("<u8")[:, 0]
        own = np.ascontiguousarray(heads[:, 8:]).view("<i2")[:, 0]  # (C,)
        differ = own != levels[lo:lo + CHUNK]  # (C,)
        if differ.any():
            slot = lo + int(np.argmax(differ))
            raise IndexRejected(f"usearch node {slot} says level {own[slot - lo]}, the levels array {levels[slot]}")
    return keys


def _check_lists(raw: np.ndarray, at: np.ndarray, capacity: int, count: int, levels: np.ndarray,
                 level: int | np.ndarray) -> None:
    """Check the neighbour lists at byte offsets `at` (a u32 count then `capacity` u32 slots each), CHUNK at a
    time: the count is at most the capacity, every used slot is below `count` and, above level 0, names a node
    that reaches the list's `level` (an int, or one per list).

    Raises:
        IndexRejected: a list breaks one of those; the message names the first offender.
    """
    width = 4 + 4 * capacity
    columns = np.arange(capacity)  # (K,)
    for lo in range(0, len(at), CHUNK):
        lists = np.ascontiguousarray(_gather(raw, at[lo:lo + CHUNK], width)).view("<u4")  # (C, 1 + K)
        used, slots = lists[:, 0], lists[:, 1:]  # (C,), (C, K)
        lvl = level if isinstance(level, int) else level[lo:lo + CHUNK]  # int or (C,)
        over = used > capacity  # (C,)
        if over.any():
            i = int(np.argmax(over))
            raise IndexRejected(f"usearch neighbour list at byte {int(at[lo + i])} (level {_level_of(lvl, i)}) "
                                f"holds {used[i]} slots, capacity {capacity}")
        mask = columns[None, :] < used[:, None]  # (C, K) the slots in use
        wild = mask & (slots >= count)  # (C, K)
        if wild.any():
            i = int(np.argmax(wild.any(axis=1)))
            raise IndexRejected(f"usearch neighbour list at byte {int(at[lo + i])} names slot "
                                f"{int(slots[i][wild[i]][0])}, not below the node count {count}")
        if isinstance(lvl, int) and lvl == 0:
            continue  # every node reaches level 0
        reach = levels[np.where(mask, slots, 0)]  # (C, K) each used neighbour's level (slot 0 where unused)
        low = mask & (reach < (lvl if isinstance(lvl, int) else lvl[:, None]))  # (C, K)
        if low.any():
            i = int(np.argmax(low.any(axis=1)))
            raise IndexRejected(f"usearch neighbour list at byte {int(at[lo + i])} (level {_level_of(lvl, i)}) "
                                f"names slot {int(slots[i][low[i]][0])}, a node that does not reach that level")


def _level_of(level: int | np.ndarray, i: int) -> int:
    return level if isinstance(level, int) else int(level[i])


def _keys_info(keys: np.ndarray, deleted: int, dim: int, conn: int, conn_base: int, max_level: int, entry: int,
               vectors: np.ndarray) -> UsearchInfo:
    """Check the keys against the header's removed count and our key rules, and assemble the UsearchInfo.

    Raises:
        IndexRejected: the removed slots disagree with count_deleted, or a live key is negative (>= 2**63 as
            usearch's u64) or repeated.
    """
    removed = keys == np.uint64(FREE_KEY)  # (N,)
    if int(removed.sum()) != deleted:
        raise IndexRejected(f"usearch header says {deleted} removed slots, the nodes hold {int(removed.sum())}")
    signed = keys.view(np.int64)  # (N,) a removed slot reads -1
    live = signed[~removed]  # (live,)
    if (live < 0).any():
        raise IndexRejected(f"usearch holds a negative key ({int(live[np.argmax(live < 0)])} as int64)")
    ordered = np.sort(live)  # (live,) (not np.unique: it imports numpy.ma)
    same = ordered[1:] == ordered[:-1]
    if same.any():
        raise IndexRejected(f"usearch holds key {int(ordered[1:][same][0])} more than once")
    return UsearchInfo(dim, conn, conn_base, len(keys), max_level, entry, signed, removed, vectors)
