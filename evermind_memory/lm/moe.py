"""Shared-expert mixture of experts: y = Shared(x) + sum over the top-k routed experts of gate * Expert(x).

Dispatch is by expert: the rows routed to expert e are gathered, run through that expert only (unchosen
experts are never computed) and scattered back; inference-only twins skip the caches, and for a few rows
(a short query) run every expert in one stacked matmul instead. Shapes: N rows, C channels, H expert
hidden, E experts, k = top_k. Load-balancing losses are not here (the reference keeps them outside too).
"""

from __future__ import annotations

from typing import Container, Mapping, NamedTuple

import numpy as np

from evermind_memory.lm.layers import (
    FFNCache,
    RouterCache,
    ffn_backward,
    ffn_forward,
    router_backward,
    router_forward,
)

_FFN_NAMES = ("w1", "b1", "w2", "b2")


class _ExpertBatch(NamedTuple):
    expert: int  # expert id
    slots: np.ndarray  # (n_e,) flat indices into the (N, k) routing arrays
    rows: np.ndarray  # (n_e,) row ids routed to this expert (unique: top-k ids are distinct per row)
    y: np.ndarray  # (n_e, C) the expert's output, before the gate (needed for dL/dgate)
    ffn: FFNCache


class MoECache(NamedTuple):
    n_experts: int
    top_k: int
    router: RouterCache
    shared: FFNCache
    batches: list[_ExpertBatch]


def _ffn_weights(params: Mapping[str, np.ndarray], prefix: str) -> tuple[np.ndarray, ...]:
    return tuple(params[f"{prefix}.{n}"] for n in _FFN_NAMES)


def moe_forward(
    params: Mapping[str, np.ndarray], x: np.ndarray, top_k: int, *, keep_cache: bool = True
) -> tuple[np.ndarray, MoECache | None]:
    """Shared expert plus the gated top-k routed experts, dispatched by expert.

    Args:
        params: one layer's MoE weights under local names: "router" (C, E), "shared.w1" (C, H),
            "shared.b1" (H,), "shared.w2" (H, C), "shared.b2" (C,), and the same four for each
            "expert{e}".
        x: (N, C) rows (real positions only).
        top_k: routed experts per row.
        keep_cache: False for inference (nothing is kept for a backward).

    Returns:
        y: (N, C), and the cache for `moe_backward` (None when keep_cache is False).
    """
    router_w = params["router"]
    n_experts = router_w.shape[1]
    experts, gates, router_cache = router_forward(x, router_w, top_k)  # (N, k), (N, k)
    y, shared_cache = ffn_forward(x, *_ffn_weights(params, "shared"))  # (N, C)

    flat_experts = experts.ravel()  # (N*k,)
    flat_gates = gates.ravel()  # (N*k,)
    order = np.argsort(flat_experts, kind="stable")  # (N*k,) slots grouped by expert
    bounds = np.concatenate(([0], np.cumsum(np.bincount(flat_experts, minlength=n_experts))))  # (E+1,)
    batches = []
    for e in range(n_experts):
        if bounds[e] == bounds[e + 1]:
            continue  # no row chose this expert: it is not computed at all
        slots = order[bounds[e] : bounds[e + 1]]  # (n_e,)
        rows = slots // top_k  # (n_e,)
        ye, ffn_cache = ffn_forward(x[rows], *_ffn_weights(params, f"expert{e}"))  # (n_e, C)
        if keep_cache:
            batches.append(_ExpertBatch(e, slots, rows, ye, ffn_cache))
            ye = ye * flat_gates[slots, None]  # (n_e, C) a copy: the backward needs the ungated output
        else:
            ye *= flat_gates[slots, None]
        y[rows] += ye  # rows are unique within one expert, so fancy += adds once each
    if not keep_cache:
        return y, None
    return y, MoECache(n_experts, top_k, router_cache, shared_cache, batches)


