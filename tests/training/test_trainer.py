"""LMTrainer: learning, accumulation, checkpointing, mixed precision, sharding, resuming."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.model import EvermindLM, LMConfig
from evermind_memory.training import LMTrainer, TrainConfig

TINY = LMConfig(vocab_size=64, d_model=16, n_layers=2, conv_kernel=3, hidden_dim=32, n_experts=4, top_k=2)


def _corpus(n: int, seed: int = 0) -> list[list[int]]:
    """Repetitive sequences of varied length: a cycle of 8 tokens started at a random phase."""
    rng = np.random.default_rng(seed)
    cycle = [3, 17, 42, 8, 25, 60, 11, 5]
    out = []
    for _ in range(n):
        start, length = int(rng.integers(8)), int(rng.integers(5, 17))
        out.append([cycle[(start + i) % 8] for i in range(length)])
    return out


def _random_batch(rng: np.random.Generator, b: int = 3, t: int = 9) -> tuple[np.ndarray, np.ndarray]:
    tokens = rng.integers(0, TINY.vocab_size, size=(b, t))
    lengths = np.array([t, t - 3, 2][:b])
    return tokens, lengths


def _same_params(a: EvermindLM, b: EvermindLM) -> bool:
    return all(np.array_equal(a.params[n], b.params[n]) for n in a.params)


def test_training_drives_the_loss_well_below_the_uniform_guess():
    model = EvermindLM(TINY, seed=1)
    trainer = LMTrainer(model, TrainConfig(lr=1e-2, batch_size=8, warmup=5, progress=False))
    history = trainer.fit(_corpus(64), eval_data=_corpus(8, seed=99), steps=80)
    uniform = np.log(TINY.vocab_size)
    assert history.eval_losses[-1][0] == 80
    assert history.eval_losses[-1][1] < 0.2 * uniform
    assert np.mean(history.losses[-5:]) < 0.2 * uniform < history.losses[0]


def test_checkpointed_backward_equals_the_plain_backward(rng):
    model = EvermindLM(TINY, seed=2)
    tokens, lengths = _random_batch(rng)
    loss_a, plain = model.loss_and_grads(tokens, lengths)
    loss_b, ckpt = model.loss_and_grads(tokens, lengths, checkpoint=True)
    assert loss_a == loss_b
    for name in plain:
        assert np.abs(plain[name] - ckpt[name]).max() <= 1e-6, name


def test_checkpointed_training_follows_the_plain_run():
    runs = []
    for checkpoint in (False, True):
        model = EvermindLM(TINY, seed=3)
        LMTrainer(model, TrainConfig(batch_size=4, checkpoint=checkpoint, progress=False)).fit(_corpus(16), steps=4)
        runs.append(model)
    for name in runs[0].params:
        assert np.abs(runs[0].params[name] - runs[1].params[name]).max() <= 1e-6


def test_accumulating_micro_batches_equals_one_batch_of_all_of_them():
    data = _corpus(8, seed=4)  # lengths differ: the token weighting matters
    # eps = 1 makes the first Adam step ~ lr * g / (|g| + 1): the parameters show the gradient itself.
    common = dict(lr=1.0, eps=1.0, weight_decay=0.0, clip=0.0, progress=False)
    one = EvermindLM(TINY, seed=5)
    many = EvermindLM(TINY, seed=5)
    h_one = LMTrainer(one, TrainConfig(batch_size=8, **common)).fit(data, steps=1)
    h_many = LMTrainer(many, TrainConfig(batch_size=2, accum_steps=4, **common)).fit(data, steps=1)
    assert h_one.tokens == h_many.tokens == sum(len(s) - 1 for s in data)
    assert h_many.losses[0] == pytest.approx(h_one.losses[0], rel=1e-5)
    assert h_many.grad_norms[0] == pytest.approx(h_one.grad_norms[0], rel=1e-4)
    for name in one.params:
        np.testing.assert_allclose(many.params[name], one.params[name], rtol=1e-5, atol=2e-6, err_msg=name)


def test_sharded_optimizer_gives_the_unsharded_result_bit_for_bit():
    full, sharded = EvermindLM(TINY, seed=6), EvermindLM(TINY, seed=6)
    t_full = LMTrainer(full, TrainConfig(batch_size=4, weight_decay=0.1, progress=False))
    t_sharded = LMTrainer(sharded, TrainConfig(batch_size=4, weight_decay=0.1, shards=3, progress=False))
    t_full.fit(_corpus(12), steps=4)
    t_sharded.fit(_corpus(12), steps=4)
    assert _same_params(full, sharded)
    parts = t_sharded.optimizer_state_bytes()
    assert len(parts) == 3 and sum(parts) == t_full.optimizer_state_bytes()[0] and max(parts) < sum(parts)


def test_same_seed_same_run_other_seed_other_order():
    models = [EvermindLM(TINY, seed=7) for _ in range(3)]
    for model, seed in zip(models, (11, 11, 12)):
        LMTrainer(model, TrainConfig(batch_size=3, seed=seed, progress=False)).fit(_corpus(20), steps=3)
    assert _same_params(models[0], models[1])
    assert not _same_params(models[0], models[2])


def test_mixed_precision_skips_an_overflowing_step_and_halves_the_scale():
    model = EvermindLM(TINY, seed=8)
    before = {n: p.copy() for n, p in model.params.items()}
    cfg = TrainConfig(batch_size=8, mixed_precision=True, init_loss_scale=2.0**30, progress=False)
    trainer = LMTrainer(model, cfg)
    history = trainer.fit(_corpus(8), steps=1)
    assert history.skipped == 1
    assert trainer.scaler.scale == 2.0**29
    assert all(np.array_equal(before[n], model.params[n]) for n in before)
    trainer.fit(_corpus(8), steps=20)  # the scale backs off until the steps go through
    assert history.skipped < 21 and not all(np.array_equal(before[n], model.params[n]) for n in before)
    assert trainer.scaler.scale < 2.0**17


def test_mixed_precision_training_learns_close_to_fp32():
    losses = []
    for mixed in (False, True):
        model = EvermindLM(TINY, seed=9)
        cfg = TrainConfig(lr=1e-2, batch_size=8, mixed_precision=mixed, progress=False)
        losses.append(LMTrainer(model, cfg).fit(_corpus(32), steps=30).losses)
    assert losses[1][-1] < 0.5 * losses[1][0]
    assert losses[1][-1] == pytest.approx(losses[0][-1], rel=0.25, abs=0.05)


def test_mixed_precision_accumulation_unscales_by_the_scale_it_scaled_with():
    data = _corpus(8, seed=4)
    # growth_interval=1 doubles the scale after every clean step: a window that mixed two scales
    # would report a gradient off by a factor of two.
    common = dict(weight_decay=0.0, mixed_precision=True, scale_growth_interval=1, init_loss_scale=256.0,
                  progress=False)
    one = LMTrainer(EvermindLM(TINY, seed=5), TrainConfig(batch_size=8, **common)).fit(data, steps=3)
    many = LMTrainer(EvermindLM(TINY, seed=5), TrainConfig(batch_size=2, accum_steps=4, **common)).fit(data, steps=3)
    assert one.skipped == many.skipped == 0
    np.testing.assert_allclose(many.grad_norms, one.grad_norms, rtol=1e-2)


def test_a_resumed_run_ends_where_the_uninterrupted_run_ends(tmp_path):
    cfg = TrainConfig(batch_size=3, accum_steps=2, total_steps=12, warmup=2, shards=2, mixed_precision=True,
                      init_loss_scale=2.0**20, scale_growth_interval=3, progress=False)
    data, held = _corpus(15, seed=10), _corpus(4, seed=11)
    straight = EvermindLM(TINY, seed=12)
    h_straight = LMTrainer(straight, cfg).fit(data, eval_data=held, steps=12)

    first = EvermindLM(TINY, seed=12)
    trainer = LMTrainer(first, cfg)
    trainer.fit(data, steps=5)  # stops mid-epoch (3 steps per epoch)
    trainer.save_training_checkpoint(tmp_path / "run.evtrain")
    resumed = LMTrainer.resume(tmp_path / "run.evtrain", progress=False)
    assert resumed.step == 5
    h_resumed = resumed.fit(data, eval_data=held, steps=7)
    assert _same_params(straight, resumed.model)
    assert h_resumed.losses == h_straight.losses
    assert h_resumed.skipped == h_straight.skipped and h_straight.skipped >= 1  # the scaler state came along
    assert h_resumed.eval_losses[-1] == h_straight.eval_losses[-1]


def test_loading_a_checkpoint_into_other_settings_or_with_other_data_is_refused(tmp_path):
    trainer = LMTrainer(EvermindLM(TINY, seed=13), TrainConfig(batch_size=4, progress=False))
    trainer.fit(_corpus(12), steps=1)
    path = tmp_path / "t.evtrain"
    trainer.save_training_checkpoint(path)
    other = LMTrainer(EvermindLM(TINY, seed=13), TrainConfig(batch_size=5, progress=False))
    with pytest.raises(CheckpointError, match="batch_size"):
        other.load_training_checkpoint(path)
    same = LMTrainer(EvermindLM(TINY, seed=0), TrainConfig(batch_size=4, progress=False))
    same.load_training_checkpoint(path)
    assert _same_params(same.model, trainer.model)
    with pytest.raises(InvalidInput, match="same data"):
        same.fit(_corpus(12, seed=77), steps=1)


def test_a_corrupted_training_checkpoint_is_refused(tmp_path):
    trainer = LMTrainer(EvermindLM(TINY, seed=14), TrainConfig(batch_size=4, progress=False))
    path = tmp_path / "t.evtrain"
    trainer.save_training_checkpoint(path)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError):
        LMTrainer.resume(path)


def test_eval_loss_is_recorded_every_eval_every_steps():
    trainer = LMTrainer(EvermindLM(TINY, seed=15), TrainConfig(batch_size=4, eval_every=2, progress=False))
    history = trainer.fit(_corpus(12), eval_data=_corpus(3, seed=5), steps=5)
    assert [s for s, _ in history.eval_losses] == [2, 4, 5]
    assert history.eval_losses[-1][1] == pytest.approx(trainer.evaluate(_corpus(3, seed=5)))


def test_long_sequences_are_cut_into_windows_that_keep_every_target():
    trainer = LMTrainer(EvermindLM(TINY, seed=16), TrainConfig(batch_size=4, max_len=8, progress=False))
    history = trainer.fit([list(range(30))], epochs=1)
    assert history.tokens == 29


def test_progress_bar_only_on_a_terminal(capsys):
    LMTrainer(EvermindLM(TINY, seed=17), TrainConfig(batch_size=4)).fit(_corpus(8), steps=2)
    assert capsys.readouterr().err == ""  # stderr is not a TTY under pytest: quiet
    LMTrainer(EvermindLM(TINY, seed=17), TrainConfig(batch_size=4, progress=True)).fit(_corpus(8), steps=2)
    assert "train" in capsys.readouterr().err


def test_bad_input_is_refused_with_a_clear_message():
    trainer = LMTrainer(EvermindLM(TINY, seed=18), TrainConfig(progress=False))
    with pytest.raises(InvalidInput, match=r"expected token ids in \[0, 64\)"):
        trainer.fit([[1, 2, 64]])
    with pytest.raises(InvalidInput, match="at least one sequence"):
        trainer.fit([[1], []])
    with pytest.raises(InvalidInput, match="batch_size an int >= 1"):
        TrainConfig(batch_size=0)
    with pytest.raises(InvalidInput, match="TrainConfig"):
        LMTrainer(EvermindLM(TINY), {"lr": 1.0})
    assert TrainConfig.from_dict(dataclasses.replace(TrainConfig(), lr=0.5).to_dict()).lr == 0.5
