"""LoRA / QLoRA: exact adapter gradients, a frozen base, quantisation, adapter files, merge."""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.adapter import load_adapter, merge_adapter
from evermind_memory.lm.model import EvermindLM, LMConfig
from evermind_memory.training import LoRAAdapter, LoRAModel, TrainConfig
from evermind_memory.training.lora import dequantize_int8_rows, lora_grads, quantize_int8_rows

TINY = LMConfig(vocab_size=64, d_model=16, n_layers=2, conv_kernel=3, hidden_dim=32, n_experts=4, top_k=2)
TARGETS = ("emb", "layers.1.expert2.w1", "layers.0.shared.w2")


def _corpus(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    cycle = [9, 33, 2, 50, 14, 7]
    return [[cycle[(int(s) + i) % 6] for i in range(int(n_))] for s, n_ in
            zip(rng.integers(6, size=n), rng.integers(6, 15, size=n))]


def _batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return rng.integers(0, TINY.vocab_size, size=(3, 8)), np.array([8, 5, 3])


def test_adapter_starts_at_zero_delta_and_its_gradients_match_finite_differences(rng):
    ad = LoRAAdapter(7, 5, rank=3, alpha=6.0, seed=1, dtype=np.float64)
    assert not ad.delta().any() and ad.A.std() > 0
    ad.B[...] = rng.standard_normal(ad.B.shape)  # away from B = 0 so gA is not trivially zero
    W0, target = rng.standard_normal((7, 5)), rng.standard_normal((7, 5))

    def loss(A: np.ndarray, B: np.ndarray) -> float:
        W = W0 + (ad.alpha / ad.rank) * B @ A
        return float(0.5 * np.sum(np.sin(W) * target))

    G = 0.5 * np.cos(W0 + ad.delta()) * target  # dL/dW_eff
    gA, gB = ad.project_grad(G)
    dA, dB = rng.standard_normal(ad.A.shape), rng.standard_normal(ad.B.shape)
    h = 1e-6
    numeric = (loss(ad.A + h * dA, ad.B + h * dB) - loss(ad.A - h * dA, ad.B - h * dB)) / (2 * h)
    analytic = float(np.sum(gA * dA) + np.sum(gB * dB))
    assert numeric == pytest.approx(analytic, rel=1e-7, abs=1e-9), (numeric, analytic)


def test_adapter_gradients_through_the_real_model_match_finite_differences(rng):
    base = EvermindLM(TINY, seed=3)
    model64 = EvermindLM(TINY, seed=3)
    model64.params.update({n: p.astype(np.float64) for n, p in base.params.items()})  # float64 maths
    tokens, lengths = _batch(rng)
    for target in TARGETS:
        W0 = model64.params[target].copy()
        rows, cols = W0.shape
        ad = LoRAAdapter(rows, cols, rank=4, alpha=8.0, seed=2, dtype=np.float64)
        ad.B[...] = 0.1 * rng.standard_normal(ad.B.shape)

        def loss(A: np.ndarray, B: np.ndarray) -> float:
            model64.params[target] = W0 + ad.scale * B @ A
            return model64.loss_and_grads(tokens, lengths)[0]

        loss(ad.A, ad.B)
        _, grads = model64.loss_and_grads(tokens, lengths)
        gA, gB = lora_grads(grads[target], ad.A, ad.B, ad.scale)
        dA, dB = rng.standard_normal(ad.A.shape), rng.standard_normal(ad.B.shape)
        h = 1e-5
        numeric = (loss(ad.A + h * dA, ad.B + h * dB) - loss(ad.A - h * dA, ad.B - h * dB)) / (2 * h)
        analytic = float(np.sum(gA * dA) + np.sum(gB * dB))
        model64.params[target] = W0
        assert numeric == pytest.approx(analytic, rel=1e-5, abs=1e-8), (target, numeric, analytic)


def test_lora_model_gradients_are_the_projected_base_gradients(rng):
    base = EvermindLM(TINY, seed=4)
    lora = LoRAModel(base, targets=TARGETS, rank=4, alpha=8.0, seed=5)
    for name, p in lora.params.items():
        if name.endswith(".B"):
            p[...] = 0.05 * rng.standard_normal(p.shape)
    tokens, lengths = _batch(rng)
    loss, grads = lora.loss_and_grads(tokens, lengths)
    merged = lora.merge()
    loss_m, full = merged.loss_and_grads(tokens, lengths)
    assert loss == pytest.approx(loss_m, rel=1e-6)
    for t in TARGETS:
        gA, gB = lora_grads(full[t], lora.params[f"{t}.A"], lora.params[f"{t}.B"], lora.scale)
        np.testing.assert_allclose(grads[f"{t}.A"], gA, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(grads[f"{t}.B"], gB, rtol=1e-5, atol=1e-7)
    assert set(grads) == set(lora.params)


@pytest.mark.parametrize("targets", [("layers.1.expert2.w1",), ("layers.1.router", "layers.1.shared.w2"),
                                     ("layers.0.expert1.w2",)])
@pytest.mark.parametrize("checkpoint", [False, True])
def test_lora_gradients_on_frozen_lower_layers_stay_exact(rng, targets, checkpoint):
    # LoRAModel asks the base only for its targets' gradients (layers below the lowest target are not
    # back-propagated at all); the result must still be the projection of the full gradient.
    base = EvermindLM(TINY, seed=8)
    lora = LoRAModel(base, targets=targets, rank=4, alpha=8.0, seed=1)
    for name, p in lora.params.items():
        if name.endswith(".B"):
            p[...] = 0.05 * rng.standard_normal(p.shape)
    tokens, lengths = _batch(rng)
    loss, grads = lora.loss_and_grads(tokens, lengths, checkpoint=checkpoint)
    loss_m, full = lora.merge().loss_and_grads(tokens, lengths)
    assert loss == pytest.approx(loss_m, rel=1e-6)
    assert set(grads) == set(lora.params)
    for t in targets:
        gA, gB = lora_grads(full[t], lora.params[f"{t}.A"], lora.params[f"{t}.B"], lora.scale)
        np.testing.assert_allclose(grads[f"{t}.A"], gA, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(grads[f"{t}.B"], gB, rtol=1e-5, atol=1e-7)


def test_the_adapted_model_starts_equal_to_the_base(rng):
    base = EvermindLM(TINY, seed=6)
    lora = LoRAModel(base, targets=TARGETS, rank=4)
    tokens, lengths = _batch(rng)
    assert np.array_equal(lora.forward(tokens, lengths), base.forward(tokens, lengths))


def test_training_moves_only_the_adapter_and_the_base_stays_bit_identical():
    base = EvermindLM(TINY, seed=7)
    snapshot = {n: p.copy() for n, p in base.params.items()}
    for quant in ("none", "int8"):
        lora = LoRAModel(base, targets=TARGETS, rank=4, alpha=8.0, base_quant=quant)
        frozen = {n: p.copy() for n, p in lora.effective_params().items() if n not in TARGETS}
        history = lora.fit(_corpus(24), config=TrainConfig(lr=2e-2, batch_size=8, progress=False), steps=25)
        assert history.losses[-1] < 0.7 * history.losses[0]
        assert all(np.array_equal(snapshot[n], base.params[n]) for n in snapshot), quant
        after = lora.effective_params()
        assert all(np.array_equal(frozen[n], after[n]) for n in frozen)  # frozen inside the LoRAModel too
        assert any(lora.params[f"{t}.B"].any() for t in TARGETS)


def test_int8_per_row_quantisation_is_within_half_a_step_per_row(rng):
    W = rng.standard_normal((20, 12)).astype(np.float32) * np.logspace(-3, 1, 20, dtype=np.float32)[:, None]
    q, scales = quantize_int8_rows(W)
    assert q.dtype == np.int8 and scales.shape == (20,)
    err = np.abs(dequantize_int8_rows(q, scales) - W)
    assert np.all(err <= scales[:, None] * 0.5 + 1e-7)
    single = np.abs(W).max() / 127  # one scale for the whole matrix, as the reference does
    small_rows = np.abs(np.rint(W[:5] / single) * single - W[:5]).max()
    assert err[:5].max() < small_rows / 10


def test_qlora_holds_the_base_quantised_and_stays_close_to_it(rng):
    base = EvermindLM(TINY, seed=8)
    tokens, lengths = _batch(rng)
    ref = base.forward(tokens, lengths)
    prints = {}
    for quant in ("none", "fp16", "int8"):
        lora = LoRAModel(base, rank=4, base_quant=quant)
        prints[quant] = lora.footprint()
        out = lora.forward(tokens, lengths)
        tol = {"none": 0.0, "fp16": 1e-2, "int8": 0.1}[quant]
        assert np.abs(out - ref).max() <= tol * max(1.0, np.abs(ref).max()), quant
    fp32 = prints["none"].base_bytes
    assert fp32 == 4 * base.num_parameters()
    assert prints["fp16"].base_bytes < 0.55 * fp32
    assert prints["int8"].base_bytes < 0.35 * fp32
    fp = prints["int8"]
    assert fp.trainable_params == 4 * (64 + 16) and fp.adapter_bytes == 4 * fp.trainable_params
    assert fp.base_params == base.num_parameters()


def test_adapter_file_round_trip_and_merge(tmp_path, rng):
    base = EvermindLM(TINY, seed=9)
    lora = LoRAModel(base, targets=TARGETS, rank=4, alpha=8.0)
    lora.fit(_corpus(16), config=TrainConfig(lr=2e-2, batch_size=8, progress=False), steps=5)
    path = tmp_path / "a.evlora"
    lora.save_adapter(path)
    again = LoRAModel.from_adapter(base, path)
    assert again.targets == TARGETS and again.rank == 4 and again.alpha == 8.0
    tokens, lengths = _batch(rng)
    assert np.array_equal(again.forward(tokens, lengths), lora.forward(tokens, lengths))
    merged = lora.merge()
    via_lm = merge_adapter(base, load_adapter(path))
    for n in merged.params:
        np.testing.assert_allclose(merged.params[n], via_lm.params[n], rtol=1e-6, atol=1e-6)
    merged.params["emb"][...] = 0.0  # standalone: touching the merge changes neither the adapter nor the base
    assert lora.forward(tokens, lengths).any() and base.params["emb"].any()
    assert lora.generate([9, 33], 5, temperature=0.0) == via_lm.generate([9, 33], 5, temperature=0.0)
    np.testing.assert_allclose(lora.embed([9, 33, 2]), via_lm.embed([9, 33, 2]), atol=1e-5)


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_corrupted_adapter_files_are_refused(tmp_path, damage):
    base = EvermindLM(TINY, seed=10)
    lora = LoRAModel(base, rank=4)
    path = tmp_path / "a.evlora"
    lora.save_adapter(path)
    raw = path.read_bytes()
    if damage == "truncate":
        raw = raw[: len(raw) - 37]
    elif damage == "flip":
        raw = bytearray(raw)
        raw[len(raw) - 60] ^= 0x01
        raw = bytes(raw)
    else:
        raw = b""
    path.write_bytes(raw)
    with pytest.raises(CheckpointError):
        lora.load_adapter(path)


def test_an_adapter_for_another_model_is_refused(tmp_path):
    LoRAModel(EvermindLM(TINY, seed=11), rank=4).save_adapter(tmp_path / "a.evlora")
    other = EvermindLM(LMConfig(vocab_size=80, d_model=16, n_layers=2, hidden_dim=32), seed=0)
    with pytest.raises(CheckpointError, match="another model"):
        LoRAModel(other, rank=4).load_adapter(tmp_path / "a.evlora")


def test_bad_targets_and_settings_are_refused():
    base = EvermindLM(TINY, seed=12)
    with pytest.raises(InvalidInput, match="not a 2-D weight"):
        LoRAModel(base, targets=("layers.0.conv_norm",))
    with pytest.raises(InvalidInput, match="not a 2-D weight"):
        LoRAModel(base, targets=("nope",))
    with pytest.raises(InvalidInput, match="base_quant"):
        LoRAModel(base, base_quant="int4")
    with pytest.raises(InvalidInput, match="rank <= min"):
        LoRAModel(base, targets=("layers.0.router",), rank=8)  # router is (16, 4)


def test_a_lora_run_resumes_from_a_training_checkpoint(tmp_path):
    from evermind_memory.training import LMTrainer

    cfg = TrainConfig(lr=1e-2, batch_size=4, total_steps=6, weight_decay=0.0, progress=False)
    base = EvermindLM(TINY, seed=13)
    straight = LoRAModel(base, targets=TARGETS, rank=4)
    straight.fit(_corpus(12), config=cfg, steps=6)
    first = LoRAModel(base, targets=TARGETS, rank=4)
    first.fit(_corpus(12), config=cfg, steps=2)
    first.trainer.save_training_checkpoint(tmp_path / "lora.evtrain")
    second = LoRAModel(base, targets=TARGETS, rank=4, seed=99)  # other init: the checkpoint overrides it
    LMTrainer.resume(tmp_path / "lora.evtrain", model=second, progress=False).fit(_corpus(12), steps=4)
    assert all(np.array_equal(straight.params[n], second.params[n]) for n in straight.params)
