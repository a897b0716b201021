"""Checkpoint format: round trips, atomic writes, refusal of damaged or forged files, row deltas."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.checkpoint import (
    DELTA_KIND,
    DELTA_MAGIC,
    MODEL_KIND,
    MODEL_MAGIC,
    decode_tensor_bytes,
    encode_tensor_bytes,
    read_tensor_file,
    write_tensor_file,
)
from evermind_memory.lm.delta import apply_delta, export_delta
from evermind_memory.lm.model import load_model, save_model

MAGIC = b"TESTMAG\x01"
KIND = "test-tensors 1"


def forge(header: dict | bytes, data: bytes = b"", *, magic: bytes = MAGIC, version: int = 1) -> bytes:
    """Build a file by hand, with a correct CRC, so a check other than the CRC has to catch it."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    head = struct.pack("<8sII", magic, version, len(raw)) + raw
    body = head + bytes(-len(head) % 64) + data
    return body + struct.pack("<I", zlib.crc32(body))


def entry(name: str, shape: list, offset: int = 0, nbytes: int | None = None, dtype: str = "f32") -> dict:
    n = int(np.prod(shape)) * (2 if dtype == "f16" else 4) if nbytes is None else nbytes
    return {"name": name, "dtype": dtype, "shape": shape, "offset": offset, "nbytes": n}


def read(path: Path):
    return read_tensor_file(path, magic=MAGIC, kind=KIND)


@pytest.fixture
def sample(rng) -> dict[str, np.ndarray]:
    return {
        "emb": rng.standard_normal((7, 5)).astype(np.float32),
        "norm": rng.standard_normal(5).astype(np.float32),
        "empty": np.zeros((0, 3), np.float32),
        "scalar": np.float32(2.5),
    }


@pytest.fixture
def sample_file(tmp_path, sample) -> Path:
    path = tmp_path / "t.bin"
    write_tensor_file(path, magic=MAGIC, kind=KIND, meta={"note": "hi"}, tensors=sample)
    return path


# ------------------------------------------------------------------------------------- round trips


names = st.text(alphabet="abcdefgh.0123", min_size=1, max_size=12)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(names, shapes.flatmap(lambda s: hnp.arrays(np.float32, s)), max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
)
def test_fp32_round_trip_is_bit_exact(tmp_path_factory, tensors, meta):
    path = tmp_path_factory.mktemp("rt") / "f.bin"
    write_tensor_file(path, magic=MAGIC, kind=KIND, meta=meta, tensors=tensors)
    got_meta, got = read(path)
    assert got_meta == meta
    assert list(got) == list(tensors)
    for name, arr in tensors.items():
        assert got[name].dtype == np.float32 and got[name].shape == arr.shape
        assert got[name].tobytes() == arr.tobytes()  # bitwise: NaN payloads and -0.0 survive
    assert path.read_bytes() == encode_tensor_bytes(magic=MAGIC, kind=KIND, meta=meta, tensors=tensors)


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(names, shapes.flatmap(
    lambda s: hnp.arrays(np.float32, s, elements=st.floats(-6e4, 6e4, width=32))), max_size=5))
def test_fp16_round_trip_within_fp16_precision(tensors):
    data = encode_tensor_bytes(magic=MAGIC, kind=KIND, meta={}, tensors=tensors, fp16=True)
    _, got = decode_tensor_bytes(data, magic=MAGIC, kind=KIND)
    for name, arr in tensors.items():
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], arr.astype(np.float16).astype(np.float32))
        normal = np.abs(arr) >= 6.2e-5  # below that fp16 is subnormal: absolute, not relative, error
        rel = np.abs(got[name][normal] - arr[normal]) / np.abs(arr[normal])
        assert np.all(rel <= 1e-3)


def test_fp16_file_is_about_half_the_size(tmp_path, rng):
    tensors = {"w": rng.standard_normal((64, 64)).astype(np.float32)}
    write_tensor_file(tmp_path / "a", magic=MAGIC, kind=KIND, meta={}, tensors=tensors)
    write_tensor_file(tmp_path / "b", magic=MAGIC, kind=KIND, meta={}, tensors=tensors, fp16=True)
    assert (tmp_path / "b").stat().st_size < 0.6 * (tmp_path / "a").stat().st_size


