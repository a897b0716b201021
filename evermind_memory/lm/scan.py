"""Numpy references of the sequence blocks' kernels: scans (Mamba-1 selective scan, Mamba-2 SSD, Mamba-3
complex SSD) and causal attention. lm/sequence.py builds the blocks on them; gpu/blocks tests its WGSL twins
against them. Shapes as in sequence.py. Scans run chunk by chunk with the closed form inside a chunk, never
step by step.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "softplus_numpy",
    "linear_scan_numpy",
    "selective_scan_numpy",
    "selective_scan_backward_numpy",
    "ssd_numpy",
    "complex_ssd_numpy",
    "causal_attention_numpy",
]

A_LOG_MIN, A_LOG_MAX = -10.0, 5.0  # the Mamba-1 log-decay clamp: keeps exp(dt a) strictly inside (0, 1)
_SCAN_CHUNK = 16  # steps per closed-form chunk in linear_scan_numpy (memory grows with its square)


def softplus_numpy(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)) without overflow, in x's dtype."""
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # (...) never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def silu(x: np.ndarray) -> np.ndarray:
    return x * _sigmoid(x)


def _expm1_over(z: np.ndarray) -> np.ndarray:
    """expm1(z) / z for real or complex z, 1 at z = 0 (a series near 0, as the kernels use)."""
    small = np.abs(z) < 0.1
    zs = np.where(small, z, 0)  # (...)
    series = 1 + zs * (1 / 2 + zs * (1 / 6 + zs * (1 / 24 + zs * (1 / 120 + zs / 720))))  # (...)
    zl = np.where(small, 1, z)  # (...) no division by zero below
    return np.where(small, series, np.expm1(zl) / zl)


def linear_scan_numpy(log_a: np.ndarray, x: np.ndarray, h0: np.ndarray | None = None,
                      chunk: int = _SCAN_CHUNK) -> np.ndarray:
    """Every state of h_t = exp(log_a_t) * h_{t-1} + x_t along axis 1 (real or complex).

    Inside a chunk of Q steps, h_t = sum_{s<=t} exp(sum_{s<r<=t} log_a_r) x_s + exp(sum_{r<=t} log_a_r) h_in,
    with the segment sums taken as differences of a cumulative sum; chunks follow one another.

    Args:
        log_a: (B, L, ...) log decays, broadcastable against x's trailing axes.
        x: (B, L, ...) inputs.
        h0: optional (B, ...) state before t = 0 (zeros by default).
        chunk: steps per closed-form chunk.

    Returns:
        (B, L, ...) states h_1..h_L, in the common dtype of log_a and x.
    """
    b, length = x.shape[:2]
    trail = np.broadcast_shapes(log_a.shape[2:], x.shape[2:])
    dtype = np.result_type(log_a.dtype, x.dtype)
    out = np.empty((b, length) + trail, dtype=dtype)  # (B, L, ...)
    h = np.zeros((b,) + trail, dtype=dtype) if h0 is None else h0.astype(dtype)  # (B, ...)
    for c0 in range(0, length, chunk):  # loop over chunks, not positions
        c1 = min(length, c0 + chunk)
        cum = np.cumsum(log_a[:, c0:c1], axis=1)  # (B, Q, ...)
        seg = cum[:, :, None] - cum[:, None, :]  # (B, Q, Q, ...) sum over s < r <= t
        q = c1 - c0
        causal = np.tril(np.ones((q, q), dtype=bool)).reshape((1, q, q) + (1,) * (seg.ndim - 3))
        w = np.exp(np.where(causal, seg, -np.inf))  # (B, Q, Q, ...) zero above the diagonal
        local = np.sum(w * x[:, None, c0:c1], axis=2)  # (B, Q, ...)
        out[:, c0:c1] = local + np.exp(cum) * h[:, None]
        h = out[:, c1 - 1]
    return out


def _scan_terms(u, delta, a_log, b):
    """Shared pieces of the selective scan: dt, a, dt*a, the ZOH input factor and the input term."""
    dt = softplus_numpy(delta)  # (B, L, D)
    a = -np.exp(np.clip(a_log, A_LOG_MIN, A_LOG_MAX))  # (D, N)
    za = dt[..., None] * a  # (B, L, D, N)
    coef = dt[..., None] * _expm1_over(za)  # (B, L, D, N) = (exp(dt a) - 1) / a
    bu = b[:, :, None, :] * u[..., None]  # (B, L, D, N)
    return dt, a, za, coef, bu


