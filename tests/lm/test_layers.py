"""Gradient checks (float64 central differences, HIPS/autograd check_vjp style) and worked examples for
every forward/backward pair in lm/layers.py and lm/moe.py."""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory.lm.layers import (
    conv_backward,
    conv_forward,
    cross_entropy_backward,
    cross_entropy_forward,
    embed_backward,
    embed_forward,
    ffn_backward,
    ffn_forward,
    rmsnorm_backward,
    rmsnorm_forward,
    router_backward,
    router_forward,
    unembed_backward,
    unembed_forward,
)
from evermind_memory.lm.moe import moe_backward, moe_forward

EPS = 1e-6


def check_vjp(objective, args: dict, grads: dict, rng: np.random.Generator, eps: float = EPS) -> None:
    """Compare <dL/darg, u> with (L(arg + eps u) - L(arg - eps u)) / 2 eps for each arg in `grads`."""
    for name, grad in grads.items():
        u = rng.standard_normal(args[name].shape)
        plus = {**args, name: args[name] + eps * u}
        minus = {**args, name: args[name] - eps * u}
        numeric = (objective(**plus) - objective(**minus)) / (2 * eps)
        analytic = float(np.sum(grad * u))
        assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-8), (
            f"d/d{name}: analytic {analytic!r} vs numeric {numeric!r}"
        )


def test_embed_backward_matches_finite_difference_with_repeated_tokens(rng):
    emb = rng.standard_normal((7, 5))
    tokens = np.array([3, 1, 3, 3, 0, 6, 1])
    r = rng.standard_normal((tokens.size, 5))

    def objective(emb):
        return float(np.sum(embed_forward(emb, tokens)[0] * r))

    _, cache = embed_forward(emb, tokens)
    d_emb = embed_backward(r, cache, np.zeros_like(emb))
    check_vjp(objective, {"emb": emb}, {"emb": d_emb}, rng)


def test_embed_backward_adds_into_existing_gradient(rng):
    emb = rng.standard_normal((4, 3))
    _, cache = embed_forward(emb, np.array([2, 2]))
    d_emb = np.ones_like(emb)
    embed_backward(np.ones((2, 3)), cache, d_emb)
    expected = np.ones_like(emb)
    expected[2] += 2.0
    np.testing.assert_array_equal(d_emb, expected)


def test_rmsnorm_backward_matches_finite_difference(rng):
    x = rng.standard_normal((6, 8))
    gain = rng.standard_normal(8)
    r = rng.standard_normal((6, 8))

    def objective(x, gain):
        return float(np.sum(rmsnorm_forward(x, gain)[0] * r))

    _, cache = rmsnorm_forward(x, gain)
    dx, dgain = rmsnorm_backward(r, cache)
    check_vjp(objective, {"x": x, "gain": gain}, {"x": dx, "gain": dgain}, rng)


def test_rmsnorm_worked_example():
    y, _ = rmsnorm_forward(np.array([[3.0, 4.0]]), np.array([1.0, 2.0]))
    rms = np.sqrt((9.0 + 16.0) / 2 + 1e-5)
    np.testing.assert_allclose(y, [[3.0 / rms, 8.0 / rms]], rtol=1e-12)


@pytest.mark.parametrize("t_len", [1, 2, 9])
def test_conv_backward_matches_finite_difference(rng, t_len):
    x = rng.standard_normal((2, t_len, 5))
    w = rng.standard_normal((3, 5))
    r = rng.standard_normal((2, t_len, 5))

    def objective(x, w):
        return float(np.sum(conv_forward(x, w)[0] * r))

    _, cache = conv_forward(x, w)
    dx, dw = conv_backward(r, cache)
    check_vjp(objective, {"x": x, "w": w}, {"x": dx, "w": dw}, rng)


def test_conv_is_causal_and_tap_k_reads_k_steps_back():
    x = np.zeros((1, 5, 1))
    x[0, 1, 0] = 1.0  # an impulse at t = 1
    w = np.array([[2.0], [3.0], [5.0]])
    y, _ = conv_forward(x, w)
    np.testing.assert_array_equal(y[0, :, 0], [0.0, 2.0, 3.0, 5.0, 0.0])


def test_ffn_backward_matches_finite_difference(rng):
    c, h = 5, 7
    args = {
        "x": rng.standard_normal((6, c)),
        "w1": rng.standard_normal((c, h)),
        "b1": rng.standard_normal(h),
        "w2": rng.standard_normal((h, c)),
        "b2": rng.standard_normal(c),
    }
    r = rng.standard_normal((6, c))

    def objective(x, w1, b1, w2, b2):
        return float(np.sum(ffn_forward(x, w1, b1, w2, b2)[0] * r))

    _, cache = ffn_forward(**args)
    dx, (dw1, db1, dw2, db2) = ffn_backward(r, cache)
    check_vjp(objective, args, {"x": dx, "w1": dw1, "b1": db1, "w2": dw2, "b2": db2}, rng)


def test_router_backward_matches_finite_difference(rng):
    x = rng.standard_normal((10, 6))
    w = rng.standard_normal((6, 5))
    r = rng.standard_normal((10, 2))

    def objective(x, w):
        experts, gates, _ = router_forward(x, w, 2)
        return float(np.sum(gates * r))

    experts, gates, cache = router_forward(x, w, 2)
    dx, dw = router_backward(r, cache)
    check_vjp(objective, {"x": x, "w": w}, {"x": dx, "w": dw}, rng)


