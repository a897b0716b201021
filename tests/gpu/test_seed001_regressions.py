"""One regression test per seed-001 fix in the sequence blocks, each showing the buggy version fails:

1. projections are split by strided column slices, not prefix copies (right only when M = B * L == 1);
2. the conv uniform has the five fields of the kernel's struct (a four-field one is rejected);
3. the Mamba-1 scan is dispatched on a D x N x B grid (ceil(D/8) x ceil(N/8) leaves states unscanned).
The buggy versions are written here, in the tests, never in the package.
"""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.attention import AttentionBlock, AttentionConfig
from evermind_memory.gpu.blocks.mamba1 import Mamba1Block, Mamba1Config
from evermind_memory.gpu.blocks.reference import causal_attention_numpy, selective_scan_numpy
from evermind_memory.gpu.blocks.sequence_layer import RMS_EPS
from evermind_memory.gpu.ops import column_slice_numpy, conv1d_causal_numpy, rmsnorm_numpy, silu_numpy


def prefix_copy(y: np.ndarray, start: int, width: int) -> np.ndarray:
    """The bug: the reference's copyBufferToBuffer of width * M floats from offset start * M."""
    m = y.shape[0]
    return y.reshape(-1)[start * m:(start + width) * m].reshape(m, width)


def perturbed(block, rng):
    block.load_parameters({n: a + (rng.standard_normal(a.shape) * 0.3).astype(np.float32)
                           for n, a in block.parameters().items()})
    return block


def mamba1_forward(block: Mamba1Block, x: np.ndarray, split) -> np.ndarray:
    """Mamba-1's numpy forward with a pluggable projection split (the fixed one or the bug)."""
    p, cfg = block.parameters(), block.config
    b, length, c = x.shape
    d, n, r, m = cfg.d_inner, cfg.d_state, cfg.rank, b * length
    xz = rmsnorm_numpy(x.reshape(m, c), p["norm"], RMS_EPS) @ p["w_in"] + p["b_in"]
    xs, z = split(xz, 0, d), split(xz, d, d)
    u = silu_numpy(conv1d_causal_numpy(xs.reshape(b, length, d), p["w_conv"], p["b_conv"]))
    dbc = u.reshape(m, d) @ p["w_x"] + p["b_x"]
    delta = split(dbc, 0, r) @ p["w_dt"] + p["b_dt"]
    y = selective_scan_numpy(u, delta.reshape(b, length, d), p["a_log"], split(dbc, r, n).reshape(b, length, n),
                             split(dbc, r + n, n).reshape(b, length, n), p["d"], z.reshape(b, length, d))
    return x + (y.reshape(m, d) @ p["w_out"] + p["b_out"]).reshape(b, length, c)


def attention_forward(block: AttentionBlock, x: np.ndarray, split) -> np.ndarray:
    p = block.parameters()
    b, length, c = x.shape
    m = b * length
    qkv = rmsnorm_numpy(x.reshape(m, c), p["norm"], RMS_EPS) @ p["w_qkv"] + p["b_qkv"]
    q, k, v = (split(qkv, i * c, c).reshape(b, length, c) for i in range(3))
    o = causal_attention_numpy(q, k, v, block.config.n_heads)
    return x + (o.reshape(m, c) @ p["w_o"] + p["b_o"]).reshape(b, length, c)


# ---- 1. column slices, not prefix copies ----------------------------------------------------------------

def test_prefix_copy_split_is_only_right_for_a_single_row():
    y = np.arange(3 * 7, dtype=np.float32).reshape(3, 7)
    np.testing.assert_array_equal(prefix_copy(y[:1], 2, 4), column_slice_numpy(y[:1], 2, 4))
    assert not np.array_equal(prefix_copy(y, 2, 4), column_slice_numpy(y, 2, 4))


@pytest.mark.parametrize("kind", ["mamba1", "attention"])
def test_blocks_split_projections_by_column_slices(gpu, kind):
    rng = np.random.default_rng(1)
    if kind == "mamba1":
        block, ref_forward = perturbed(Mamba1Block(Mamba1Config(8, d_state=4, d_conv=3)), rng), mamba1_forward
    else:
        block, ref_forward = perturbed(AttentionBlock(AttentionConfig(8, n_heads=2)), rng), attention_forward
    one = rng.standard_normal((1, 1, 8)).astype(np.float32)
    # With one row the bug and the fix agree (which is how the bug survived) ...
    np.testing.assert_allclose(ref_forward(block, one, prefix_copy), ref_forward(block, one, column_slice_numpy),
                               rtol=1e-6, atol=1e-6)
    # ... with B > 1 and L > 1 they differ, and the GPU block follows the column slices.
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    fixed = ref_forward(block, x, column_slice_numpy)
    buggy = ref_forward(block, x, prefix_copy)
    np.testing.assert_allclose(fixed, block.forward_numpy(x), rtol=1e-6, atol=1e-6)
    assert np.abs(buggy - fixed).max() > 1e-2
    got = block.forward(x)
    np.testing.assert_allclose(got, fixed, rtol=1e-4, atol=1e-4)
    assert np.abs(got - buggy).max() > 1e-2


