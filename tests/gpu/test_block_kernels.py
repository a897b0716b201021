"""The sequence-mixing kernels (selective scan forward/backward, SSD, complex SSD, causal attention) against
their numpy twins, and the twins against plain step-by-step recurrences.

Shapes are small (software Vulkan) and include B > 1, L > 1, lengths that are not multiples of the scan
tile (64), the SSD chunk or the attention tiles (256 / lanes query rows and 32-128 keys in the flash kernel,
16 in the three-pass kernels), and binding limits lowered to force windowing.
Tolerances: |gpu - twin| <= 2e-5 + 2e-5 |twin| unless a test says otherwise (float32, short sums).
"""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.blocks import reference as ref
from evermind_memory.gpu.blocks import sequence_ops as so

RTOL, ATOL = 2e-5, 2e-5


def f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def scan_inputs(rng, b, length, d, n):
    return (f32(rng, b, length, d), f32(rng, b, length, d), f32(rng, d, n, scale=0.7), f32(rng, b, length, n),
            f32(rng, b, length, n), f32(rng, d))


# ---- the twins against step-by-step recurrences (float64) -----------------------------------------------

def selective_scan_steps(u, delta, a_log, b, c, d):
    dt = ref.softplus_numpy(delta)
    a = -np.exp(np.clip(a_log, -10, 5))
    h = np.zeros((u.shape[0],) + a.shape)
    ys = []
    for t in range(u.shape[1]):  # a test may walk time step by step
        ea = np.exp(dt[:, t, :, None] * a)
        h = ea * h + (ea - 1) / a * b[:, t, None, :] * u[:, t, :, None]
        ys.append((h * c[:, t, None, :]).sum(-1) + d * u[:, t])
    return np.stack(ys, axis=1)


def ssd_steps(x, dt, a_log, dt_bias, b, c, d, n_groups, complex_):
    bsz, length, dim = x.shape
    heads = a_log.shape[0]
    p = dim // heads
    grp = np.arange(heads) * n_groups // heads
    xh = x.reshape(bsz, length, heads, p)
    step = ref.softplus_numpy(dt + dt_bias)
    if complex_:
        big_a = a_log[:, 0] + 1j * a_log[:, 1]
        bb = b.reshape(bsz, length, n_groups, -1, 2)
        cc = c.reshape(bsz, length, n_groups, -1, 2)
        bb, cc = (bb[..., 0] + 1j * bb[..., 1])[:, :, grp], (cc[..., 0] + 1j * cc[..., 1])[:, :, grp]
    else:
        bb = b.reshape(bsz, length, n_groups, -1)[:, :, grp]
        cc = c.reshape(bsz, length, n_groups, -1)[:, :, grp]
    h = np.zeros((bsz, heads, bb.shape[-1], p), dtype=complex if complex_ else float)
    ys = []
    for t in range(length):
        if complex_:
            a = np.exp(step[:, t] * big_a)
            inp = ((a - 1) / big_a)[..., None] * bb[:, t]
        else:
            a = np.exp(-ref.softplus_numpy(a_log) * step[:, t])
            inp = bb[:, t]
        h = a[..., None, None] * h + inp[..., None] * xh[:, t, :, None, :]
        ys.append(np.einsum("bhnp,bhn->bhp", h, cc[:, t]).real + d[:, None] * xh[:, t])
    return np.stack(ys, axis=1).reshape(bsz, length, dim)


def test_linear_scan_twin_matches_a_step_loop_across_chunks():
    rng = np.random.default_rng(1)
    log_a = -np.abs(rng.standard_normal((2, 37, 3)))
    x = rng.standard_normal((2, 37, 3))
    h0 = rng.standard_normal((2, 3))
    h, want = h0.copy(), []
    for t in range(37):
        h = np.exp(log_a[:, t]) * h + x[:, t]
        want.append(h)
    np.testing.assert_allclose(ref.linear_scan_numpy(log_a, x, h0, chunk=5), np.stack(want, 1), rtol=1e-12)


