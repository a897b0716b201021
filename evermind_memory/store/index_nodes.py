"""How an index's labels become graph nodes (one node per distinct vector: store/index.py says why): the vector
hashes and near-duplicate test that find a vector's node, the exact search over the nodes while the graph is small,
and the label/node bookkeeping, as dicts (NodeMaps) or, for a snapshot just loaded, as the arrays it was read as
(LoadedNodes)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, NamedTuple

from .._lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

# Vectors that differ by at most NEAR_TOL in every component share a graph node (and its score, within
# NEAR_TOL * sqrt(D)): the same text embedded in two batches differs by ~1e-7 (the shipped model and the tiny
# test model alike), which rounding to the int8 steps a row stores (backend/vector_blobs.py) turns into 0 or one
# step (the row's largest component / 127: at most 1 / 127 for any unit row, 0.0024 for the shipped model's); two
# different texts of the shipped model differ by at least ~0.02 in some component (0.0217 at the closest of 200
# personal facts and questions). A node of the float16 rows of schemas 5 and 6 is within half a step of the int8
# row read now.
NEAR_TOL = 8e-3
KEY_COLUMNS = 16  # vector_keys hashes this many components of a row
KEY_CHUNK = 4096  # nodes whose vectors are read from the snapshot at a time to hash them (~9 MB at 512 dims)
NEAR_WINDOW = 4  # near_duplicates() compares each row with the next this many in projection order


def exact_search(vectors: np.ndarray, labels: np.ndarray, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k.

    Args:
        vectors: (N, D) float32 unit rows.
        labels: (N,) int64 labels of those rows.
        query: (D,) float32 unit query.
        k: how many (clamped to N).
    Returns:
        (labels (k,), scores (k,)) best first.
    """
    n = len(labels)
    k = min(k, n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    scores = vectors @ query  # (N,)
    top = np.argpartition(-scores, k - 1)[:k] if k < n else np.arange(n)  # (k,)
    top = top[np.lexsort((labels[top], -scores[top]))]  # (k,) best first, ties by label
    return labels[top].astype(np.int64), scores[top].astype(np.float32)


def step_keys(steps: np.ndarray, rows: np.ndarray | None = None) -> list[int]:
    """A 64-bit hash of each (N, D) int8 row of steps (a random linear hash mod 2**64 of KEY_COLUMNS components
    spread over the row): equal for rows whose steps are equal. Only a shortcut to a candidate node: add() checks
    the node's vector before a row joins it, so two rows that agree on those components and differ elsewhere cost
    a nearest-node search, never a wrong node (hashing every component cost 1 s of an open at 100k vectors).
    `rows`: hash only these rows (N',) of `steps` (a view into a file: only their hashed components are copied)."""
    return key_array(steps, rows).tolist()


def key_array(steps: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """step_keys as a (N,) uint64 array."""
    cols = np.arange(0, steps.shape[1], max(1, steps.shape[1] // KEY_COLUMNS))[:KEY_COLUMNS]  # (c,)
    picked = steps[:, cols] if rows is None else steps[np.ix_(rows, cols)]  # (N, c)
    bits = np.ascontiguousarray(picked, dtype=np.int8).view(np.uint8).astype(np.uint64)  # (N, c)
    mult = np.random.default_rng(steps.shape[1]).integers(1, 2**63, size=len(cols), dtype=np.uint64)  # (c,)
    return (bits * (mult | np.uint64(1))).sum(axis=1, dtype=np.uint64)  # (N,) wraps mod 2**64


def near_duplicates(vectors: np.ndarray) -> np.ndarray:
    """For (R, D) rows, the first row each one is a near-duplicate of (itself when none): (R,) row numbers.

    Rows within NEAR_TOL of each other in every component have projections on any unit direction within
    NEAR_TOL * sqrt(D), so after sorting by one projection they sit next to each other: each row is compared with
    the next NEAR_WINDOW rows in that order (a chance row between two copies can split a group into two nodes,
    which costs nothing but a node)."""
    n = len(vectors)
    first = np.arange(n)  # (R,)
    if n < 2:
        return first
    direction = np.random.default_rng(0).standard_normal((vectors.shape[1],)).astype(np.float32)  # (D,)
    direction /= np.linalg.norm(direction)
    proj = vectors @ direction  # (R,)
    order = np.argsort(proj, kind="stable")  # (R,)
    proj = proj[order]
    slack = NEAR_TOL * np.sqrt(vectors.shape[1]) + 1e-6  # (+ float32 rounding of the projections)
    pairs = []
    for step in range(1, min(NEAR_WINDOW, n - 1) + 1):
        a, b = order[:-step], order[step:]  # (R - step,) rows `step` apart in projection order
        cand = np.flatnonzero(proj[step:] - proj[:-step] <= slack)
        a, b = a[cand], b[cand]
        same = np.abs(vectors[a] - vectors[b]).max(axis=1) <= NEAR_TOL
        pairs.append((a[same], b[same]))
    a = np.concatenate([p[0] for p in pairs])  # (P,)
    b = np.concatenate([p[1] for p in pairs])  # (P,)
    while len(a):  # connected components: every row takes the smallest row it is linked to, until none changes
        low = np.minimum(first[a], first[b])  # (P,)
        before = first.copy()
        np.minimum.at(first, a, low)
        np.minimum.at(first, b, low)
        first = first[first]
        if np.array_equal(first, before):
            break
    return first


class NodeMatrix:
    """The live nodes' vectors as one (N, D) matrix, for exact search while the graph is small; rows stay packed
    (a deleted node's row takes the last row's place), so a search reads them without a copy. Not thread-safe:
    VectorIndex calls it under its lock.

    Args:
        dim: vector length.
    """

    def __init__(self, dim: int) -> None:
        self.vectors = np.zeros((0, dim), dtype=np.float32)  # (capacity, D)
        self.nodes = np.zeros(0, dtype=np.int64)  # (capacity,)
        self.count = 0
        self._row: dict[int, int] = {}

    def add(self, nodes: np.ndarray, vectors: np.ndarray) -> None:
        """Append (N,) nodes with their (N, D) vectors."""
        n = len(nodes)
        if self.count + n > len(self.nodes):
            cap = max(64, 2 * len(self.nodes), self.count + n)
            grown = np.zeros((cap, self.vectors.shape[1]), dtype=np.float32)  # (cap, D)
            grown[:self.count] = self.vectors[:self.count]
            ids = np.zeros(cap, dtype=np.int64)  # (cap,)
            ids[:self.count] = self.nodes[:self.count]
            self.vectors, self.nodes = grown, ids
        self.vectors[self.count:self.count + n] = vectors
        self.nodes[self.count:self.count + n] = nodes
        self._row.update(zip(nodes.tolist(), range(self.count, self.count + n)))
        self.count += n

    def row(self, node: int) -> int:
        """The row holding a live node's vector."""
        return self._row[node]

    def row_or(self, node: int) -> int:
        """The row holding a node's vector, -1 for a node not live."""
        return self._row.get(node, -1)

    def delete(self, node: int) -> None:
        """Drop a node (its row gets the last row)."""
        row, last = self._row.pop(node), self.count - 1
        if row != last:
            moved = int(self.nodes[last])
            self.vectors[row], self.nodes[row] = self.vectors[last], moved
            self._row[moved] = row
        self.count = last

    def search(self, query: np.ndarray, k: int, allow: Callable[[int], bool] | None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k nodes for a (D,) query among those `allow` passes: (nodes (k',), scores (k',))."""
        vectors, nodes = self.vectors[:self.count], self.nodes[:self.count]  # (N, D), (N,)
        if allow is not None:
            keep = np.fromiter(map(allow, nodes.tolist()), dtype=bool, count=len(nodes))  # (N,)
            vectors, nodes = vectors[keep], nodes[keep]
        return exact_search(vectors, nodes, query, k)


class NodeMaps(NamedTuple):
    """The label/node bookkeeping of an index, as dicts (what every change updates)."""

    node_of: dict[int, int]  # live label -> its node (its keys: the live labels)
    members: dict[int, dict[int, None]]  # live node -> its live labels (an ordered set)
    node_key: dict[int, int]  # a live node's vector hash -> the node (vector_keys)
    key_of: dict[int, int]  # live node -> its vector hash


class LoadedNodes:
    """A snapshot's bookkeeping as arrays, until a change, a filtered search or a check needs the dicts: building
    a million dict entries and hashing every node's vector took 1.1 s of the first vector recall after an open
    at a million facts, which an unfiltered search answers from these arrays."""

    def __init__(self, groups: np.ndarray, nodes: np.ndarray, starts: np.ndarray, by_node: np.ndarray,
                 rows: np.ndarray, steps: np.ndarray) -> None:
        self.groups = groups  # (L, 2) label, node: the live labels ascending
        self.nodes = nodes  # (n,) the live nodes ascending
        self.starts = starts  # (n + 1,) node i's labels are by_node[starts[i]:starts[i + 1]]
        self.by_node = by_node  # (L,) the labels by node, then label
        self.rows = rows  # (n,) the slot of each of `nodes` in the file
        self._steps: np.ndarray | None = steps  # (slots, D) int8, a view into the mapped file until hashed
        self._keys: np.ndarray | None = None
        self._lock = threading.Lock()

    def members(self, node: int) -> list[int]:
        i = int(np.searchsorted(self.nodes, node))
        return self.by_node[self.starts[i]:self.starts[i + 1]].tolist() if i < len(self.nodes) and \
            self.nodes[i] == node else []

    def node_of(self, labels: np.ndarray) -> np.ndarray:
        """(N,) the node of each of `labels` (N,), -1 for a label not live."""
        if not len(self.groups):
            return np.full(len(labels), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.groups[:, 0], labels), len(self.groups) - 1)  # (N,)
        return np.where(self.groups[at, 0] == labels, self.groups[at, 1], -1)

    def keys(self) -> np.ndarray:
        """(n,) each node's vector hash (step_keys), read from the mapped snapshot KEY_CHUNK nodes at a time (the
        pages are the graph's own, shared with other processes); then the view of the file is let go."""
        with self._lock:
            if self._keys is not None:
                return self._keys
            steps = self._steps
            assert steps is not None
            keys = np.zeros(len(self.nodes), dtype=np.uint64)  # (n,)
            for a in range(0, len(self.rows), KEY_CHUNK):
                keys[a:a + KEY_CHUNK] = key_array(steps, self.rows[a:a + KEY_CHUNK])
            self._keys, self._steps = keys, None
            return keys

    def maps(self) -> NodeMaps:
        """The dicts."""
        nodes, keys = self.nodes.tolist(), self.keys().tolist()
        labels, bounds = self.by_node.tolist(), self.starts.tolist()
        members = {node: dict.fromkeys(labels[a:b]) for node, a, b in zip(nodes, bounds[:-1], bounds[1:])}
        return NodeMaps(dict(zip(self.groups[:, 0].tolist(), self.groups[:, 1].tolist())), members,
                        dict(zip(keys, nodes)), dict(zip(nodes, keys)))
