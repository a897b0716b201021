"""The relevance model's tree ensemble (store/trees.py): evaluation, validation and its place in FusionParams."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evermind_memory.errors import CheckpointError
from evermind_memory.store.fusion import FusionParams
from evermind_memory.store.trees import TreeEnsemble

# x0 <= 0.5 ? (x1 <= -1 ? 1.0 : 2.0) : 3.0
STUMP2 = {"feature": [0, 1, 0, 0, 0], "threshold": [0.5, -1.0, 0.0, 0.0, 0.0], "left": [1, 3, -1, -1, -1],
          "right": [2, 4, -1, -1, -1], "value": [0.0, 0.0, 3.0, 1.0, 2.0]}
LEAF = {"feature": [0], "threshold": [0.0], "left": [-1], "right": [-1], "value": [0.25]}


def test_each_row_reaches_its_leaf_in_every_tree():
    ens = TreeEnsemble.from_dict({"baseline": -0.5, "trees": [STUMP2, LEAF]}, n_features=2)
    X = np.array([[0.0, -2.0], [0.5, 0.0], [0.6, -5.0], [np.nan, -5.0]])
    # NaN compares False: it goes right
    assert ens.raw(X).tolist() == pytest.approx([-0.5 + 1.0 + 0.25, -0.5 + 2.0 + 0.25, -0.5 + 3.0 + 0.25,
                                                 -0.5 + 3.0 + 0.25])
    assert ens.depth == 2
    again = TreeEnsemble.from_dict(ens.to_dict(), n_features=2)
    assert again.raw(X).tolist() == ens.raw(X).tolist()


def _walk(tree: dict, x: np.ndarray) -> float:
    node = 0
    while tree["left"][node] >= 0:
        node = tree["left"][node] if x[tree["feature"][node]] <= tree["threshold"][node] else tree["right"][node]
    return tree["value"][node]


@st.composite
def _tree(draw, n_features: int) -> dict:
    """A random binary tree in node order (children after their parent), up to depth 4."""
    t: dict = {"feature": [0], "threshold": [0.0], "left": [-1], "right": [-1], "value": [0.0]}
    frontier = [(0, 0)]
    while frontier:
        node, depth = frontier.pop(0)
        if depth < 4 and draw(st.booleans()):
            t["feature"][node] = draw(st.integers(0, n_features - 1))
            t["threshold"][node] = draw(st.floats(-2, 2))
            for side in ("left", "right"):
                t[side][node] = len(t["value"])
                for k, v in (("feature", 0), ("threshold", 0.0), ("left", -1), ("right", -1), ("value", 0.0)):
                    t[k].append(v)
                frontier.append((t[side][node], depth + 1))
        else:
            t["value"][node] = draw(st.floats(-3, 3))
    return t


@settings(max_examples=40, deadline=None)
@given(trees=st.lists(_tree(3), min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_all_trees_at_once_give_what_a_walk_down_each_tree_gives(trees, seed):
    ens = TreeEnsemble.from_dict({"baseline": 0.125, "trees": trees}, n_features=3)
    X = np.random.default_rng(seed).normal(0, 1.5, (20, 3))
    want = [0.125 + sum(_walk(t, x) for t in trees) for x in X]
    assert ens.raw(X).tolist() == pytest.approx(want)


@pytest.mark.parametrize("tree, why", [
    ({**STUMP2, "left": [1, 0, -1, -1, -1]}, "a child before its parent: a loop"),
    ({**STUMP2, "left": [1, 9, -1, -1, -1]}, "a child outside the tree"),
    ({**STUMP2, "right": [2, -1, -1, -1, -1]}, "a node with one child"),
    ({**STUMP2, "feature": [0, 7, 0, 0, 0]}, "a feature the model does not have"),
    ({**STUMP2, "value": [0.0, 0.0, float("inf"), 1.0, 2.0]}, "a value that is not finite"),
    ({**STUMP2, "value": [0.0, 0.0]}, "fields of different lengths"),
])
def test_a_malformed_tree_is_refused(tree, why):
    with pytest.raises(ValueError):
        TreeEnsemble.from_dict({"baseline": 0.0, "trees": [tree]}, n_features=2)


def test_fusion_params_carry_trees_and_refuse_bad_ones():
    d = {"format": "evermind-fusion 1", "fingerprint": None,
         "ranking": {"features": ["lex", "cos"], "weights": [1.0, 2.0], "pool": 30},
         "relevance": {"model": "trees", "features": ["score", "cos"], "baseline": -1.0, "trees": [STUMP2]}}
    params = FusionParams.from_dict(d)
    assert params.relevance_trees is not None and params.relevance_weights == ()
    back = FusionParams.from_dict(params.to_dict())
    assert back.relevance_trees is not None and back.relevance_trees.to_dict() == params.relevance_trees.to_dict()
    bad = {**d, "relevance": {**d["relevance"], "features": ["score"]}}  # STUMP2 reads feature 1: not there
    with pytest.raises(CheckpointError, match="calibrate_fusion"):
        FusionParams.from_dict(bad)