def test_selective_scan_twin_matches_recurrence():
    rng = np.random.default_rng(2)
    args = [a.astype(np.float64) for a in scan_inputs(rng, 2, 23, 3, 4)]
    np.testing.assert_allclose(ref.selective_scan_numpy(*args), selective_scan_steps(*args), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("complex_", [False, True])
def test_ssd_twins_match_recurrence(complex_):
    rng = np.random.default_rng(3)
    bsz, length, heads, p, g, n = 2, 21, 4, 3, 2, 3
    x, dt = rng.standard_normal((bsz, length, heads * p)), rng.standard_normal((bsz, length, heads))
    a_log = rng.standard_normal((heads, 2)) * [0.5, 2.0] - [0.5, 0] if complex_ else rng.standard_normal(heads)
    width = g * n * (2 if complex_ else 1)
    b, c = rng.standard_normal((bsz, length, width)), rng.standard_normal((bsz, length, width))
    dt_bias, d = rng.standard_normal(heads), rng.standard_normal(heads)
    twin = ref.complex_ssd_numpy if complex_ else ref.ssd_numpy
    got = twin(x, dt, a_log, dt_bias, b, c, d, n_groups=g)
    np.testing.assert_allclose(got, ssd_steps(x, dt, a_log, dt_bias, b, c, d, g, complex_), rtol=1e-7, atol=1e-9)


def test_selective_scan_backward_twin_matches_finite_differences():
    rng = np.random.default_rng(4)
    args = [a.astype(np.float64) for a in scan_inputs(rng, 2, 5, 2, 2)]
    args[2][0, 1] = 6.0  # beyond the clamp: no gradient reaches this a_log entry
    w = rng.standard_normal((2, 5, 2))
    grads = ref.selective_scan_backward_numpy(*args, w)

    def loss(vals):
        return float(np.sum(ref.selective_scan_numpy(*vals) * w))

    eps = 1e-6
    for i, g in enumerate(grads):
        num = np.zeros_like(args[i])
        for idx in np.ndindex(args[i].shape):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            num[idx] = (loss(plus) - loss(minus)) / (2 * eps)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8, err_msg=f"gradient {i}")
    assert grads[2][0, 1] == 0.0


# ---- GPU kernels against the twins ----------------------------------------------------------------------

@pytest.mark.parametrize("b,length,d,n", [(1, 1, 1, 1), (2, 3, 5, 4), (3, 70, 6, 3), (2, 130, 4, 16)])
@pytest.mark.parametrize("gated", [False, True])
def test_selective_scan_matches_twin(gpu, b, length, d, n, gated):
    rng = np.random.default_rng(b * 1000 + length + d + n)
    args = scan_inputs(rng, b, length, d, n)
    z = f32(rng, b, length, d) if gated else None
    np.testing.assert_allclose(so.selective_scan(*args, z=z), ref.selective_scan_numpy(*args, z=z),
                               rtol=RTOL, atol=ATOL)


def test_selective_scan_carries_state_across_windows(gpu):
    # 32 KiB per binding holds a 64-step window of (B=2, D=8, N=8) partials: L = 150 needs three windows.
    rng = np.random.default_rng(6)
    args = scan_inputs(rng, 2, 150, 8, 8)
    with gpu.binding_limit(32768):
        got = so.selective_scan(*args)
    np.testing.assert_allclose(got, ref.selective_scan_numpy(*args), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("b,length,d,n,limit", [(2, 9, 3, 4, None), (1, 70, 5, 2, None), (1, 140, 4, 4, 16384)])
def test_selective_scan_backward_matches_twin(gpu, b, length, d, n, limit):
    # Tolerance 1e-4 relative to each gradient's largest entry (sums over time and state in float32).
    rng = np.random.default_rng(7 + length)
    args = scan_inputs(rng, b, length, d, n)
    dy = f32(rng, b, length, d)
    if limit is None:
        got = so.selective_scan_backward(*args, dy)
    else:
        with gpu.binding_limit(limit):  # 4 planes of 64 steps do not fit: several windows, walked backwards
            got = so.selective_scan_backward(*args, dy)
    want = ref.selective_scan_backward_numpy(*args, dy)
    for name, g, w in zip(("du", "ddelta", "da_log", "db", "dc", "dd"), got, want):
        assert g.shape == w.shape and g.dtype == np.float32, name
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * (np.abs(w).max() + 1e-3), err_msg=name)


def ssd_inputs(rng, b, length, heads, p, g, n, complex_):
    width = g * n * (2 if complex_ else 1)
    a_log = f32(rng, heads, 2) if complex_ else f32(rng, heads)
    if complex_:
        a_log[:, 0] = -np.abs(a_log[:, 0]) * 0.5
    return (f32(rng, b, length, heads * p), f32(rng, b, length, heads), a_log, f32(rng, heads),
            f32(rng, b, length, width), f32(rng, b, length, width), f32(rng, heads))


