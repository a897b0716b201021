"""Every sequence block (Mamba-1/2/3, attention) and the stacked model on the GPU against their numpy
references, for several (B, L, C) including B > 1, L > 1 and sizes off the kernels' tiles.

Parameters are perturbed well away from their small initial values so every branch of a block matters.
Tolerance: |gpu - reference| <= 1e-4 (1 + |reference|) (float32 through several matmuls and a scan).
"""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.attention import AttentionBlock, AttentionConfig
from evermind_memory.gpu.blocks.mamba1 import Mamba1Block, Mamba1Config
from evermind_memory.gpu.blocks.mamba2 import Mamba2Block, Mamba2Config
from evermind_memory.gpu.blocks.mamba3 import Mamba3Block, Mamba3Config
from evermind_memory.gpu.blocks.model import SequenceModel, SequenceModelConfig
from evermind_memory.gpu.blocks.sequence_layer import SequenceLayer


def make(kind: str, c: int) -> SequenceLayer:
    if kind == "mamba1":
        return Mamba1Block(Mamba1Config(c, d_state=5, d_conv=3, dt_rank=2))
    if kind == "mamba2":
        return Mamba2Block(Mamba2Config(c, d_state=5, n_heads=4, n_groups=2, chunk_len=7))
    if kind == "mamba3":
        return Mamba3Block(Mamba3Config(c, d_state=3, n_heads=2, chunk_len=5))
    return AttentionBlock(AttentionConfig(c, n_heads=2, ffn_mult=2))


def perturb(block: SequenceLayer, rng: np.random.Generator, scale: float = 0.3) -> None:
    block.load_parameters({name: arr + (rng.standard_normal(arr.shape) * scale).astype(np.float32)
                           for name, arr in block.parameters().items()})


def close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