def test_router_picks_highest_logits_and_softmaxes_only_those():
    x = np.array([[1.0, 0.0]])
    w = np.array([[0.1, 3.0, 2.0, -1.0], [0.0, 0.0, 0.0, 0.0]])  # logits 0.1, 3, 2, -1
    experts, gates, _ = router_forward(x, w, 2)
    np.testing.assert_array_equal(experts, [[1, 2]])
    np.testing.assert_allclose(gates, [[np.exp(3) / (np.exp(3) + np.exp(2)), np.exp(2) / (np.exp(3) + np.exp(2))]])


def test_unembed_backward_matches_finite_difference_and_adds_into_d_emb(rng):
    h = rng.standard_normal((4, 3))
    emb = rng.standard_normal((6, 3))
    r = rng.standard_normal((4, 6))

    def objective(h, emb):
        return float(np.sum(unembed_forward(h, emb)[0] * r))

    _, cache = unembed_forward(h, emb)
    start = rng.standard_normal(emb.shape)
    dh, d_emb = unembed_backward(r, cache, start.copy())
    check_vjp(objective, {"h": h, "emb": emb}, {"h": dh, "emb": d_emb - start}, rng)


def test_cross_entropy_backward_matches_finite_difference(rng):
    logits = rng.standard_normal((5, 9)) * 3
    targets = rng.integers(0, 9, 5)

    def objective(logits):
        return cross_entropy_forward(logits, targets)[0]

    _, cache = cross_entropy_forward(logits, targets)
    check_vjp(objective, {"logits": logits}, {"logits": cross_entropy_backward(cache)}, rng)


def test_cross_entropy_of_uniform_logits_is_log_v_and_inplace_matches():
    logits = np.zeros((3, 8), dtype=np.float32)
    loss, _ = cross_entropy_forward(logits.copy(), np.array([0, 5, 7]), inplace=True)
    assert loss == pytest.approx(np.log(8), rel=1e-6)
    big = np.array([[1000.0, 0.0]], dtype=np.float32)  # no overflow: the row max is subtracted first
    loss, cache = cross_entropy_forward(big, np.array([1]))
    assert loss == pytest.approx(1000.0, rel=1e-6)
    assert np.isfinite(cross_entropy_backward(cache)).all()


def _moe_params(rng, c=6, h=5, e=4):
    params = {"router": rng.standard_normal((c, e))}
    for name in ["shared"] + [f"expert{i}" for i in range(e)]:
        params[f"{name}.w1"] = rng.standard_normal((c, h))
        params[f"{name}.b1"] = rng.standard_normal(h)
        params[f"{name}.w2"] = rng.standard_normal((h, c))
        params[f"{name}.b2"] = rng.standard_normal(c)
    return params


def test_moe_backward_matches_finite_difference(rng):
    params = _moe_params(rng)
    x = rng.standard_normal((12, 6))
    r = rng.standard_normal((12, 6))

    def objective(x, **params):
        return float(np.sum(moe_forward(params, x, 2)[0] * r))

    _, cache = moe_forward(params, x, 2)
    dx, grads = moe_backward(r, cache)
    full = {name: grads.get(name, np.zeros_like(p)) for name, p in params.items()}
    check_vjp(objective, {"x": x, **params}, {"x": dx, **full}, rng)


def test_moe_equals_dense_combination_of_all_experts(rng):
    params = _moe_params(rng)
    x = rng.standard_normal((12, 6))
    experts, gates, _ = router_forward(x, params["router"], 2)
    expected, _ = ffn_forward(x, *(params[f"shared.{n}"] for n in ("w1", "b1", "w2", "b2")))
    for e in range(4):
        ye, _ = ffn_forward(x, *(params[f"expert{e}.{n}"] for n in ("w1", "b1", "w2", "b2")))
        weight = np.where(experts == e, gates, 0.0).sum(axis=1)  # (N,)
        expected = expected + weight[:, None] * ye
    y, _ = moe_forward(params, x, 2)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


def test_moe_never_computes_an_unchosen_expert(rng):
    params = _moe_params(rng)
    params["router"][:, 3] = 0.0
    x = np.abs(rng.standard_normal((8, 6)))
    params["router"][:, :3] = np.abs(params["router"][:, :3]) + 0.1  # expert 3 always has the lowest logit
    for n in ("w1", "b1", "w2", "b2"):
        params[f"expert3.{n}"] = np.full_like(params[f"expert3.{n}"], np.nan)
    y, cache = moe_forward(params, x, 2)
    assert np.isfinite(y).all()
    dx, grads = moe_backward(np.ones_like(y), cache)
    assert np.isfinite(dx).all()
    assert "expert3.w1" not in grads


def test_layers_keep_float32(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    params = {k: v.astype(np.float32) for k, v in _moe_params(rng).items()}
    y, cache = moe_forward(params, x, 2)
    dx, grads = moe_backward(np.ones_like(y), cache)
    normed, ncache = rmsnorm_forward(x, np.ones(6, dtype=np.float32))
    conv, _ = conv_forward(x[None], np.ones((3, 6), dtype=np.float32))
    assert {y.dtype, dx.dtype, normed.dtype, conv.dtype} == {np.dtype(np.float32)}
    assert all(g.dtype == np.float32 for g in grads.values())
