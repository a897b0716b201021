"""The files of a saved vector index: the graph file, the groups file (fact label -> graph node) and the JSON manifest,
written so that a crash leaves the previous snapshot valid (R4, R5) and read without trusting them (R6): the graph
file is parsed by usearch_file.py before usearch sees it.

Split from index.py, which builds and searches the index and hands its parts here to be written or read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import hashlib
import json
import mmap
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from .._atomic import fsync_path, write_atomic
from .._crash import crash_point
from .._lazy import lazy_import
from .index_nodes import LoadedNodes
from .usearch_file import IndexRejected, UsearchInfo, parse_usearch_file

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

INDEX_FORMAT = "evermind-usearch 1"  # (before: "evermind-hnsw 2", hnswlib's float32 graph: rebuilt once)
SPACE = "cos-i8"  # usearch's cosine over the rows' int8 steps
MAX_MANIFEST_BYTES = 64 * 1024
GROUP_ROW = 16  # a groups file row: (label, node) as little-endian int64
GRAPH_SUFFIX = ".usearch"  # a saved graph: "<db name>.<token>.usearch" (usearch_file.py reads it)
OLD_SUFFIXES = (".hnsw",)  # graphs of earlier releases (hnswlib's), removed by the first save of the new kind
_FILE_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}\.usearch$")


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


def close_quietly(data: mmap.mmap | bytes) -> None:
    """Close a map once nothing views it (a view still held keeps it open: BufferError)."""
    if isinstance(data, mmap.mmap):
        try:
            data.close()
        except BufferError:
            pass


# ---- writing --------------------------------------------------------------------------------------------------
def new_snapshot_name(directory: Path, stem: str) -> tuple[str, Path]:
    """(the file name of a new snapshot of `stem`, the temporary path its graph is saved to first)."""
    name = f"{stem}.{secrets.token_hex(6)}{GRAPH_SUFFIX}"
    return name, directory / (name + ".tmp")


def write_snapshot(directory: Path, stem: str, name: str, groups: np.ndarray, meta: dict, *, dim: int, M: int,
                   ef_construction: int, live: int, nodes: int) -> dict:
    """Finish a save whose graph is at new_snapshot_name's temporary path: fsync it, read it back and parse it (a
    short write shows up here), write the groups file, rename the graph into place, then write the manifest (the
    commit point). Older snapshot files of the stem (hnswlib's too) are removed afterwards.

    Args:
        directory, stem, name: as from new_snapshot_name.
        groups: (live, 2) int64 rows (label, node), labels ascending.
        meta: the store's manifest fields (store_id, fingerprint, watermark, ...).
        dim, M, ef_construction: the graph's; live, nodes: the labels and nodes it holds.
    Returns:
        the manifest written.
    Raises:
        OSError: the disk refused a write or the file read back is not what was saved; the previous manifest and
        snapshot stay valid.
    """
    final, groups_file = directory / name, directory / groups_name(name)
    tmp = directory / (name + ".tmp")
    groups_data = np.ascontiguousarray(groups, dtype="<i8").tobytes()
    try:
        crash_point("index.save.written")
        fsync_path(tmp)
        data = tmp.read_bytes()
        try:
            info = parse_usearch_file(data, dim, M)  # a short write shows up here (R4)
        except IndexRejected as exc:
            raise OSError(f"index file {tmp.name} was not written whole ({exc}); disk full?") from None
        if info.live != nodes:
            raise OSError(f"index file {tmp.name} does not hold what was saved; disk full?")
        manifest = {
            **meta,
            "format": INDEX_FORMAT, "space": SPACE, "dim": dim, "M": M, "ef_construction": ef_construction,
            "count": info.count, "live": live, "file": name, "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "groups_size": len(groups_data), "groups_sha256": hashlib.sha256(groups_data).hexdigest(),
        }
        write_atomic(groups_file, groups_data)
        os.replace(tmp, final)
        crash_point("index.save.before_manifest")
        write_atomic(directory / f"{stem}.json", json.dumps(manifest, sort_keys=True).encode())
    except BaseException:
        tmp.unlink(missing_ok=True)
        if name not in manifest_names(directory / f"{stem}.json"):
            final.unlink(missing_ok=True)
            groups_file.unlink(missing_ok=True)
        raise
    for old in index_files_of(directory, stem, leftovers=True):
        if old.name not in (name, groups_file.name):
            try:
                old.unlink(missing_ok=True)
            except OSError:
                pass  # best effort: a stray directory or a permission problem must not fail the save
    return manifest


# ---- reading --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """A saved index that passed every check: its manifest, the mapped graph file and what it holds."""

    manifest: dict
    path: Path  # the graph file
    data: mmap.mmap | bytes  # its bytes, mapped (the caller closes them: close_quietly)
    info: UsearchInfo  # the parsed graph
    nodes: LoadedNodes  # the groups, arranged by node


def read_snapshot(directory: Path, stem: str, *, expect: dict, M: int, ef_construction: int, max_seq: int,
                  defer_hash: bool) -> Snapshot:
    """Validate the manifest, the graph file and the groups file of `stem` against each other and the store (R6).

    Args:
        expect: manifest fields that must match exactly (store_id, fingerprint, dim, ...; a tuple: any of those).
        M, ef_construction: the store's graph parameters.
        max_seq: the store's highest change sequence; a newer watermark is refused.
        defer_hash: leave the graph file's sha256 to the caller (VectorIndex.file_agrees).
    Raises:
        IndexRejected: anything disagrees; the message says what.
    """
    manifest = read_manifest(directory / f"{stem}.json")
    want = {"format": INDEX_FORMAT, "space": SPACE, "M": M, "ef_construction": ef_construction, **expect}
    for key, value in want.items():  # (a tuple: any of these values)
        if manifest.get(key) not in (value if isinstance(value, tuple) else (value,)):
            raise IndexRejected(f"manifest {key} is {manifest.get(key)!r:.80}, expected {value!r:.80}")
    for key in ("watermark", "count", "live", "size", "groups_size"):
        if not isinstance(manifest.get(key), int) or isinstance(manifest.get(key), bool) or manifest[key] < 0:
            raise IndexRejected(f"manifest {key} is not a non-negative integer")
    if manifest["watermark"] > max_seq:
        raise IndexRejected(f"manifest watermark {manifest['watermark']} is newer than the store ({max_seq})")
    name = manifest.get("file")
    if not isinstance(name, str) or not _FILE_RE.match(name) or not name.startswith(f"{stem}."):
        raise IndexRejected(f"manifest names an unexpected index file {name!r:.80}")
    path = directory / name
    if not path.is_file() or path.is_symlink():
        raise IndexRejected(f"index file {name} is missing")
    if path.stat().st_size != manifest["size"]:
        raise IndexRejected(f"index file is {path.stat().st_size} bytes, manifest says {manifest['size']}")
    fd = os.open(path, os.O_RDONLY)
    try:
        data = map_file(fd)
    finally:
        os.close(fd)  # (a map keeps its own reference to the file)
    try:
        if not defer_hash and hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
            raise IndexRejected("index file sha256 does not match the manifest")
        info = parse_usearch_file(data, int(expect["dim"]), M)
        if info.count != manifest["count"]:
            raise IndexRejected("index header counts disagree with the manifest")
        live_keys = info.keys[~info.removed]  # (n,) the live nodes, slot order
        if len(live_keys) and int(live_keys.max()) > manifest["watermark"]:
            raise IndexRejected("index holds a label newer than its watermark")
        groups = read_groups(directory / groups_name(name), manifest)  # (live, 2) label, node
        alive = np.flatnonzero(~info.removed)  # (n,) slots of live nodes
        nodes = live_keys.astype(np.int64)  # (n,)
        order = np.argsort(nodes)  # (n,)
        by_node = np.argsort(groups[:, 1], kind="stable")  # (live,) by node, then label (the rows are by label)
        grouped = groups[by_node, 1]  # (live,)
        starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]]) if len(groups) else by_node  # (n',)
        if len(starts) != len(nodes) or (grouped[starts] != nodes[order]).any():  # (the groups' nodes: the graph's)
            raise IndexRejected("index groups and graph disagree on the live nodes")
        if len(groups) and int(groups[:, 0].max()) > manifest["watermark"]:
            raise IndexRejected("index groups hold a label newer than its watermark")
    except BaseException:
        close_quietly(data)
        raise
    loaded = LoadedNodes(groups, nodes[order], np.r_[starts, len(groups)], groups[by_node, 0], alive[order],
                         info.vectors)
    return Snapshot(manifest, path, data, info, loaded)