def test_tensor_data_is_64_byte_aligned(sample):
    data = encode_tensor_bytes(magic=MAGIC, kind=KIND, meta={}, tensors=sample)
    (header_len,) = struct.unpack("<I", data[12:16])
    header = json.loads(data[16 : 16 + header_len])
    data_start = -(-(16 + header_len) // 64) * 64
    assert len(data) == data_start + header["data_nbytes"] + 4
    for t in header["tensors"]:
        assert t["offset"] % 64 == 0
        arr = np.frombuffer(data, "<f4", count=int(np.prod(t["shape"])), offset=data_start + t["offset"])
        np.testing.assert_array_equal(arr.reshape(t["shape"]), sample[t["name"]])


def test_fp16_overflow_is_refused(tmp_path):
    with pytest.raises(InvalidInput, match="beyond the fp16 range"):
        write_tensor_file(tmp_path / "f", magic=MAGIC, kind=KIND, meta={}, tensors={"w": np.float32([1e5])},
                          fp16=True)


# ------------------------------------------------------------------------------------ atomic writes


def test_write_leaves_no_temp_file(sample_file):
    assert sorted(p.name for p in sample_file.parent.iterdir()) == ["t.bin"]


@pytest.mark.parametrize(
    "tensors, meta, message",
    [
        ({"ok": np.ones(3, np.float32), "bad": np.array(["a", "b"])}, {}, "expected a float array"),
        ({"ok": np.ones(3, np.float32), "bad": np.ones(2, np.complex64)}, {}, "expected a float array"),
        ({"ok": np.ones(3, np.float32)}, {"x": object()}, "JSON-serialisable"),
        ({"ok": np.ones(3, np.float32)}, {"x": float("nan")}, "JSON-serialisable"),
        ({"": np.ones(3, np.float32)}, {}, "non-empty strings"),
    ],
)
def test_failed_write_keeps_old_file_and_leaves_no_temp(sample_file, tensors, meta, message):
    before = sample_file.read_bytes()
    with pytest.raises(InvalidInput, match=message):
        write_tensor_file(sample_file, magic=MAGIC, kind=KIND, meta=meta, tensors=tensors)
    assert sample_file.read_bytes() == before
    assert sorted(p.name for p in sample_file.parent.iterdir()) == ["t.bin"]


def test_write_into_missing_directory_is_refused(tmp_path, sample):
    with pytest.raises(CheckpointError, match=r"t\.bin: cannot write .*directory exists"):
        write_tensor_file(tmp_path / "no" / "t.bin", magic=MAGIC, kind=KIND, meta={}, tensors=sample)


def test_write_replaces_old_file(sample_file, rng):
    new = {"w": rng.standard_normal(4).astype(np.float32)}
    write_tensor_file(sample_file, magic=MAGIC, kind=KIND, meta={"v": 2}, tensors=new)
    meta, got = read(sample_file)
    assert meta == {"v": 2} and list(got) == ["w"]
    np.testing.assert_array_equal(got["w"], new["w"])


# ------------------------------------------------------------------------------ damaged files refused


def test_truncated_files_are_refused(sample_file):
    data = sample_file.read_bytes()
    (header_len,) = struct.unpack("<I", data[12:16])
    for cut in [0, 1, 7, 12, 19, 16 + header_len // 2, 16 + header_len, len(data) // 2 + 40, len(data) - 4,
                len(data) - 1]:
        sample_file.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=r"t\.bin.*(truncated|too small)"):
            read(sample_file)


def test_appended_bytes_are_refused(sample_file):
    sample_file.write_bytes(sample_file.read_bytes() + b"\0" * 8)
    with pytest.raises(CheckpointError, match="header declares .* bytes but the file has"):
        read(sample_file)


def test_flipped_data_byte_fails_crc(sample_file):
    data = bytearray(sample_file.read_bytes())
    data[-10] ^= 0x01
    sample_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC mismatch"):
        read(sample_file)


def test_bad_crc_trailer_is_refused(sample_file):
    data = bytearray(sample_file.read_bytes())
    data[-4:] = struct.pack("<I", (struct.unpack("<I", data[-4:])[0] + 1) & 0xFFFFFFFF)
    sample_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC mismatch"):
        read(sample_file)


def test_bad_magic_is_refused(sample_file):
    data = sample_file.read_bytes()
    sample_file.write_bytes(b"NOTMAGIC" + data[8:])
    with pytest.raises(CheckpointError, match="bad magic .* not an evermind file"):
        read(sample_file)


