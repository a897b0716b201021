"""fp16 rounding and the dynamic loss scaler."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evermind_memory.errors import InvalidInput
from evermind_memory.training.mixed_precision import (
    FP16_MIN_NORMAL,
    DynamicLossScaler,
    has_overflow,
    round_fp16,
    round_fp16_,
)


@settings(max_examples=50, deadline=None)
@given(st.floats(min_value=FP16_MIN_NORMAL, max_value=60000.0), st.booleans())
def test_round_fp16_keeps_normal_values_to_half_precision(x, negative):
    x = -x if negative else x
    y = float(round_fp16(np.array([x], np.float32))[0])
    assert abs(y - x) <= abs(x) * 2.0**-11 * (1 + 1e-6)


def test_round_fp16_overflows_to_inf_and_flushes_subnormals():
    y = round_fp16(np.array([1e5, -7e4, 3e-5, -1e-7, 0.5], np.float32))
    assert np.isposinf(y[0]) and np.isneginf(y[1])
    assert y[2] == 0.0 and y[3] == 0.0 and y[4] == 0.5
    kept = round_fp16(np.array([3e-5], np.float32), flush_subnormals=False)
    assert kept[0] == pytest.approx(3e-5, rel=1e-2)


def test_round_fp16_in_place_matches_the_copying_form(rng):
    a = {"w": (rng.standard_normal((6, 5)) * 1e-3).astype(np.float32)}
    expected = round_fp16(a["w"])
    round_fp16_(a)
    assert a["w"].dtype == np.float32 and np.array_equal(a["w"], expected)


def test_loss_scaling_keeps_a_tiny_gradient_alive_through_fp16():
    grad = np.full(8, 1e-6, np.float32)
    assert not round_fp16(grad).any()  # below fp16's normal range: lost without scaling
    scaler = DynamicLossScaler()
    scaled = round_fp16(grad * np.float32(scaler.scale))
    assert scaler.update(has_overflow({"g": scaled}))
    recovered = scaled / np.float32(scaler.scale)
    np.testing.assert_allclose(recovered, 1e-6, rtol=1e-3)


def test_an_overflowing_step_is_skipped_and_the_scale_halves():
    scaler = DynamicLossScaler(init_scale=2.0**15)
    grads = {"a": np.array([1.0, 3.0], np.float32), "b": np.array([0.1], np.float32)}
    scaled = {n: round_fp16(g * np.float32(scaler.scale)) for n, g in grads.items()}  # 3 * 2^15 > 65504
    assert has_overflow(scaled)
    assert scaler.update(has_overflow(scaled)) is False
    assert scaler.scale == 2.0**14 and scaler.overflows == 1
    rescaled = {n: round_fp16(g * np.float32(scaler.scale)) for n, g in grads.items()}
    assert not has_overflow(rescaled)
    assert scaler.update(False) is True


def test_scale_grows_after_the_interval_and_never_drops_below_the_floor():
    scaler = DynamicLossScaler(init_scale=8.0, growth_interval=3, min_scale=2.0)
    for _ in range(2):
        scaler.update(False)
    assert scaler.scale == 8.0
    scaler.update(False)
    assert scaler.scale == 16.0
    for _ in range(10):
        scaler.update(True)
    assert scaler.scale == 2.0


def test_has_overflow_sees_nan_and_inf_but_not_large_finite_values():
    assert has_overflow({"a": np.array([1.0, np.nan], np.float32)})
    assert has_overflow({"a": np.array([np.inf], np.float32)})
    assert not has_overflow({"a": np.array([3e38, 3e38], np.float32)})  # dot overflows, elements are finite


def test_scaler_state_round_trips_through_json():
    a = DynamicLossScaler(init_scale=64.0, growth_interval=2)
    for flag in (False, True, False):
        a.update(flag)
    b = DynamicLossScaler()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict()
    with pytest.raises(InvalidInput, match="state format"):
        b.load_state_dict({"format": "other"})


def test_scaler_refuses_bad_settings():
    with pytest.raises(InvalidInput, match="backoff_factor"):
        DynamicLossScaler(backoff_factor=1.5)