def selective_scan_numpy(u: np.ndarray, delta: np.ndarray, a_log: np.ndarray, b: np.ndarray, c: np.ndarray,
                         d: np.ndarray, z: np.ndarray | None = None) -> np.ndarray:
    """The Mamba-1 (S6) scan with exact zero-order-hold discretisation (twin of the GPU `selective_scan`).

    dt = softplus(delta), a = -exp(clip(a_log, -10, 5)), h_t = exp(dt a) h_{t-1} + (exp(dt a) - 1)/a B_t u_t,
    y_t = C_t . h_t + d u_t, times silu(z_t) when z is given.

    Args:
        u: (B, L, D) input after conv and SiLU.
        delta: (B, L, D) time steps before softplus.
        a_log: (D, N) log decay rates.
        b: (B, L, N) input projection.
        c: (B, L, N) output projection.
        d: (D,) skip scale.
        z: optional (B, L, D) gate.

    Returns:
        (B, L, D), the inputs' dtype.
    """
    _, _, za, coef, bu = _scan_terms(u, delta, a_log, b)
    hs = linear_scan_numpy(za, coef * bu)  # (B, L, D, N)
    y = np.einsum("bldn,bln->bld", hs, c) + d * u  # (B, L, D)
    if z is not None:
        y = y * z * _sigmoid(z)  # (B, L, D)
    return y


def selective_scan_backward_numpy(u: np.ndarray, delta: np.ndarray, a_log: np.ndarray, b: np.ndarray,
                                  c: np.ndarray, d: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, ...]:
    """Gradients of the ungated selective scan's output (twin of the GPU `selective_scan_backward`).

    Args:
        u, delta, a_log, b, c, d: the forward inputs (see `selective_scan_numpy`).
        dy: (B, L, D) gradient of y.

    Returns:
        (du (B, L, D), ddelta (B, L, D), da_log (D, N), db (B, L, N), dc (B, L, N), dd (D,)).
    """
    dt, a, za, coef, bu = _scan_terms(u, delta, a_log, b)
    hs = linear_scan_numpy(za, coef * bu)  # (B, L, D, N)
    h_prev = np.concatenate([np.zeros_like(hs[:, :1]), hs[:, :-1]], axis=1)  # (B, L, D, N)
    # dL/dh_t = C_t dy_t + exp(dt_{t+1} a) dL/dh_{t+1}: the same scan run backwards in time.
    za_next = np.concatenate([za[:, 1:], np.zeros_like(za[:, :1])], axis=1)  # (B, L, D, N)
    src = c[:, :, None, :] * dy[..., None]  # (B, L, D, N)
    gh = linear_scan_numpy(za_next[:, ::-1], src[:, ::-1])[:, ::-1]  # (B, L, D, N)
    ea = np.exp(za)  # (B, L, D, N)
    dc = np.einsum("bldn,bld->bln", hs, dy)  # (B, L, N)
    db = np.einsum("bldn,bld->bln", gh * coef, u)  # (B, L, N)
    du = np.einsum("bldn,bln->bld", gh * coef, b) + d * dy  # (B, L, D)
    ddelta = np.sum(gh * ea * (a * h_prev + bu), axis=-1) * _sigmoid(delta)  # (B, L, D)
    inside = (a_log > A_LOG_MIN) & (a_log < A_LOG_MAX)  # (D, N) the clamp passes no gradient outside
    dt4 = dt[..., None]  # (B, L, D, 1)
    da_log = np.sum(gh * (dt4 * ea * a * h_prev + (dt4 * ea - coef) * bu), axis=(0, 1)) * inside  # (D, N)
    dd = np.sum(dy * u, axis=(0, 1))  # (D,)
    return du, ddelta, da_log.astype(u.dtype), db, dc, dd


def _group_of_head(n_heads: int, n_groups: int) -> np.ndarray:
    return np.arange(n_heads) * n_groups // n_heads  # (H,) heads share B/C groups in order


def ssd_numpy(x: np.ndarray, dt: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray, b: np.ndarray,
              c: np.ndarray, d: np.ndarray, *, n_groups: int = 1, chunk_len: int = 64) -> np.ndarray:
    """The Mamba-2 scan with one scalar decay per head (twin of the GPU `ssd`).

    a_t = exp(-softplus(a_log[h]) softplus(dt + dt_bias[h])), S_t = a_t S_{t-1} + B_t x_t^T (N x P per head),
    y_t = C_t^T S_t + d[h] x_t. Head h reads B/C group h * G // H.

    Args:
        x: (B, L, H * P) scan input.
        dt: (B, L, H) time steps before bias and softplus.
        a_log: (H,) decay rates (through softplus).
        dt_bias: (H,).
        b: (B, L, G * N).
        c: (B, L, G * N).
        d: (H,) skip scale.
        n_groups: G.
        chunk_len: the GPU op's chunk length; it does not change the result (kept for the same signature).

    Returns:
        (B, L, H * P), the inputs' dtype.
    """
    del chunk_len
    bsz, length, dim = x.shape
    heads = a_log.shape[0]
    p = dim // heads
    n = b.shape[-1] // n_groups
    grp = _group_of_head(heads, n_groups)
    step = softplus_numpy(dt + dt_bias)  # (B, L, H)
    log_a = -softplus_numpy(a_log) * step  # (B, L, H)
    bh = b.reshape(bsz, length, n_groups, n)[:, :, grp]  # (B, L, H, N)
    ch = c.reshape(bsz, length, n_groups, n)[:, :, grp]  # (B, L, H, N)
    xh = x.reshape(bsz, length, heads, p)  # (B, L, H, P)
    hs = linear_scan_numpy(log_a[..., None, None], bh[..., None] * xh[..., None, :])  # (B, L, H, N, P)
    y = np.einsum("blhnp,blhn->blhp", hs, ch) + d[:, None] * xh  # (B, L, H, P)
    return y.reshape(bsz, length, dim)