def test_other_evermind_file_is_named(sample_file):
    sample_file.write_bytes(MODEL_MAGIC + sample_file.read_bytes()[8:])
    with pytest.raises(CheckpointError, match="this file is an evermind-lm model checkpoint"):
        read(sample_file)


def test_unknown_version_is_refused(sample_file):
    data = sample_file.read_bytes()
    sample_file.write_bytes(data[:8] + struct.pack("<I", 2) + data[12:])
    with pytest.raises(CheckpointError, match="unknown format version 2"):
        read(sample_file)


def test_huge_header_length_is_refused(sample_file):
    data = sample_file.read_bytes()
    sample_file.write_bytes(data[:12] + struct.pack("<I", 0xFFFFFFFF) + data[16:])
    with pytest.raises(CheckpointError, match="header length 4294967295 exceeds"):
        read(sample_file)
    sample_file.write_bytes(data[:12] + struct.pack("<I", 1_000_000) + data[16:])
    with pytest.raises(CheckpointError, match="header length 1000000 does not fit"):
        read(sample_file)


def test_size_cap_comes_first(sample_file):
    with pytest.raises(CheckpointError, match="above the 100-byte cap"):
        read_tensor_file(sample_file, magic=b"whatever", kind=KIND, max_bytes=100)


@pytest.mark.parametrize(
    "header, message",
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"format": "test-tensors 1", "format": "x", "meta": {}, "tensors": [], "data_nbytes": 0}',
         "duplicate key"),
        (b'{"format": "test-tensors 1", "meta": {"x": NaN}, "tensors": [], "data_nbytes": 0}', "NaN"),
        ({"format": KIND, "meta": {}, "tensors": []}, "missing \\['data_nbytes'\\]"),
        ({"format": KIND, "meta": [], "tensors": [], "data_nbytes": 0}, "'meta' should be dict"),
        ({"format": KIND, "meta": {}, "tensors": [], "data_nbytes": True}, "'data_nbytes' should be int"),
        ({"format": "test-tensors 2", "meta": {}, "tensors": [], "data_nbytes": 0}, "unknown format"),
    ],
)
def test_malformed_header_is_refused(tmp_path, header, message):
    path = tmp_path / "f.bin"
    path.write_bytes(forge(header))
    with pytest.raises(CheckpointError, match=message):
        read(path)


def table(*entries: dict, data_nbytes: int = 64) -> dict:
    return {"format": KIND, "meta": {}, "tensors": list(entries), "data_nbytes": data_nbytes}


@pytest.mark.parametrize(
    "header, message",
    [
        (table(entry("a", [2, 2], dtype="f64")), "unknown dtype 'f64'"),
        (table(entry("a", [-1, 4], nbytes=16)), "negative or non-integer dims"),
        (table(entry("a", [2.0, 2], nbytes=16)), "negative or non-integer dims"),
        (table(entry("a", [1] * 9)), "at most 8 ints"),
        (table(entry("a", [2, 2], nbytes=8)), "declares 8 bytes but shape"),
        (table(entry("a", [2, 2], offset=2)), "not aligned"),
        (table(entry("a", [4, 4], offset=32)), "beyond the 64-byte data region"),
        (table(entry("a", [2, 2]), entry("a", [2, 2], offset=16)), "appears twice"),
        (table(entry("a", [2, 2]), entry("b", [2, 2], offset=8)), "'a' and 'b' overlap"),
        (table(entry("a", [2, 2], offset=16), entry("b", [4, 4], offset=0)), "overlap"),
        (table({"name": "a", "dtype": "f32", "shape": [1]}), "should be an object with keys"),
        (table(entry("a", [2, 2]), data_nbytes=128), "header declares .* bytes but the file has"),
    ],
)
def test_forged_tensor_table_is_refused(tmp_path, header, message):
    path = tmp_path / "f.bin"
    path.write_bytes(forge(header, bytes(64)))
    with pytest.raises(CheckpointError, match=message):
        read(path)


@pytest.mark.parametrize(
    "header",
    [
        table(entry("a", [10**9, 10**9])),  # nbytes consistent with the shape, beyond the data region
        table(entry("a", [10**9, 10**9], nbytes=16)),  # nbytes that lies about the shape
        table(entry("a", [10**9, 10**9]), data_nbytes=4 * 10**18),  # data region that lies about the file
    ],
)
def test_huge_declared_shape_is_refused_before_allocating(tmp_path, header):
    # Allocating 4e18 bytes would raise MemoryError, not CheckpointError, so this fails if it tries.
    path = tmp_path / "f.bin"
    path.write_bytes(forge(header, bytes(64)))
    with pytest.raises(CheckpointError, match="f.bin: corrupt tensor table|header declares"):
        read(path)


