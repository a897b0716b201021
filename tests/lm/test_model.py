"""EvermindLM through its public API: config validation, exact gradients (float64 central differences),
padding invariance, checkpointed backward, generation, embeddings and a short training run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evermind_memory.errors import InvalidInput
from evermind_memory.lm.model import EvermindLM, LMConfig, param_shapes

EPS = 1e-6
TINY = LMConfig(vocab_size=23, d_model=8, n_layers=2, conv_kernel=3, hidden_dim=10, n_experts=3, top_k=2)


def float64_model(config: LMConfig = TINY, seed: int = 3) -> EvermindLM:
    model = EvermindLM(config, seed=seed)
    rng = np.random.default_rng(seed + 100)
    # Move away from the identity-like init so every parameter (norm gains, conv taps, biases) matters.
    model.params = {
        name: p.astype(np.float64) + 0.3 * rng.standard_normal(p.shape) for name, p in model.params.items()
    }
    return model


def check_directional(objective, model: EvermindLM, grads: dict, rng: np.random.Generator) -> None:
    """For each parameter, compare <grad, u> with a central difference of `objective` along u."""
    base = dict(model.params)
    for name, grad in grads.items():
        u = rng.standard_normal(base[name].shape)
        model.params = {**base, name: base[name] + EPS * u}
        plus = objective()
        model.params = {**base, name: base[name] - EPS * u}
        minus = objective()
        model.params = base
        numeric = (plus - minus) / (2 * EPS)
        analytic = float(np.sum(grad * u))
        assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-8), (
            f"d/d{name}: analytic {analytic!r} vs numeric {numeric!r}"
        )


# ── config ────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"vocab_size": 0}, "vocab_size >= 1"),
        ({"vocab_size": 10, "d_model": -4}, "d_model >= 1"),
        ({"vocab_size": 10, "n_experts": 2, "top_k": 3}, "top_k <= n_experts"),
        ({"vocab_size": 10, "n_layers": 2.0}, "expected an int for n_layers"),
        ({"vocab_size": True}, "expected an int for vocab_size"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(InvalidInput, match=match):
        LMConfig(**kwargs)


def test_config_from_dict_rejects_unknown_and_missing_keys():
    with pytest.raises(InvalidInput, match="unknown keys \\['heads'\\]"):
        LMConfig.from_dict({"vocab_size": 10, "heads": 4})
    with pytest.raises(InvalidInput, match="'vocab_size' key"):
        LMConfig.from_dict({"d_model": 8})
    with pytest.raises(InvalidInput, match="expected a dict"):
        LMConfig.from_dict([("vocab_size", 10)])


@settings(max_examples=30, deadline=None)
@given(
    v=st.integers(1, 10**6),
    c=st.integers(1, 512),
    layers=st.integers(1, 12),
    k=st.integers(1, 9),
    h=st.integers(1, 2048),
    e=st.integers(1, 16),
    data=st.data(),
)
def test_config_dict_round_trip(v, c, layers, k, h, e, data):
    top_k = data.draw(st.integers(1, e))
    config = LMConfig(v, c, layers, k, h, e, top_k)
    assert LMConfig.from_dict(config.to_dict()) == config


# ── parameters ────────────────────────────────────────────────────────────────


def test_params_follow_param_shapes_and_init_rules():
    model = EvermindLM(TINY, seed=0)
    shapes = param_shapes(TINY)
    assert list(model.params) == list(shapes)
    assert list(shapes)[:6] == [
        "emb", "layers.0.conv_norm", "layers.0.conv", "layers.0.moe_norm", "layers.0.router", "layers.0.shared.w1",
    ]
    assert "layers.1.expert2.b2" in shapes
    assert {n: p.shape for n, p in model.params.items()} == shapes
    assert all(p.dtype == np.float32 for p in model.params.values())
    assert model.num_parameters() == sum(int(np.prod(s)) for s in shapes.values())
    np.testing.assert_array_equal(model.params["layers.1.conv"][0], 1.0)
    np.testing.assert_array_equal(model.params["layers.1.conv"][1:], 0.0)
    np.testing.assert_array_equal(model.params["layers.0.moe_norm"], 1.0)
    np.testing.assert_array_equal(model.params["layers.0.expert1.b1"], 0.0)
    assert model.params["emb"].std() == pytest.approx(0.02, rel=0.2)
    assert model.params["layers.0.expert0.w1"].std() == pytest.approx(math.sqrt(2 / 8), rel=0.2)


def test_init_is_seeded():
    a, b, c = EvermindLM(TINY, seed=5), EvermindLM(TINY, seed=5), EvermindLM(TINY, seed=6)
    assert all(np.array_equal(a.params[n], b.params[n]) for n in a.params)
    assert not np.array_equal(a.params["emb"], c.params["emb"])


def test_from_params_copies_to_float32_and_validates():
    source = float64_model()
    model = EvermindLM.from_params(TINY, source.params)
    assert all(p.dtype == np.float32 for p in model.params.values())
    model.params["emb"][0, 0] = 123.0
    assert source.params["emb"][0, 0] != 123.0
    broken = dict(source.params)
    del broken["layers.1.router"]
    with pytest.raises(InvalidInput, match="missing \\['layers.1.router'\\]"):
        EvermindLM.from_params(TINY, broken)
    with pytest.raises(InvalidInput, match="emb of shape \\(23, 8\\)"):
        EvermindLM.from_params(TINY, {**source.params, "emb": np.zeros((22, 8))})
    with pytest.raises(InvalidInput, match="finite"):
        EvermindLM.from_params(TINY, {**source.params, "emb": np.full((23, 8), np.nan)})


# ── exact gradients ───────────────────────────────────────────────────────────


def test_loss_gradients_match_finite_differences_for_every_parameter(rng):
    model = float64_model()
    tokens = rng.integers(0, TINY.vocab_size, (3, 7))
    lengths = np.array([7, 4, 2])
    loss, grads = model.loss_and_grads(tokens, lengths)
    assert list(grads) == list(model.params)
    assert all(g.dtype == np.float64 for g in grads.values())
    check_directional(lambda: model.loss_and_grads(tokens, lengths)[0], model, grads, rng)


def test_hidden_backward_matches_finite_differences(rng):
    model = float64_model()
    tokens = rng.integers(0, TINY.vocab_size, (2, 6))
    lengths = np.array([6, 3])
    r = rng.standard_normal((2, 6, TINY.d_model))
    h, cache = model.hidden_forward(tokens, lengths)
    grads = model.hidden_backward(r, cache)
    check_directional(lambda: float(np.sum(model.hidden_forward(tokens, lengths)[0] * r)), model, grads, rng)


def test_checkpointed_gradients_equal_plain_ones(rng):
    model = EvermindLM(TINY, seed=1)
    tokens = rng.integers(0, TINY.vocab_size, (3, 9))
    lengths = np.array([9, 5, 8])
    loss, grads = model.loss_and_grads(tokens, lengths)
    loss_ckpt, grads_ckpt = model.loss_and_grads(tokens, lengths, checkpoint=True)
    assert loss == loss_ckpt
    assert max(float(np.max(np.abs(grads[n] - grads_ckpt[n]))) for n in grads) <= 1e-6


# ── chunked head and selective gradients ─────────────────────────────────────


@pytest.mark.parametrize("checkpoint", [False, True])
def test_chunked_head_gives_the_unchunked_loss_and_gradients(rng, checkpoint):
    model = EvermindLM(TINY, seed=2)
    tokens = rng.integers(0, TINY.vocab_size, (3, 9))
    lengths = np.array([9, 5, 8])  # 19 predicted rows
    loss, grads = model.loss_and_grads(tokens, lengths, head_chunk=10**6)  # one chunk: the unchunked path
    for chunk in (1, 4, 7, 18):  # 18: one full chunk and a remainder of one row
        loss_c, grads_c = model.loss_and_grads(tokens, lengths, checkpoint=checkpoint, head_chunk=chunk)
        assert loss_c == pytest.approx(loss, rel=1e-6)
        assert list(grads_c) == list(grads)
        assert max(float(np.max(np.abs(grads[n] - grads_c[n]))) for n in grads) <= 1e-6, chunk


def test_default_head_chunk_splits_by_vocab_size_and_stays_exact(rng, monkeypatch):
    from evermind_memory.lm import model as model_module

    model = EvermindLM(TINY, seed=2)
    tokens = rng.integers(0, TINY.vocab_size, (2, 12))
    loss, grads = model.loss_and_grads(tokens)
    monkeypatch.setattr(model_module, "HEAD_CHUNK_ELEMENTS", 5 * TINY.vocab_size)  # 5 rows per chunk
    loss_c, grads_c = model.loss_and_grads(tokens)
    loss_5, grads_5 = model.loss_and_grads(tokens, head_chunk=5)
    assert loss_c == loss_5 and all(np.array_equal(grads_c[n], grads_5[n]) for n in grads)
    assert loss_c == pytest.approx(loss, rel=1e-6)
    assert max(float(np.max(np.abs(grads[n] - grads_c[n]))) for n in grads) <= 1e-6


def test_chunked_head_gradients_match_finite_differences(rng):
    model = float64_model()
    tokens = rng.integers(0, TINY.vocab_size, (2, 7))
    lengths = np.array([7, 5])
    _, grads = model.loss_and_grads(tokens, lengths, head_chunk=3)
    check_directional(lambda: model.loss_and_grads(tokens, lengths, head_chunk=3)[0], model, grads, rng)


SUBSETS = [
    ("emb",),
    ("layers.1.expert2.w1", "layers.1.router"),  # only the top layer: the layer below is not back-propagated
    ("layers.0.conv", "layers.1.moe_norm", "layers.0.shared.b2", "layers.1.expert0.w2"),
    tuple(param_shapes(TINY)),
]


@pytest.mark.parametrize("subset", SUBSETS)
@pytest.mark.parametrize("checkpoint", [False, True])
def test_grads_for_returns_exactly_those_gradients_bit_identical(rng, subset, checkpoint):
    model = EvermindLM(TINY, seed=5)
    tokens = rng.integers(0, TINY.vocab_size, (3, 10))
    lengths = np.array([10, 6, 3])
    loss, full = model.loss_and_grads(tokens, lengths, checkpoint=checkpoint, head_chunk=4)
    loss_s, some = model.loss_and_grads(tokens, lengths, checkpoint=checkpoint, head_chunk=4, grads_for=subset)
    assert loss_s == loss
    assert list(some) == [n for n in model.params if n in subset]  # absent, not None, and in canonical order
    for name in subset:
        assert np.array_equal(some[name], full[name]), name


def test_grads_for_empty_gives_the_loss_only(rng):
    model = EvermindLM(TINY, seed=5)
    tokens = rng.integers(0, TINY.vocab_size, (2, 6))
    loss, grads = model.loss_and_grads(tokens, grads_for=())
    assert grads == {} and loss == model.loss_and_grads(tokens)[0]


def test_hidden_and_pooled_backward_accept_grads_for(rng):
    cfg = LMConfig(vocab_size=23, d_model=8, n_layers=2, conv_kernel=3, hidden_dim=10, n_experts=3, top_k=2,
                   attn_heads=2)
    model = EvermindLM(cfg, seed=4)
    tokens = rng.integers(0, cfg.vocab_size, (2, 6))
    lengths = np.array([6, 4])
    h, cache = model.hidden_forward(tokens, lengths)
    r = rng.standard_normal(h.shape).astype(np.float32)
    full = model.hidden_backward(r, cache)
    some = model.hidden_backward(r, cache, grads_for=["layers.1.shared.w1", "layers.1.conv_norm"])
    assert list(some) == ["layers.1.conv_norm", "layers.1.shared.w1"]
    assert all(np.array_equal(some[n], full[n]) for n in some)

    pooled, pcache = model.pooled_forward(tokens, lengths)
    w = rng.standard_normal(pooled.shape).astype(np.float32)
    full = model.pooled_backward(w, pcache)
    for subset in (["pool.wo", "pool.out_norm"], ["emb", "pool.attn_norm", "layers.0.router"]):
        some = model.pooled_backward(w, pcache, grads_for=subset)
        assert set(some) == set(subset)
        assert all(np.array_equal(some[n], full[n]) for n in some), subset


def test_bad_grads_for_and_head_chunk_raise_invalid_input():
    model = EvermindLM(TINY, seed=0)
    tokens = np.zeros((1, 4), dtype=np.int64)
    with pytest.raises(InvalidInput, match="unknown parameter names.*layers.9.conv"):
        model.loss_and_grads(tokens, grads_for=["emb", "layers.9.conv"])
    with pytest.raises(InvalidInput, match="collection of parameter names"):
        model.loss_and_grads(tokens, grads_for="emb")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(InvalidInput, match="head_chunk"):
            model.loss_and_grads(tokens, head_chunk=bad)
    h, cache = model.hidden_forward(tokens)
    with pytest.raises(InvalidInput, match="unknown parameter names"):
        model.hidden_backward(h, cache, grads_for=["pool.wo"])


# ── padding ───────────────────────────────────────────────────────────────────


def test_padded_batch_matches_each_sequence_alone(rng):
    model = EvermindLM(TINY, seed=2)
    seqs = [rng.integers(0, TINY.vocab_size, n) for n in (6, 2, 4)]
    tokens = np.full((3, 6), TINY.vocab_size + 7)  # padding ids out of range must be ignored
    for b, s in enumerate(seqs):
        tokens[b, : s.size] = s
    lengths = np.array([s.size for s in seqs])
    logits = model.forward(tokens, lengths)
    h, _ = model.hidden_forward(tokens, lengths)
    for b, s in enumerate(seqs):
        alone = model.forward(s[None, :])[0]
        np.testing.assert_allclose(logits[b, : s.size], alone, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(logits[b, s.size :], 0.0)
        np.testing.assert_array_equal(h[b, s.size :], 0.0)
    np.testing.assert_allclose(model.embed_batch(seqs), [model.embed(s.tolist()) for s in seqs], atol=1e-5)


def test_padded_batch_gradients_are_the_weighted_sum_of_per_sequence_gradients(rng):
    model = float64_model()
    seqs = [rng.integers(0, TINY.vocab_size, n) for n in (5, 3, 2)]
    tokens = np.zeros((3, 5), dtype=np.int64)
    for b, s in enumerate(seqs):
        tokens[b, : s.size] = s
    loss, grads = model.loss_and_grads(tokens, [s.size for s in seqs])
    predicted = np.array([s.size - 1 for s in seqs], dtype=np.float64)
    weights = predicted / predicted.sum()  # the batch loss is the mean over all predicted positions
    expected_loss = 0.0
    expected = {n: np.zeros_like(p) for n, p in model.params.items()}
    for w, s in zip(weights, seqs):
        l_one, g_one = model.loss_and_grads(s[None, :])
        expected_loss += w * l_one
        for n in expected:
            expected[n] += w * g_one[n]
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    for n in grads:
        np.testing.assert_allclose(grads[n], expected[n], rtol=1e-9, atol=1e-12, err_msg=n)


def test_hidden_backward_ignores_gradient_at_padded_positions(rng):
    model = EvermindLM(TINY, seed=4)
    tokens = rng.integers(0, TINY.vocab_size, (2, 5))
    h, cache = model.hidden_forward(tokens, [5, 2])
    dh = np.zeros(h.shape, dtype=np.float32)
    dh[1, 2:] = 1.0  # only padded positions
    grads = model.hidden_backward(dh, cache)
    assert all(not np.any(g) for g in grads.values())


# ── inputs ────────────────────────────────────────────────────────────────────


def test_bad_inputs_raise_invalid_input():
    model = EvermindLM(TINY, seed=0)
    with pytest.raises(InvalidInput, match=r"token ids in \[0, 23\), got 23 at \(batch 1, position 0\)"):
        model.forward(np.array([[1, 2], [23, 0]]))
    with pytest.raises(InvalidInput, match="shape \\(B, T\\)"):
        model.forward(np.array([1, 2, 3]))
    with pytest.raises(InvalidInput, match="pad the sequences and pass lengths"):
        model.forward([[1, 2, 3], [4]])
    with pytest.raises(InvalidInput, match="1 <= lengths <= T=2"):
        model.forward(np.array([[1, 2]]), [3])
    with pytest.raises(InvalidInput, match="at least one token"):
        model.embed([])
    with pytest.raises(InvalidInput, match="embed_batch\\(\\) item 1 expected at least one token"):
        model.embed_batch([[1], []])
    with pytest.raises(InvalidInput, match="got -1"):
        model.generate([-1], 3)
    with pytest.raises(InvalidInput, match=">= 2 tokens"):
        model.loss_and_grads(np.array([[1, 2]]), [1])


# ── generation and embeddings ─────────────────────────────────────────────────


def test_greedy_generation_matches_argmax_of_the_full_forward(rng):
    model = float64_model(seed=7)
    prompt = rng.integers(0, TINY.vocab_size, 9).tolist()  # longer than the receptive field
    produced = model.generate(prompt, 8)
    seq = list(prompt)
    for _ in range(8):
        seq.append(int(np.argmax(model.forward(np.array([seq]))[0, -1])))
    assert produced == seq[len(prompt) :]
    assert model.generate(prompt, 8) == produced


def test_sampling_is_seeded_and_stop_token_ends_generation():
    model = EvermindLM(TINY, seed=0)
    a = model.generate([1, 2], 20, temperature=1.5, seed=11)
    assert a == model.generate([1, 2], 20, temperature=1.5, seed=11)
    assert a != model.generate([1, 2], 20, temperature=1.5, seed=12)
    stopped = model.generate([1, 2], 20, temperature=1.5, seed=11, stop_token=a[3])
    assert stopped == a[: a.index(a[3]) + 1]
    assert model.generate([1, 2], 0) == []


def test_embed_is_unit_norm_float32_and_batch_agrees():
    model = EvermindLM(TINY, seed=0)
    v = model.embed([3, 4, 5])
    assert v.shape == (TINY.d_model,) and v.dtype == np.float32
    assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-6)
    lists = [[1] * n for n in (1, 40, 3)] + [list(range(20)), [7, 7]]
    batch = model.embed_batch(lists)
    assert batch.dtype == np.float32 and batch.shape == (5, TINY.d_model)
    np.testing.assert_allclose(batch, [model.embed(t) for t in lists], atol=1e-5)
    assert model.embed_batch([]).shape == (0, TINY.d_model)


# ── training ──────────────────────────────────────────────────────────────────


def test_adam_on_a_repetitive_sequence_drives_loss_well_below_log_v():
    config = LMConfig(vocab_size=16, d_model=16, n_layers=2, conv_kernel=3, hidden_dim=32, n_experts=4, top_k=2)
    model = EvermindLM(config, seed=0)
    tokens = np.array([[1, 5, 9, 2, 7] * 6, [5, 9, 2, 7, 1] * 6])
    lr, beta1, beta2 = 0.02, 0.9, 0.999
    m = {n: np.zeros_like(p) for n, p in model.params.items()}
    v = {n: np.zeros_like(p) for n, p in model.params.items()}
    first = None
    for step in range(1, 61):
        loss, grads = model.loss_and_grads(tokens)
        first = loss if first is None else first
        for n, g in grads.items():
            m[n] = beta1 * m[n] + (1 - beta1) * g
            v[n] = beta2 * v[n] + (1 - beta2) * g * g
            m_hat = m[n] / (1 - beta1**step)
            v_hat = v[n] / (1 - beta2**step)
            model.params[n] -= (lr * m_hat / (np.sqrt(v_hat) + 1e-8)).astype(np.float32)
    assert first == pytest.approx(math.log(16), rel=0.05)
    assert loss < 0.2 * math.log(16)


# ── files ─────────────────────────────────────────────────────────────────────


def test_save_load_round_trip(tmp_path):
    pytest.importorskip("evermind_memory.lm.checkpoint")
    model = EvermindLM(TINY, seed=9)
    model.save(tmp_path / "lm.bin")
    loaded = EvermindLM.load(tmp_path / "lm.bin")
    assert loaded.config == TINY
    assert all(np.array_equal(loaded.params[n], model.params[n]) for n in model.params)
