"""Shared-expert mixture of experts: y = Shared(x) + sum over the top-k routed experts of gate * Expert(x).

Dispatch is by expert: the rows routed to expert e are gathered, run through that expert only (unchosen
experts are never computed) and scattered back. Shapes: N rows, C channels, H expert hidden, E experts,
k = top_k. Load-balancing losses are not here (the reference keeps them outside the forward too).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

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


def moe_backward(dy: np.ndarray, cache: MoECache) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Backward of `moe_forward`, mirroring its dispatch.

    Experts that no row chose get no entry in the returned grads (their gradient is zero).

    Args:
        dy: (N, C) upstream gradient.
        cache: from `moe_forward` with keep_cache=True.

    Returns:
        dx: (N, C), and grads under the same local names as `moe_forward`'s params.
    """
    grads: dict[str, np.ndarray] = {}
    dx, shared_grads = ffn_backward(dy, cache.shared)  # (N, C)
    for name, g in zip(_FFN_NAMES, shared_grads):
        grads[f"shared.{name}"] = g

    gates_flat = cache.router.gates.ravel()  # (N*k,)
    dgates = np.zeros_like(gates_flat)  # (N*k,)
    for batch in cache.batches:
        dye = dy[batch.rows]  # (n_e, C)
        dgates[batch.slots] = np.einsum("nc,nc->n", dye, batch.y)
        dye *= gates_flat[batch.slots, None]
        dxe, expert_grads = ffn_backward(dye, batch.ffn)  # (n_e, C)
        dx[batch.rows] += dxe
        for name, g in zip(_FFN_NAMES, expert_grads):
            grads[f"expert{batch.expert}.{name}"] = g

    dx_router, grads["router"] = router_backward(dgates.reshape(-1, cache.top_k), cache.router)  # (N, C), (C, E)
    dx += dx_router
    return dx, grads