@pytest.mark.parametrize("complex_", [False, True])
@pytest.mark.parametrize("b,length,heads,p,g,n,chunk", [
    (1, 1, 1, 1, 1, 1, 64), (2, 19, 4, 3, 2, 5, 7), (3, 50, 2, 5, 1, 4, 16), (2, 33, 3, 70, 3, 2, 64),
])
def test_ssd_kernels_match_twins(gpu, complex_, b, length, heads, p, g, n, chunk):
    # chunk < L exercises the carry between chunks; p = 70 > 64 lanes exercises the lane loop.
    rng = np.random.default_rng(length * 7 + heads + int(complex_))
    args = ssd_inputs(rng, b, length, heads, p, g, n, complex_)
    op, twin = (so.complex_ssd, ref.complex_ssd_numpy) if complex_ else (so.ssd, ref.ssd_numpy)
    got = op(*args, n_groups=g, chunk_len=chunk)
    want = twin(*args, n_groups=g)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * (np.abs(want).max() + 1))


def test_ssd_result_does_not_depend_on_chunk_length(gpu):
    rng = np.random.default_rng(9)
    args = ssd_inputs(rng, 2, 40, 2, 3, 1, 4, False)
    outs = [so.ssd(*args, chunk_len=q) for q in (1, 3, 40, 64)]
    for out in outs[1:]:
        np.testing.assert_allclose(out, outs[0], rtol=1e-4, atol=1e-4)


# Flash attention (default lanes: 8 per row, 32 rows per workgroup for P <= 32; 4 and 64 above), keys staged
# 128 (P <= 16), 64 (P <= 32), 40 (P <= 48) or 32 (P <= 64) at a time. L = 1 and 17 are under one tile,
# 130 and 200 span several query and key tiles and are not multiples of either, 128 is an exact multiple;
# P = 5, 20 and 40 pad the head to a multiple of 16 dims (one, two or three 4 x 4 register blocks).
@pytest.mark.parametrize("b,length,heads,p", [
    (1, 1, 1, 1), (2, 17, 3, 5), (2, 40, 2, 20), (2, 130, 2, 32), (3, 128, 2, 32), (1, 200, 2, 64),
    (2, 150, 1, 40),
])
def test_causal_attention_matches_twin(gpu, b, length, heads, p):
    rng = np.random.default_rng(length + heads)
    q, k, v = (f32(rng, b, length, heads * p) for _ in range(3))
    np.testing.assert_allclose(so.causal_attention(q, k, v, heads), ref.causal_attention_numpy(q, k, v, heads),
                               rtol=RTOL, atol=ATOL)


def test_flash_attention_is_stable_for_large_scores(gpu):
    # Scores of several hundred: exp overflows float32 unless the running max is subtracted at every step,
    # and a late key that beats the max must rescale the sum and the accumulator correctly.
    rng = np.random.default_rng(13)
    q, k, v = (f32(rng, 2, 150, 64) for _ in range(3))
    q *= 30.0
    k[:, 140] *= 4.0
    got = so.causal_attention(q, k, v, 2)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref.causal_attention_numpy(q, k, v, 2), rtol=1e-4, atol=1e-4)


# Each query row's keys are split over `lanes` invocations (groups of 4 keys, lane n taking groups n,
# n + lanes, ...), each with its own running max, sum and accumulator, merged at the end; a workgroup of
# `threads` invocations holds threads / lanes rows and stages threads / (2 ceil(P / 16)) keys a tile. Lanes
# 1 and 2 make one lane sum several output columns in the merge; 16 and 64 leave lanes with no key in any
# tile (P = 64 stages 8 groups a tile at 256 threads, 2 at 64; L = 5 gives every row lanes that see
# nothing); P = 48 is three register blocks over a 40-key tile (480 of the 512 staging slots).
@pytest.mark.parametrize("threads,lanes", [(256, 1), (256, 2), (256, 4), (256, 8), (256, 16), (256, 64),
                                           (128, 4), (128, 16), (64, 8), (64, 64)])
@pytest.mark.parametrize("b,length,heads,p", [(2, 5, 2, 4), (2, 100, 2, 32), (1, 90, 1, 48), (2, 70, 1, 64)])
def test_flash_attention_lanes_merge_exactly(gpu, threads, lanes, b, length, heads, p):
    rng = np.random.default_rng(length + p)
    q, k, v = (f32(rng, b, length, heads * p) for _ in range(3))
    want = ref.causal_attention_numpy(q, k, v, heads)
    got = so.causal_attention(q, k, v, heads, threads=threads, lanes=lanes)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("lanes", [2, 8, 16])
