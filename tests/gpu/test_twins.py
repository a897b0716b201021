"""The numpy twins' backward functions against central finite differences in float64 (no GPU needed).

The GPU kernels are checked against these twins elsewhere, so this is what ties the kernels to the maths.
"""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory.gpu import ops


def numgrad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central-difference gradient of the scalar f() with respect to x (perturbed in place)."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):  # gradient check: a loop over elements is the point
        old = flat[i]
        flat[i] = old + h
        hi = f()
        flat[i] = old - h
        lo = f()
        flat[i] = old
        gflat[i] = (hi - lo) / (2 * h)
    return g


@pytest.fixture
def r64():
    return np.random.default_rng(77)


def test_linear_backward_twin(r64):
    x, w, dy = r64.standard_normal((5, 4)), r64.standard_normal((4, 3)), r64.standard_normal((5, 3))
    b = r64.standard_normal(3)
    dx, dw, db = ops.linear_backward_numpy(x, w, dy)
    loss = lambda: float(np.sum(ops.linear_numpy(x, w, b) * dy))  # noqa: E731
    np.testing.assert_allclose(dx, numgrad(loss, x), atol=1e-7)
    np.testing.assert_allclose(dw, numgrad(loss, w), atol=1e-7)
    np.testing.assert_allclose(db, numgrad(loss, b), atol=1e-7)


def test_conv1d_backward_twin(r64):
    x, w, bias = r64.standard_normal((2, 6, 3)), r64.standard_normal((4, 3)), r64.standard_normal(3)
    dy = r64.standard_normal((2, 6, 3))
    dx, dw, db = ops.conv1d_causal_backward_numpy(x, w, dy)
    loss = lambda: float(np.sum(ops.conv1d_causal_numpy(x, w, bias) * dy))  # noqa: E731
    np.testing.assert_allclose(dx, numgrad(loss, x), atol=1e-7)
    np.testing.assert_allclose(dw, numgrad(loss, w), atol=1e-7)
    np.testing.assert_allclose(db, numgrad(loss, bias), atol=1e-7)


def test_rmsnorm_backward_twin(r64):
    x, wt, dy = r64.standard_normal((2, 3, 5)), r64.standard_normal(5), r64.standard_normal((2, 3, 5))
    dx, dw = ops.rmsnorm_backward_numpy(x, wt, dy, 1e-5)
    loss = lambda: float(np.sum(ops.rmsnorm_numpy(x, wt, 1e-5) * dy))  # noqa: E731
    np.testing.assert_allclose(dx, numgrad(loss, x), atol=1e-7)
    np.testing.assert_allclose(dw, numgrad(loss, wt), atol=1e-7)


@pytest.mark.parametrize("kind", ["relu", "silu", "gelu"])
def test_activation_backward_twins(r64, kind):
    x = r64.standard_normal(40) * 3
    x[np.abs(x) < 1e-3] = 0.5  # keep away from relu's kink
    dy = r64.standard_normal(40)
    fwd, bwd = getattr(ops, kind + "_numpy"), getattr(ops, kind + "_backward_numpy")
    np.testing.assert_allclose(bwd(x, dy), numgrad(lambda: float(np.sum(fwd(x) * dy)), x), atol=1e-7)


def test_gelu_twin_is_the_tanh_form(r64):
    x = np.linspace(-9, 9, 101)
    ref = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(ops.gelu_numpy(x), ref, atol=1e-12)


def test_cross_entropy_twin(r64):
    logits, targets = r64.standard_normal((6, 5)), r64.integers(0, 5, 6)
    valid = np.array([1, 1, 0, 1, 0, 1], bool)
    loss, grad = ops.cross_entropy_numpy(logits, targets, valid)
    p = ops.softmax_numpy(logits)
    expect = -np.mean(np.log(p[np.arange(6), targets])[valid])
    assert loss == pytest.approx(expect, rel=1e-12)
    np.testing.assert_allclose(grad, numgrad(lambda: ops.cross_entropy_numpy(logits, targets, valid)[0], logits),
                               atol=1e-7)


def test_moe_route_and_combine_twins(r64):
    logits = np.array([[0.1, 2.0, 2.0, -1.0]])
    idx, gates = ops.moe_route_numpy(logits, 3)
    np.testing.assert_array_equal(idx, [[1, 2, 0]])
    sel = np.array([2.0, 2.0, 0.1])
    np.testing.assert_allclose(gates[0], np.exp(sel) / np.exp(sel).sum())
    out, ye = r64.standard_normal((5, 3)), r64.standard_normal((2, 3))
    rows, g = np.array([4, 1]), r64.standard_normal(2)
    dout = r64.standard_normal((5, 3))
    dye, dg = ops.moe_combine_backward_numpy(dout, ye, rows, g)
    loss = lambda: float(np.sum(ops.moe_combine_numpy(out, ye, rows, g) * dout))  # noqa: E731
    np.testing.assert_allclose(dye, numgrad(loss, ye), atol=1e-7)
    np.testing.assert_allclose(dg, numgrad(loss, g), atol=1e-7)


def test_embedding_scatter_add_twin_is_gather_adjoint(r64):
    table, ids, dy = r64.standard_normal((7, 3)), r64.integers(0, 7, (2, 5)), r64.standard_normal((2, 5, 3))
    dt = ops.embedding_scatter_add_numpy(ids, dy, 7)
    loss = lambda: float(np.sum(ops.embedding_gather_numpy(table, ids) * dy))  # noqa: E731
    np.testing.assert_allclose(dt, numgrad(loss, table), atol=1e-7)
