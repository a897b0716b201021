"""Mixture-of-experts kernels: top-k routing, dispatch and combine (with backward), and the dense-gate
expert mix the resident model runs (gates, hidden layer, and their backward).
"""

from __future__ import annotations

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import get_device
from evermind_memory.gpu.ops.support import (
    MAX_EXPERTS,
    BufferScope,
    dispatch_1d,
    check_f32,
    check_fits,
    fold_groups,
    check_ids,
    check_shape,
    binding_tiles,
)
from evermind_memory.gpu.ops.embedding import gather_rows

__all__ = [
    "moe_route_numpy", "moe_route", "moe_dispatch_numpy", "moe_dispatch", "moe_combine_numpy", "moe_combine",
    "moe_combine_backward_numpy", "moe_combine_backward", "moe_gates_dense_numpy", "moe_gates_dense",
    "moe_gates_backward_numpy", "moe_gates_backward", "moe_hidden_numpy", "moe_hidden",
    "moe_hidden_backward_numpy", "moe_hidden_backward",
]


def moe_route_numpy(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Numpy twin of `moe_route`: (idx (N, k) int64 highest logit first, gates (N, k))."""
    idx = np.argsort(-logits, axis=1, kind="stable")[:, :k]  # (N, k)
    sel = np.take_along_axis(logits, idx, axis=1)  # (N, k)
    e = np.exp(sel - sel[:, :1])  # (N, k)
    return idx.astype(np.int64), e / e.sum(axis=1, keepdims=True)


def moe_route(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k expert routing on the GPU: the k largest router logits and a softmax over just those.

    Args:
        logits: float32 (N, E) router logits, E <= 64, all finite.
        k: experts per token, 1 <= k <= E.

    Returns:
        (idx (N, k) int64, experts by decreasing logit, ties to the lower index; gates (N, k) float32,
        each row summing to 1).

    Raises:
        InvalidInput: wrong dtype, rank or contiguity, E > 64, k out of range, or a non-finite logit.
        GpuUnavailable: no GPU device.
    """
    check_f32("logits", logits, 2)
    n, e = logits.shape
    if e > MAX_EXPERTS:
        raise InvalidInput(f"moe_route supports at most {MAX_EXPERTS} experts, got E = {e}")
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= e:
        raise InvalidInput(f"k must be an int in [1, E = {e}], got {k!r}")
    if not np.isfinite(logits).all():
        raise InvalidInput("router logits must be finite (NaN/Inf found); check the model's weights")
    dev = get_device()
    idx = np.empty((n, k), dtype=np.int64)  # (N, k)
    gates = np.empty((n, k), dtype=np.float32)  # (N, k)
    with BufferScope(dev) as s:
        for r0, r1 in binding_tiles(n, e * 4, dev, "row"):
            m = r1 - r0
            batch = dev.batch()
            i_buf, g_buf = s.empty(m * k * 4), s.empty(m * k * 4)
            params = batch.uniform([("u", m), ("u", e), ("u", int(k)), ("u", 0)])
            batch.dispatch("moe_route", "main", {0: params, 1: s.up(logits[r0:r1]), 2: i_buf, 3: g_buf},
                           fold_groups(dev, -(-m // 64)))
            batch.submit()
            idx[r0:r1] = dev.read(i_buf, np.int32, (m, k))
            gates[r0:r1] = dev.read(g_buf, np.float32, (m, k))
    return idx, gates


def moe_dispatch_numpy(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Numpy twin of `moe_dispatch`: x[rows] (R, C)."""
    return x[rows]


def moe_dispatch(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Gather the token rows routed to one expert on the GPU.

    Args:
        x: float32 (N, C) token activations.
        rows: integer (R,) token indices in [0, N).

    Returns:
        (R, C) float32.

    Raises:
        InvalidInput: wrong dtype, rank or contiguity, or a row index out of range.
        GpuUnavailable: no GPU device.
    """
    check_f32("x", x, 2)
    return gather_rows(x, check_ids("rows", rows, 1, 0, x.shape[0]))


def _check_combine(out: np.ndarray, ye: np.ndarray, rows: np.ndarray, gates: np.ndarray,
                   out_name: str) -> np.ndarray:
    check_f32(out_name, out, 2)
    check_f32("ye", ye, 2)
    check_f32("gates", gates, 1)
    r = ye.shape[0]
    if ye.shape[1] != out.shape[1]:
        raise InvalidInput(f"ye must be (R, C = {out.shape[1]}), got {ye.shape}")
    check_shape("gates", gates, (r,))
    rr = check_ids("rows", rows, 1, 0, out.shape[0])
    check_shape("rows", rr, (r,))
    if np.unique(rr).size != rr.size:
        raise InvalidInput("rows must not repeat a token within one expert (top-k picks distinct experts)")
    return rr


def moe_combine_numpy(out: np.ndarray, ye: np.ndarray, rows: np.ndarray, gates: np.ndarray) -> np.ndarray:
    """Numpy twin of `moe_combine`: a copy of out with out[rows] += gates[:, None] * ye."""
    res = out.copy()  # (N, C)
    res[rows] += gates[:, None] * ye
    return res


def moe_combine(out: np.ndarray, ye: np.ndarray, rows: np.ndarray, gates: np.ndarray) -> np.ndarray:
    """Add one expert's gated output back into its tokens' rows on the GPU.

    Args:
        out: float32 (N, C), the running MoE output (not modified).
        ye: float32 (R, C), the expert's output for its R tokens.
        rows: integer (R,), distinct token indices in [0, N).
        gates: float32 (R,), each token's gate for this expert.

    Returns:
        (N, C) float32: out with out[rows[r]] += gates[r] * ye[r].

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, a row out of range or repeated.
        GpuUnavailable: no GPU device.
    """
    rr = _check_combine(out, ye, rows, gates, "out")
    n, c = out.shape
    dev = get_device()
    res = out.copy()  # (N, C)
    if rr.size == 0 or c == 0:
        return res
    with BufferScope(dev) as s:
        for n0, n1 in binding_tiles(n, c * 4, dev, "output row"):
            sel_all = np.nonzero((rr >= n0) & (rr < n1))[0]  # (R_tile,)
            if sel_all.size == 0:
                continue
            o_buf = s.up(res[n0:n1])
            batch = dev.batch()
            for j0, j1 in binding_tiles(sel_all.size, c * 4, dev, "expert row"):
                sel = sel_all[j0:j1]
                params = batch.uniform([("u", sel.size), ("u", c), ("u", 0), ("u", 0)])
                dispatch_1d(batch, "moe_combine", "main",
                                {0: params, 1: s.up(ye[sel]), 2: s.up(rr[sel] - n0), 3: s.up(gates[sel]),
                                 4: o_buf}, sel.size * c)
            batch.submit()
            res[n0:n1] = dev.read(o_buf, np.float32, (n1 - n0, c))
    return res


def moe_combine_backward_numpy(dout: np.ndarray, ye: np.ndarray, rows: np.ndarray,
                               gates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numpy twin of `moe_combine_backward`: (dye (R, C), dgates (R,))."""
    d = dout[rows]  # (R, C)
    return gates[:, None] * d, np.sum(d * ye, axis=1)


def moe_combine_backward(dout: np.ndarray, ye: np.ndarray, rows: np.ndarray,
                         gates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of `moe_combine` for one expert on the GPU.

    Args:
        dout: float32 (N, C), gradient of the MoE output.
        ye: float32 (R, C), the expert's forward output.
        rows: integer (R,), distinct token indices in [0, N).
        gates: float32 (R,).

    Returns:
        (dye (R, C) = gates * dout[rows], dgates (R,) = rowwise dot(dout[rows], ye)), float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, a row out of range or repeated.
        GpuUnavailable: no GPU device.
    """
    rr = _check_combine(dout, ye, rows, gates, "dout")
    n, c = dout.shape
    r = rr.size
    dev = get_device()
    dye = np.zeros((r, c), dtype=np.float32)  # (R, C)
    dgates = np.zeros((r,), dtype=np.float32)  # (R,)
    if r == 0:
        return dye, dgates
    with BufferScope(dev) as s:
        for n0, n1 in binding_tiles(n, c * 4, dev, "gradient row"):
            sel_all = np.nonzero((rr >= n0) & (rr < n1))[0]  # (R_tile,)
            if sel_all.size == 0:
                continue
            d_buf = s.up(dout[n0:n1])
            for j0, j1 in binding_tiles(sel_all.size, c * 4, dev, "expert row"):
                sel = sel_all[j0:j1]
                m = sel.size
                batch = dev.batch()
                dye_buf, dg_buf = s.empty(m * c * 4), s.empty(m * 4)
                params = batch.uniform([("u", m), ("u", c), ("u", 0), ("u", 0)])
                batch.dispatch("moe_combine_backward", "main",
                               {0: params, 1: d_buf, 2: s.up(ye[sel]), 3: s.up(rr[sel] - n0),
                                4: s.up(gates[sel]), 5: dye_buf, 6: dg_buf}, fold_groups(dev, m))
                batch.submit()
                dye[sel] = dev.read(dye_buf, np.float32, (m, c))
                dgates[sel] = dev.read(dg_buf, np.float32, (m,))
    return dye, dgates

def _check_routing(idx: np.ndarray, gates: np.ndarray, n_experts: int) -> tuple[np.ndarray, int, int]:
    check_f32("gates", gates, 2)
    n, k = gates.shape
    rr = check_ids("idx", idx, 2, 0, n_experts)
    check_shape("idx", rr, (n, k))
    if n and k > 1 and (np.sort(rr, axis=1)[:, 1:] == np.sort(rr, axis=1)[:, :-1]).any():
        raise InvalidInput("idx must name distinct experts within a row (top-k picks distinct experts)")
    return rr, n, k


def moe_gates_dense_numpy(idx: np.ndarray, gates: np.ndarray, n_experts: int) -> np.ndarray:
    """Numpy twin of `moe_gates_dense`: (N, E + 1), column 0 = 1 (shared), 1 + idx[n, j] = gates[n, j]."""
    n = gates.shape[0]
    out = np.zeros((n, n_experts + 1), dtype=gates.dtype)  # (N, E + 1)
    out[:, 0] = 1
    np.put_along_axis(out, idx + 1, gates, axis=1)
    return out


def moe_gates_dense(idx: np.ndarray, gates: np.ndarray, n_experts: int) -> np.ndarray:
    """Top-k routing as a dense gate matrix on the GPU (shared expert in column 0 with gate 1).

    Args:
        idx: integer (N, k) chosen experts, distinct within a row, in [0, n_experts).
        gates: float32 (N, k) their gates.
        n_experts: E, routed experts.

    Returns:
        (N, E + 1) float32: column 0 is 1, column 1 + idx[n, j] is gates[n, j], the rest 0.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, an expert out of range or repeated in a row.
        GpuUnavailable: no GPU device.
    """
    rr, n, k = _check_routing(idx, gates, n_experts)
    dev = get_device()
    g = n_experts + 1
    if n == 0:
        return np.zeros((0, g), dtype=np.float32)
    check_fits(dev, n * g * 4, "moe_gates_dense")
    with BufferScope(dev) as s:
        batch = dev.batch()
        out = s.empty(n * g * 4)
        params = batch.uniform([("u", n), ("u", n_experts), ("u", k), ("u", 0)])
        batch.dispatch("moe_gates", "dense", {0: params, 1: s.up(rr), 2: s.up(gates), 3: out},
                       fold_groups(dev, -(-n // 64)))
        batch.submit()
        return dev.read(out, np.float32, (n, g))


def moe_gates_backward_numpy(dgmat: np.ndarray, idx: np.ndarray, gates: np.ndarray) -> np.ndarray:
    """Numpy twin of `moe_gates_backward`: dlogits (N, E) through the softmax over the chosen logits."""
    n, g = dgmat.shape
    dg = np.take_along_axis(dgmat, idx + 1, axis=1)  # (N, k)
    dot = np.einsum("nk,nk->n", gates, dg)  # (N,)
    dlogits = np.zeros((n, g - 1), dtype=dgmat.dtype)  # (N, E)
    np.put_along_axis(dlogits, idx, gates * (dg - dot[:, None]), axis=1)
    return dlogits


def moe_gates_backward(dgmat: np.ndarray, idx: np.ndarray, gates: np.ndarray) -> np.ndarray:
    """The router's logit gradient from the dense gate gradient, on the GPU.

    Args:
        dgmat: float32 (N, E + 1), gradient of the dense gate matrix (column 0, the shared expert, unused).
        idx: integer (N, k) chosen experts, distinct within a row.
        gates: float32 (N, k) their gates.

    Returns:
        (N, E) float32: gates_j (dg_j - sum_i gates_i dg_i) at the chosen experts, 0 elsewhere.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, an expert out of range or repeated in a row.
        GpuUnavailable: no GPU device.
    """
    check_f32("dgmat", dgmat, 2)
    n, g = dgmat.shape
    rr, _, k = _check_routing(idx, gates, g - 1)
    check_shape("gates", gates, (n, k))
    dev = get_device()
    if n == 0:
        return np.zeros((0, g - 1), dtype=np.float32)
    check_fits(dev, dgmat.nbytes, "moe_gates_backward")
    with BufferScope(dev) as s:
        batch = dev.batch()
        out = s.empty(n * (g - 1) * 4)
        params = batch.uniform([("u", n), ("u", g - 1), ("u", k), ("u", 0)])
        batch.dispatch("moe_gates", "backward", {0: params, 1: s.up(rr), 2: s.up(gates), 4: s.up(dgmat), 5: out},
                       fold_groups(dev, -(-n // 64)))
        batch.submit()
        return dev.read(out, np.float32, (n, g - 1))


def moe_hidden_numpy(pre: np.ndarray, gmat: np.ndarray, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """Numpy twin of `moe_hidden`: (h = relu(pre), hs = h * gate of each column's group)."""
    n, width = pre.shape
    h = np.maximum(pre, 0)  # (N, G*H)
    hs = (h.reshape(n, width // hidden, hidden) * gmat[:, :, None]).reshape(n, width)  # (N, G*H)
    return h, hs


def _check_hidden(name: str, arr: np.ndarray, gmat: np.ndarray, hidden: int) -> tuple[int, int]:
    check_f32(name, arr, 2)
    check_f32("gmat", gmat, 2)
    n, g = gmat.shape
    if not isinstance(hidden, (int, np.integer)) or hidden < 1:
        raise InvalidInput(f"hidden must be an int >= 1, got {hidden!r}")
    check_shape(name, arr, (n, g * int(hidden)))
    return n, g


def moe_hidden(pre: np.ndarray, gmat: np.ndarray, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """ReLU and gating of every expert's hidden layer at once, on the GPU.

    Args:
        pre: float32 (N, G * H), the stacked first-layer pre-activations (group g in columns [gH, (g+1)H)).
        gmat: float32 (N, G) gates per row and group.
        hidden: H, the hidden width of one expert.

    Returns:
        (h (N, G*H) = relu(pre), hs (N, G*H) = h times its group's gate), float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, or an input over one binding.
        GpuUnavailable: no GPU device.
    """
    n, g = _check_hidden("pre", pre, gmat, hidden)
    dev = get_device()
    if pre.size == 0:
        return pre.copy(), pre.copy()
    check_fits(dev, pre.nbytes, "moe_hidden")
    with BufferScope(dev) as s:
        batch = dev.batch()
        h_buf, hs_buf = s.up(pre), s.empty(pre.nbytes)
        params = batch.uniform([("u", n), ("u", g), ("u", int(hidden)), ("u", 0)])
        dispatch_1d(batch, "moe_hidden", "forward", {0: params, 1: h_buf, 2: s.up(gmat), 3: hs_buf}, pre.size)
        batch.submit()
        return dev.read(h_buf, np.float32, pre.shape), dev.read(hs_buf, np.float32, pre.shape)


def moe_hidden_backward_numpy(dhs: np.ndarray, h: np.ndarray, gmat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numpy twin of `moe_hidden_backward`: (dpre (N, G*H), dgmat (N, G))."""
    n, g = gmat.shape
    d3 = dhs.reshape(n, g, -1)  # (N, G, H)
    h3 = h.reshape(n, g, -1)  # (N, G, H)
    dgmat = np.einsum("ngh,ngh->ng", d3, h3)  # (N, G)
    dpre = np.where(h3 > 0, d3 * gmat[:, :, None], 0).reshape(dhs.shape)  # (N, G*H)
    return dpre.astype(dhs.dtype, copy=False), dgmat


def moe_hidden_backward(dhs: np.ndarray, h: np.ndarray, gmat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of `moe_hidden` on the GPU.

    Args:
        dhs: float32 (N, G*H), gradient of the gated hidden hs.
        h: float32 (N, G*H), the forward's relu output.
        gmat: float32 (N, G), the gates.

    Returns:
        (dpre (N, G*H) = gate * dhs where h > 0 else 0, dgmat (N, G) = per-group sums of dhs * h), float32.

    Raises:
        InvalidInput: wrong dtype, rank, contiguity or shapes, or an input over one binding.
        GpuUnavailable: no GPU device.
    """
    check_f32("gmat", gmat, 2)
    check_f32("dhs", dhs, 2)
    n, g = gmat.shape
    if g == 0 or dhs.shape[0] != n or dhs.shape[1] % g or dhs.shape[1] == 0:
        raise InvalidInput(f"dhs must be (N, G * H) for gmat (N, G) = {gmat.shape}, got {dhs.shape}")
    hidden = dhs.shape[1] // g
    check_f32("h", h, 2)
    check_shape("h", h, dhs.shape)
    dev = get_device()
    if dhs.size == 0:
        return dhs.copy(), np.zeros((n, g), dtype=np.float32)
    check_fits(dev, dhs.nbytes, "moe_hidden_backward")
    with BufferScope(dev) as s:
        batch = dev.batch()
        d_buf, dg_buf = s.up(dhs), s.empty(n * g * 4)
        params = batch.uniform([("u", n), ("u", g), ("u", hidden), ("u", 0)])
        batch.dispatch("moe_hidden", "backward", {0: params, 2: s.up(gmat), 4: s.up(h), 5: d_buf, 6: dg_buf},
                       fold_groups(dev, n * g))
        batch.submit()
        return dev.read(d_buf, np.float32, dhs.shape), dev.read(dg_buf, np.float32, (n, g))
