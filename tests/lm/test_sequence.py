"""The numpy sequence backbone (lm.sequence): scan maths, causality, configs and the checkpoint format."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.backbone import load_backbone
from evermind_memory.lm.checkpoint import MODEL_KIND, MODEL_MAGIC, write_tensor_file
from evermind_memory.lm.model import EvermindLM, LMConfig, load_model
from evermind_memory.lm.sequence import (
    SequenceBackbone,
    load_sequence_model,
    save_sequence_model,
    SequenceModelConfig,
    linear_scan_numpy,
    sequence_param_shapes,
)

BLOCKS = ["mamba1", "mamba2", "mamba3", "attention", ("mamba1", "attention", "mamba3", "mamba2")]


def tiny_config(block="mamba2", **kw) -> SequenceModelConfig:
    n_layers = len(block) if isinstance(block, tuple) else 2
    return SequenceModelConfig(vocab_size=50, d_model=16, n_layers=n_layers, block=block, d_state=4,
                               n_heads=2, ffn_mult=2, **kw)


def perturbed(cfg: SequenceModelConfig, seed: int = 0) -> SequenceBackbone:
    """A backbone whose weights are far from the near-identity init, so every block changes its input."""
    rng = np.random.default_rng(seed)
    base = SequenceBackbone.init(cfg, rng)
    return SequenceBackbone(cfg, {n: a + (rng.standard_normal(a.shape) * 0.3).astype(np.float32)
                                  for n, a in base.params.items()})


def test_linear_scan_matches_the_step_by_step_recurrence(rng):
    log_a = -rng.uniform(0, 2, (2, 37, 3))  # (B, L, D) more than two chunks, not a multiple of 16
    x = rng.standard_normal((2, 37, 3))
    h0 = rng.standard_normal((2, 3))
    want, h = np.empty_like(x), h0.copy()
    for t in range(37):  # the definition, in a test only
        h = np.exp(log_a[:, t]) * h + x[:, t]
        want[:, t] = h
    np.testing.assert_allclose(linear_scan_numpy(log_a, x, h0), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_backbone_is_causal_so_right_padding_leaves_real_positions_alone(block, rng):
    model = perturbed(tiny_config(block))
    ids = rng.integers(0, 50, (3, 21))
    full = model.forward(ids)  # (3, 21, 16)
    assert full.dtype == np.float32 and full.shape == (3, 21, 16)
    np.testing.assert_allclose(model.forward(ids[:, :9]), full[:, :9], atol=1e-5)
    changed = ids.copy()
    changed[:, 9:] = (changed[:, 9:] + 1) % 50  # every later token differs
    np.testing.assert_allclose(model.forward(changed)[:, :9], full[:, :9], atol=1e-5)
    assert not np.allclose(model.forward(changed)[:, 9:], full[:, 9:], atol=1e-3)  # and they do matter


def test_every_block_mixes_over_time(rng):
    """A later position depends on earlier tokens (the blocks are not position-wise maps)."""
    for block in BLOCKS[:4]:
        model = perturbed(tiny_config(block))
        ids = rng.integers(0, 50, (1, 8))
        other = ids.copy()
        other[0, 0] = (other[0, 0] + 1) % 50
        assert not np.allclose(model.forward(ids)[0, -1], model.forward(other)[0, -1], atol=1e-6), block


def test_config_round_trips_through_a_dict_and_rejects_bad_ones():
    cfg = tiny_config(("mamba2", "attention"))
    assert SequenceModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    good = cfg.to_dict()
    for bad, match in [
        ({**good, "block": ["mamba2", "mamba9"]}, "must be one of"),
        ({**good, "n_heads": True}, "expected ints"),
        ({**good, "d_state": 65}, "at most 64"),
        ({**good, "n_heads": 3}, "must divide"),
        ({k: v for k, v in good.items() if k != "d_conv"}, "missing"),
        ({**good, "dropout": 0}, "unknown"),
    ]:
        with pytest.raises(InvalidInput, match=match):
            SequenceModelConfig.from_dict(bad)


def test_backbone_rejects_params_and_ids_that_do_not_fit():
    cfg = tiny_config()
    params = SequenceBackbone.init(cfg).params
    with pytest.raises(InvalidInput, match="missing"):
        SequenceBackbone(cfg, {n: a for n, a in params.items() if n != "final_norm"})
    with pytest.raises(InvalidInput, match="shape"):
        SequenceBackbone(cfg, {**params, "embedding": np.zeros((50, 8), np.float32)})
    with pytest.raises(InvalidInput, match="finite"):
        SequenceBackbone(cfg, {**params, "final_norm": np.full(16, np.nan, np.float32)})
    model = SequenceBackbone(cfg, params)
    with pytest.raises(InvalidInput, match=r"lie in \[0, 50\)"):
        model.forward(np.array([[1, 50]]))
    with pytest.raises(InvalidInput, match="integer"):
        model.forward(np.zeros((1, 3)))


def test_the_cpu_backbone_does_not_import_the_gpu_path():
    code = ("import sys, evermind_memory.lm.sequence, evermind_memory.embedder; "
            "print([m for m in sys.modules if m.startswith(('wgpu', 'evermind_memory.gpu'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ── checkpoints ───────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_checkpoint_round_trip_gives_identical_hidden_states(block, tmp_path: Path, rng):
    model = perturbed(tiny_config(block))
    model.save(tmp_path / "seq.evlm")
    loaded = SequenceBackbone.load(tmp_path / "seq.evlm")
    assert loaded.config == model.config
    assert list(loaded.params) == list(sequence_param_shapes(model.config))
    ids = rng.integers(0, 50, (2, 11))
    np.testing.assert_array_equal(loaded.forward(ids), model.forward(ids))


def test_fp16_checkpoint_loads_close(tmp_path: Path, rng):
    model = perturbed(tiny_config("mamba3"))
    model.save(tmp_path / "half.evlm", fp16=True)
    ids = rng.integers(0, 50, (2, 7))
    np.testing.assert_allclose(SequenceBackbone.load(tmp_path / "half.evlm").forward(ids), model.forward(ids),
                               atol=2e-2)


def test_load_backbone_picks_the_kind_and_each_loader_refuses_the_other(tmp_path: Path):
    seq = perturbed(tiny_config(("mamba2", "attention")))
    seq.save(tmp_path / "seq.evlm")
    lm = EvermindLM(LMConfig(vocab_size=50, d_model=16, n_layers=1, hidden_dim=32))
    lm.save(tmp_path / "lm.evlm")
    assert isinstance(load_backbone(tmp_path / "seq.evlm")[0], SequenceModelConfig)
    assert isinstance(load_backbone(tmp_path / "lm.evlm")[0], LMConfig)
    with pytest.raises(CheckpointError, match="holds a sequence backbone.*load_sequence_model"):
        load_model(tmp_path / "seq.evlm")
    with pytest.raises(CheckpointError, match="holds a evermind-lm backbone.*load_model"):
        load_sequence_model(tmp_path / "lm.evlm")


def _write(path: Path, meta: dict, tensors: dict) -> Path:
    """A well-formed file (valid CRC) whose contents disagree with what a sequence backbone needs."""
    write_tensor_file(path, magic=MODEL_MAGIC, kind=MODEL_KIND, meta=meta, tensors=tensors)
    return path


def _damaged_files(tmp_path: Path) -> dict[str, Path]:
    cfg = tiny_config(("mamba1", "attention"))
    params = perturbed(cfg).params
    meta = {"backbone": "sequence", "config": cfg.to_dict()}
    good = tmp_path / "good.evlm"
    save_sequence_model(good, cfg, params)
    raw = good.read_bytes()
    files = {}
    files["truncated"] = tmp_path / "truncated.evlm"
    files["truncated"].write_bytes(raw[: len(raw) - 100])
    flipped = bytearray(raw)
    flipped[len(raw) - 40] ^= 0x01  # inside the last tensor's data
    files["flipped byte"] = tmp_path / "flipped.evlm"
    files["flipped byte"].write_bytes(bytes(flipped))
    files["wrong shape"] = _write(tmp_path / "shape.evlm", meta,
                                  {**params, "layer1.w_o": np.zeros((16, 8), np.float32)})
    files["unknown block"] = _write(tmp_path / "block.evlm",
                                    {**meta, "config": {**cfg.to_dict(), "block": ["mamba1", "mamba9"]}}, params)
    files["missing tensor"] = _write(tmp_path / "missing.evlm", meta,
                                     {n: a for n, a in params.items() if n != "layer0.a_log"})
    files["extra tensor"] = _write(tmp_path / "extra.evlm", meta, {**params, "layer2.norm": np.ones(16)})
    files["u32 tensor"] = _write(tmp_path / "u32.evlm", meta,
                                 {**params, "final_norm": np.ones(16, np.uint32)})
    files["unknown backbone"] = _write(tmp_path / "backbone.evlm", {**meta, "backbone": "transformer"}, params)
    files["nan weight"] = _write(tmp_path / "nan.evlm", meta,
                                 {**params, "final_norm": np.full(16, np.nan, np.float32)})
    files["meta keys"] = _write(tmp_path / "meta.evlm", {**meta, "note": 1}, params)
    # A header that declares a bigger tensor than the data holds: re-encode the JSON with the CRC left stale.
    head_len = struct.unpack_from("<I", raw, 12)[0]
    header = json.loads(raw[16:16 + head_len])
    header["tensors"][0]["shape"] = [51, 16]
    new_head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    files["header shape"] = tmp_path / "header.evlm"
    files["header shape"].write_bytes(raw[:12] + struct.pack("<I", len(new_head)) + new_head
                                      + raw[16 + head_len:])
    return files


@pytest.mark.parametrize("case", ["truncated", "flipped byte", "wrong shape", "unknown block", "missing tensor",
                                  "extra tensor", "u32 tensor", "unknown backbone", "nan weight", "meta keys",
                                  "header shape"])
def test_damaged_sequence_checkpoints_raise_checkpoint_error(case, tmp_path: Path):
    path = _damaged_files(tmp_path)[case]
    for loader in (load_sequence_model, load_backbone, SequenceBackbone.load):
        with pytest.raises(CheckpointError):
            loader(path)


def test_damage_messages_name_the_problem(tmp_path: Path):
    files = _damaged_files(tmp_path)
    expected = {
        "wrong shape": "'layer1.w_o' has shape \\(16, 8\\), the config needs \\(16, 16\\)",
        "unknown block": "invalid model config.*mamba9",
        "missing tensor": "missing \\['layer0.a_log'\\]",
        "unknown backbone": "unknown backbone 'transformer'",
        "u32 tensor": "unknown dtype 'u32'",
    }
    for case, match in expected.items():
        with pytest.raises(CheckpointError, match=match):
            load_sequence_model(files[case])


def test_save_refuses_params_that_do_not_fit(tmp_path: Path):
    cfg = tiny_config()
    params = SequenceBackbone.init(cfg).params
    with pytest.raises(InvalidInput, match="missing"):
        save_sequence_model(tmp_path / "x.evlm", cfg, {n: a for n, a in params.items() if n != "embedding"})
    with pytest.raises(InvalidInput, match="SequenceModelConfig"):
        save_sequence_model(tmp_path / "x.evlm", LMConfig(vocab_size=50), params)
    assert not (tmp_path / "x.evlm").exists()
