"""The causal multi-head attention block, as the reference's `attention_block.ts` with seed-001's fix: Q, K
and V are strided column slices of the fused (M, 3C) projection, not prefix copies.

x + o_proj(attention(q, k, v)) with q | k | v = qkv(rmsnorm(x)); an optional SiLU feed-forward sublayer
follows (no norm before it, as the reference). Forward only. Heads up to 64 wide run as one flash-attention
dispatch (online softmax, O(L) memory) that reads Q, K and V straight out of the fused projection; wider
heads are split out by column slices and take the three-pass kernels (O(L^2) scores, tiled by query rows).
The numpy reference and the config are in lm.sequence.
"""

from __future__ import annotations

from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.sequence_layer import RMS_EPS, SequenceLayer
from evermind_memory.gpu.device import Batch, GpuBuffer
from evermind_memory.lm.sequence import AttentionConfig

__all__ = ["AttentionConfig", "AttentionBlock"]


class AttentionBlock(SequenceLayer):
    """Causal multi-head self-attention with pre-norm and residual (see the module docstring)."""

    layer_type = "attention"

    def record_forward(self, batch: Batch, x: GpuBuffer, y: GpuBuffer, b: int, length: int) -> None:
        w = self.gpu_weights()
        c, h, m = self.config.d_model, self.config.n_heads, b * length
        s = batch.scratch
        xn, qkv = s(m * c * 4), s(m * 3 * c * 4)
        so.record_rmsnorm(batch, x, w["norm"], xn, m, c, RMS_EPS)
        so.record_linear(batch, xn, w["w_qkv"], w["b_qkv"], qkv, m, c, 3 * c)
        o = s(m * c * 4)
        if c // h <= so.FLASH_MAX_HEAD_DIM:
            # The flash kernel reads Q, K and V in place as strided column slices of the fused projection.
            so.record_causal_attention(batch, qkv, qkv, qkv, o, b, length, h, c // h, row_stride=3 * c,
                                       offsets=(0, c, 2 * c))
        else:
            q, k, v = s(m * c * 4), s(m * c * 4), s(m * c * 4)
            for i, part in enumerate((q, k, v)):
                so.record_column_slice(batch, qkv, part, m, 3 * c, i * c, c)
            so.record_causal_attention(batch, q, k, v, o, b, length, h, c // h)
        batch.copy(x, 0, y, 0, m * c * 4)  # the residual: the output projection accumulates onto x
        so.record_linear(batch, o, w["w_o"], w["b_o"], y, m, c, c, accumulate=True)
        if self.config.ffn_mult:
            f = self.config.ffn_mult * c
            hid, act = s(m * f * 4), s(m * f * 4)
            so.record_linear(batch, y, w["w_ffn1"], w["b_ffn1"], hid, m, c, f)
            so.record_silu(batch, hid, act, m * f)
            so.record_linear(batch, act, w["w_ffn2"], w["b_ffn2"], y, m, f, c, accumulate=True)
