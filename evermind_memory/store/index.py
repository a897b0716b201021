"""The HNSW index: a disposable cache of the vectors in SQLite, wrapped so the graph library cannot hurt us.

The graph is usearch's (Unum, Apache-2.0) over the rows' own int8 components: a row stores int8 steps of its
largest component / 127 (backend/vector_blobs.py) and the graph holds exactly those steps under the cosine metric,
which ignores the per-row scale, so the graph ranks by the stored vectors' own cosines (to the int8 rounding of the
query) at 661 bytes a vector where hnswlib's float32 graph took 2,196 (benchmarks/index_library.py), and the
candidates it returns are scored again exactly against the float32 query. A saved graph is read as a shared
read-only map (a process that only recalls reads no copy of it; processes share its pages) until the process
first changes the index, which then loads a copy it can change.

Every graph call runs under one readers-writer lock (R7); `k` is clamped and a failed search is retried, then
reported so the caller can search exactly (R9). Files are saved with temp + fsync + rename and a manifest written
last (R4, R5), and a file is parsed and checked by us (sha256, headers, levels, neighbour lists, keys:
usearch_file.py) before usearch is allowed to read it (R6): index_files.py writes and reads them.

One graph node per distinct vector: facts whose vectors are bit-identical (templated or repeated memories; the tiny
model maps many texts to one vector) share a node, and a search expands each node it finds into its facts. An HNSW
neighbour heuristic (hnswlib's, which served before usearch) keeps a candidate only when it is closer to the new
node than to every neighbour already kept, so among exact duplicates (distance 0 to each other) each node kept a
single link, and groups of duplicates came loose from the graph: recall@10 fell to 0.75-0.9 against exact search.
The node -> facts table is saved beside the graph (`<file>.groups`, checked like it). While the graph holds at most
IndexConfig.exact_max nodes, a search is exact instead (a matrix product over the nodes' vectors, kept in memory up
to that size): as fast or faster there (benchmarks/exact_vs_hnsw.py) and never misses a fact.
"""

from __future__ import annotations

import hashlib
import mmap
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from .._lazy import lazy_import
from ..errors import EvermindError, InvalidInput
from .backend.vector_blobs import steps_of, unit_steps
from .index_files import (  # noqa: F401  (groups_name, read_manifest: imported from here by the store and tests)
    IndexRejected, close_quietly, groups_name, new_snapshot_name, read_manifest, read_snapshot, write_snapshot,
)
from .index_config import IndexConfig, search_ef
from .index_nodes import NEAR_TOL, LoadedNodes, NodeMaps, NodeMatrix, near_duplicates, step_keys
from .lock import RWLock

usearch = lazy_import("usearch.index", globals(), "usearch")
if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

FILTER_CANDIDATES = 200  # nodes a filtered search asks the graph for at first (it takes no predicate): among a
# tenth of the nodes (the smallest selection the store hands the graph) 200 rescored found 0.997 of the selection's
# exact top 10 (benchmarks/index_library.py --selections); fewer found than wanted: 4x more, up to FILTER_WIDEST
FILTER_WIDEST = 12_800
ADD_CHUNK = 8192  # new nodes handed to the graph at a time when an add reports progress


class SearchFailed(Exception):
    """The graph could not return the requested neighbours even after a retry; search exactly instead."""


def _new_graph(dim: int, config: IndexConfig):
    """An empty usearch graph of our kind: cosine over int8 vectors, one vector a key."""
    return usearch.Index(ndim=dim, metric="cos", dtype="i8", connectivity=config.M,
                         expansion_add=config.ef_construction, expansion_search=config.ef_search)


def _rows_of(found, dim: int) -> np.ndarray:
    """usearch's get() answer as an (N, D) int8 matrix (it answers a tuple, with None for a key it lacks: zeros)."""
    if isinstance(found, np.ndarray):
        return found.reshape(-1, dim)
    return np.stack([np.zeros(dim, np.int8) if row is None else row for row in found]) if len(found) else \
        np.zeros((0, dim), np.int8)


