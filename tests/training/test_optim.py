"""AdamW, its kernel mirror, sharding, clipping and the LR schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evermind_memory.errors import InvalidInput
from evermind_memory.training.optim import (
    AdamW,
    AdamWStep,
    LRSchedule,
    ShardSpec,
    adamw_update_,
    assign_shards,
    clip_grad_norm_,
    grad_norm,
)

SHAPES = {"emb": (13, 5), "a.w1": (5, 7), "a.b1": (7,), "a.w2": (7, 5), "norm": (5,), "b.w1": (5, 3)}


def _params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def _grads(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {n: (0.1 * rng.standard_normal(s)).astype(np.float32) for n, s in SHAPES.items()}


def _hp(t: int = 1, **kw) -> AdamWStep:
    base = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, beta1_t=0.9**t, beta2_t=0.999**t)
    base.update(kw)
    return AdamWStep(**base)


def test_kernel_mirror_matches_float64_adamw(rng):
    p = rng.standard_normal(50).astype(np.float32)
    m = np.zeros(50, np.float32)
    v = np.zeros(50, np.float32)
    p64, m64, v64 = p.astype(np.float64), np.zeros(50), np.zeros(50)
    for t in range(1, 6):
        g = rng.standard_normal(50).astype(np.float32)
        assert adamw_update_(p, g, m, v, _hp(t, grad_scale=0.5))
        g64 = g.astype(np.float64) * 0.5
        m64 = 0.9 * m64 + 0.1 * g64
        v64 = 0.999 * v64 + 0.001 * g64**2
        step = 1e-2 * (m64 / (1 - 0.9**t)) / (np.sqrt(v64 / (1 - 0.999**t)) + 1e-8)
        p64 = p64 * (1 - 1e-2 * 0.1) - step
    np.testing.assert_allclose(p, p64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v, v64, rtol=1e-4)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_kernel_drops_a_non_finite_step(rng, bad):
    p = rng.standard_normal(20).astype(np.float32)
    m = rng.standard_normal(20).astype(np.float32)
    v = np.abs(rng.standard_normal(20)).astype(np.float32)
    g = rng.standard_normal(20).astype(np.float32)
    g[7] = bad
    before = (p.copy(), m.copy(), v.copy())
    assert adamw_update_(p, g, m, v, _hp(3)) is False
    for now, then in zip((p, m, v), before):
        assert np.array_equal(now, then)


def test_kernel_trust_region_bounds_every_element(rng):
    p = rng.standard_normal(200).astype(np.float32)
    g = (100 * rng.standard_normal(200)).astype(np.float32)
    free = p.copy()
    adamw_update_(free, g, np.zeros(200, np.float32), np.zeros(200, np.float32), _hp(lr=1.0, weight_decay=0.0))
    assert np.abs(free - p).max() > 0.5  # without the bound the first Adam step moves by ~lr
    bounded = p.copy()
    adamw_update_(bounded, g, np.zeros(200, np.float32), np.zeros(200, np.float32),
                  _hp(lr=1.0, weight_decay=0.0, max_delta=1e-3))
    assert np.abs(bounded - p).max() <= 1e-3 + 1e-6  # float32 rounding of p - step at |p| ~ 3
    assert np.abs(bounded - p).max() >= 0.9e-3


def test_kernel_decoupled_decay_with_zero_gradient_shrinks_by_one_minus_lr_wd(rng):
    p = rng.standard_normal(30).astype(np.float32)
    expected = p * (np.float32(1) - np.float32(0.01) * np.float32(0.5))
    adamw_update_(p, np.zeros(30, np.float32), np.zeros(30, np.float32), np.zeros(30, np.float32),
                  _hp(lr=0.01, weight_decay=0.5))
    assert np.array_equal(p, expected)


def test_kernel_refuses_wrong_shapes_and_dtypes():
    p = np.zeros(4, np.float32)
    with pytest.raises(InvalidInput, match="expected grad of shape"):
        adamw_update_(p, np.zeros(5, np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32), _hp())
    with pytest.raises(InvalidInput, match="expected float32 grad"):
        adamw_update_(p, np.zeros(4), np.zeros(4, np.float32), np.zeros(4, np.float32), _hp())


def test_adamw_step_equals_kernel_per_tensor(rng):
    params = _params(rng)
    copies = {n: p.copy() for n, p in params.items()}
    opt = AdamW(params, lr=3e-3, weight_decay=0.05, max_delta=0.01)
    ms = {n: np.zeros_like(p) for n, p in copies.items()}
    vs = {n: np.zeros_like(p) for n, p in copies.items()}
    for t in range(1, 4):
        grads = _grads(rng)
        assert opt.step(grads, grad_scale=0.25)
        for n in copies:
            adamw_update_(copies[n], grads[n], ms[n], vs[n],
                          AdamWStep(3e-3, 0.9, 0.999, 1e-8, 0.05, 0.9**t, 0.999**t, 0.01, 0.25))
    for n in params:
        assert np.array_equal(params[n], copies[n])


def test_adamw_coupled_form_is_adam_on_grad_plus_decay(rng):
    a = _params(rng)
    b = {n: p.copy() for n, p in a.items()}
    coupled = AdamW(a, lr=1e-2, weight_decay=0.3, decoupled=False)
    plain = AdamW(b, lr=1e-2, weight_decay=0.0)
    for _ in range(3):
        grads = _grads(rng)
        coupled.step(grads)
        plain.step({n: grads[n] + np.float32(0.3) * b[n] for n in grads})
    for n in a:
        np.testing.assert_allclose(a[n], b[n], rtol=1e-6, atol=1e-7)
    decoupled = _params(np.random.default_rng(5))
    d2 = {n: p.copy() for n, p in decoupled.items()}
    AdamW(decoupled, lr=1e-2, weight_decay=0.3).step(_grads(np.random.default_rng(6)))
    AdamW(d2, lr=1e-2, weight_decay=0.3, decoupled=False).step(_grads(np.random.default_rng(6)))
    assert not np.allclose(decoupled["emb"], d2["emb"])


def test_adamw_no_decay_names_are_not_decayed(rng):
    params = _params(rng)
    norm_before = params["norm"].copy()
    emb_before = params["emb"].copy()
    zeros = {n: np.zeros_like(p) for n, p in params.items()}
    AdamW(params, lr=0.1, weight_decay=0.5, no_decay=("norm",)).step(zeros)
    assert np.array_equal(params["norm"], norm_before)
    assert not np.array_equal(params["emb"], emb_before)


def test_adamw_drops_the_whole_step_when_any_gradient_is_nan(rng):
    params = _params(rng)
    before = {n: p.copy() for n, p in params.items()}
    opt = AdamW(params, lr=1e-2)
    grads = _grads(rng)
    grads["b.w1"][1, 2] = np.nan
    assert opt.step(grads) is False
    assert opt.t == 0
    for n in params:
        assert np.array_equal(params[n], before[n])
        assert not opt.m[n].any() and not opt.v[n].any()


@settings(max_examples=25, deadline=None)
@given(count=st.integers(1, 7), steps=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_union_of_shard_steps_equals_the_unsharded_step_bit_for_bit(count, steps, seed):
    rng = np.random.default_rng(seed)
    full = _params(rng)
    sharded = {n: p.copy() for n, p in full.items()}
    ref = AdamW(full, lr=1e-2, weight_decay=0.1, max_delta=0.05, no_decay=("norm", "a.b1"))
    shards = [AdamW(sharded, lr=1e-2, weight_decay=0.1, max_delta=0.05, no_decay=("norm", "a.b1"),
                    shard=ShardSpec(i, count)) for i in range(count)]
    owned = [n for s in shards for n in s.owned]
    assert sorted(owned) == sorted(SHAPES)  # every tensor has exactly one owner
    for _ in range(steps):
        grads = _grads(rng)
        ref.step(grads, grad_scale=0.7)
        for s in shards:
            s.step(grads, grad_scale=0.7)
    for n in full:
        assert np.array_equal(full[n], sharded[n]), n
    assert sum(s.state_bytes() for s in shards) == ref.state_bytes()


def test_each_shard_holds_only_its_part_of_the_state(rng):
    params = _params(rng)
    full = AdamW(params).state_bytes()
    assert full == 2 * sum(p.nbytes for p in params.values())
    parts = [AdamW(params, shard=ShardSpec(i, 2)).state_bytes() for i in range(2)]
    assert sum(parts) == full and max(parts) < full


def test_shard_assignment_is_deterministic_and_balances_sizes():
    shapes = {f"t{i}": (i + 1, 10) for i in range(12)}
    first = assign_shards(shapes, 3)
    assert first == assign_shards(dict(reversed(list(shapes.items()))), 3)
    loads = [sum((int(n[1:]) + 1) * 10 for n, s in first.items() if s == k) for k in range(3)]
    assert max(loads) - min(loads) <= 120


@pytest.mark.parametrize("index,count", [(2, 2), (-1, 2), (0, 0), (1, -3)])
def test_invalid_shard_is_refused(index, count):
    with pytest.raises(InvalidInput, match="ShardSpec expected"):
        ShardSpec(index, count)


def test_state_dict_round_trip_continues_the_same_run(rng):
    a = _params(rng)
    b = {n: p.copy() for n, p in a.items()}
    grads = [_grads(rng) for _ in range(5)]
    straight = AdamW(a, lr=1e-2, weight_decay=0.1)
    for g in grads:
        straight.step(g)
    first = AdamW(b, lr=1e-2, weight_decay=0.1)
    for g in grads[:2]:
        first.step(g)
    meta, tensors = first.state_dict()
    import json

    meta = json.loads(json.dumps(meta))
    second = AdamW(b, lr=0.5)
    second.load_state_dict(meta, tensors)
    for g in grads[2:]:
        second.step(g)
    for n in a:
        assert np.array_equal(a[n], b[n])


def test_load_state_dict_refuses_another_shard(rng):
    params = _params(rng)
    meta, tensors = AdamW(params, shard=ShardSpec(0, 2)).state_dict()
    with pytest.raises(InvalidInput, match="shard"):
        AdamW(params, shard=ShardSpec(1, 2)).load_state_dict(meta, tensors)


def test_clip_grad_norm_bounds_the_global_norm_and_keeps_direction(rng):
    grads = _grads(rng)
    before = {n: g.copy() for n, g in grads.items()}
    norm = clip_grad_norm_(grads, 0.1)
    expected = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in before.values()))
    assert norm == pytest.approx(expected, rel=1e-5)
    assert grad_norm(grads) == pytest.approx(0.1, rel=1e-4)
    ratio = grads["emb"] / before["emb"]
    np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-5)
    small = {n: g * np.float32(1e-3) for n, g in before.items()}
    kept = {n: g.copy() for n, g in small.items()}
    clip_grad_norm_(small, 10.0)
    assert all(np.array_equal(small[n], kept[n]) for n in small)


def test_lr_schedule_warms_up_then_follows_a_cosine_to_the_floor():
    sched = LRSchedule(base_lr=1.0, warmup=4, total_steps=20, min_lr=0.1)
    assert [sched(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    decay = [sched(s) for s in range(4, 21)]
    assert decay[0] == pytest.approx(1.0)
    assert all(x >= y for x, y in zip(decay, decay[1:]))
    assert sched(20) == pytest.approx(0.1) and sched(100) == pytest.approx(0.1)
    assert sched(12) == pytest.approx(0.1 + 0.9 * 0.5)
    assert LRSchedule(base_lr=0.3)(1000) == 0.3