def test_empty_file_is_refused(tmp_path):
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty\.bin: file is 0 bytes, too small"):
        read(path)


def test_directory_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory|not a regular file"):
        read(tmp_path)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"nope\.bin: cannot read"):
        read(tmp_path / "nope.bin")


def test_dtype_allow_list(tmp_path):
    path = tmp_path / "f.bin"
    write_tensor_file(path, magic=MAGIC, kind=KIND, meta={}, tensors={"idx": np.arange(3, dtype=np.uint32)})
    with pytest.raises(CheckpointError, match="unknown dtype 'u32'"):
        read(path)
    _, got = read_tensor_file(path, magic=MAGIC, kind=KIND, dtypes=("u32",))
    assert got["idx"].dtype == np.uint32 and got["idx"].tolist() == [0, 1, 2]


# ----------------------------------------------------------------------------------------- models


@pytest.fixture
def model_api():
    from evermind_memory.lm import model

    return model


@pytest.fixture
def tiny(model_api, rng):
    config = model_api.LMConfig(vocab_size=24, d_model=8, n_layers=2, conv_kernel=3, hidden_dim=12,
                                n_experts=3, top_k=2)
    params = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in model_api.param_shapes(config).items()}
    return config, params


def test_model_round_trip_fp32(tmp_path, tiny):
    config, params = tiny
    save_model(tmp_path / "m.evlm", config, params)
    got_config, got = load_model(tmp_path / "m.evlm")
    assert got_config == config
    assert list(got) == list(params)
    for name in params:
        assert got[name].dtype == np.float32
        assert got[name].tobytes() == params[name].tobytes()


def test_model_round_trip_fp16(tmp_path, tiny):
    config, params = tiny
    save_model(tmp_path / "m.evlm", config, params, fp16=True)
    _, got = load_model(tmp_path / "m.evlm")
    for name in params:
        normal = np.abs(params[name]) >= 6.2e-5
        rel = np.abs(got[name] - params[name])[normal] / np.abs(params[name][normal])
        assert np.all(rel <= 1e-3), name


def test_model_save_in_canonical_order(tmp_path, tiny, model_api):
    config, params = tiny
    save_model(tmp_path / "m.evlm", config, dict(reversed(params.items())))
    _, got = load_model(tmp_path / "m.evlm")
    assert list(got) == list(model_api.param_shapes(config))


def test_model_save_refuses_mismatched_params(tmp_path, tiny):
    config, params = tiny
    with pytest.raises(InvalidInput, match="missing \\['emb'\\]"):
        save_model(tmp_path / "m.evlm", config, {k: v for k, v in params.items() if k != "emb"})
    with pytest.raises(InvalidInput, match="has shape"):
        save_model(tmp_path / "m.evlm", config, {**params, "emb": params["emb"][:-1]})
    assert not list(tmp_path.iterdir())


def write_model_like(path: Path, config, tensors: dict, *, config_dict: dict | None = None) -> None:
    """A well-formed model-format file whose content disagrees with its config."""
    meta = {"config": config.to_dict() if config_dict is None else config_dict}
    write_tensor_file(path, magic=MODEL_MAGIC, kind=MODEL_KIND, meta=meta, tensors=tensors)


def test_model_non_finite_weights_are_refused(tmp_path, tiny):
    config, params = tiny
    broken = {**params, "layers.0.conv": np.full((3, 8), np.nan, np.float32)}
    with pytest.raises(InvalidInput, match="'layers.0.conv'\\] holds NaN or Inf"):
        save_model(tmp_path / "m.evlm", config, broken)
    write_model_like(tmp_path / "m.evlm", config, broken)
    with pytest.raises(CheckpointError, match="tensor 'layers.0.conv' holds NaN or Inf"):
        load_model(tmp_path / "m.evlm")


def test_model_wrong_shape_is_refused(tmp_path, tiny):
    config, params = tiny
    write_model_like(tmp_path / "m.evlm", config, {**params, "emb": np.zeros((25, 8), np.float32)})
    with pytest.raises(CheckpointError, match=r"m\.evlm: tensor 'emb' has shape \(25, 8\), the config needs \(24, 8\)"):
        load_model(tmp_path / "m.evlm")


