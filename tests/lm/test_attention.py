"""The embedder's attention block: exact backward and padding that never leaks into real positions."""

from __future__ import annotations

import numpy as np

from evermind_memory.lm.attention import attention_backward, attention_forward


def _setup(rng, B=2, T=5, C=8, N=2):
    x = rng.normal(size=(B, T, C))
    wqkv = rng.normal(size=(C, 3 * C)) * 0.5
    wo = rng.normal(size=(C, C)) * 0.5
    lengths = np.array([T, T - 2][:B])
    return x, wqkv, wo, lengths, N


def test_backward_matches_central_differences(rng):
    x, wqkv, wo, lengths, N = _setup(rng)
    real = (np.arange(x.shape[1])[None, :] < lengths[:, None])[..., None]
    w = rng.normal(size=x.shape) * real  # loss sees real positions only

    def loss(x_, wqkv_, wo_):
        return float((attention_forward(x_, wqkv_, wo_, lengths, N)[0] * w).sum())

    _, cache = attention_forward(x, wqkv, wo, lengths, N)
    dx, dwqkv, dwo = attention_backward(w, cache, wqkv, wo, N)
    eps = 1e-6
    for i, (arg, grad) in enumerate([(x, dx), (wqkv, dwqkv), (wo, dwo)]):
        u = rng.normal(size=arg.shape)
        args_p = [x, wqkv, wo]
        args_m = [x, wqkv, wo]
        args_p[i] = arg + eps * u
        args_m[i] = arg - eps * u
        numeric = (loss(*args_p) - loss(*args_m)) / (2 * eps)
        analytic = float((grad * u).sum())
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(numeric)), (i, analytic, numeric)


def test_padding_does_not_change_real_positions(rng):
    x, wqkv, wo, _, N = _setup(rng, B=1, T=4)
    y_short, _ = attention_forward(x[:, :3], wqkv, wo, np.array([3]), N)
    padded = np.concatenate([x[:, :3], rng.normal(size=(1, 3, x.shape[2])) * 100], axis=1)
    y_pad, _ = attention_forward(padded, wqkv, wo, np.array([3]), N)
    np.testing.assert_allclose(y_pad[:, :3], y_short, rtol=1e-12, atol=1e-12)
