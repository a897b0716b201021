"""The files of a saved vector index, read without trusting them: the hnswlib graph file parsed by its header and
sizes before hnswlib sees it, the groups file (fact label -> graph node) and the JSON manifest (R4-R6).

Split from index.py, which builds, searches and saves the index; everything here only reads and validates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import bisect
import hashlib
import json
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from .._lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

FileBytes = bytes | mmap.mmap  # a whole index file, read or mapped (parse_hnsw_file reads it in place)
HEADER = struct.Struct("<QQQQQQiIQQQdQ")  # hnswlib 0.8 saveIndex header, 96 bytes
MAX_MANIFEST_BYTES = 64 * 1024
MAX_LEVEL = 64
GROUP_ROW = 16  # a groups file row: (label, node) as little-endian int64


class IndexRejected(Exception):
    """An index file or manifest failed validation; the caller discards it and rebuilds from SQLite."""


@dataclass(frozen=True)
class HnswFileInfo:
    """What we learn from parsing an hnswlib file ourselves (arrays are read-only views into the file's bytes)."""

    count: int
    max_elements: int
    ef_construction: int
    labels: np.ndarray  # (count,) uint64
    deleted: np.ndarray  # (count,) bool
    vectors: np.ndarray  # (count, dim) float32, a strided view: copy the rows you keep


def _rows(data: FileBytes, dtype: str, count: int, offset: int, width: int, stride: int) -> np.ndarray:
    """A zero-copy (count, width) view of `dtype` items starting at byte `offset`, one row every `stride` bytes."""
    item = np.dtype(dtype).itemsize
    return np.ndarray((count, width), dtype=dtype, buffer=data, offset=offset, strides=(stride, item))


def element_layout(dim: int, M: int) -> tuple[int, int, int]:
    """hnswlib 0.8's level-0 element table at `dim` and `M`, as parse_hnsw_file requires it: (where the table
    starts in the file, bytes an element, where an element's vector starts in it: after its level-0 links)."""
    links0 = 2 * M * 4 + 4  # a u32 link count (its first u16) and 2M u32 links
    return HEADER.size, links0 + dim * 4 + 8, links0  # (the vector, then the u64 label)


def parse_hnsw_file(data: FileBytes, dim: int, M: int) -> HnswFileInfo:
    """Parse and check an hnswlib 0.8 index file without trusting it.

    Every field hnswlib would follow is bounded: header sizes, level-0 and upper-level link counts and ids, the
    labels, the vectors (finite) and the file length. Views, not copies: the level-0 table is read in place, and
    the variable-length upper-level records are walked from one non-empty record to the next (most elements
    have none), then checked all at once.

    Args:
        data: the whole file.
        dim: the dimension it must have.
        M: the graph degree it must have.
    Returns:
        HnswFileInfo.
    Raises:
        IndexRejected: the header, the link lists, the labels, the vectors or the length are inconsistent.
    """
    if len(data) < HEADER.size:
        raise IndexRejected(f"index file is {len(data)} bytes, shorter than hnswlib's {HEADER.size}-byte header")
    (off0, max_el, cur, size_per, label_off, off_data, maxlevel, enter, max_m, max_m0, m, mult,
     efc) = HEADER.unpack_from(data, 0)
    _, element, links0 = element_layout(dim, M)
    expected = {
        "offsetLevel0": (off0, 0), "M": (m, M), "maxM": (max_m, M), "maxM0": (max_m0, 2 * M),
        "size_data_per_element": (size_per, element), "offsetData": (off_data, links0),
        "label_offset": (label_off, links0 + dim * 4),
    }
    for field, (got, want) in expected.items():
        if got != want:
            raise IndexRejected(f"index header {field} is {got}, expected {want}")
    if not (cur <= max_el <= min(2 * cur + (1 << 20), 2**32 - 1)):
        raise IndexRejected(f"index header counts are impossible (count {cur}, max_elements {max_el})")
    if not (math.isfinite(mult) and mult > 0) or not 1 <= efc <= 1 << 20:
        raise IndexRejected("index header mult or ef_construction is out of range")
    if cur == 0:
        if maxlevel != -1 or len(data) != HEADER.size:
            raise IndexRejected("empty index has a level or trailing bytes")
        empty = np.zeros(0, dtype=np.uint64)
        return HnswFileInfo(0, max_el, efc, empty, np.zeros(0, bool), np.zeros((0, dim), np.float32))
    if not (0 <= maxlevel <= MAX_LEVEL) or enter >= cur:
        raise IndexRejected(f"index header level {maxlevel} or entry point {enter} is out of range")
    body = cur * size_per
    if len(data) < HEADER.size + body + 4 * cur:
        raise IndexRejected("index file is shorter than its element table")
    counts = _rows(data, "<u2", cur, HEADER.size, 1, size_per)[:, 0]  # (N,)
    if (counts > 2 * M).any():
        raise IndexRejected("index level-0 link count exceeds maxM0")
    nbrs = _rows(data, "<u4", cur, HEADER.size + 4, 2 * M, size_per)  # (N, 2M)
    used = np.arange(2 * M)[None, :] < counts[:, None]  # (N, 2M)
    if (used & (nbrs >= cur)).any():
        raise IndexRejected("index level-0 link points past the element count")
    vectors = _rows(data, "<f4", cur, HEADER.size + off_data, dim, size_per)  # (N, D)
    if not np.isfinite(vectors.sum(axis=1, dtype=np.float64)).all():  # a NaN or inf in a row makes its sum one
        raise IndexRejected("index holds non-finite vectors")
    labels = _rows(data, "<u8", cur, HEADER.size + label_off, 1, size_per)[:, 0]  # (N,)
    ordered = np.sort(labels)  # (N,) (not np.unique: it imports numpy.ma, ~20 ms of every store's open)
    if (ordered[1:] == ordered[:-1]).any():
        raise IndexRejected("index holds duplicate labels")
    deleted = (_rows(data, "u1", cur, HEADER.size + 2, 1, size_per)[:, 0] & 1).astype(bool)  # (N,)
    levels = _upper_levels(data, HEADER.size + body, cur, M, maxlevel)  # (N,)
    if levels[enter] != maxlevel:
        raise IndexRejected("index entry point is not on the top level")
    return HnswFileInfo(int(cur), int(max_el), int(efc), labels, deleted, vectors)


def _upper_levels(data: FileBytes, start: int, cur: int, M: int, maxlevel: int) -> np.ndarray:
    """Walk and check the upper-level link lists that follow the level-0 table: (N,) each element's level count.

    Each element has a 4-byte size, then that many bytes of (M + 1)-word level blocks (a u16 link count, M u32
    ids). The file is read as u32 words: a run of zero sizes (elements on level 0 only) is skipped in one step
    by finding the next non-zero word, so the Python loop runs once per element with upper levels (about 1/M
    of them); their blocks are then checked together.

    Raises:
        IndexRejected: a size or a link is out of range, the file ends inside the lists or has bytes after them.
    """
    size_links = M * 4 + 4
    block_words = M + 1
    if (len(data) - start) % 4:
        raise IndexRejected("index file ends inside the link lists")
    words = np.frombuffer(data, dtype="<u4", count=(len(data) - start) // 4, offset=start)  # (W,)
    total = len(words)
    nonzero = np.flatnonzero(words).tolist()  # word positions that may hold a record's size
    firsts: list[int] = []  # the first block word of each element with upper levels
    owners: list[int] = []  # that element
    sizes: list[int] = []  # its level count
    w = elem = 0
    while elem < cur:  # one step per element with upper levels (a loop over variable-length records)
        k = bisect.bisect_left(nonzero, w)
        j = nonzero[k] if k < len(nonzero) else total  # the next non-empty record starts at word j
        if elem + (j - w) >= cur:  # every element left is on level 0 only
            w += cur - elem
            break
        if j >= total:
            raise IndexRejected("index file ends inside the link lists")
        elem += j - w
        n = int(words[j])
        if n % size_links or n // size_links > maxlevel or j + 1 + n // 4 > total:
            raise IndexRejected(f"index link list of element {elem} has an impossible size {n}")
        firsts.append(j + 1)
        owners.append(elem)
        sizes.append(n // size_links)
        w = j + 1 + n // 4
        elem += 1
    if w > total:
        raise IndexRejected("index file ends inside the link lists")
    if w != total:
        raise IndexRejected(f"index file has {4 * (total - w)} bytes after the link lists")
    levels = np.zeros(cur, dtype=np.int64)  # (N,)
    if not owners:
        return levels
    owner_arr, size_arr = np.array(owners, dtype=np.int64), np.array(sizes, dtype=np.int64)  # (U,), (U,)
    levels[owner_arr] = size_arr
    block_owner = np.repeat(np.arange(len(owners)), size_arr)  # (L,) the record each level block belongs to
    within = np.arange(len(block_owner)) - np.repeat(np.cumsum(size_arr) - size_arr, size_arr)  # (L,)
    block_start = np.array(firsts, dtype=np.int64)[block_owner] + block_words * within  # (L,)
    link_count = words[block_start] & 0xFFFF  # (L,) the u16 count (little-endian: the word's low half)
    ids = words[block_start[:, None] + 1 + np.arange(M)[None, :]]  # (L, M)
    bad = (link_count > M) | ((np.arange(M)[None, :] < link_count[:, None]) & (ids >= cur)).any(axis=1)  # (L,)
    if bad.any():
        raise IndexRejected(f"index upper-level links of element {owners[int(block_owner[np.argmax(bad)])]} are out of "
                            "range")
    return levels


def groups_name(index_file: str) -> str:
    """The groups file saved beside an index file ("s.db.<token>.hnsw" -> "s.db.<token>.groups")."""
    return index_file[: -len(".hnsw")] + ".groups"


def read_groups(path: Path, manifest: dict) -> np.ndarray:
    """Read and check a groups file against its manifest: (live, 2) int64 rows (label, node), labels ascending.

    Raises:
        IndexRejected: missing, another size or hash than the manifest's, or labels not distinct and ascending.
    """
    size = manifest["groups_size"]
    if size != GROUP_ROW * manifest["live"]:
        raise IndexRejected(f"index groups are {size} bytes, expected {GROUP_ROW} per live vector ({manifest['live']})")
    if not path.is_file() or path.is_symlink():
        raise IndexRejected(f"index groups file {path.name} is missing")
    if path.stat().st_size != size:
        raise IndexRejected(f"index groups file is {path.stat().st_size} bytes, manifest says {size}")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest.get("groups_sha256"):
        raise IndexRejected("index groups file sha256 does not match the manifest")
    groups = np.frombuffer(data, dtype="<i8").reshape(-1, 2).astype(np.int64)  # (live, 2)
    if (groups < 0).any() or (np.diff(groups[:, 0]) <= 0).any():
        raise IndexRejected("index groups labels are not distinct non-negative and ascending")
    return groups


def read_manifest(path: Path) -> dict:
    """Read a manifest JSON object, refusing anything oversized or malformed.

    Raises:
        IndexRejected: missing, too large, not JSON, not an object.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        raise IndexRejected("no index manifest") from None
    if not path.is_file() or st.st_size > MAX_MANIFEST_BYTES:
        raise IndexRejected(f"index manifest is not a regular file of at most {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IndexRejected(f"index manifest is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise IndexRejected("index manifest is not a JSON object")
    return manifest


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")


def manifest_names(path: Path) -> set[str]:
    """The file a manifest names, as a set (empty when the manifest is unreadable)."""
    try:
        name = read_manifest(path).get("file")
        return {name} if isinstance(name, str) else set()
    except IndexRejected:
        return set()


def map_file(fd: int) -> mmap.mmap | bytes:
    """The bytes of the open file `fd`, mapped read-only rather than copied: hashing and parsing read it in place
    (reading a 276 MB snapshot into a new buffer cost 0.6-0.8 s of a load). Snapshot files are never written after
    their rename, and the map is released with the last view of it (the parsed rows kept are copies)."""
    if os.fstat(fd).st_size == 0:
        return b""  # (an empty file cannot be mapped; the parse rejects it)
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
