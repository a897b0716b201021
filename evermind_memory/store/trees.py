"""A small ensemble of regression trees evaluated with numpy: the relevance model of a fitted hybrid rule.

recipe/calibrate_fusion.py fits gradient-boosted trees on the relevance features of the dev pools (a store of a few
facts and one of thousands make the same cosine mean different things, and a linear model cannot say so) and writes
them into fusion.json; the store only evaluates them. Every tree is evaluated at once, one level per step, so the
cost is depth x a few array operations over (candidates x trees), with no Python loop over trees or candidates.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from .._lazy import lazy_import

np = lazy_import("numpy", globals(), "np")

MAX_TREES = 1000
MAX_NODES = 255     # per tree
MAX_DEPTH = 16


@dataclass(frozen=True)
class TreeEnsemble:
    """raw(X) = baseline + the sum over trees of the value of the leaf each row of X reaches.

    At an internal node a row goes left when X[row, feature] <= threshold (NaN goes right); a leaf has left == -1.
    All arrays are (trees, nodes), padded with leaves of value 0; node 0 is each tree's root and every child's
    index is larger than its parent's, so a walk of `depth` steps ends on a leaf.
    """

    baseline: float
    feature: Any    # (T, N) int64
    threshold: Any  # (T, N) float64
    left: Any       # (T, N) int64, -1 at a leaf
    right: Any      # (T, N) int64, -1 at a leaf
    value: Any      # (T, N) float64, the leaf values (0 at internal nodes)
    depth: int

    @classmethod
    def from_dict(cls, d: Any, n_features: int) -> "TreeEnsemble":
        """Validate and build from the JSON form: {"baseline", "trees": [{"feature", "threshold", "left", "right",
        "value"}, ...]} (one list per field, one entry per node). Raises ValueError on anything malformed."""
        trees = d["trees"]
        if not isinstance(trees, list) or not 1 <= len(trees) <= MAX_TREES:
            raise ValueError(f"expected 1 to {MAX_TREES} trees")
        sizes = [len(t["feature"]) for t in trees]
        n = max(sizes)
        if min(sizes) < 1 or n > MAX_NODES:
            raise ValueError(f"expected 1 to {MAX_NODES} nodes per tree")
        fields = {"feature": (np.int64, 0), "left": (np.int64, -1), "right": (np.int64, -1),
                  "threshold": (np.float64, 0.0), "value": (np.float64, 0.0)}
        arrays = {}
        for name, (dtype, pad) in fields.items():
            a = np.full((len(trees), n), pad, dtype=dtype)
            for i, t in enumerate(trees):
                col = t[name]
                if len(col) != sizes[i]:
                    raise ValueError(f"tree {i}: {name} has {len(col)} entries for {sizes[i]} nodes")
                a[i, : sizes[i]] = np.asarray(col, dtype=dtype)
            arrays[name] = a
        left, right, feature = arrays["left"], arrays["right"], arrays["feature"]
        leaf = left < 0
        node = np.arange(n)[None, :]
        sizes_ = np.asarray(sizes)[:, None]
        if not (np.all(leaf == (right < 0))
                and np.all(leaf | ((left > node) & (left < sizes_) & (right > node) & (right < sizes_)))
                and np.all(leaf | ((feature >= 0) & (feature < n_features)))):
            raise ValueError("a node's children must come after it inside its tree, and its feature must exist")
        baseline = float(d["baseline"])
        if not (math.isfinite(baseline) and np.isfinite(arrays["threshold"]).all()
                and np.isfinite(arrays["value"]).all()):
            raise ValueError("thresholds, values and the baseline must be finite")
        depth = np.zeros((len(trees), n), dtype=np.int64)  # children come after parents: one pass in node order
        for j in range(n):
            internal = ~leaf[:, j]
            rows = np.flatnonzero(internal)
            depth[rows, left[rows, j]] = depth[rows, j] + 1
            depth[rows, right[rows, j]] = depth[rows, j] + 1
        max_depth = int(depth.max())
        if max_depth > MAX_DEPTH:
            raise ValueError(f"trees deeper than {MAX_DEPTH}")
        return cls(baseline, feature, arrays["threshold"], left, right, np.where(leaf, arrays["value"], 0.0),
                   max_depth)

    def to_dict(self) -> dict:
        """The JSON form (from_dict reads it back); padding nodes are written as they are."""
        return {"baseline": self.baseline,
                "trees": [{"feature": self.feature[i].tolist(), "threshold": self.threshold[i].tolist(),
                           "left": self.left[i].tolist(), "right": self.right[i].tolist(),
                           "value": self.value[i].tolist()} for i in range(len(self.feature))]}

    @functools.cached_property
    def _flat(self) -> tuple[Any, Any, Any, Any, Any, Any]:
        """The tables flattened to one array each, node ids global (tree * nodes + node), a leaf its own child."""
        t, n = self.feature.shape
        offset = (np.arange(t) * n)[:, None]  # (T, 1)
        own = np.arange(n)[None, :]           # (1, N)
        left = (np.where(self.left < 0, own, self.left) + offset).ravel()
        right = (np.where(self.right < 0, own, self.right) + offset).ravel()
        return (self.feature.ravel(), self.threshold.ravel(), left, right, self.value.ravel(), offset.ravel())

    def raw(self, X: Any) -> Any:
        """(n,) baseline + summed leaf values for the rows of X (n, F)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        feature, threshold, left, right, value, roots = self._flat
        n = len(X)
        node = np.broadcast_to(roots, (n, len(roots))).copy()  # (n, T): every row at every tree's root
        row = (np.arange(n) * X.shape[1])[:, None]              # (n, 1): where each row starts in X.ravel()
        flat = X.ravel()
        for _ in range(self.depth):
            x = flat.take(row + feature.take(node))  # (n, T)
            node = np.where(x <= threshold.take(node), left.take(node), right.take(node))
        return self.baseline + value.take(node).sum(axis=1)