def complex_ssd_numpy(x: np.ndarray, dt: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray, b: np.ndarray,
                      c: np.ndarray, d: np.ndarray, *, n_groups: int = 1, chunk_len: int = 64) -> np.ndarray:
    """The Mamba-3 scan with complex states and exact zero-order hold (twin of the GPU `complex_ssd`).

    A = a_log[h, 0] + i a_log[h, 1], dt = softplus(dt_raw + dt_bias[h]), S_t = exp(dt A) S_{t-1} +
    (exp(dt A) - 1)/A B_t x_t^T, y_t = Re(C_t^T S_t) + d[h] x_t. B and C hold (re, im) pairs.

    Args:
        x: (B, L, H * P).
        dt: (B, L, H).
        a_log: (H, 2) (real part, imaginary part) of the continuous-time A.
        dt_bias: (H,).
        b: (B, L, G * Nc * 2).
        c: (B, L, G * Nc * 2).
        d: (H,).
        n_groups: G.
        chunk_len: the GPU op's chunk length; it does not change the result.

    Returns:
        (B, L, H * P), the inputs' (real) dtype.
    """
    del chunk_len
    bsz, length, dim = x.shape
    heads = a_log.shape[0]
    p = dim // heads
    nc = b.shape[-1] // (2 * n_groups)
    cdt = np.result_type(x.dtype, np.complex64)
    grp = _group_of_head(heads, n_groups)
    big_a = (a_log[:, 0] + 1j * a_log[:, 1]).astype(cdt)  # (H,)
    step = softplus_numpy(dt + dt_bias)  # (B, L, H)
    za = step * big_a  # (B, L, H)
    f = step * _expm1_over(za)  # (B, L, H) = (exp(dt A) - 1) / A
    bc = b.reshape(bsz, length, n_groups, nc, 2)  # (B, L, G, Nc, 2)
    cc = c.reshape(bsz, length, n_groups, nc, 2)  # (B, L, G, Nc, 2)
    bh = (bc[..., 0] + 1j * bc[..., 1]).astype(cdt)[:, :, grp]  # (B, L, H, Nc)
    ch = (cc[..., 0] + 1j * cc[..., 1]).astype(cdt)[:, :, grp]  # (B, L, H, Nc)
    xh = x.reshape(bsz, length, heads, p)  # (B, L, H, P)
    src = (f[..., None] * bh)[..., None] * xh[..., None, :]  # (B, L, H, Nc, P)
    hs = linear_scan_numpy(za[..., None, None], src)  # (B, L, H, Nc, P)
    y = np.einsum("blhnp,blhn->blhp", hs, ch).real + d[:, None] * xh  # (B, L, H, P)
    return y.reshape(bsz, length, dim).astype(x.dtype)


def causal_attention_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_heads: int) -> np.ndarray:
    """softmax(q k^T / sqrt(P), keys j <= i) v per head (twin of the GPU `causal_attention`).

    Args:
        q: (B, L, H * P) queries (heads side by side).
        k: (B, L, H * P) keys.
        v: (B, L, H * P) values.
        n_heads: H.

    Returns:
        (B, L, H * P), the inputs' dtype.
    """
    bsz, length, dim = q.shape
    p = dim // n_heads

    def heads(t: np.ndarray) -> np.ndarray:
        return t.reshape(bsz, length, n_heads, p).transpose(0, 2, 1, 3)  # (B, H, L, P)

    s = heads(q) @ heads(k).transpose(0, 1, 3, 2) / np.sqrt(p).astype(q.dtype)  # (B, H, L, L)
    future = np.triu(np.ones((length, length), dtype=bool), k=1)  # (L, L)
    s = np.where(future, -np.inf, s)  # (B, H, L, L)
    e = np.exp(s - s.max(axis=-1, keepdims=True))  # (B, H, L, L)
    probs = e / e.sum(axis=-1, keepdims=True)  # (B, H, L, L)
    o = probs @ heads(v)  # (B, H, L, P)
    return o.transpose(0, 2, 1, 3).reshape(bsz, length, dim).astype(q.dtype)
