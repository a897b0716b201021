"""The embedder's pooling path (attention block, final norm, mean): exact backward, padding-proof, batched."""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory.errors import InvalidInput
from evermind_memory.lm.model import EvermindLM, LMConfig, param_shapes


def _model(attn_heads: int, seed: int = 3) -> EvermindLM:
    cfg = LMConfig(vocab_size=40, d_model=8, n_layers=2, conv_kernel=3, hidden_dim=12, n_experts=3, top_k=2,
                   attn_heads=attn_heads)
    model = EvermindLM(cfg, seed=seed)
    rng = np.random.default_rng(seed)
    # float64, nudged off the init so norm gains, biases and the near-identity conv all matter.
    model.params = {k: v.astype(np.float64) + rng.normal(0, 0.05, v.shape) for k, v in model.params.items()}
    return model


@pytest.mark.parametrize("attn_heads", [0, 2])
def test_pooled_backward_matches_central_differences(attn_heads):
    model = _model(attn_heads)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 40, size=(3, 6))
    lengths = np.array([6, 4, 1])
    w = rng.normal(size=(3, model.config.d_model))
    pooled, cache = model.pooled_forward(tokens, lengths)
    grads = model.pooled_backward(w, cache)
    base = {k: v.copy() for k, v in model.params.items()}
    eps = 1e-6
    for name in ["emb", "layers.0.conv", "layers.1.expert0.w1"] + [n for n in base if n.startswith("pool.")]:
        u = rng.normal(size=base[name].shape)
        vals = []
        for sign in (1, -1):
            model.params = {**base, name: base[name] + sign * eps * u}
            vals.append(float((model.pooled_forward(tokens, lengths)[0] * w).sum()))
        model.params = base
        numeric = (vals[0] - vals[1]) / (2 * eps)
        analytic = float((grads[name] * u).sum())
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(numeric)), (name, analytic, numeric)


def test_attention_pooling_padding_and_batching_agree():
    cfg = LMConfig(vocab_size=50, d_model=16, n_layers=2, hidden_dim=16, attn_heads=4)
    model = EvermindLM(cfg, seed=1)
    rng = np.random.default_rng(5)
    seqs = [list(rng.integers(0, 50, size=n)) for n in (1, 3, 7, 7, 12, 30)]
    batched = model.embed_batch(seqs)
    single = np.stack([model.embed(s) for s in seqs])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    assert "pool.wqkv" in param_shapes(cfg) and "pool.wqkv" not in param_shapes(
        LMConfig(vocab_size=50, d_model=16))


def test_attention_heads_must_divide_width():
    with pytest.raises(InvalidInput, match="divisible by attn_heads"):
        LMConfig(vocab_size=10, d_model=10, attn_heads=4)
    with pytest.raises(InvalidInput, match="attn_heads >= 0"):
        LMConfig(vocab_size=10, attn_heads=-1)
