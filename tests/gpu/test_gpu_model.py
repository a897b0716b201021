"""EvermindLM resident on the GPU (gpu/model.py) against the numpy model, and its kernels against their twins.

Tiny configs (software Vulkan runs about 0.2 GFLOP/s) with padding, odd sizes off the matmul tiles and the
top-k MoE routing. Tolerances: loss within 1e-5 relative; each gradient tensor within 1e-4 of its largest
element (+1e-7); logits and embeddings within 1e-5 absolute; after AdamW steps, weights within 5e-5
(lr 1e-2, so a half percent of one step). Every test skips only when wgpu finds no adapter.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu import ops
from evermind_memory.gpu.model import GpuLM
from evermind_memory.gpu.trainer import GpuTrainer
from evermind_memory.lm.attention import attention_forward
from evermind_memory.lm.model import EvermindLM, LMConfig
from evermind_memory.training import LMTrainer, TrainConfig
from evermind_memory.training.optim import LRSchedule

GPU_SETTINGS = settings(max_examples=8, deadline=None, derandomize=True,
                        suppress_health_check=[HealthCheck.function_scoped_fixture])
TINY = LMConfig(vocab_size=50, d_model=16, n_layers=2, conv_kernel=3, hidden_dim=24, n_experts=4, top_k=2)
ODD = LMConfig(vocab_size=37, d_model=10, n_layers=2, conv_kernel=2, hidden_dim=7, n_experts=3, top_k=1,
               attn_heads=2)


def f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def perturbed(config: LMConfig, seed: int) -> EvermindLM:
    """A model whose biases, gains and conv taps are not at their (symmetric) initial values."""
    model = EvermindLM(config, seed=seed)
    rng = np.random.default_rng(seed)
    for p in model.params.values():
        p += f32(rng, *p.shape, scale=0.05)
    return model


def assert_grads_close(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    assert list(got) == list(ref)
    for name, g in ref.items():
        tol = 1e-4 * float(np.abs(g).max()) + 1e-7
        assert got[name].shape == g.shape and got[name].dtype == np.float32
        assert float(np.abs(got[name] - g).max()) <= tol, name


# ---- the model's new kernels against their twins ------------------------------------------------------------

def test_axpy_matches_twin(gpu):
    rng = np.random.default_rng(1)
    y, x = f32(rng, 7, 33), f32(rng, 7, 33)
    np.testing.assert_allclose(ops.axpy(y, x, -0.5), ops.axpy_numpy(y, x, -0.5), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("clip", [0.0, 1.0, 1e6])
def test_clip_grads_matches_twin(gpu, clip):
    # Tolerance: norm 1e-6 relative (float32 partial sums against float64); scaled grads 1e-6 relative.
    rng = np.random.default_rng(2)
    grads = [f32(rng, 3, 5), f32(rng, 5000), f32(rng, 1), np.zeros(0, np.float32)]
    got, norm, ok = ops.clip_grads(grads, clip, unscale=0.5)
    ref, ref_norm, ref_ok = ops.clip_grads_numpy(grads, clip, unscale=0.5)
    assert ok and ref_ok and norm == pytest.approx(ref_norm, rel=1e-6)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_clip_grads_flags_a_non_finite_norm(gpu):
    grads = [np.array([1.0, np.inf], np.float32), np.ones(3, np.float32)]
    _, norm, ok = ops.clip_grads(grads, 1.0)
    assert not ok and not math.isfinite(norm)
    assert ops.clip_grads_numpy(grads, 1.0)[2] is False


@pytest.mark.parametrize("n,e,k", [(1, 1, 1), (9, 4, 2), (70, 5, 3), (3, 8, 8)])
def test_moe_gates_match_twins(gpu, n, e, k):
    rng = np.random.default_rng(n + e + k)
    idx, gates = ops.moe_route_numpy(f32(rng, n, e), k)
    gates = gates.astype(np.float32)
    np.testing.assert_array_equal(ops.moe_gates_dense(idx, gates, e), ops.moe_gates_dense_numpy(idx, gates, e))
    dg = f32(rng, n, e + 1)
    np.testing.assert_allclose(ops.moe_gates_backward(dg, idx, gates), ops.moe_gates_backward_numpy(dg, idx, gates),
                               rtol=1e-6, atol=1e-7)


def test_moe_gates_reject_a_repeated_expert(gpu):
    with pytest.raises(InvalidInput, match="distinct"):
        ops.moe_gates_dense(np.array([[1, 1]]), np.ones((1, 2), np.float32), 3)


@GPU_SETTINGS
@given(n=st.integers(1, 40), g=st.integers(1, 5), h=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_moe_hidden_matches_twin(gpu, n, g, h, seed):
    # Tolerance: forward exact (max and one multiply); dgmat sums H products: 1e-5 relative + 1e-6.
    rng = np.random.default_rng(seed)
    pre, gm, dhs = f32(rng, n, g * h), f32(rng, n, g), f32(rng, n, g * h)
    hid, hs = ops.moe_hidden(pre, gm, h)
    ref_h, ref_hs = ops.moe_hidden_numpy(pre, gm, h)
    np.testing.assert_array_equal(hid, ref_h)
    np.testing.assert_array_equal(hs, ref_hs)
    dpre, dgm = ops.moe_hidden_backward(dhs, hid, gm)
    ref_dpre, ref_dgm = ops.moe_hidden_backward_numpy(dhs, ref_h, gm)
    np.testing.assert_array_equal(dpre, ref_dpre)
    np.testing.assert_allclose(dgm, ref_dgm, rtol=1e-5, atol=1e-6)


def _numeric_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(x)  # (x.shape)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        g[i] = (up - f()) / (2 * eps)
        x[i] = old
    return g


def test_backward_twins_match_float64_differences():
    # The twins the kernels are checked against are themselves exact gradients (float64, 1e-6 relative).
    rng = np.random.default_rng(18)
    pre, gm, dy = rng.standard_normal((3, 2 * 4)), rng.standard_normal((3, 2)), rng.standard_normal((3, 2 * 4))
    dpre, dgm = ops.moe_hidden_backward_numpy(dy, ops.moe_hidden_numpy(pre, gm, 4)[0], gm)
    loss = lambda: float(np.sum(ops.moe_hidden_numpy(pre, gm, 4)[1] * dy))  # noqa: E731
    np.testing.assert_allclose(dpre, _numeric_grad(loss, pre), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dgm, _numeric_grad(loss, gm), rtol=1e-6, atol=1e-8)
    logits, dg = rng.standard_normal((4, 5)), rng.standard_normal((4, 6))
    idx, gates = ops.moe_route_numpy(logits, 2)
    def loss() -> float:  # the selection stays fixed under the small differences
        return float(np.sum(ops.moe_gates_dense_numpy(idx, ops.moe_route_numpy(logits, 2)[1], 5) * dg))

    np.testing.assert_allclose(ops.moe_gates_backward_numpy(dg, idx, gates), _numeric_grad(loss, logits),
                               rtol=1e-6, atol=1e-8)


def test_pool_attention_matches_twin_and_lm_attention(gpu):
    # Tolerance 1e-5: softmax over at most 13 keys of unit-scale scores.
    rng = np.random.default_rng(3)
    b, t, c, heads = 3, 13, 12, 3
    x, wqkv = f32(rng, b, t, c), f32(rng, c, 3 * c, scale=0.5)
    lengths = np.array([13, 6, 1])
    qkv = np.ascontiguousarray((x.reshape(b * t, c) @ wqkv).reshape(b, t, 3 * c))
    got = ops.pool_attention(qkv, lengths, heads)
    ref = ops.pool_attention_numpy(qkv, lengths, heads)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    lm_y, _ = attention_forward(x, wqkv, np.eye(c, dtype=np.float32), lengths, heads)  # (B, T, C)
    real = np.arange(t)[None, :] < lengths[:, None]  # (B, T)
    np.testing.assert_allclose(ref[real], lm_y[real], rtol=1e-5, atol=1e-5)
    assert not got[~real].any()
    with pytest.raises(InvalidInput):
        ops.pool_attention(qkv, np.array([14, 1, 1]), heads)


def test_mean_pool_matches_twin_and_keeps_a_zero_row_zero(gpu):
    rng = np.random.default_rng(4)
    x = f32(rng, 3, 9, 70)
    x[2] = 0.0
    lengths = np.array([9, 2, 4])
    got = ops.mean_pool(x, lengths)
    np.testing.assert_allclose(got, ops.mean_pool_numpy(x, lengths), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got[:2], axis=1), 1.0, rtol=1e-5)
    assert not got[2].any()


# ---- the resident model against lm/model.py -------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(gpu):
    model = perturbed(TINY, 5)
    return model, GpuLM.from_model(model, device=gpu)


def test_weights_round_trip_exactly(tiny):
    model, g = tiny
    back = g.to_params()
    assert list(back) == list(model.params)
    for name, p in model.params.items():
        np.testing.assert_array_equal(back[name], p)
    assert g.num_parameters() == model.num_parameters()


def test_loss_and_grads_match_numpy_with_padding(tiny):
    model, g = tiny
    rng = np.random.default_rng(6)
    tokens = rng.integers(0, TINY.vocab_size, (4, 9))
    tokens[1, 5:] = 10**6  # padding may hold anything
    lengths = np.array([9, 5, 2, 1])
    loss, grads = g.loss_and_grads(tokens, lengths)
    ref_loss, ref_grads = model.loss_and_grads(np.where(tokens < 50, tokens, 0), lengths)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert_grads_close(grads, ref_grads)
    for name, ref in ref_grads.items():  # an expert no position chose gets exactly zero, as in numpy
        assert ref.any() or not grads[name].any(), name


def test_loss_and_grads_match_numpy_on_odd_sizes_and_top1(gpu):
    # C=10, H=7, V=37, E=3: off every vec4 path; top-1 routing; no lengths (no padding).
    model = perturbed(ODD, 7)
    g = GpuLM.from_model(model, device=gpu)
    tokens = np.random.default_rng(8).integers(0, ODD.vocab_size, (3, 11))
    loss, grads = g.loss_and_grads(tokens)
    ref_loss, ref_grads = model.loss_and_grads(tokens)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert_grads_close(grads, ref_grads)
    g.close()


def test_head_in_several_row_chunks_matches_numpy(gpu):
    # A lowered binding limit makes the tied head run in 64-row chunks (N = 90 rows here).
    cfg = LMConfig(vocab_size=300, d_model=16, n_layers=1, conv_kernel=2, hidden_dim=8, n_experts=2, top_k=1)
    model = perturbed(cfg, 9)
    tokens = np.random.default_rng(10).integers(0, cfg.vocab_size, (3, 30))
    lengths = np.array([30, 17, 29])
    with gpu.binding_limit(64 * cfg.vocab_size * 4):
        g = GpuLM.from_model(model, device=gpu)
        assert len(g._head_chunks(90)) == 2
        loss, grads = g.loss_and_grads(tokens, lengths)
        g.close()
    ref_loss, ref_grads = model.loss_and_grads(tokens, lengths)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert_grads_close(grads, ref_grads)


def test_forward_logits_match_numpy(tiny):
    model, g = tiny
    tokens = np.random.default_rng(11).integers(0, TINY.vocab_size, (2, 7))
    lengths = np.array([7, 3])
    got = g.forward(tokens, lengths)
    np.testing.assert_allclose(got, model.forward(tokens, lengths), rtol=1e-5, atol=1e-5)
    assert not got[1, 3:].any()


@pytest.mark.parametrize("config", [TINY, ODD], ids=["mean-pool", "attention-pool"])
def test_embed_batch_matches_numpy(gpu, config):
    model = perturbed(config, 12)
    g = GpuLM.from_model(model, device=gpu)
    rng = np.random.default_rng(13)
    docs = [rng.integers(0, config.vocab_size, n).tolist() for n in (3, 1, 9, 17, 4, 4, 70, 2)]
    got = g.embed_batch(docs)
    np.testing.assert_allclose(got, model.embed_batch(docs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.embed(docs[2]), model.embed(docs[2]), rtol=1e-5, atol=1e-5)
    assert g.embed_batch([]).shape == (0, config.d_model)
    with pytest.raises(InvalidInput, match="item 1"):
        g.embed_batch([[1, 2], []])
    with pytest.raises(InvalidInput, match=r"\[0, "):
        g.embed_batch([[1, config.vocab_size]])
    g.close()


def test_attention_pool_past_the_kernel_limit_falls_back_to_numpy(gpu, monkeypatch):
    from evermind_memory.gpu import model as gpu_model

    monkeypatch.setattr(gpu_model, "_POOL_MAX_T", 8)  # so a 20-token document takes the fallback path
    model = perturbed(ODD, 17)
    docs = [list(range(20)), [1, 2, 3]]
    got = GpuLM.from_model(model, device=gpu).embed_batch(docs)
    np.testing.assert_allclose(got, model.embed_batch(docs), rtol=1e-5, atol=1e-5)


def test_bad_batches_raise_invalid_input(tiny):
    _, g = tiny
    with pytest.raises(InvalidInput, match="lengths"):
        g.loss_and_grads(np.zeros((2, 4), np.int64), np.array([5, 1]))
    with pytest.raises(InvalidInput, match="token ids"):
        g.loss_and_grads(np.full((1, 3), 50))
    with pytest.raises(InvalidInput, match=">= 2 tokens"):
        g.loss_and_grads(np.zeros((2, 3), np.int64), np.array([1, 1]))


# ---- a full training step against the numpy trainer ------------------------------------------------------

def test_training_steps_match_lm_trainer(gpu):
    # Two optimizer steps of two accumulated micro-batches each, clipping and the trust region active.
    tc = TrainConfig(lr=1e-2, weight_decay=0.1, clip=0.5, eps=1e-6, max_delta=6e-3, batch_size=2, accum_steps=2,
                     max_len=8, total_steps=2, progress=False)
    rng = np.random.default_rng(14)
    data = [rng.integers(0, TINY.vocab_size, n).tolist() for n in (8, 5, 3, 7)]
    start = perturbed(TINY, 15)

    cpu_model = EvermindLM.from_params(TINY, start.params)
    cpu = LMTrainer(cpu_model, tc)
    cpu.fit(data, steps=2)

    gpu_model = EvermindLM.from_params(TINY, start.params)
    host = LMTrainer(gpu_model, tc)  # its optimizers and history receive the device state
    dev_trainer = GpuTrainer(gpu_model, tc, host.optimizers, device=gpu)
    tokens = np.zeros((4, 8), np.int64)  # (4, 8) the same sequences, split differently into micro-batches
    for i, seq in enumerate(data):
        tokens[i, :len(seq)] = seq
    lengths = np.array([len(s) for s in data])
    schedule = LRSchedule(tc.lr, tc.warmup, 2, tc.min_lr)
    for step in range(2):
        window = [(tokens[i:i + 2], lengths[i:i + 2], int(lengths[i:i + 2].sum()) - 2) for i in (0, 2)]
        dev_trainer.trainer_step(host, window, schedule(step))
    dev_trainer.pull()

    assert host.history.losses == pytest.approx(cpu.history.losses, rel=1e-5)
    assert host.history.grad_norms == pytest.approx(cpu.history.grad_norms, rel=1e-5)
    assert host.history.tokens == cpu.history.tokens and host.history.skipped == 0
    assert min(cpu.history.grad_norms) > tc.clip  # clipping was active
    for name, p in cpu_model.params.items():
        np.testing.assert_allclose(gpu_model.params[name], p, rtol=0, atol=5e-5, err_msg=name)
    (opt,), (ref_opt,) = host.optimizers, cpu.optimizers
    assert opt.t == ref_opt.t == 2
    for name in ref_opt.m:
        np.testing.assert_allclose(opt.m[name], ref_opt.m[name], rtol=1e-4, atol=1e-8, err_msg=name)
        np.testing.assert_allclose(opt.v[name], ref_opt.v[name], rtol=1e-3, atol=1e-10, err_msg=name)
    dev_trainer.close()


def test_a_non_finite_gradient_drops_the_whole_step(gpu):
    model = EvermindLM(TINY, seed=16)
    model.params["emb"][3] = 1e30  # its logits overflow: the loss and every gradient become non-finite
    before = {n: p.copy() for n, p in model.params.items()}
    tc = TrainConfig(lr=1e-2, progress=False)
    trainer = GpuTrainer(model, tc, device=gpu)
    res = trainer.step([(np.array([[3, 3, 4, 5]]), None)], tc.lr)
    assert not res.applied and not math.isfinite(res.grad_norm) and trainer.t == 0
    trainer.pull()
    for name, p in before.items():
        np.testing.assert_array_equal(model.params[name], p)
    model.params["emb"][3] = 0.01
    trainer.push()  # the host weights go back up; the next step applies
    res = trainer.step([(np.array([[1, 2, 4, 5]]), None)], tc.lr)
    assert res.applied and math.isfinite(res.loss) and trainer.t == 1
    trainer.pull()
    assert np.abs(model.params["emb"][1] - before["emb"][1]).max() > 0
    trainer.close()


def test_gpu_trainer_refuses_what_it_does_not_run(gpu):
    with pytest.raises(InvalidInput, match="float32"):
        GpuTrainer(EvermindLM(TINY), TrainConfig(mixed_precision=True), device=gpu)
    with pytest.raises(InvalidInput, match="EvermindLM"):
        GpuTrainer(object(), TrainConfig(), device=gpu)


def test_lm_trainer_with_the_gpu_engine_fits_like_the_cpu_trainer(gpu, tmp_path):
    # Through the public switch: LMTrainer(engine=GpuTrainer).fit gives the CPU run's weights, history and
    # checkpoint.
    tc = TrainConfig(lr=1e-2, batch_size=2, accum_steps=2, max_len=8, total_steps=4, seed=3, progress=False)
    rng = np.random.default_rng(21)
    data = [rng.integers(0, TINY.vocab_size, n).tolist() for n in (8, 5, 3, 7, 6, 4)]
    start = perturbed(TINY, 22)
    cpu_model = EvermindLM.from_params(TINY, start.params)
    cpu = LMTrainer(cpu_model, tc)
    cpu.fit(data, steps=2)
    gpu_model = EvermindLM.from_params(TINY, start.params)
    on_gpu = LMTrainer(gpu_model, tc, engine=GpuTrainer)
    on_gpu.fit(data, steps=2)
    assert on_gpu.history.losses == pytest.approx(cpu.history.losses, rel=1e-5)
    for name, p in cpu_model.params.items():
        np.testing.assert_allclose(gpu_model.params[name], p, rtol=0, atol=5e-5, err_msg=name)
    on_gpu.save_training_checkpoint(tmp_path / "run.train")
    resumed = LMTrainer(EvermindLM.from_params(TINY, start.params), tc, engine=GpuTrainer)
    resumed.load_training_checkpoint(tmp_path / "run.train")
    resumed.fit(data, steps=2)
    on_gpu.fit(data, steps=2)
    assert resumed.history.losses == pytest.approx(on_gpu.history.losses, rel=1e-6)


def test_lm_trainer_refuses_an_engine_that_is_not_a_constructor():
    with pytest.raises(InvalidInput, match="engine=None or a step engine's constructor"):
        LMTrainer(EvermindLM(TINY, seed=0), TrainConfig(progress=False), engine="gpu")