def moe_backward(
    dy: np.ndarray, cache: MoECache, *, need: Container[str] | None = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Backward of `moe_forward`, mirroring its dispatch.

    Experts that no row chose get no entry in the returned grads (their gradient is zero).

    Args:
        dy: (N, C) upstream gradient.
        cache: from `moe_forward` with keep_cache=True.
        need: the local names ("router", "shared.w1", "expert0.b2", ...) whose weight gradients to compute;
            None computes all of them. Skipped names are absent from the result and their weight-gradient
            matmuls are not done; dx is always complete, and the gradients that are computed are
            bit-identical to those of a call with need=None.

    Returns:
        dx: (N, C), and grads under the same local names as `moe_forward`'s params.
    """
    grads: dict[str, np.ndarray] = {}

    def wanted(prefix: str) -> frozenset[str] | None:
        return None if need is None else frozenset(n for n in _FFN_NAMES if f"{prefix}.{n}" in need)

    def keep(prefix: str, found: tuple) -> None:
        for name, g in zip(_FFN_NAMES, found):
            if g is not None:
                grads[f"{prefix}.{name}"] = g

    dx, found = ffn_backward(dy, cache.shared, weights=wanted("shared"))  # (N, C)
    keep("shared", found)

    gates_flat = cache.router.gates.ravel()  # (N*k,)
    dgates = np.zeros_like(gates_flat)  # (N*k,)
    for batch in cache.batches:
        dye = dy[batch.rows]  # (n_e, C)
        dgates[batch.slots] = np.einsum("nc,nc->n", dye, batch.y)
        dye *= gates_flat[batch.slots, None]
        prefix = f"expert{batch.expert}"
        dxe, found = ffn_backward(dye, batch.ffn, weights=wanted(prefix))  # (n_e, C)
        dx[batch.rows] += dxe
        keep(prefix, found)

    dx_router, d_router = router_backward(
        dgates.reshape(-1, cache.top_k), cache.router, weight_grad=need is None or "router" in need
    )  # (N, C), (C, E) or None
    if d_router is not None:
        grads["router"] = d_router
    dx += dx_router
    return dx, grads


# ── inference ─────────────────────────────────────────────────────────────────
# The forward above keeps what the backward needs; the functions below only compute outputs, with fewer
# numpy calls and temporaries. Same maths: the same experts are chosen (ties to the lower id) with the same
# gates, and outputs equal moe_forward's up to float rounding.

SHORT_MAX_ROWS = 16  # up to this many rows, `moe_infer_short` (every expert on every row) is the faster path


class MoEInference(NamedTuple):
    """One layer's MoE weights arranged for `moe_infer` / `moe_infer_short` (see `moe_inference_weights`)."""

    gain: np.ndarray | None  # (C,) input gain to apply first; None when folded into router and w1
    router: np.ndarray  # (C, E)
    w1: tuple  # E+1 arrays (C, H): the shared expert first, then expert0..E-1
    b1: tuple  # E+1 arrays (H,)
    w2: tuple  # E+1 arrays (H, C)
    b2: tuple  # E+1 arrays (C,)
    w1_aug: np.ndarray | None  # (E+1, C+1, H+1): [[w1, 0], [b1, 1]] per expert, for rows with a ones column
    w2_aug: np.ndarray | None  # (E+1, H+1, C): [[w2], [b2]] per expert


def moe_inference_weights(
    params: Mapping[str, np.ndarray], gain: np.ndarray | None, *, fused: bool
) -> MoEInference:
    """Arrange one layer's MoE weights for inference.

    Args:
        params: local names as for `moe_forward`.
        gain: (C,) gain of the RMSNorm in front of the MoE (or None).
        fused: True folds the gain into router and w1 and builds the augmented stacks `moe_infer_short`
            needs (new arrays: worth it for a model used many times); False only references `params`.

    Returns:
        The MoEInference (with fused=True, w1..b2 are views into the augmented stacks).
    """
    n_experts = params["router"].shape[1]
    names = ["shared"] + [f"expert{e}" for e in range(n_experts)]
    w1, b1, w2, b2 = (tuple(params[f"{n}.{leaf}"] for n in names) for leaf in _FFN_NAMES)
    if not fused:
        return MoEInference(gain, params["router"], w1, b1, w2, b2, None, None)
    (c, h), dtype = w1[0].shape, w1[0].dtype
    g = np.ones(c, dtype=dtype) if gain is None else gain  # (C,)
    w1_aug = np.zeros((n_experts + 1, c + 1, h + 1), dtype=dtype)  # (E+1, C+1, H+1)
    w1_aug[:, :c, :h] = g[None, :, None] * np.stack(w1)
    w1_aug[:, c, :h] = np.stack(b1)
    w1_aug[:, c, h] = 1.0  # the ones column passes through the relu, to carry the gated b2
    w2_aug = np.concatenate((np.stack(w2), np.stack(b2)[:, None, :]), axis=1)  # (E+1, H+1, C)
    views = (tuple(w1_aug[:, :c, :h]), tuple(w1_aug[:, c, :h]), tuple(w2_aug[:, :h]), tuple(w2_aug[:, h]))
    return MoEInference(None, np.ascontiguousarray(g[:, None] * params["router"]), *views, w1_aug, w2_aug)


def _route(x: np.ndarray, router: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """`router_forward`'s choice and gates without its cache: (experts (N, k), gates (N, k))."""
    logits = x @ router  # (N, E)
    if top_k > 2:
        experts = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]  # (N, k)
        sel = np.take_along_axis(logits, experts, axis=1)  # (N, k)
        gates = np.exp(sel - sel[:, :1])  # (N, k)
        gates /= gates.sum(axis=1, keepdims=True)
        return experts, gates
    # argmax takes the first maximum, so repeated argmax picks what a stable descending sort does.
    n = logits.shape[0]
    rows = np.arange(n)  # (N,)
    experts = np.empty((n, top_k), dtype=np.intp)  # (N, k)
    experts[:, 0] = logits.argmax(axis=1)
    if top_k == 1:
        return experts, np.ones((n, 1), dtype=logits.dtype)
    top = logits[rows, experts[:, 0]]  # (N,)
    logits[rows, experts[:, 0]] = -np.inf
    experts[:, 1] = logits.argmax(axis=1)
    gates = np.empty((n, 2), dtype=logits.dtype)  # (N, 2)
    e = np.exp(logits[rows, experts[:, 1]] - top)  # (N,)
    total = e + 1.0  # (N,) as sum([1, e]) in router_forward
    np.divide(1.0, total, out=gates[:, 0])
    np.divide(e, total, out=gates[:, 1])
    return experts, gates


def _gate_matrix(x: np.ndarray, router: np.ndarray, top_k: int) -> np.ndarray:
    """Gates (N, E) of the chosen experts, 0 elsewhere (the dense form of `_route`)."""
    logits = x @ router  # (N, E)
    n, n_experts = logits.shape
    ranked = np.sort(logits, axis=1)  # (N, E) ascending; for a few experts cheaper than partition + max
    if top_k < n_experts:
        chosen = logits >= ranked[:, n_experts - top_k, None]  # (N, E) at or above the k-th largest
        if np.count_nonzero(chosen) != n * top_k:  # a tie at the k-th logit: let the exact route decide
            experts, gates = _route(x, router, top_k)  # (N, k)
            g = np.zeros_like(logits)  # (N, E)
            g[np.arange(n)[:, None], experts] = gates
            return g
    g = logits - ranked[:, -1:]  # (N, E) the chosen maximum is subtracted, as in router_forward
    np.exp(g, out=g)
    if top_k < n_experts:
        g *= chosen
    g /= g.sum(axis=1, keepdims=True)
    return g


def moe_infer_short(w: MoEInference, xa: np.ndarray, top_k: int, out: np.ndarray) -> None:
    """Add the MoE output for a few rows into out, running every expert on every row (inference only).

    numpy loops over the experts of one stacked matmul in C, which beats gathering rows per expert when
    there are only a few rows; unchosen experts get gate 0 and add exactly nothing.

    Args:
        w: from `moe_inference_weights(..., fused=True)`.
        xa: (N, C+1) normalised rows with a last column of ones.
        top_k: routed experts per row.
        out: (N, C) the residual stream; receives += MoE(x).
    """
    g = _gate_matrix(xa[:, :-1], w.router, top_k)  # (N, E)
    h = np.matmul(xa, w.w1_aug)  # (E+1, N, H+1); column H is 1 (relu keeps it), to carry the gated b2
    np.maximum(h, 0, out=h)
    h[1:] *= g.T[:, :, None]
    out += np.matmul(h, w.w2_aug).sum(axis=0)  # (N, C)


def moe_infer(w: MoEInference, x: np.ndarray, top_k: int, out: np.ndarray) -> None:
    """Add the MoE output for rows x into out, dispatched by expert (inference only: no cache).

    Args:
        w: from `moe_inference_weights`.
        x: (N, C) normalised rows, before the gain (overwritten when the gain is not folded).
        top_k: routed experts per row.
        out: (N, C) the residual stream; receives += MoE(x).
    """
    if w.gain is not None:
        x *= w.gain
    experts, gates = _route(x, w.router, top_k)  # (N, k), (N, k)
    h = x @ w.w1[0]  # (N, H) the shared expert
    h += w.b1[0]
    np.maximum(h, 0, out=h)
    y = h @ w.w2[0]  # (N, C)
    y += w.b2[0]
    out += y
    flat = experts.ravel()  # (N*k,)
    order = np.argsort(flat, kind="stable")  # (N*k,) slots grouped by expert, rows ascending within one
    bounds = np.cumsum(np.bincount(flat, minlength=len(w.w1) - 1)).tolist()  # (E,)
    rows = order // top_k  # (N*k,)
    slot_gates = gates.ravel()[order, None]  # (N*k, 1)
    xs = x[rows]  # (N*k, C) every routed row, grouped by expert
    start = 0
    for e, stop in enumerate(bounds):
        if stop == start:
            continue  # no row chose this expert: it is not computed at all
        h = xs[start:stop] @ w.w1[e + 1]  # (n_e, H)
        h += w.b1[e + 1]
        np.maximum(h, 0, out=h)
        y = h @ w.w2[e + 1]  # (n_e, C)
        y += w.b2[e + 1]
        y *= slot_gates[start:stop]
        out[rows[start:stop]] += y  # rows are unique within one expert, so fancy += adds once each
        start = stop