KINDS = ["mamba1", "mamba2", "mamba3", "attention"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b,length,c", [(1, 1, 8), (2, 5, 12), (3, 19, 10)])
def test_block_matches_numpy_reference(gpu, kind, b, length, c):
    rng = np.random.default_rng(b * 100 + length + c)
    block = make(kind, c)
    perturb(block, rng)
    x = rng.standard_normal((b, length, c)).astype(np.float32)
    got = block.forward(x)
    want = block.forward_numpy(x)
    assert got.shape == x.shape and got.dtype == np.float32
    assert np.abs(want - x).max() > 0.05  # the block does more than its residual
    close(got, want)


@pytest.mark.parametrize("b,length,c,heads", [(2, 150, 64, 2), (2, 90, 128, 2), (1, 20, 132, 2)])
def test_attention_block_over_flash_tiles_and_wide_heads(gpu, b, length, c, heads):
    # Head width 32: the flash kernel over five 32-row query tiles (150 is no multiple), reading Q, K, V
    # in place from the fused projection; width 64: 64-row tiles, 4 lanes per row. Head width 66 > 64:
    # column slices and the three-pass kernels.
    rng = np.random.default_rng(length + c)
    block = AttentionBlock(AttentionConfig(c, n_heads=heads))
    perturb(block, rng)
    x = rng.standard_normal((b, length, c)).astype(np.float32)
    want = block.forward_numpy(x)
    assert np.abs(want - x).max() > 0.05
    close(block.forward(x), want)


@pytest.mark.parametrize("threads,lanes", [(256, 2), (128, 16)])
def test_attention_block_honours_the_flash_kernel_setting(gpu, monkeypatch, threads, lanes):
    # benchmarks/blocks_speed.py --flash-variants rebinds sequence_ops.FLASH_THREADS and FLASH_LANES to time
    # kernel variants: the block must pick them up and stay exact (128 x 16: 8 rows a workgroup, 32-key
    # tiles, lanes 8 .. 15 of every row idle).
    monkeypatch.setattr(so, "FLASH_THREADS", threads)
    monkeypatch.setattr(so, "FLASH_LANES", lanes)
    rng = np.random.default_rng(lanes)
    block = AttentionBlock(AttentionConfig(64, n_heads=2))
    perturb(block, rng)
    x = rng.standard_normal((2, 45, 64)).astype(np.float32)
    close(block.forward(x), block.forward_numpy(x))
    built = [dict(consts) for kernel, _, consts in gpu._pipelines if kernel == "attention_flash"]
    assert {"THREADS": threads, "LANES": lanes, "HEAD_DIM": 32} in [
        {n: c.get(n) for n in ("THREADS", "LANES", "HEAD_DIM")} for c in built]


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_are_causal(gpu, kind):
    rng = np.random.default_rng(3)
    block = make(kind, 8)
    perturb(block, rng)
    x = rng.standard_normal((2, 11, 8)).astype(np.float32)
    x2 = x.copy()
    x2[:, 6:] += 1.0
    a, b = block.forward(x), block.forward(x2)
    np.testing.assert_allclose(a[:, :6], b[:, :6], rtol=1e-6, atol=1e-6)
    assert np.abs(a[:, 6:] - b[:, 6:]).max() > 1e-3


def test_batch_rows_are_independent(gpu):
    rng = np.random.default_rng(4)
    block = make("mamba1", 8)
    perturb(block, rng)
    x = rng.standard_normal((3, 9, 8)).astype(np.float32)
    whole = block.forward(x)
    for i in range(3):
        close(block.forward(np.ascontiguousarray(x[i:i + 1])), whole[i:i + 1])


@pytest.mark.parametrize("kind", KINDS)
def test_parameters_by_name_round_trip(gpu, kind):
    rng = np.random.default_rng(5)
    block = make(kind, 8)
    params = block.parameters()
    assert list(params) == list(block.param_shapes())
    assert all(arr.dtype == np.float32 and arr.shape == block.param_shapes()[n] for n, arr in params.items())
    x = rng.standard_normal((2, 4, 8)).astype(np.float32)
    before = block.forward(x)
    perturb(block, rng)  # new weights reach the device on the next forward
    after = block.forward(x)
    assert np.abs(after - before).max() > 1e-3
    close(after, block.forward_numpy(x))
    with pytest.raises(InvalidInput, match="missing"):
        block.load_parameters({k: v for k, v in params.items() if k != "norm" and k != "pre_norm"})
    name = next(iter(params))
    with pytest.raises(InvalidInput, match="shape"):
        block.load_parameters({**params, name: np.zeros((1, 1, 1), np.float32)})


def test_default_initialisation_is_seeded_and_near_identity(gpu):
    x = np.random.default_rng(6).standard_normal((1, 3, 16)).astype(np.float32)
    for kind in KINDS:
        a, b = make(kind, 16), make(kind, 16)
        for name, arr in a.parameters().items():
            np.testing.assert_array_equal(arr, b.parameters()[name])
        out = a.forward_numpy(x)
        assert np.all(np.isfinite(out)) and np.abs(out - x).max() < 0.5


def test_blocks_reject_bad_inputs(gpu):
    block = make("mamba2", 8)
    with pytest.raises(InvalidInput, match="float32"):
        block.forward(np.zeros((1, 2, 8)))
    with pytest.raises(InvalidInput, match=r"\(B, L, 8\)"):
        block.forward(np.zeros((1, 2, 9), np.float32))
    with pytest.raises(InvalidInput, match="divide"):
        Mamba2Config(8, n_heads=3)
    with pytest.raises(InvalidInput, match="at most 64"):
        Mamba3Config(8, d_state=65)
    with pytest.raises(InvalidInput, match="divide"):
        AttentionConfig(10, n_heads=4)


@pytest.mark.parametrize("block", ["mamba1", "mamba2", "mamba3", "attention",
                                   ("mamba1", "attention", "mamba3")])
def test_sequence_model_matches_numpy_reference(gpu, block):
    n_layers = 3 if isinstance(block, tuple) else 2
    cfg = SequenceModelConfig(vocab_size=40, d_model=12, n_layers=n_layers, block=block, d_state=4, n_heads=2,
                              chunk_len=5, ffn_mult=1)
    model = SequenceModel(cfg, np.random.default_rng(7))
    rng = np.random.default_rng(8)
    for layer in model.layers:
        perturb(layer, rng)
    ids = rng.integers(0, 40, (2, 9))
    got = model.forward(ids)
    assert got.shape == (2, 9, 12)
    close(got, model.forward_numpy(ids))
    assert cfg.schedule == ((block,) * 2 if isinstance(block, str) else block)
    assert cfg.architecture.startswith("seqmodel/")
    assert set(model.parameters()) >= {"embedding", "final_norm", "layer0.w_in" if cfg.schedule[0] != "attention"
                                       else "layer0.w_qkv"}


def test_sequence_model_config_is_checked():
    with pytest.raises(InvalidInput, match="block"):
        SequenceModelConfig(vocab_size=10, d_model=8, n_layers=2, block="mamba4")
    with pytest.raises(InvalidInput, match="block"):
        SequenceModelConfig(vocab_size=10, d_model=8, n_layers=2, block=("mamba1",))
    model = SequenceModel(SequenceModelConfig(vocab_size=10, d_model=8, n_layers=1))
    with pytest.raises(InvalidInput, match=r"\[0, 10\)"):
        model.forward_numpy(np.array([[3, 10]]))
    a = SequenceModelConfig(vocab_size=10, d_model=8, n_layers=1, block="mamba2").architecture
    assert a != SequenceModelConfig(vocab_size=10, d_model=8, n_layers=1, block="mamba3").architecture