class VectorIndex:
    """A usearch graph over the int8 steps of unit vectors, with integer labels; thread-safe for all methods.

    The graph holds one node per distinct vector, named by the first label that carried it; a node lives while
    any of its labels does (see the module docstring). While the graph has at most config.exact_max nodes, their
    vectors are also kept in one matrix and searched exactly.

    Args:
        dim: vector length.
        config: HNSW parameters.
    """

    def __init__(self, dim: int, config: IndexConfig = IndexConfig()) -> None:
        self.dim = int(dim)
        self.config = config
        self._lock = RWLock()
        self._graph = _new_graph(self.dim, config)
        self._mapped: mmap.mmap | bytes | None = None  # the saved file a loaded graph views (None: it owns a copy)
        self._ef = search_ef(config, 0)
        self._graph.expansion_search = self._ef
        self._elements = 0  # graph slots: nodes added, removed ones not yet reused included
        self._maps: NodeMaps | None = NodeMaps({}, {}, {}, {})  # None while a loaded snapshot's arrays stand for it
        self._loaded: LoadedNodes | None = None
        self._maps_lock = threading.Lock()  # one thread builds the dicts from _loaded
        self.unhashed: tuple[Path, str] | None = None  # (file, sha256) of a load that left the hash to file_agrees()
        self._closed = False  # close(): no graph call starts any more
        self.hash_agreed = True  # what file_agrees() found once it hashed
        self._matrix: NodeMatrix | None = NodeMatrix(self.dim) if config.exact_max > 0 else None

    # ---- state -------------------------------------------------------------------------------------------
    def _dicts(self) -> NodeMaps:
        """The bookkeeping dicts, built from a loaded snapshot's arrays at first need, by whichever thread needs them
        first, holding the index lock or not (the arrays are never changed, and the dicts replace them in one
        assignment)."""
        maps = self._maps
        if maps is not None:
            return maps
        with self._maps_lock:
            if self._maps is None:
                loaded = self._loaded
                assert loaded is not None
                self._maps = loaded.maps()
                self._loaded = None
            return self._maps

    @property
    def _node_of(self) -> dict[int, int]:
        return self._dicts().node_of

    @property
    def _members(self) -> dict[int, dict[int, None]]:
        return self._dicts().members

    @property
    def _node_key(self) -> dict[int, int]:
        return self._dicts().node_key

    @property
    def _key_of(self) -> dict[int, int]:
        return self._dicts().key_of

    def _counts(self) -> tuple[int, int]:
        """(live labels, live nodes), without building the dicts."""
        maps, loaded = self._maps, self._loaded
        if maps is None and loaded is not None:
            return len(loaded.groups), len(loaded.nodes)
        maps = self._dicts()
        return len(maps.node_of), len(maps.members)

    @property
    def live_count(self) -> int:
        """Number of searchable (not deleted) vectors."""
        return self._counts()[0]

    @property
    def element_count(self) -> int:
        """Graph slots: nodes ever added to this index, removed ones not yet reused by an add included."""
        return self._elements

    @property
    def retired_count(self) -> int:
        """Graph nodes deleted (none of their labels is live) but still in the graph, until a rebuild."""
        return self._elements - self._counts()[1]

    @property
    def exact(self) -> bool:
        """Whether searches are exact now (the graph is at most config.exact_max nodes)."""
        return self._matrix is not None

    @property
    def mapped(self) -> bool:
        """Whether the graph is a read-only map of its saved file (shared with other processes), not a copy."""
        return self._mapped is not None

    @property
    def capacity(self) -> int:
        """Elements reserved now."""
        with self._lock.read():
            return max(int(self._graph.capacity), self._elements)

    @property
    def ef(self) -> int:
        """The beam width searches use now (search_ef of the graph size)."""
        return self._ef

    def deleted_ratio(self) -> float:
        """deleted / total graph nodes, 0.0 when empty."""
        return 0.0 if self._elements == 0 else self.retired_count / self._elements

    def live_labels(self) -> frozenset[int]:
        """A snapshot of the live labels."""
        with self._lock.read():
            loaded = self._loaded if self._maps is None else None
            return frozenset(loaded.groups[:, 0].tolist() if loaded is not None else self._node_of)

    def live_label_array(self) -> np.ndarray:
        """(L,) the live labels, ascending (a loaded snapshot's own array while its dicts are not built: the
        background check of a million labels then builds nothing and sorts nothing in Python)."""
        with self._lock.read():
            loaded = self._loaded if self._maps is None else None
            if loaded is not None:
                return loaded.groups[:, 0].copy()
            return np.sort(np.fromiter(self._node_of, dtype=np.int64, count=len(self._node_of)))

    def settle(self) -> None:
        """Hash a loaded snapshot's node vectors now (the background pass calls it, so that the first change of a
        process that loaded a large snapshot does not pay for it)."""
        loaded = self._loaded
        if loaded is not None:
            loaded.keys()

    def holds(self, labels: np.ndarray | list[int]) -> np.ndarray:
        """(N,) whether each of `labels` (N,) is live here."""
        asked = np.asarray(labels, dtype=np.int64).reshape(-1)  # (N,)
        with self._lock.read():
            loaded = self._loaded if self._maps is None else None
            if loaded is not None:
                return loaded.node_of(asked) >= 0
            node_of = self._node_of
            return np.fromiter((label in node_of for label in asked.tolist()), dtype=bool, count=len(asked))

    def __contains__(self, label: int) -> bool:
        loaded = self._loaded if self._maps is None else None
        if loaded is not None:
            return bool(loaded.node_of(np.array([int(label)], dtype=np.int64))[0] >= 0)
        return int(label) in self._node_of

    def close(self) -> None:
        """Wait for the graph calls in flight, then refuse new ones (EvermindError): once the store's close returns,
        no thread of the process is inside usearch. Its Python binding drops the GIL during a search and takes it
        back in a C++ destructor; a daemon thread doing that while the interpreter finalises is ended from inside
        that destructor, which aborts the process ("terminate called without an active exception")."""
        with self._lock.write():
            self._closed = True

    def _check_open(self) -> None:
        """Raise EvermindError after close() (the caller holds the lock)."""
        if self._closed:
            raise EvermindError("this MemoryStore is closed; open a new one.")

    def get_vectors(self, labels: list[int]) -> np.ndarray:
        """The stored vectors of live labels, (N, D) float32 unit rows of the graph's int8 steps (for spot checks
        against SQLite: within 1e-6 of what a read of the same row gives); a label not live reads as zeros."""
        with self._lock.read():
            self._check_open()
            if not labels:
                return np.zeros((0, self.dim), dtype=np.float32)  # (0, D)
            loaded = self._loaded if self._maps is None else None
            if loaded is not None:
                asked = np.array(labels, dtype=np.int64)  # (N,)
                nodes = np.where((found := loaded.node_of(asked)) >= 0, found, asked)
            else:
                nodes = np.array([self._node_of.get(int(label), int(label)) for label in labels], dtype=np.int64)
            return self._node_vectors(nodes)

    # ---- writes (exclusive) --------------------------------------------------------------------------------
    def _own(self) -> None:
        """Trade a mapped graph for a copy this process can change (the caller holds the exclusive lock): the
        nodes' hashes are read from the map first, then the map is let go."""
        mapped = self._mapped
        if mapped is None:
            return
        self._dicts()
        graph = _new_graph(self.dim, self.config)
        graph.load(mapped)  # a copy of the bytes parse_usearch_file checked
        graph.expansion_search = self._ef
        self._graph, self._mapped = graph, None  # (the viewing graph goes with its last reference, before the map)
        close_quietly(mapped)  # (a view still held somewhere keeps it open: the finaliser load() set closes it)

    def add(self, labels: np.ndarray, vectors: np.ndarray,
            progress: Callable[[int, int], None] | None = None) -> None:
        """Add vectors under new labels; a vector the index already holds (the same int8 steps, or within NEAR_TOL
        in every component: a text embedded in another batch differs in the last bits) joins that vector's node
        instead of getting one of its own, and so do near-identical rows of one batch.

        Args:
            labels: (N,) distinct ints never used in this index before.
            vectors: (N, D) float32 unit rows (already validated).
            progress: called with (new nodes added so far, new nodes in all) after each ADD_CHUNK of them (a
                rebuild of a large store takes a minute: the caller shows it).
        Raises:
            InvalidInput: a label is already present or the shapes disagree.
        """
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)  # (N,)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(labels), self.dim)  # (N, D)
        if len(labels) == 0:
            return
        if len(set(labels.tolist())) != len(labels) or (labels < 0).any():
            raise InvalidInput("VectorIndex.add expected distinct non-negative labels.")
        steps = steps_of(vectors)  # (N, D) int8: what the graph holds
        keys = step_keys(steps)
        with self._lock.write():
            self._check_open()
            if any(int(label) in self._node_of for label in labels):
                raise InvalidInput("VectorIndex.add got a label that is already in the index.")
            self._own()
            node = np.array([self._node_key.get(key, -1) for key in keys], dtype=np.int64)  # (N,) -1: none yet
            hit = np.flatnonzero(node >= 0)  # (H,) rows whose hash names a live node: is it their vector?
            if len(hit):
                differ = np.abs(self._node_vectors(node[hit]) - vectors[hit]).max(axis=1) > NEAR_TOL  # (H,)
                node[hit[differ]] = -1
            rest = np.flatnonzero(node < 0)  # (R,)
            if len(rest) and self._members:  # the nearest live node, if it is this vector
                near, same = self._nearest_nodes(vectors[rest], steps[rest])  # (R,), (R,)
                node[rest[same]] = near[same]
                rest = rest[~same]
            first = rest[near_duplicates(vectors[rest])]  # (R,) the batch row whose node each row joins
            node[rest] = labels[first]
            rest = rest[first == rest]  # the rows that make new nodes
            threads = self.config.threads if len(rest) >= 256 else 1
            step = ADD_CHUNK if progress is not None else max(len(rest), 1)
            for a in range(0, len(rest), step):
                part = rest[a:a + step]
                self._graph.add(labels[part].astype(np.uint64), steps[part], threads=threads)
                if progress is not None:
                    progress(a + len(part), len(rest))
            for i in rest.tolist():  # the graph took them: record the new nodes, then every label's node
                new = int(labels[i])
                self._node_key.setdefault(keys[i], new)
                self._key_of[new], self._members[new] = keys[i], {}
            for label, n in zip(labels.tolist(), node.tolist()):
                self._members[n][label] = None
                self._node_of[label] = n
            self._elements = max(self._elements, len(self._members))  # (an add fills removed slots first)
            if self._matrix is not None:
                if self._elements > self.config.exact_max:
                    self._matrix = None  # the graph is faster from here on; a rebuild that shrinks it brings it back
                else:
                    self._matrix.add(labels[rest], vectors[rest])
            self._set_ef()

    def _node_vectors(self, nodes: np.ndarray) -> np.ndarray:
        """The (N, D) float32 vectors of (N,) nodes (zeros for one the graph lacks); the caller holds the lock."""
        if self._matrix is not None:
            rows = [self._matrix.row_or(int(n)) for n in nodes.tolist()]
            out = self._matrix.vectors[[max(r, 0) for r in rows]]  # (N, D)
            out[np.array(rows) < 0] = 0.0
            return out
        return unit_steps(_rows_of(self._graph.get(nodes.astype(np.uint64), dtype=np.int8), self.dim))

    def _nearest_nodes(self, vectors: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The nearest live node of each (R, D) row (exactly while the matrix is kept, else by the graph, asked
        with the rows' int8 `steps`), and whether it is that row's vector up to NEAR_TOL: (nodes (R,), same (R,)).
        The caller holds the lock."""
        if self._matrix is not None:
            matrix = self._matrix
            rows = np.argmax(vectors @ matrix.vectors[:matrix.count].T, axis=1)  # (R,)
            nodes, found = matrix.nodes[rows], matrix.vectors[rows]  # (R,), (R, D)
        else:
            try:
                got = self._graph.search(steps, 1, threads=self.config.threads)
            except (RuntimeError, ValueError):  # the graph could not answer: the rows make nodes of their own
                return np.zeros(len(vectors), np.int64), np.zeros(len(vectors), bool)
            if hasattr(got, "counts"):  # (R > 1: one row of keys a query, padded beyond its count)
                answered = np.asarray(got.counts).reshape(-1) > 0  # (R,)
                first = np.asarray(got.keys, dtype=np.uint64).reshape(len(vectors), -1)[:, 0]  # (R,)
            else:  # (one query: its keys, trimmed to what it found)
                answered = np.array([len(got.keys) > 0])
                first = np.asarray(got.keys, dtype=np.uint64)[:1] if len(got.keys) else np.zeros(1, np.uint64)
            nodes = np.where(answered, first.astype(np.int64), 0)  # (R,)
            found = self._node_vectors(nodes)  # (R, D)
            found[~answered] = 0.0
        return nodes, np.abs(found - vectors).max(axis=1) <= NEAR_TOL

    def mark_deleted(self, labels: Iterable[int]) -> int:
        """Hide labels from search (a node when its last label goes); labels not live in this index are ignored.

        Args:
            labels: iterable of ints.
        Returns:
            how many were live and are now deleted.
        """
        wanted = [int(label) for label in np.asarray(list(labels), dtype=np.int64).reshape(-1)]
        with self._lock.write():
            self._check_open()
            if not any(label in self._node_of for label in wanted):
                return 0
            self._own()
            done, gone = 0, []
            for label in wanted:
                node = self._node_of.pop(label, None)
                if node is None:
                    continue
                members = self._members[node]
                del members[label]
                if not members:
                    del self._members[node]
                    key = self._key_of.pop(node)
                    if self._node_key.get(key) == node:
                        del self._node_key[key]
                    gone.append(node)
                    if self._matrix is not None:
                        self._matrix.delete(node)
                done += 1
            if gone:
                self._graph.remove(np.array(gone, dtype=np.uint64))
            return done

    def _set_ef(self) -> None:
        """Match the beam width to the graph size; the caller holds the exclusive lock."""
        self._ef = search_ef(self.config, self._elements)
        self._graph.expansion_search = self._ef

    # ---- reads (shared) ------------------------------------------------------------------------------------
    def query(self, vector: np.ndarray, k: int,
              allow: Callable[[int], bool] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by cosine: exact while the graph is small (see `exact`), else approximate.

        Args:
            vector: (D,) float32 unit query.
            k: wanted neighbours (>= 1; clamped to the live count).
            allow: only labels for which it returns True. The graph takes no predicate: it is asked for
                FILTER_CANDIDATES nodes or 4 x k, those none of whose labels pass are dropped, and while fewer
                than k pass it is asked for 4x more, up to FILTER_WIDEST (fewer than k come back only then; the
                store then searches its selection exactly).
        Returns:
            (labels (k',), scores (k',)) best first, k' <= min(k, live); a score is the exact cosine of the
            query with the node's stored vector.
        Raises:
            SearchFailed: the graph could not return k' results even with a larger ef.
        """
        q = np.ascontiguousarray(vector, dtype=np.float32).reshape(self.dim)  # (D,)
        with self._lock.read():
            self._check_open()
            live, node_count = self._counts()
            k_eff = min(int(k), live)
            if k_eff <= 0:
                return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
            node_allow = self._node_filter(allow)
            if self._matrix is not None:
                return self._expand(*self._matrix.search(q, k_eff, node_allow), k_eff, allow)
            try:
                return self._expand(*self._graph_search(q, min(k_eff, node_count), node_count, node_allow),
                                    k_eff, allow)
            except (RuntimeError, _Short):
                pass
        with self._lock.write():  # retry once with a wider beam (ef changes only under the exclusive lock)
            self._check_open()
            live, node_count = self._counts()
            k_eff = min(int(k), live)
            if k_eff <= 0:
                return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
            k_nodes = min(k_eff, node_count)
            self._graph.expansion_search = max(self._ef, 4 * k_nodes, min(self._elements, 4 * k_nodes + 256))
            try:
                return self._expand(*self._graph_search(q, k_nodes, node_count, self._node_filter(allow)), k_eff,
                                    allow)
            except (RuntimeError, _Short) as exc:
                raise SearchFailed(str(exc) or "the graph returned fewer neighbours than it holds") from None
            finally:
                self._graph.expansion_search = self._ef

    def _graph_search(self, q: np.ndarray, k_nodes: int, node_count: int,
                      node_allow: Callable[[int], bool] | None) -> tuple[np.ndarray, np.ndarray]:
        """The best nodes for q by the graph, then scored exactly: (nodes (n,), cosines (n,)) best first. Unfiltered,
        k_nodes (asking for 2 x k_nodes and ranking them again found the same: recall@10 0.993 on the 100k scale
        store's vectors either way); filtered, see query(). The caller holds the lock.

        Raises:
            _Short: an unfiltered search returned fewer than k_nodes nodes (the graph lost some: retry wider).
        """
        top = float(np.abs(q).max())  # (any scale serves a query: the cosine ignores it)
        q_steps = np.rint(q * (127.0 / top if top > 0 else 1.0)).astype(np.int8)  # (D,)
        want = k_nodes if node_allow is None else max(FILTER_CANDIDATES, 4 * k_nodes)
        while True:
            asked = min(want, node_count)
            found = self._graph.search(q_steps, asked, threads=1)
            nodes = np.asarray(found.keys, dtype=np.uint64).astype(np.int64)  # (n,) trimmed to what it found
            if node_allow is None:
                if len(nodes) < min(k_nodes, asked):
                    raise _Short()
                break
            nodes = nodes[np.fromiter(map(node_allow, nodes.tolist()), dtype=bool, count=len(nodes))]
            if len(nodes) >= k_nodes or asked >= node_count or want >= FILTER_WIDEST:
                break
            want *= 4
        steps = _rows_of(self._graph.get(nodes.astype(np.uint64), dtype=np.int8), self.dim)  # (n, D)
        scores = unit_steps(steps) @ q  # (n,)
        order = np.argsort(-scores, kind="stable")
        return nodes[order], scores[order].astype(np.float32)

    def _node_filter(self, allow: Callable[[int], bool] | None) -> Callable[[int], bool] | None:
        """`allow` over labels as a filter over nodes: a node passes when any of its labels does."""
        if allow is None:
            return None
        members = self._members
        return lambda node: any(map(allow, members.get(node, ())))

    def _expand(self, nodes: np.ndarray, scores: np.ndarray, k: int,
                allow: Callable[[int], bool] | None) -> tuple[np.ndarray, np.ndarray]:
        """(labels (k',), scores (k',)): the allowed labels of `nodes` (best first, with their `scores`), the first
        k of them (a node's labels share its score)."""
        out: list[int] = []
        out_scores: list[float] = []
        loaded = self._loaded if self._maps is None and allow is None else None  # (an unfiltered search of a
        members_of = loaded.members if loaded is not None else lambda node: self._members.get(node, ())  # load)
        for node, score in zip(nodes.tolist(), scores.tolist()):
            for label in members_of(int(node)):
                if allow is None or allow(label):
                    out.append(label)
                    out_scores.append(score)
                    if len(out) == k:
                        return np.array(out, dtype=np.int64), np.array(out_scores, dtype=np.float32)
        return np.array(out, dtype=np.int64), np.array(out_scores, dtype=np.float32)

    # ---- files ---------------------------------------------------------------------------------------------
    def file_agrees(self) -> bool:
        """Whether the file a deferred-hash load read still hashes to its manifest's sha256 (True when nothing is
        pending, or the file was replaced by a newer save since: it cannot be read any more and the graph in
        memory was validated structurally). Read in chunks, not mapped: hashing must not add the file to RSS."""
        pending = self.unhashed
        if pending is None:  # (hashed already: the same answer to every caller, e.g. check() racing the pass)
            return self.hash_agreed
        path, want = pending
        digest = hashlib.sha256()
        try:
            with path.open("rb") as f:
                while chunk := f.read(8 << 20):
                    digest.update(chunk)
            agreed = digest.hexdigest() == want
        except FileNotFoundError:
            agreed = True
        self.hash_agreed, self.unhashed = agreed, None
        return agreed

    def save(self, directory: Path, stem: str, meta: dict) -> dict:
        """Save atomically: index temp file + fsync + rename, verify, the groups file (label -> node) likewise,
        then the manifest (the commit point). Older snapshot files of the stem (hnswlib's too) are removed.

        Args:
            directory: where the store lives.
            stem: file name prefix (the db file name).
            meta: extra manifest fields from the store (store_id, fingerprint, watermark, ...).
        Returns:
            the manifest written.
        Raises:
            OSError: the disk refused a write; the previous manifest and index stay valid.
        """
        name, tmp = new_snapshot_name(Path(directory), stem)
        with self._lock.write():
            self._check_open()
            try:
                self._graph.save(str(tmp))
            except (RuntimeError, ValueError) as exc:  # usearch could not open or write the file
                tmp.unlink(missing_ok=True)
                raise OSError(f"usearch could not write {tmp.name} ({exc})") from None
            live, nodes = self._counts()
            loaded = self._loaded if self._maps is None else None
            groups = (loaded.groups if loaded is not None else
                      np.array(sorted(self._node_of.items()), dtype=np.int64).reshape(-1, 2))  # (live, 2) label, node
        manifest = write_snapshot(Path(directory), stem, name, groups, meta, dim=self.dim, M=self.config.M,
                                  ef_construction=self.config.ef_construction, live=live, nodes=nodes)
        self._elements = manifest["count"]
        return manifest

    @classmethod
    def load(cls, directory: Path, stem: str, *, expect: dict, config: IndexConfig,
             max_seq: int, defer_hash: bool = False) -> tuple["VectorIndex", dict]:
        """Validate the manifest and index file, then map them (R6): the graph reads the checked file in place,
        shared with every process that maps it, until this process first changes the index (`_own`).

        With `defer_hash` the file's sha256 is not compared here (0.1 s of a load at a million facts) but by
        `file_agrees()`, which the store's background pass and check() call: what usearch follows (every count,
        level, link and size) is bounded by parse_usearch_file either way, so a damaged file can cost recall until
        then, never memory safety, and the vectors themselves are compared with SQLite by the same pass.

        Args:
            directory: where the store lives.
            stem: file name prefix.
            expect: manifest fields that must match exactly (store_id, fingerprint, dim, ...).
            config: the HNSW parameters this store uses.
            max_seq: the store's highest change sequence; a newer watermark is refused.
        Returns:
            (index, manifest).
        Raises:
            IndexRejected: anything disagrees; the message says what.
        """
        snap = read_snapshot(Path(directory), stem, expect=expect, M=config.M,
                             ef_construction=config.ef_construction, max_seq=max_seq, defer_hash=defer_hash)
        data, info = snap.data, snap.info
        try:
            dim = int(expect["dim"])
            self = cls(dim, config)
            with self._lock.write():
                if info.count:  # (an empty graph stays the new one: nothing to map)
                    self._graph.view(data)  # (the map stays referenced by self._mapped while the graph views it)
                    self._mapped = data
                    if isinstance(data, mmap.mmap):
                        # when the index is collected, not at exit: weakref's exit hook runs before the store's
                        # own close, while a daemon thread (the verify pass, a user's) may still search the graph
                        # that views the map; at exit the process's end unmaps it
                        weakref.finalize(self, close_quietly, data).atexit = False
                else:
                    close_quietly(data)
                self._elements = info.count
                self.unhashed = (snap.path, str(snap.manifest.get("sha256"))) if defer_hash else None
                self._maps, self._loaded = None, snap.nodes
                if self._matrix is not None:
                    if info.count > config.exact_max:
                        self._matrix = None
                    else:
                        self._matrix.add(snap.nodes.nodes, unit_steps(info.vectors[snap.nodes.rows]))  # (n, D) a copy
                self._set_ef()
        except BaseException:
            close_quietly(data)
            raise
        return self, snap.manifest


class _Short(Exception):
    """An unfiltered graph search returned fewer nodes than asked (retried with a wider beam)."""
