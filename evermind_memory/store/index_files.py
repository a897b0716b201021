"""The files of a saved vector index, read without trusting them: the groups file (fact label -> graph node) and the
JSON manifest (R4-R6); the graph file itself is parsed by usearch_file.py before usearch sees it.

Split from index.py, which builds, searches and saves the index; everything here only reads and validates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import hashlib
import json
import mmap
import os
from pathlib import Path

from .._lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

MAX_MANIFEST_BYTES = 64 * 1024
GROUP_ROW = 16  # a groups file row: (label, node) as little-endian int64
GRAPH_SUFFIX = ".usearch"  # a saved graph: "<db name>.<token>.usearch" (usearch_file.py reads it)
OLD_SUFFIXES = (".hnsw",)  # graphs of earlier releases (hnswlib's), removed by the first save of the new kind


class IndexRejected(Exception):
    """An index file or manifest failed validation; the caller discards it and rebuilds from SQLite."""


def groups_name(index_file: str) -> str:
    """The groups file saved beside an index file ("s.db.<token>.usearch" -> "s.db.<token>.groups")."""
    for suffix in (GRAPH_SUFFIX, *OLD_SUFFIXES):
        if index_file.endswith(suffix):
            return index_file[: -len(suffix)] + ".groups"
    return index_file + ".groups"


def index_files_of(directory: Path, stem: str, leftovers: bool = False) -> list[Path]:
    """The snapshot files of the store `stem` in `directory`: graphs (of this release and earlier ones) and their
    groups files; with `leftovers`, also the temporary files of saves that did not finish."""
    tail = "*" if leftovers else ""
    found = [p for suffix in (GRAPH_SUFFIX, *OLD_SUFFIXES, ".groups")
             for p in directory.glob(f"{stem}.*{suffix}{tail}")]
    if leftovers:
        found += list(directory.glob(f"{stem}.json.*.tmp"))
    return sorted(set(found))


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
