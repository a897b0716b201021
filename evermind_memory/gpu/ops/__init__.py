"""GPU ops: each WGSL kernel behind a numpy-in, numpy-out function, beside its numpy twin `<op>_numpy`.

Ops check dtype (float32), shape and contiguity (InvalidInput), tile work past the device's binding limit,
and dispatch; twins share the signature and keep their inputs' dtype (float64 gradient checks). The model
resident on the device is not here: `record_matmul` and the device's `Batch` are its building blocks.

One module per kernel family (dense, conv, norm, activation, loss, embedding, moe, optim, pool); every op is
importable from here, as `from evermind_memory.gpu import ops; ops.matmul(...)`. The resident model's kernels
(axpy, clip_grads, dense-gate MoE, pooling) run their whole input in one binding (the model keeps these
sizes small); past the device's binding limit they raise InvalidInput rather than tiling.
"""

from __future__ import annotations

from evermind_memory.gpu.ops.dense import (
    axpy,
    axpy_numpy,
    column_slice,
    column_slice_numpy,
    column_sum,
    column_sum_numpy,
    linear,
    linear_backward,
    linear_backward_numpy,
    linear_numpy,
    matmul,
    matmul_numpy,
    record_matmul,
)
from evermind_memory.gpu.ops.conv import (
    conv1d_causal,
    conv1d_causal_backward,
    conv1d_causal_backward_numpy,
    conv1d_causal_numpy,
)
from evermind_memory.gpu.ops.norm import (
    rmsnorm,
    rmsnorm_backward,
    rmsnorm_backward_numpy,
    rmsnorm_numpy,
)
from evermind_memory.gpu.ops.activation import (
    gelu,
    gelu_backward,
    gelu_backward_numpy,
    gelu_numpy,
    relu,
    relu_backward,
    relu_backward_numpy,
    relu_numpy,
    silu,
    silu_backward,
    silu_backward_numpy,
    silu_numpy,
)
from evermind_memory.gpu.ops.loss import (
    cross_entropy,
    cross_entropy_numpy,
    softmax,
    softmax_numpy,
)
from evermind_memory.gpu.ops.embedding import (
    embedding_gather,
    embedding_gather_numpy,
    embedding_scatter_add,
    embedding_scatter_add_numpy,
)
from evermind_memory.gpu.ops.moe import (
    moe_combine,
    moe_combine_backward,
    moe_combine_backward_numpy,
    moe_combine_numpy,
    moe_dispatch,
    moe_dispatch_numpy,
    moe_gates_backward,
    moe_gates_backward_numpy,
    moe_gates_dense,
    moe_gates_dense_numpy,
    moe_hidden,
    moe_hidden_backward,
    moe_hidden_backward_numpy,
    moe_hidden_numpy,
    moe_route,
    moe_route_numpy,
)
from evermind_memory.gpu.ops.optim import (
    adamw_update_,
    adamw_update_numpy,
    clip_grads,
    clip_grads_numpy,
)
from evermind_memory.gpu.ops.pool import (
    mean_pool,
    mean_pool_numpy,
    pool_attention,
    pool_attention_numpy,
)

__all__ = [
    "matmul", "matmul_numpy", "record_matmul",
    "linear", "linear_numpy", "linear_backward", "linear_backward_numpy",
    "column_sum", "column_sum_numpy",
    "conv1d_causal", "conv1d_causal_numpy", "conv1d_causal_backward", "conv1d_causal_backward_numpy",
    "rmsnorm", "rmsnorm_numpy", "rmsnorm_backward", "rmsnorm_backward_numpy",
    "relu", "relu_numpy", "relu_backward", "relu_backward_numpy",
    "silu", "silu_numpy", "silu_backward", "silu_backward_numpy",
    "gelu", "gelu_numpy", "gelu_backward", "gelu_backward_numpy",
    "softmax", "softmax_numpy",
    "cross_entropy", "cross_entropy_numpy",
    "embedding_gather", "embedding_gather_numpy",
    "embedding_scatter_add", "embedding_scatter_add_numpy",
    "moe_route", "moe_route_numpy",
    "moe_dispatch", "moe_dispatch_numpy",
    "moe_combine", "moe_combine_numpy", "moe_combine_backward", "moe_combine_backward_numpy",
    "column_slice", "column_slice_numpy",
    "adamw_update_", "adamw_update_numpy",
]

__all__ += [
    "axpy", "axpy_numpy",
    "clip_grads", "clip_grads_numpy",
    "moe_gates_dense", "moe_gates_dense_numpy", "moe_gates_backward", "moe_gates_backward_numpy",
    "moe_hidden", "moe_hidden_numpy", "moe_hidden_backward", "moe_hidden_backward_numpy",
    "pool_attention", "pool_attention_numpy",
    "mean_pool", "mean_pool_numpy",
]
