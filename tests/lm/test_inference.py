"""The embedding inference path (embed, embed_batch, frozen()) against the training path it must equal, the
MoE inference functions against moe_forward, and moe_backward's `need` subset."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evermind_memory.errors import InvalidInput
from evermind_memory.lm.inference import build_plan, plan_embed_one
from evermind_memory.lm.model import EvermindLM, FrozenEmbedder, LMConfig
from evermind_memory.lm.moe import (
    SHORT_MAX_ROWS,
    moe_backward,
    moe_forward,
    moe_infer,
    moe_infer_short,
    moe_inference_weights,
)


def _model(config: LMConfig, seed: int = 0, dtype=np.float32) -> EvermindLM:
    """A model nudged off its init, so gains, biases, taps and the router all matter."""
    model = EvermindLM(config, seed=seed)
    rng = np.random.default_rng(seed + 7)
    model.params = {k: (v + rng.normal(0, 0.1, v.shape)).astype(dtype) for k, v in model.params.items()}
    return model


def _reference(model: EvermindLM, seqs: list[list[int]]) -> np.ndarray:
    """L2-normalised pooled_forward (the training path) of each sequence alone, in float64."""
    out = []
    for s in seqs:
        pooled, _ = model.pooled_forward(np.array([s]))  # (1, C)
        out.append(pooled[0] / np.linalg.norm(pooled[0]))
    return np.array(out)


CONFIGS = [
    LMConfig(vocab_size=60, d_model=16, n_layers=2, conv_kernel=3, hidden_dim=24, n_experts=4, top_k=2),
    LMConfig(vocab_size=60, d_model=16, n_layers=3, conv_kernel=4, hidden_dim=24, n_experts=4, top_k=2, attn_heads=4),
    LMConfig(vocab_size=60, d_model=8, n_layers=2, conv_kernel=2, hidden_dim=12, n_experts=5, top_k=3, attn_heads=2),
    LMConfig(vocab_size=60, d_model=8, n_layers=1, conv_kernel=5, hidden_dim=12, n_experts=3, top_k=1),
    LMConfig(vocab_size=60, d_model=8, n_layers=2, conv_kernel=3, hidden_dim=12, n_experts=2, top_k=2, attn_heads=1),
]
# Lengths on both sides of the short path's row limit, and shorter than the conv.
LENGTHS = [1, 2, 3, 7, SHORT_MAX_ROWS, SHORT_MAX_ROWS + 1, 40]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"E{c.n_experts}k{c.top_k}a{c.attn_heads}")
def test_every_inference_entry_point_equals_the_training_path(config: LMConfig):
    model = _model(config)
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 60, size=n).tolist() for n in LENGTHS]
    ref = _reference(model, seqs)
    frozen = model.frozen()
    assert isinstance(frozen, FrozenEmbedder)
    for got in (
        np.stack([model.embed(s) for s in seqs]),
        model.embed_batch(seqs),
        np.stack([frozen.embed(s) for s in seqs]),
        frozen.embed_batch(seqs),
        frozen.embed_batch(seqs[::-1])[::-1],
    ):
        assert got.dtype == np.float32 and got.shape == ref.shape
        np.testing.assert_allclose(got, ref, atol=2e-6)


def test_padded_buckets_equal_unpadded_sequences():
    model = _model(CONFIGS[1])
    rng = np.random.default_rng(2)
    seqs = [rng.integers(0, 60, size=n).tolist() for n in rng.integers(1, 30, size=50)]  # ragged: padded buckets
    frozen = model.frozen()
    np.testing.assert_allclose(frozen.embed_batch(seqs), np.stack([frozen.embed(s) for s in seqs]), atol=2e-6)
    np.testing.assert_allclose(model.embed_batch(seqs), _reference(model, seqs), atol=2e-6)


@pytest.mark.parametrize("length", [3, 40])
def test_router_ties_go_to_the_lower_expert_as_in_training(length: int):
    # A zero router gives every expert the same logit: the stable choice is experts 0..k-1 for every row.
    config = LMConfig(vocab_size=30, d_model=8, n_layers=2, conv_kernel=3, hidden_dim=12, n_experts=4, top_k=2)
    model = _model(config)
    for layer in range(config.n_layers):
        model.params[f"layers.{layer}.router"][:] = 0.0
    seq = [i % 30 for i in range(length)]
    ref = _reference(model, [seq])
    np.testing.assert_allclose(model.frozen().embed(seq), ref[0], atol=2e-6)
    np.testing.assert_allclose(model.embed(seq), ref[0], atol=2e-6)
    # and the tie decides something: with expert 0 muted the vector changes
    model.params["layers.0.expert0.w2"][:] = 0.0
    model.params["layers.0.expert0.b2"][:] = 0.0
    assert not np.allclose(model.frozen().embed(seq), ref[0], atol=1e-4)


def test_float64_params_keep_float64_maths():
    model = _model(CONFIGS[1], dtype=np.float64)
    seqs = [[1, 2, 3], list(range(25))]
    ref = _reference(model, seqs)
    np.testing.assert_allclose(model.embed_batch(seqs), ref, atol=1e-6)
    np.testing.assert_allclose(model.frozen().embed(seqs[0]), ref[0], atol=1e-6)


def test_frozen_is_a_snapshot_and_the_model_follows_its_params():
    model = _model(CONFIGS[1])
    seq = [4, 5, 6, 7]
    frozen = model.frozen()
    before = frozen.embed(seq)
    for name in model.params:
        if name.endswith(".w1") or name == "emb":
            model.params[name] *= 1.5  # in place, as an optimiser step does
    np.testing.assert_array_equal(frozen.embed(seq), before)
    after = model.embed(seq)
    assert not np.allclose(after, before, atol=1e-4)
    np.testing.assert_allclose(after, _reference(model, [seq])[0], atol=2e-6)


def test_frozen_checks_inputs_like_the_model():
    frozen = _model(CONFIGS[0]).frozen()
    with pytest.raises(InvalidInput, match="at least one token"):
        frozen.embed([])
    with pytest.raises(InvalidInput, match=r"embed_batch\(\) item 1 .*\[0, 60\)"):
        frozen.embed_batch([[1], [60]])
    assert frozen.embed_batch([]).shape == (0, 16)


def _moe_params(rng: np.random.Generator, c: int, h: int, e: int) -> dict[str, np.ndarray]:
    p = {"router": rng.normal(0, 1, (c, e)).astype(np.float32)}
    for name in ["shared"] + [f"expert{i}" for i in range(e)]:
        p[f"{name}.w1"] = rng.normal(0, 0.3, (c, h)).astype(np.float32)
        p[f"{name}.b1"] = rng.normal(0, 0.3, h).astype(np.float32)
        p[f"{name}.w2"] = rng.normal(0, 0.3, (h, c)).astype(np.float32)
        p[f"{name}.b2"] = rng.normal(0, 0.3, c).astype(np.float32)
    return p


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 40), experts=st.integers(1, 5), top_k=st.integers(1, 5), seed=st.integers(0, 2**16),
       tie=st.booleans())
def test_moe_inference_equals_moe_forward(rows: int, experts: int, top_k: int, seed: int, tie: bool):
    top_k = min(top_k, experts)
    rng = np.random.default_rng(seed)
    c, h = 6, 10
    params = _moe_params(rng, c, h, experts)
    if tie:
        params["router"][:, : min(2, experts)] = params["router"][:, :1]  # experts 0 and 1 always tie
    gain = rng.normal(1, 0.2, c).astype(np.float32)
    x = rng.normal(0, 1, (rows, c)).astype(np.float32)
    want, _ = moe_forward(params, x * gain, top_k, keep_cache=False)  # (N, C)
    base = rng.normal(0, 1, (rows, c)).astype(np.float32)  # the residual stream the output is added to
    for fused in (False, True):
        w = moe_inference_weights(params, gain, fused=fused)
        out = base.copy()
        moe_infer(w, x.copy(), top_k, out)
        np.testing.assert_allclose(out - base, want, atol=2e-5)
    xa = np.concatenate([x, np.ones((rows, 1), np.float32)], axis=1)  # (N, C+1)
    out = base.copy()
    moe_infer_short(moe_inference_weights(params, gain, fused=True), xa, top_k, out)
    np.testing.assert_allclose(out - base, want, atol=2e-5)


def test_moe_backward_need_computes_only_what_is_asked_bit_for_bit():
    rng = np.random.default_rng(3)
    params = {k: v.astype(np.float64) for k, v in _moe_params(rng, 5, 7, 4).items()}
    x = rng.normal(0, 1, (20, 5))
    dy = rng.normal(0, 1, (20, 5))
    _, cache = moe_forward(params, x, 2)
    dx_all, all_grads = moe_backward(dy, cache)
    assert set(all_grads) == set(params)  # 20 rows, top-2 of 4: every expert is chosen
    for need in ({"router"}, {"shared.w1", "expert2.b2"}, {"expert0.w1", "expert0.b1", "expert3.w2"}, set()):
        dx, grads = moe_backward(dy, cache, need=need)
        np.testing.assert_array_equal(dx, dx_all)
        assert set(grads) == need
        for name in need:
            np.testing.assert_array_equal(grads[name], all_grads[name])


def test_lm_embedder_single_and_batched_paths_agree_and_hold_a_snapshot():
    from evermind_memory.embedder import LMEmbedder
    from evermind_memory.lm.tokenizer import BPETokenizer

    texts = ["green tea", "the cat sat on the mat and then on the rug", "x", "a b c d e f g h i j k l m n o p q r s t"]
    tok = BPETokenizer.train(texts * 5, 300)
    config = LMConfig(vocab_size=len(tok), d_model=16, n_layers=2, conv_kernel=3, hidden_dim=24, attn_heads=2)
    model = _model(config)
    embedder = LMEmbedder(model, tok)
    one = np.stack([embedder.embed(t) for t in texts])
    np.testing.assert_allclose(one, embedder.embed_many(texts), atol=2e-6)
    np.testing.assert_array_equal(embedder.embed_many(texts[:1])[0], one[0])
    ref = _reference(model, [tok.encode(t) for t in texts])
    np.testing.assert_allclose(one, ref, atol=2e-6)
    model.params["layers.0.shared.w1"] *= 2.0  # the fingerprint names the weights at construction: no effect
    np.testing.assert_array_equal(np.stack([embedder.embed(t) for t in texts]), one)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_single_text_padded_to_4k_positions_embeds_as_the_training_path(config):
    """plan_embed_one pads a text to a multiple of 4 positions (faster BLAS rows); every length, padded or not
    (1, 4k, past the short path's 16 rows), gives the training path's vector of the text alone."""
    model = _model(config, seed=5)
    plan = build_plan(config, model.params, fused=True)
    rng = np.random.default_rng(11)
    seqs = [rng.integers(0, config.vocab_size, size=t).tolist() for t in range(1, 20)]
    got = np.stack([plan_embed_one(plan, np.array(s, dtype=np.intp)) for s in seqs])
    np.testing.assert_allclose(got, _reference(model, seqs), atol=2e-6)