def test_model_missing_tensor_is_refused(tmp_path, tiny):
    config, params = tiny
    write_model_like(tmp_path / "m.evlm", config, {k: v for k, v in params.items() if k != "layers.1.conv"})
    with pytest.raises(CheckpointError, match=r"missing \['layers.1.conv'\], unexpected \[\]"):
        load_model(tmp_path / "m.evlm")


def test_model_extra_tensor_is_refused(tmp_path, tiny):
    config, params = tiny
    write_model_like(tmp_path / "m.evlm", config, {**params, "layers.2.conv": np.zeros((3, 8), np.float32)})
    with pytest.raises(CheckpointError, match=r"missing \[\], unexpected \['layers.2.conv'\]"):
        load_model(tmp_path / "m.evlm")


def test_model_invalid_config_is_refused(tmp_path, tiny):
    config, params = tiny
    bad = {**config.to_dict(), "vocab_size": -5}
    write_model_like(tmp_path / "m.evlm", config, params, config_dict=bad)
    with pytest.raises(CheckpointError, match="invalid model config"):
        load_model(tmp_path / "m.evlm")


def test_model_huge_config_is_refused_before_allocating(tmp_path, tiny):
    config, params = tiny
    huge = {**config.to_dict(), "vocab_size": 10**9}
    write_model_like(tmp_path / "m.evlm", config, params, config_dict=huge)
    with pytest.raises(CheckpointError, match="tensor 'emb' has shape"):
        load_model(tmp_path / "m.evlm")


def test_model_corruption_is_refused(tmp_path, tiny):
    config, params = tiny
    path = tmp_path / "m.evlm"
    save_model(path, config, params)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC mismatch"):
        load_model(path)
    path.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(CheckpointError, match="truncated"):
        load_model(path)


def test_evermind_lm_save_load_uses_this_format(tmp_path, model_api):
    config = model_api.LMConfig(vocab_size=16, d_model=8, n_layers=1, hidden_dim=8, n_experts=2, top_k=1)
    model = model_api.EvermindLM(config, seed=1)
    model.save(tmp_path / "m.evlm")
    assert (tmp_path / "m.evlm").read_bytes()[:8] == MODEL_MAGIC
    loaded = model_api.EvermindLM.load(tmp_path / "m.evlm")
    tokens = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(loaded.forward(tokens, None), model.forward(tokens, None))


def test_generic_file_is_not_a_model(tmp_path, sample_file):
    with pytest.raises(CheckpointError, match="bad magic"):
        load_model(sample_file)


# ------------------------------------------------------------------------------------------ deltas


