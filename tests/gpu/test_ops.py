"""Parity of every WGSL kernel with its numpy twin, on whatever adapter wgpu finds.

Shapes are small (software Vulkan runs about 0.2 GFLOP/s) and include sizes that are not multiples of
the kernels' tiles. Each test states its tolerance; every test skips only when no adapter exists.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu import ops
from evermind_memory.training.optim import AdamWStep

GPU_SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                        suppress_health_check=[HealthCheck.function_scoped_fixture])


def f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---- matmul / linear: tolerance |gpu - float64| <= 1e-5 * sqrt(K) * 4 + 1e-5 * |ref| -------------------

def _close_matmul(got: np.ndarray, ref64: np.ndarray, k: int) -> None:
    np.testing.assert_allclose(got, ref64, rtol=1e-5, atol=4e-5 * max(k, 1) ** 0.5)


@GPU_SETTINGS
@given(m=st.integers(1, 150), n=st.integers(1, 150), k=st.integers(1, 140),
       trans_a=st.booleans(), trans_b=st.booleans(), with_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_matmul_matches_twin_on_any_shape(gpu, m, n, k, trans_a, trans_b, with_bias, seed):
    rng = np.random.default_rng(seed)
    a = f32(rng, *((k, m) if trans_a else (m, k)))
    b = f32(rng, *((n, k) if trans_b else (k, n)))
    bias = f32(rng, n) if with_bias else None
    got = ops.matmul(a, b, trans_a=trans_a, trans_b=trans_b, bias=bias)
    ref = ops.matmul_numpy(a.astype(np.float64), b.astype(np.float64), trans_a=trans_a, trans_b=trans_b,
                           bias=None if bias is None else bias.astype(np.float64))
    assert got.shape == (m, n) and got.dtype == np.float32
    _close_matmul(got, ref, k)


@pytest.mark.parametrize("m,n,k", [(4, 4, 4), (128, 128, 8), (132, 260, 36), (200, 8, 516)])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_vec4_matmul_path_matches_twin(gpu, m, n, k, trans_a, trans_b):
    # Multiples of 4 take the register-blocked vec4 kernel; edges of its 128x128 tile are covered too.
    rng = np.random.default_rng(m * 7 + n + k)
    a = f32(rng, *((k, m) if trans_a else (m, k)))
    b = f32(rng, *((n, k) if trans_b else (k, n)))
    bias = f32(rng, n)
    got = ops.matmul(a, b, trans_a=trans_a, trans_b=trans_b, bias=bias)
    ref = ops.matmul_numpy(a.astype(np.float64), b.astype(np.float64), trans_a=trans_a, trans_b=trans_b,
                           bias=bias.astype(np.float64))
    _close_matmul(got, ref, k)


def test_general_and_vec4_kernels_agree(gpu):
    rng = np.random.default_rng(5)
    a, b = f32(rng, 68, 44), f32(rng, 44, 132)
    outs = []
    for vec4 in (False, True):
        batch = gpu.batch()
        a_buf, b_buf, c_buf = gpu.upload(a), gpu.upload(b), gpu.storage(68 * 132 * 4)
        ops.record_matmul(batch, a_buf, b_buf, c_buf, 68, 132, 44, vec4=vec4)
        batch.submit()
        outs.append(gpu.read(c_buf, np.float32, (68, 132)))
        for buf in (a_buf, b_buf, c_buf):
            gpu.release(buf)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-4)
    _close_matmul(outs[1], a.astype(np.float64) @ b.astype(np.float64), 44)


def test_matmul_tiles_work_larger_than_one_binding(gpu):
    # A 64 KiB binding limit forces M, N and K tiling (with on-device accumulation over K).
    rng = np.random.default_rng(11)
    a, b, bias = f32(rng, 300, 90), f32(rng, 90, 210), f32(rng, 210)
    with gpu.binding_limit(64 * 1024):
        got = ops.matmul(a, b, bias=bias)
        got_t = ops.matmul(a.T.copy(), b.T.copy(), trans_a=True, trans_b=True)
    _close_matmul(got, a.astype(np.float64) @ b + bias, 90)
    _close_matmul(got_t, a.astype(np.float64) @ b, 90)


def test_matmul_with_empty_inner_dimension_is_bias(gpu):
    bias = np.arange(3, dtype=np.float32)
    got = ops.matmul(np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32), bias=bias)
    np.testing.assert_array_equal(got, np.tile(bias, (2, 1)))


def test_linear_and_its_backward_match_twins(gpu):
    # tolerance: as matmul; db (a column sum over 37 rows) within 1e-5 relative.
    rng = np.random.default_rng(3)
    x, w, b, dy = f32(rng, 37, 29), f32(rng, 29, 45), f32(rng, 45), f32(rng, 37, 45)
    _close_matmul(ops.linear(x, w, b), ops.linear_numpy(x.astype(np.float64), w, b), 29)
    got = ops.linear_backward(x, w, dy)
    ref = ops.linear_backward_numpy(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
    for g, r, k in zip(got, ref, (45, 37, 37)):
        assert g.dtype == np.float32
        _close_matmul(g, r, k)


def test_column_sum_tiles_rows(gpu):
    rng = np.random.default_rng(4)
    x = f32(rng, 1000, 70)
    with gpu.binding_limit(4096):
        got = ops.column_sum(x)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(0), rtol=1e-5, atol=1e-4)


# ---- depthwise causal conv1d: tolerance 1e-5 ---------------------------------------------------------------

@GPU_SETTINGS
@given(b=st.integers(1, 3), t=st.integers(1, 19), c=st.integers(1, 70), k=st.integers(1, 5),
       with_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_conv1d_forward_and_backward_match_twins(gpu, b, t, c, k, with_bias, seed):
    rng = np.random.default_rng(seed)
    x, w, dy = f32(rng, b, t, c), f32(rng, k, c), f32(rng, b, t, c)
    bias = f32(rng, c) if with_bias else None
    np.testing.assert_allclose(ops.conv1d_causal(x, w, bias), ops.conv1d_causal_numpy(x, w, bias),
                               rtol=1e-5, atol=1e-5)
    for g, r in zip(ops.conv1d_causal_backward(x, w, dy), ops.conv1d_causal_backward_numpy(x, w, dy)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-4)


def test_conv1d_is_causal(gpu):
    rng = np.random.default_rng(8)
    x, w = f32(rng, 1, 12, 5), f32(rng, 3, 5)
    y = ops.conv1d_causal(x, w)
    x2 = x.copy()
    x2[:, 7:] += 100.0  # change the future only
    np.testing.assert_array_equal(ops.conv1d_causal(x2, w)[:, :7], y[:, :7])


def test_conv1d_backward_tiles_the_batch(gpu):
    rng = np.random.default_rng(9)
    x, w, dy = f32(rng, 6, 10, 16), f32(rng, 4, 16), f32(rng, 6, 10, 16)
    with gpu.binding_limit(1024):  # one sequence (640 bytes) per tile
        got = ops.conv1d_causal_backward(x, w, dy)
    for g, r in zip(got, ops.conv1d_causal_backward_numpy(x, w, dy)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-4)


# ---- RMSNorm: tolerance 2e-5 -------------------------------------------------------------------------------

@GPU_SETTINGS
@given(rows=st.integers(1, 40), c=st.integers(1, 200), lead3d=st.booleans(), seed=st.integers(0, 2**16))
def test_rmsnorm_forward_and_backward_match_twins(gpu, rows, c, lead3d, seed):
    rng = np.random.default_rng(seed)
    shape = (2, rows, c) if lead3d else (rows, c)
    x, wt, dy = f32(rng, *shape, scale=3.0), f32(rng, c), f32(rng, *shape)
    np.testing.assert_allclose(ops.rmsnorm(x, wt, 1e-5), ops.rmsnorm_numpy(x, wt, 1e-5), rtol=2e-5, atol=2e-5)
    gdx, gdw = ops.rmsnorm_backward(x, wt, dy, 1e-5)
    rdx, rdw = ops.rmsnorm_backward_numpy(x.astype(np.float64), wt.astype(np.float64), dy.astype(np.float64), 1e-5)
    assert gdx.shape == shape and gdw.shape == (c,)
    np.testing.assert_allclose(gdx, rdx, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(gdw, rdw, rtol=2e-5, atol=2e-5 * np.sqrt(x.size / c))


# ---- activations (against the float64 twin): relu exact; silu/gelu 2e-6 absolute + 1e-5 relative ---

@pytest.mark.parametrize("kind", ["relu", "silu", "gelu"])
def test_activations_and_backward_match_twins(gpu, kind):
    rng = np.random.default_rng(12)
    x = f32(rng, 3, 7, 301, scale=4.0)
    x[0, 0, :5] = [0.0, -0.0, 80.0, -80.0, 1e-30]  # zero, saturation and tiny values
    dy = f32(rng, 3, 7, 301)
    fwd, bwd = getattr(ops, kind), getattr(ops, kind + "_backward")
    fwd_np, bwd_np = getattr(ops, kind + "_numpy"), getattr(ops, kind + "_backward_numpy")
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    tol = dict(rtol=0, atol=0) if kind == "relu" else dict(rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(fwd(x), fwd_np(x64), **tol)
    np.testing.assert_allclose(bwd(x, dy), bwd_np(x64, dy64), **tol)
    assert np.isfinite(fwd(x)).all() and np.isfinite(bwd(x, dy)).all()


# ---- softmax and cross-entropy: 1e-6 absolute on probabilities and gradients, 1e-5 relative on the loss ----

@GPU_SETTINGS
@given(n=st.integers(1, 30), v=st.integers(1, 700), seed=st.integers(0, 2**16))
def test_softmax_matches_twin(gpu, n, v, seed):
    rng = np.random.default_rng(seed)
    x = f32(rng, n, v, scale=5.0)
    got = ops.softmax(x)
    np.testing.assert_allclose(got, ops.softmax_numpy(x.astype(np.float64)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)


@GPU_SETTINGS
@given(n=st.integers(1, 30), v=st.integers(2, 600), masked=st.booleans(), seed=st.integers(0, 2**16))
def test_cross_entropy_matches_twin(gpu, n, v, masked, seed):
    rng = np.random.default_rng(seed)
    logits = f32(rng, n, v, scale=4.0)
    targets = rng.integers(0, v, n)
    valid = rng.random(n) < 0.7 if masked else None
    if valid is not None:
        targets[~valid] = -1  # padded rows may hold anything
    loss, grad = ops.cross_entropy(logits, targets, valid)
    rloss, rgrad = ops.cross_entropy_numpy(logits.astype(np.float64), targets, valid)
    assert loss == pytest.approx(rloss, rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(grad, rgrad, rtol=1e-5, atol=1e-6)
    if valid is not None:
        assert not grad[~valid].any()


# ---- embedding gather (exact) and scatter-add (1e-5), MoE routing/dispatch/combine (1e-6) ------------------

@GPU_SETTINGS
@given(v=st.integers(1, 50), c=st.integers(1, 40), n=st.integers(0, 80), seed=st.integers(0, 2**16))
def test_embedding_gather_and_scatter_add_match_twins(gpu, v, c, n, seed):
    rng = np.random.default_rng(seed)
    table, ids = f32(rng, v, c), rng.integers(0, v, (n,))
    dy = f32(rng, n, c)
    np.testing.assert_array_equal(ops.embedding_gather(table, ids), ops.embedding_gather_numpy(table, ids))
    np.testing.assert_allclose(ops.embedding_scatter_add(ids, dy, v),
                               ops.embedding_scatter_add_numpy(ids, dy.astype(np.float64), v), rtol=1e-5, atol=1e-5)


def test_embedding_ops_tile_the_vocabulary_and_rows(gpu):
    rng = np.random.default_rng(21)
    table, ids = f32(rng, 97, 24), rng.integers(0, 97, (4, 33))
    dy = f32(rng, 4, 33, 24)
    with gpu.binding_limit(1024):  # ten rows of 96 bytes per binding
        got = ops.embedding_gather(table, ids)
        dtab = ops.embedding_scatter_add(ids, dy, 97)
    np.testing.assert_array_equal(got, table[ids])
    np.testing.assert_allclose(dtab, ops.embedding_scatter_add_numpy(ids, dy.astype(np.float64), 97), atol=1e-5)


def test_scatter_add_is_deterministic(gpu):
    rng = np.random.default_rng(22)
    ids = rng.integers(0, 5, 400)  # heavy collisions
    dy = f32(rng, 400, 33)
    first = ops.embedding_scatter_add(ids, dy, 5)
    for _ in range(3):
        np.testing.assert_array_equal(ops.embedding_scatter_add(ids, dy, 5), first)


@GPU_SETTINGS
@given(n=st.integers(1, 90), e=st.integers(1, 64), data=st.data())
def test_moe_route_matches_twin(gpu, n, e, data):
    k = data.draw(st.integers(1, e))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    logits = f32(rng, n, e)
    if e > 2:
        logits[0, 1] = logits[0, 2] = 9.0  # a tie goes to the lower expert index
    idx, gates = ops.moe_route(logits, k)
    ridx, rgates = ops.moe_route_numpy(logits.astype(np.float64), k)
    np.testing.assert_array_equal(idx, ridx)
    np.testing.assert_allclose(gates, rgates, rtol=1e-5, atol=1e-6)


def test_moe_dispatch_and_combine_round_trip(gpu):
    # Route tokens to experts, dispatch, run a stand-in expert, combine, and backprop the combine.
    rng = np.random.default_rng(30)
    n, c, e, k = 57, 19, 6, 2
    x, logits, dout = f32(rng, n, c), f32(rng, n, e), f32(rng, n, c)
    idx, gates = ops.moe_route(logits, k)
    out_gpu = np.zeros((n, c), np.float32)
    out_np = np.zeros((n, c), np.float32)
    for ex in range(e):
        tok, slot = np.nonzero(idx == ex)
        xe = ops.moe_dispatch(x, tok)
        np.testing.assert_array_equal(xe, ops.moe_dispatch_numpy(x, tok))
        ye = np.tanh(xe * (ex + 1)).astype(np.float32)
        g = np.ascontiguousarray(gates[tok, slot])
        out_gpu = ops.moe_combine(out_gpu, ye, tok, g)
        out_np = ops.moe_combine_numpy(out_np, ye, tok, g)
        for got, ref in zip(ops.moe_combine_backward(dout, ye, tok, g),
                            ops.moe_combine_backward_numpy(dout, ye, tok, g)):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out_gpu, out_np, rtol=1e-5, atol=1e-6)


def test_moe_combine_rejects_repeated_rows(gpu):
    out = np.zeros((4, 3), np.float32)
    with pytest.raises(InvalidInput, match="repeat"):
        ops.moe_combine(out, np.ones((2, 3), np.float32), np.array([1, 1]), np.ones(2, np.float32))


# ---- column slice (exact) ----------------------------------------------------------------------------------

def test_column_slice_is_a_strided_gather(gpu):
    rng = np.random.default_rng(40)
    x = f32(rng, 13, 3 * 7)
    parts = [ops.column_slice(x, j * 7, 7) for j in range(3)]
    for j, part in enumerate(parts):
        np.testing.assert_array_equal(part, ops.column_slice_numpy(x, j * 7, 7))
    # The seed-001 bug: a prefix copy of the buffer is only right for one row.
    assert not np.array_equal(parts[0], x.reshape(-1)[: 13 * 7].reshape(13, 7))
    with pytest.raises(InvalidInput):
        ops.column_slice(x, 15, 7)


# ---- AdamW against training.optim.adamw_update_: rtol 1e-5 on parameters and moments -------------------------

def _hp(step: int, **kw) -> AdamWStep:
    lr, b1, b2 = kw.pop("lr", 1e-2), kw.pop("beta1", 0.9), kw.pop("beta2", 0.999)
    return AdamWStep(lr=lr, beta1=b1, beta2=b2, eps=kw.pop("eps", 1e-8), weight_decay=kw.pop("weight_decay", 0.0),
                     beta1_t=b1 ** step, beta2_t=b2 ** step, **kw)


@pytest.mark.parametrize("max_delta,weight_decay,grad_scale", [(0.0, 0.0, 1.0), (1e-3, 0.1, 0.5)])
def test_adamw_update_matches_twin_over_steps(gpu, max_delta, weight_decay, grad_scale):
    rng = np.random.default_rng(50)
    shape = (33, 17)
    p_gpu = f32(rng, *shape)
    p_np = p_gpu.copy()
    m_gpu, v_gpu = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    m_np, v_np = m_gpu.copy(), v_gpu.copy()
    for step in range(1, 4):
        g = f32(rng, *shape)
        hp = _hp(step, weight_decay=weight_decay, max_delta=max_delta, grad_scale=grad_scale)
        assert ops.adamw_update_(p_gpu, g, m_gpu, v_gpu, hp) is True
        assert ops.adamw_update_numpy(p_np, g, m_np, v_np, hp) is True
    np.testing.assert_allclose(p_gpu, p_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m_gpu, m_np, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(v_gpu, v_np, rtol=1e-5, atol=1e-9)


def test_adamw_trust_region_bounds_every_step(gpu):
    rng = np.random.default_rng(51)
    param = f32(rng, 300)
    before = param.copy()
    g = f32(rng, 300, scale=100.0)
    m, v = np.zeros(300, np.float32), np.zeros(300, np.float32)
    assert ops.adamw_update_(param, g, m, v, _hp(1, lr=0.5, max_delta=0.01)) is True
    assert np.abs(param - before).max() <= 0.01 + 1e-6


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_adamw_nan_guard_drops_the_whole_step(gpu, bad):
    rng = np.random.default_rng(52)
    param, g = f32(rng, 700), f32(rng, 700)
    g[513] = bad  # in a later tile too, when tiled
    m, v = f32(rng, 700, scale=0.1), np.abs(f32(rng, 700, scale=0.1))
    saved = [a.copy() for a in (param, m, v)]
    with gpu.binding_limit(1024):  # 256 elements per tile: the flag must cover every tile
        applied = ops.adamw_update_(param, g, m, v, _hp(3, weight_decay=0.1))
    assert applied is False
    assert ops.adamw_update_numpy(*[a.copy() for a in saved[:1]], g, saved[1].copy(), saved[2].copy(),
                                  _hp(3, weight_decay=0.1)) is False
    for got, ref in zip((param, m, v), saved):
        np.testing.assert_array_equal(got, ref)


def test_adamw_tiled_matches_untiled(gpu):
    rng = np.random.default_rng(53)
    p1, g = f32(rng, 1000), f32(rng, 1000)
    m1, v1 = np.zeros(1000, np.float32), np.zeros(1000, np.float32)
    p2, m2, v2 = p1.copy(), m1.copy(), v1.copy()
    ops.adamw_update_(p1, g, m1, v1, _hp(1))
    with gpu.binding_limit(1024):
        ops.adamw_update_(p2, g, m2, v2, _hp(1))
    np.testing.assert_array_equal(p1, p2)


# ---- input checks ----------------------------------------------------------------------------------------------

def test_ops_reject_wrong_dtype_shape_and_layout(gpu):
    a = np.ones((4, 3), np.float32)
    with pytest.raises(InvalidInput, match="float32"):
        ops.matmul(a.astype(np.float64), a.T.copy())
    with pytest.raises(InvalidInput, match="C-contiguous"):
        ops.matmul(a, np.ones((5, 3), np.float32).T)
    with pytest.raises(InvalidInput, match="inner dimensions"):
        ops.matmul(a, a)
    with pytest.raises(InvalidInput, match=r"\[0, 4\)"):
        ops.embedding_gather(a, np.array([0, 4]))
    with pytest.raises(InvalidInput, match=r"\(K, C\)"):
        ops.conv1d_causal(np.ones((1, 4, 3), np.float32), np.ones((2, 4), np.float32))
    with pytest.raises(InvalidInput, match="shape"):
        ops.adamw_update_(a, a, a.copy(), np.zeros((3, 4), np.float32), _hp(1))
    with pytest.raises(InvalidInput):
        ops.moe_route(np.ones((2, 3), np.float32), 4)