def test_flash_attention_lane_merge_rescales_by_each_lanes_max(gpu, lanes):
    # Scores of several hundred: each lane's running max is far from the row's, so a lane partial merged
    # without its 2^(m_i - M) factor (or a sum merged without it) is off by orders of magnitude.
    rng = np.random.default_rng(15)
    q, k, v = (f32(rng, 2, 150, 64) for _ in range(3))
    q *= 30.0
    k[:, 77] *= 4.0
    got = so.causal_attention(q, k, v, 2, lanes=lanes)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref.causal_attention_numpy(q, k, v, 2), rtol=1e-4, atol=1e-4)


def test_flash_attention_rejects_shapes_it_does_not_have(gpu):
    rng = np.random.default_rng(16)
    q = f32(rng, 1, 8, 8)
    for lanes in (0, 3, 512):
        with pytest.raises(InvalidInput, match="power of two"):
            so.causal_attention(q, q, q, 2, lanes=lanes)
    with pytest.raises(InvalidInput, match="power of two"):
        so.causal_attention(q, q, q, 2, threads=64, lanes=128)
    with pytest.raises(InvalidInput, match="64, 128 or 256"):
        so.causal_attention(q, q, q, 2, threads=96)


def test_flash_attention_reads_a_fused_projection_in_place(gpu):
    # The attention block binds its (B * L, 3C) q | k | v projection three times with row stride 3C and
    # offsets 0, C, 2C: each head must come from its column slice of every row (seed-001), not a prefix.
    rng = np.random.default_rng(14)
    b, length, heads, p = 2, 70, 2, 32
    c = heads * p
    qkv = f32(rng, b, length, 3 * c)
    q, k, v = (np.ascontiguousarray(qkv[..., i * c:(i + 1) * c]) for i in range(3))
    buf, out = gpu.upload(qkv), gpu.storage(b * length * c * 4)
    try:
        batch = gpu.batch()
        so.record_causal_attention(batch, buf, buf, buf, out, b, length, heads, p, row_stride=3 * c,
                                   offsets=(0, c, 2 * c))
        batch.submit()
        got = gpu.read(out, np.float32, (b, length, c))
    finally:
        gpu.release(buf)
        gpu.release(out)
    np.testing.assert_allclose(got, ref.causal_attention_numpy(q, k, v, heads), rtol=RTOL, atol=ATOL)


def test_wide_heads_take_the_three_pass_kernels(gpu):
    # P = 66 > 64 does not fit the flash kernel's registers: scores, softmax and values in windows of query
    # rows. A binding limit of q's size holds 64 of the 100 score rows (B = 1, H = 2): two windows.
    rng = np.random.default_rng(10)
    q, k, v = (f32(rng, 1, 100, 2 * 66) for _ in range(3))
    with gpu.binding_limit(q.nbytes):
        got = so.causal_attention(q, k, v, 2)
    np.testing.assert_allclose(got, ref.causal_attention_numpy(q, k, v, 2), rtol=RTOL, atol=ATOL)


def test_causal_attention_ignores_the_future(gpu):
    rng = np.random.default_rng(11)
    q, k, v = (f32(rng, 1, 12, 4) for _ in range(3))
    k2, v2 = k.copy(), v.copy()
    k2[:, 7:] += 5.0
    v2[:, 7:] -= 3.0
    a, b = so.causal_attention(q, k, v, 2), so.causal_attention(q, k2, v2, 2)
    np.testing.assert_array_equal(a[:, :7], b[:, :7])
    assert np.abs(a[:, 7:] - b[:, 7:]).max() > 1e-3


def test_ops_reject_bad_inputs(gpu):
    rng = np.random.default_rng(12)
    u, delta, a_log, b, c, d = scan_inputs(rng, 2, 4, 3, 2)
    with pytest.raises(InvalidInput, match="float32"):
        so.selective_scan(u.astype(np.float64), delta, a_log, b, c, d)
    with pytest.raises(InvalidInput, match="shape"):
        so.selective_scan(u, delta, a_log, np.ascontiguousarray(b[:, :3]), c, d)
    with pytest.raises(InvalidInput, match="divisor"):
        so.causal_attention(u, u, u, 2)
    args = ssd_inputs(rng, 1, 4, 2, 2, 1, 65, False)
    with pytest.raises(InvalidInput, match="at most 64"):
        so.ssd(*args)
    with pytest.raises(InvalidInput, match="n_groups"):
        so.ssd(*ssd_inputs(rng, 1, 4, 3, 2, 1, 2, False), n_groups=2)
