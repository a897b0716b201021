"""The files of a saved vector index, read without trusting them: the hnswlib graph file parsed by its header and
sizes before hnswlib sees it, the groups file (fact label -> graph node) and the JSON manifest (R4-R6).

Split from index.py, which builds, searches and saves the index; everything here only reads and validates.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from .._lazy import lazy_import

np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

HEADER = struct.Struct("<QQQQQQiIQQQdQ")  # hnswlib 0.8 saveIndex header, 96 bytes
MAX_MANIFEST_BYTES = 64 * 1024
MAX_LEVEL = 64
GROUP_ROW = 16  # a groups file row: (label, node) as little-endian int64


class IndexRejected(Exception):
    """An index file or manifest failed validation; the caller discards it and rebuilds from SQLite."""


@dataclass(frozen=True)
class HnswFileInfo:
    """What we learn from parsing an hnswlib file ourselves."""

    count: int
    max_elements: int
    ef_construction: int
    labels: np.ndarray  # (count,) uint64
    deleted: np.ndarray  # (count,) bool
    vectors: np.ndarray  # (count, dim) float32


def parse_hnsw_file(data: bytes, dim: int, M: int) -> HnswFileInfo:
    """Parse and check an hnswlib 0.8 index file without trusting it.

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
    (off0, max_el, cur, size_per, label_off, off_data, maxlevel, enter, max_m, max_m0, m, mult, efc) = HEADER.unpack_from(data, 0)
    links0 = 2 * M * 4 + 4
    expected = {
        "offsetLevel0": (off0, 0), "M": (m, M), "maxM": (max_m, M), "maxM0": (max_m0, 2 * M),
        "size_data_per_element": (size_per, links0 + dim * 4 + 8), "offsetData": (off_data, links0),
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
    level0 = np.frombuffer(data, dtype=np.uint8, count=body, offset=HEADER.size).reshape(cur, size_per)  # (N, S)
    counts = level0[:, 0:2].copy().view("<u2").reshape(cur)  # (N,)
    if (counts > 2 * M).any():
        raise IndexRejected("index level-0 link count exceeds maxM0")
    nbrs = level0[:, 4:links0].copy().view("<u4")  # (N, 2M)
    used = np.arange(2 * M)[None, :] < counts[:, None]  # (N, 2M)
    if (nbrs[used] >= cur).any():
        raise IndexRejected("index level-0 link points past the element count")
    vectors = level0[:, off_data:label_off].copy().view("<f4")  # (N, D)
    if not np.isfinite(vectors).all():
        raise IndexRejected("index holds non-finite vectors")
    labels = level0[:, label_off:label_off + 8].copy().view("<u8").reshape(cur)  # (N,)
    ordered = np.sort(labels)  # (N,) (not np.unique: it imports numpy.ma, ~20 ms of every store's open)
    if (ordered[1:] == ordered[:-1]).any():
        raise IndexRejected("index holds duplicate labels")
    deleted = (level0[:, 2] & 1).astype(bool)  # (N,)
    size_links = M * 4 + 4
    pos = HEADER.size + body
    view = memoryview(data)
    levels = np.zeros(cur, dtype=np.int64)  # (N,)
    for i in range(cur):  # per-element variable-length records: no way to vectorise the walk itself
        if pos + 4 > len(data):
            raise IndexRejected("index file ends inside the link lists")
        n = int.from_bytes(view[pos:pos + 4], "little")
        pos += 4
        if n == 0:
            continue
        if n % size_links or n // size_links > maxlevel or pos + n > len(data):
            raise IndexRejected(f"index link list of element {i} has an impossible size {n}")
        block = np.frombuffer(data, dtype=np.uint8, count=n, offset=pos).reshape(-1, size_links)  # (L, S')
        c = block[:, 0:2].copy().view("<u2").reshape(-1)  # (L,)
        ids = block[:, 4:].copy().view("<u4")  # (L, M)
        if (c > M).any() or (ids[np.arange(M)[None, :] < c[:, None]] >= cur).any():
            raise IndexRejected(f"index upper-level links of element {i} are out of range")
        levels[i] = n // size_links
        pos += n
    if pos != len(data):
        raise IndexRejected(f"index file has {len(data) - pos} bytes after the link lists")
    if levels[enter] != maxlevel:
        raise IndexRejected("index entry point is not on the top level")
    return HnswFileInfo(int(cur), int(max_el), int(efc), labels, deleted, vectors)


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


def _manifest_names(path: Path) -> set[str]:
    try:
        return {read_manifest(path).get("file")}
    except IndexRejected:
        return set()
