"""The GPU ops agree with the model's own numpy layers (lm/layers.py), not only with their ops twins."""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory.gpu import ops

layers = pytest.importorskip("evermind_memory.lm.layers", reason="lm/layers.py is not in this tree")


def test_gpu_ops_match_lm_layers(gpu):
    rng = np.random.default_rng(60)
    x = rng.standard_normal((2, 9, 16)).astype(np.float32)
    w_conv = rng.standard_normal((3, 16)).astype(np.float32)
    gain = rng.standard_normal(16).astype(np.float32)
    w_router = rng.standard_normal((16, 5)).astype(np.float32)
    flat = x.reshape(-1, 16)

    np.testing.assert_allclose(ops.conv1d_causal(x, w_conv), layers.conv_forward(x, w_conv)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ops.rmsnorm(flat, gain), layers.rmsnorm_forward(flat, gain)[0], rtol=2e-5, atol=2e-5)
    experts, gates, _ = layers.router_forward(flat, w_router, 2)
    idx, g = ops.moe_route(ops.linear(flat, w_router), 2)
    np.testing.assert_array_equal(idx, experts)
    np.testing.assert_allclose(g, gates, rtol=1e-5, atol=1e-6)
    targets = rng.integers(0, 5, flat.shape[0])
    logits = ops.linear(flat, w_router)
    loss, dlogits = ops.cross_entropy(logits, targets)
    ref_loss, cache = layers.cross_entropy_forward(logits, targets)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    np.testing.assert_allclose(dlogits, layers.cross_entropy_backward(cache), rtol=1e-5, atol=1e-6)