@pytest.fixture
def base(rng) -> dict[str, np.ndarray]:
    return {
        "emb": rng.standard_normal((50, 8)).astype(np.float32),
        "norm": rng.standard_normal(8).astype(np.float32),
        "conv": rng.standard_normal((3, 8)).astype(np.float32),
        "none": np.zeros((0, 4), np.float32),
    }


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_delta_round_trip_is_exact(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    base = {"emb": rng.standard_normal((20, 4)).astype(np.float32), "norm": rng.standard_normal(4).astype(np.float32)}
    new = {k: v.copy() for k, v in base.items()}
    special = st.sampled_from([0.0, -0.0, np.nan, np.inf, 1e-30]) | st.floats(width=32)
    for _ in range(data.draw(st.integers(0, 6))):
        name = data.draw(st.sampled_from(sorted(new)))
        idx = tuple(data.draw(st.integers(0, d - 1)) for d in new[name].shape)
        new[name][idx] = data.draw(special)
    delta = export_delta(base, new)
    out = apply_delta(base, delta)
    assert list(out) == list(new)
    for name in new:
        assert out[name].tobytes() == new[name].tobytes()


def test_delta_keeps_negative_zero():
    base = {"w": np.zeros((3, 2), np.float32)}
    new = {"w": np.array([[0.0, -0.0], [0.0, 0.0], [-0.0, 0.0]], np.float32)}
    out = apply_delta(base, export_delta(base, new))
    assert out["w"].tobytes() == new["w"].tobytes()
    assert np.signbit(out["w"]).tolist() == [[False, True], [False, False], [True, False]]


def test_delta_records_only_changed_rows(base):
    new = {k: v.copy() for k, v in base.items()}
    new["emb"][7, 3] += 1.0
    small = export_delta(base, new)
    full = export_delta({k: np.zeros_like(v) for k, v in base.items()}, new)
    assert len(small) < len(full) / 2
    meta, tensors = decode_tensor_bytes(small, magic=DELTA_MAGIC, kind=DELTA_KIND, dtypes=("f32", "u32"))
    assert meta["names"] == list(base)
    assert tensors["rows.0"].tolist() == [7]
    assert [tensors[f"rows.{i}"].size for i in range(1, 4)] == [0, 0, 0]


def test_delta_eps_skips_small_changes(base):
    new = {k: v.copy() for k, v in base.items()}
    new["emb"][1] += 1e-4
    new["emb"][2, 0] += 0.5
    new["norm"][0] = np.nan  # NaN always counts as a change
    out = apply_delta(base, export_delta(base, new, eps=1e-3))
    np.testing.assert_array_equal(out["emb"][1], base["emb"][1])
    np.testing.assert_array_equal(out["emb"][2], new["emb"][2])
    assert np.isnan(out["norm"][0])


def test_delta_leaves_base_untouched(base):
    snapshot = {k: v.copy() for k, v in base.items()}
    new = {k: v + 1 for k, v in base.items()}
    out = apply_delta(base, export_delta(base, new))
    for k in base:
        np.testing.assert_array_equal(base[k], snapshot[k])
        np.testing.assert_array_equal(out[k], new[k])


def test_export_delta_refuses_mismatched_params(base):
    with pytest.raises(InvalidInput, match="same names"):
        export_delta(base, {k: v for k, v in base.items() if k != "norm"})
    with pytest.raises(InvalidInput, match="has shape"):
        export_delta(base, {**base, "emb": base["emb"][:3]})
    with pytest.raises(InvalidInput, match="eps >= 0"):
        export_delta(base, base, eps=-1.0)


def test_damaged_delta_is_refused(base):
    new = {k: v * 2 for k, v in base.items()}
    delta = export_delta(base, new)
    flipped = bytearray(delta)
    flipped[-20] ^= 0x01
    with pytest.raises(CheckpointError, match="CRC mismatch"):
        apply_delta(base, bytes(flipped))
    for cut in (0, 10, len(delta) // 2, len(delta) - 1):
        with pytest.raises(CheckpointError, match="truncated|too small"):
            apply_delta(base, delta[:cut])
    with pytest.raises(CheckpointError, match="bad magic"):
        apply_delta(base, encode_tensor_bytes(magic=MODEL_MAGIC, kind=MODEL_KIND, meta={}, tensors=base))


def test_delta_on_wrong_base_is_refused(base):
    delta = export_delta(base, {k: v + 1 for k, v in base.items()})
    with pytest.raises(CheckpointError, match="other base weights"):
        apply_delta({**base, "norm": base["norm"] + 1}, delta)
    with pytest.raises(CheckpointError, match="made for tensors"):
        apply_delta({k: v for k, v in base.items() if k != "conv"}, delta)
    with pytest.raises(CheckpointError, match="has shape \\(50, 8\\) in the delta"):
        apply_delta({**base, "emb": base["emb"][:10]}, delta)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([3, 3], "strictly increasing"),
        ([5, 2], "strictly increasing"),
        ([50], "strictly increasing and < 50"),
    ],
)
def test_forged_delta_rows_are_refused(base, rows, message):
    meta, tensors = decode_tensor_bytes(export_delta(base, base), magic=DELTA_MAGIC, kind=DELTA_KIND,
                                        dtypes=("f32", "u32"))
    tensors["rows.0"] = np.array(rows, np.uint32)
    tensors["data.0"] = np.zeros((len(rows), 8), np.float32)
    forged = encode_tensor_bytes(magic=DELTA_MAGIC, kind=DELTA_KIND, meta=meta, tensors=tensors)
    with pytest.raises(CheckpointError, match=message):
        apply_delta(base, forged)


def test_forged_delta_data_shape_is_refused(base):
    meta, tensors = decode_tensor_bytes(export_delta(base, base), magic=DELTA_MAGIC, kind=DELTA_KIND,
                                        dtypes=("f32", "u32"))
    tensors["rows.0"] = np.array([1], np.uint32)
    tensors["data.0"] = np.zeros((1, 7), np.float32)
    forged = encode_tensor_bytes(magic=DELTA_MAGIC, kind=DELTA_KIND, meta=meta, tensors=tensors)
    with pytest.raises(CheckpointError, match="expected \\(1, 8\\)"):
        apply_delta(base, forged)