# ---- 2. the five-field conv uniform ----------------------------------------------------------------------

def test_conv_uniform_needs_five_fields(gpu):
    import wgpu

    rng = np.random.default_rng(2)
    b, t, c, k = 2, 6, 5, 3
    x = rng.standard_normal((b, t, c)).astype(np.float32)
    w = rng.standard_normal((k, c)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    bufs = [gpu.upload(a) for a in (x, w, bias)]
    y = gpu.storage(x.nbytes)
    try:
        # The bug: (seq_len, channels, kernel, batch) only, 16 bytes under a 20-byte struct.
        batch = gpu.batch()
        four = batch.uniform([("u", t), ("u", c), ("u", k), ("u", b)])
        with pytest.raises(wgpu.GPUValidationError, match="minimum"):
            batch.dispatch("conv1d_causal", "main", {0: four, 1: bufs[0], 2: bufs[1], 3: bufs[2], 4: y}, (1, 1, 1),
                           {"HAS_BIAS": True})
        batch.submit()
        # The fix: the block's recorder sends all five fields, and the conv is right for every batch row.
        batch = gpu.batch()
        so.record_conv1d(batch, bufs[0], bufs[1], bufs[2], y, b, t, c, k)
        batch.submit()
        np.testing.assert_allclose(gpu.read(y, np.float32, x.shape), conv1d_causal_numpy(x, w, bias),
                                   rtol=1e-5, atol=1e-5)
    finally:
        for buf in bufs + [y]:
            gpu.release(buf)


# ---- 3. the D x N x B scan grid -------------------------------------------------------------------------

def run_scan(gpu, args, grid):
    """The selective_scan kernel dispatched on a given grid (partials zeroed first, so gaps show as zeros)."""
    u, delta, a_log, b, c, d = args
    bsz, length, dim = u.shape
    n = a_log.shape[1]
    bufs = [gpu.upload(a) for a in args]
    part, state, y = gpu.storage(bsz * length * dim * n * 4), gpu.storage(bsz * dim * n * 4), gpu.storage(u.nbytes)
    try:
        batch = gpu.batch()
        batch.clear(part)
        batch.clear(state)
        params = batch.uniform([("u", length), ("u", n), ("u", dim), ("u", bsz), ("u", 0), ("u", length),
                                ("u", 0), ("u", 0)])
        batch.dispatch("selective_scan", "scan", {0: params, 1: bufs[0], 2: bufs[1], 3: bufs[2], 4: bufs[3],
                                                  5: bufs[4], 9: part, 10: state}, grid)
        batch.dispatch("selective_scan", "reduce", {0: params, 1: bufs[0], 6: bufs[5], 7: bufs[0], 8: y, 9: part},
                       (-(-bsz * length * dim // 256), 1, 1))
        batch.submit()
        return gpu.read(y, np.float32, u.shape)
    finally:
        for buf in bufs + [part, state, y]:
            gpu.release(buf)


def test_scan_grid_covers_every_channel_state_and_batch_row(gpu):
    rng = np.random.default_rng(3)
    bsz, length, dim, n = 3, 20, 16, 16
    args = [(rng.standard_normal(s) * sc).astype(np.float32) for s, sc in
            (((bsz, length, dim), 1), ((bsz, length, dim), 1), ((dim, n), 0.5), ((bsz, length, n), 1),
             ((bsz, length, n), 1), ((dim,), 1))]
    want = selective_scan_numpy(*args)
    # The bug: ceil(D/8) x ceil(N/8) workgroups, each scanning one (d, n): most states never run.
    buggy = run_scan(gpu, args, (-(-dim // 8), -(-n // 8), bsz))
    assert np.abs(buggy - want).max() > 1e-2
    # A grid without the batch axis leaves every row but the first unscanned.
    one_row = run_scan(gpu, args, (dim, n, 1))
    np.testing.assert_allclose(one_row[0], want[0], rtol=1e-5, atol=1e-5)
    assert np.abs(one_row[1:] - want[1:]).max() > 1e-2
    # The fix, as record_selective_scan dispatches it.
    np.testing.assert_allclose(run_scan(gpu, args, (dim, n, bsz)), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(so.selective_scan(*args), want, rtol=1e-5, atol=1e-5)
