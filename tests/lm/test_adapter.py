"""LoRA adapters, inference side: file round trips, refusal of damaged files, merge maths, digests."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.adapter import (
    ADAPTER_KIND,
    ADAPTER_MAGIC,
    LoRAWeights,
    adapted_params,
    adapter_digest,
    load_adapter,
    merge_adapter,
    save_adapter,
)
from evermind_memory.lm.checkpoint import MODEL_KIND, MODEL_MAGIC, write_tensor_file


@pytest.fixture
def params(rng) -> dict[str, np.ndarray]:
    return {
        "emb": rng.standard_normal((12, 6)).astype(np.float32),
        "norm": rng.standard_normal(6).astype(np.float32),
        "router": rng.standard_normal((6, 3)).astype(np.float32),
    }


def random_adapter(rng, params, *, rank=2, alpha=4.0, targets=("emb", "router"), zero_b=False) -> LoRAWeights:
    tensors = {}
    for t in targets:
        rows, cols = params[t].shape
        a = rng.standard_normal((rank, cols)).astype(np.float32)  # (R, cols)
        b = np.zeros((rows, rank), np.float32) if zero_b else rng.standard_normal((rows, rank)).astype(np.float32)
        tensors[t] = (a, b)
    return LoRAWeights(rank=rank, alpha=alpha, tensors=tensors, base_fingerprint="evermind-lm/test/abc")


@pytest.fixture
def adapter(rng, params) -> LoRAWeights:
    return random_adapter(rng, params)


@pytest.fixture
def adapter_file(tmp_path, adapter) -> Path:
    path = tmp_path / "a.evlora"
    save_adapter(path, adapter)
    return path


# ------------------------------------------------------------------------------------- round trips


def test_round_trip(adapter_file, adapter):
    got = load_adapter(adapter_file)
    assert (got.rank, got.alpha, got.base_fingerprint) == (2, 4.0, "evermind-lm/test/abc")
    assert list(got.tensors) == list(adapter.tensors)
    for t, (a, b) in adapter.tensors.items():
        assert got.tensors[t][0].tobytes() == a.tobytes()
        assert got.tensors[t][1].tobytes() == b.tobytes()
    assert adapter_digest(got) == adapter_digest(adapter)
    assert sorted(p.name for p in adapter_file.parent.iterdir()) == ["a.evlora"]


def test_round_trip_without_fingerprint_and_odd_alpha(tmp_path, rng, params):
    w = random_adapter(rng, params, rank=3, alpha=0.1)
    w.base_fingerprint = None
    save_adapter(tmp_path / "a", w)
    got = load_adapter(tmp_path / "a")
    assert got.alpha == 0.1 and got.base_fingerprint is None and got.scale == 0.1 / 3


def test_fp16_round_trip(tmp_path, adapter):
    save_adapter(tmp_path / "a", adapter, fp16=True)
    got = load_adapter(tmp_path / "a")
    for t, (a, b) in adapter.tensors.items():
        np.testing.assert_array_equal(got.tensors[t][0], a.astype(np.float16).astype(np.float32))
        np.testing.assert_allclose(got.tensors[t][1], b, rtol=1e-3, atol=1e-7)


def test_sha256_pin(adapter_file):
    pin = hashlib.sha256(adapter_file.read_bytes()).hexdigest()
    assert adapter_digest(load_adapter(adapter_file, sha256=pin)) == adapter_digest(load_adapter(adapter_file))
    with pytest.raises(CheckpointError, match="does not match the pinned"):
        load_adapter(adapter_file, sha256="0" * 64)


# ------------------------------------------------------------------------------ damaged files refused


def test_damaged_adapter_is_refused(adapter_file):
    data = adapter_file.read_bytes()
    flipped = bytearray(data)
    flipped[-8] ^= 0x10
    adapter_file.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match=r"a\.evlora: CRC mismatch"):
        load_adapter(adapter_file)
    for cut in (0, 9, len(data) // 2, len(data) - 1):
        adapter_file.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match="truncated|too small"):
            load_adapter(adapter_file)


def test_model_file_is_not_an_adapter(tmp_path, params):
    path = tmp_path / "m.evlm"
    write_tensor_file(path, magic=MODEL_MAGIC, kind=MODEL_KIND, meta={}, tensors=params)
    with pytest.raises(CheckpointError, match="bad magic .* evermind-lm model checkpoint"):
        load_adapter(path)


def write_forged(path: Path, meta: dict, tensors: dict) -> None:
    """A well-formed adapter container whose content is inconsistent."""
    full = {"rank": 2, "alpha": 1.0, "targets": ["emb"], "base_fingerprint": None, **meta}
    write_tensor_file(path, magic=ADAPTER_MAGIC, kind=ADAPTER_KIND, meta=full, tensors=tensors)


A = np.ones((2, 6), np.float32)
B = np.ones((12, 2), np.float32)


@pytest.mark.parametrize(
    "meta, tensors, message",
    [
        ({"rank": 0}, {"emb.lora_A": A, "emb.lora_B": B}, "rank must be an int >= 1, got 0"),
        ({"rank": 2.5}, {"emb.lora_A": A, "emb.lora_B": B}, "rank must be an int"),
        ({"alpha": "x"}, {"emb.lora_A": A, "emb.lora_B": B}, "alpha must be a finite number"),
        ({"targets": "emb"}, {"emb.lora_A": A, "emb.lora_B": B}, "targets must be a list"),
        ({"targets": ["emb", "emb"]}, {"emb.lora_A": A, "emb.lora_B": B}, "target twice"),
        ({}, {"emb.lora_A": A}, "do not match its targets"),
        ({}, {"emb.lora_A": A, "emb.lora_B": B, "x.lora_A": A}, "do not match its targets"),
        ({"rank": 3}, {"emb.lora_A": A, "emb.lora_B": B}, r"expected A \(R=3, cols\)"),
        ({}, {"emb.lora_A": A[None], "emb.lora_B": B}, r"got A \(1, 2, 6\)"),
        ({}, {"emb.lora_A": np.full((2, 6), np.nan, np.float32), "emb.lora_B": B}, "NaN or Inf"),
        ({"extra": 1}, {"emb.lora_A": A, "emb.lora_B": B}, "adapter header should hold"),
    ],
)
def test_forged_adapter_is_refused(tmp_path, meta, tensors, message):
    path = tmp_path / "f.evlora"
    write_forged(path, meta, tensors)
    with pytest.raises(CheckpointError, match=message):
        load_adapter(path)


def test_load_checks_targets_against_model(tmp_path, adapter_file, params, adapter):
    class Holder:  # load_adapter only needs `.params` of the model it is checked against
        def __init__(self, p):
            self.params = p

    got = load_adapter(adapter_file, model=Holder(params))
    assert adapter_digest(got) == adapter_digest(adapter)
    with pytest.raises(CheckpointError, match="targets 'router', which the model does not have"):
        load_adapter(adapter_file, model=Holder({k: v for k, v in params.items() if k != "router"}))
    with pytest.raises(CheckpointError, match=r"needs a weight of shape \(12, 6\), the model's is \(11, 6\)"):
        load_adapter(adapter_file, model=Holder({**params, "emb": params["emb"][:11]}))


def test_invalid_weights_are_refused_at_construction(params):
    a, b = np.ones((2, 6), np.float32), np.ones((12, 2), np.float32)
    with pytest.raises(InvalidInput, match="rank must be an int >= 1"):
        LoRAWeights(rank=0, alpha=1.0, tensors={"emb": (a, b)})
    with pytest.raises(InvalidInput, match="alpha must be a finite number"):
        LoRAWeights(rank=2, alpha=float("inf"), tensors={"emb": (a, b)})
    with pytest.raises(InvalidInput, match=r"got A \(2, 6\) and B \(12, 3\)"):
        LoRAWeights(rank=2, alpha=1.0, tensors={"emb": (a, np.ones((12, 3), np.float32))})
    with pytest.raises(InvalidInput, match="must be a pair"):
        LoRAWeights(rank=2, alpha=1.0, tensors={"emb": a})


# ------------------------------------------------------------------------------------------- maths


def test_zero_b_gives_base_exactly(rng, params):
    w = random_adapter(rng, params, zero_b=True)
    out = adapted_params(params, w)
    assert list(out) == list(params)
    for k in params:
        assert out[k].tobytes() == params[k].tobytes()


def test_adapted_params_match_numpy(rng, params, adapter):
    snapshot = {k: v.copy() for k, v in params.items()}
    out = adapted_params(params, adapter)
    for t in ("emb", "router"):
        a, b = adapter.tensors[t]
        expected = params[t].astype(np.float64) + (4.0 / 2) * (b.astype(np.float64) @ a.astype(np.float64))
        np.testing.assert_allclose(out[t], expected, rtol=1e-6, atol=1e-6)
        assert out[t].dtype == np.float32
    np.testing.assert_array_equal(out["norm"], params["norm"])
    for k in params:  # base untouched and not shared
        np.testing.assert_array_equal(params[k], snapshot[k])
        assert not np.shares_memory(out[k], params[k])


def test_adapted_params_refuses_misfits(rng, params, adapter):
    with pytest.raises(InvalidInput, match="targets 'emb', which the model does not have"):
        adapted_params({k: v for k, v in params.items() if k != "emb"}, adapter)
    with pytest.raises(InvalidInput, match=r"needs a weight of shape \(6, 3\)"):
        adapted_params({**params, "router": params["router"].T}, adapter)
    with pytest.raises(InvalidInput, match="expected LoRAWeights"):
        adapted_params(params, {"emb": adapter.tensors["emb"]})


# ------------------------------------------------------------------------------------------ digest


def test_digest_changes_when_any_value_changes(adapter):
    base = adapter_digest(adapter)
    seen = {base}
    for t, (a, b) in adapter.tensors.items():
        for which, arr in ((0, a), (1, b)):
            for idx in [(0, 0), tuple(d - 1 for d in arr.shape)]:
                changed = arr.copy()
                changed[idx] = np.nextafter(changed[idx], np.float32(np.inf))  # one ulp
                pair = (changed, b) if which == 0 else (a, changed)
                w = LoRAWeights(adapter.rank, adapter.alpha, {**adapter.tensors, t: pair})
                seen.add(adapter_digest(w))
    assert len(seen) == 1 + 2 * 2 * len(adapter.tensors)
    assert adapter_digest(LoRAWeights(2, 4.5, adapter.tensors)) != base
    renamed = {("w1" if k == "router" else k): v for k, v in adapter.tensors.items()}
    assert adapter_digest(LoRAWeights(2, 4.0, renamed)) != base


def test_digest_ignores_target_order_and_fingerprint(adapter):
    reordered = LoRAWeights(2, 4.0, dict(reversed(adapter.tensors.items())), base_fingerprint=None)
    assert adapter_digest(reordered) == adapter_digest(adapter)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.floats(-8, 8, allow_nan=False), st.integers(0, 2**32 - 1))
def test_digest_survives_save_load(tmp_path_factory, rank, alpha, seed):
    rng = np.random.default_rng(seed)
    w = LoRAWeights(rank, alpha, {"x": (rng.standard_normal((rank, 3)), rng.standard_normal((5, rank)))})
    path = tmp_path_factory.mktemp("dg") / "a"
    save_adapter(path, w)  # float64 input is stored as float32; the digest is over float32
    assert adapter_digest(load_adapter(path)) == adapter_digest(w)


# ------------------------------------------------------------------------------------- with models


@pytest.fixture
def model(rng):
    from evermind_memory.lm.model import EvermindLM, LMConfig

    config = LMConfig(vocab_size=20, d_model=8, n_layers=1, conv_kernel=3, hidden_dim=12, n_experts=2, top_k=1)
    return EvermindLM(config, seed=3)


def model_adapter(rng, model, *, zero_b=False) -> LoRAWeights:
    return random_adapter(rng, model.params, rank=2, alpha=2.0, targets=("emb", "layers.0.shared.w1"),
                          zero_b=zero_b)


def test_merge_with_zero_b_equals_base(rng, model):
    merged = merge_adapter(model, model_adapter(rng, model, zero_b=True))
    assert merged is not model and merged.config == model.config
    for k in model.params:
        assert merged.params[k].tobytes() == model.params[k].tobytes()
    tokens = np.array([[1, 2, 3, 4]])
    np.testing.assert_array_equal(merged.forward(tokens, None), model.forward(tokens, None))


def test_merge_matches_numpy_and_leaves_base_untouched(rng, model):
    snapshot = {k: v.copy() for k, v in model.params.items()}
    w = model_adapter(rng, model)
    merged = merge_adapter(model, w)
    for t, (a, b) in w.tensors.items():
        expected = snapshot[t].astype(np.float64) + (2.0 / 2) * (b.astype(np.float64) @ a.astype(np.float64))
        np.testing.assert_allclose(merged.params[t], expected, rtol=1e-6, atol=1e-6)
    for k in model.params:
        np.testing.assert_array_equal(model.params[k], snapshot[k])
        assert not np.shares_memory(merged.params[k], model.params[k])
    tokens = np.array([[1, 2, 3, 4]])
    assert not np.array_equal(merged.forward(tokens, None), model.forward(tokens, None))


def test_merge_refuses_unknown_target(rng, model, params):
    w = random_adapter(rng, params, targets=("router",))  # (6, 3): no such weight in this model
    with pytest.raises(InvalidInput, match="'router', which the model does not have"):
        merge_adapter(model, w)
    with pytest.raises(InvalidInput, match="expected an EvermindLM"):
        merge_adapter(model.params, w)


def test_load_adapter_against_real_model(tmp_path, rng, model):
    w = model_adapter(rng, model)
    save_adapter(tmp_path / "a", w)
    got = load_adapter(tmp_path / "a", model=model)
    assert adapter_digest(got) == adapter_digest(w)
