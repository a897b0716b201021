"""The causal multi-head attention block, as the reference's `attention_block.ts` with seed-001's fix: Q, K
and V are strided column slices of the fused (M, 3C) projection, not prefix copies.

x + o_proj(attention(q, k, v)) with q | k | v = qkv(rmsnorm(x)); an optional SiLU feed-forward sublayer
follows (no norm before it, as the reference). Forward only. Heads up to 64 wide run as one flash-attention
dispatch (online softmax, O(L) memory) that reads Q, K and V straight out of the fused projection; wider
heads are split out by column slices and take the three-pass kernels (O(L^2) scores, tiled by query rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.reference import causal_attention_numpy
from evermind_memory.gpu.blocks.sequence_layer import RMS_EPS, SequenceLayer, gaussian
from evermind_memory.gpu.device import Batch, GpuBuffer
from evermind_memory.gpu.ops import column_slice_numpy, rmsnorm_numpy, silu_numpy

__all__ = ["AttentionConfig", "AttentionBlock"]


@dataclass(frozen=True)
class AttentionConfig:
    """Shape of an attention block."""

    d_model: int  # C, the block's input and output width
    n_heads: int = 4  # H, divides C; head width P = C / H
    ffn_mult: int = 0  # hidden width of the SiLU feed-forward sublayer in units of C; 0 leaves it out

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidInput(f"AttentionConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if not isinstance(self.ffn_mult, int) or self.ffn_mult < 0:
            raise InvalidInput(f"AttentionConfig.ffn_mult must be an int >= 0, got {self.ffn_mult!r}")
        if self.d_model % self.n_heads:
            raise InvalidInput(f"AttentionConfig: n_heads ({self.n_heads}) must divide d_model ({self.d_model})")


class AttentionBlock(SequenceLayer):
    """Causal multi-head self-attention with pre-norm and residual (see the module docstring)."""

    layer_type = "attention"

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        c, f = self.config.d_model, self.config.ffn_mult * self.config.d_model
        shapes = {"norm": (c,), "w_qkv": (c, 3 * c), "b_qkv": (3 * c,), "w_o": (c, c), "b_o": (c,)}
        if f:
            shapes |= {"w_ffn1": (c, f), "b_ffn1": (f,), "w_ffn2": (f, c), "b_ffn2": (c,)}
        return shapes

    def _init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        params = {}
        for name, shape in self.param_shapes().items():
            if name.startswith("w_"):
                params[name] = gaussian(rng, shape, 0.02)
            else:
                params[name] = (np.ones if name == "norm" else np.zeros)(shape, np.float32)
        return params

    def forward_numpy(self, x: np.ndarray) -> np.ndarray:
        """The numpy reference of `forward` (same steps, the kernels' numpy twins)."""
        p = self._params
        b, length = self.reference_dims(x)
        c, m = self.config.d_model, b * length
        qkv = rmsnorm_numpy(x.reshape(m, c), p["norm"], RMS_EPS) @ p["w_qkv"] + p["b_qkv"]  # (M, 3C)
        q, k, v = (column_slice_numpy(qkv, i * c, c).reshape(b, length, c) for i in range(3))  # (B, L, C) each
        o = causal_attention_numpy(q, k, v, self.config.n_heads)  # (B, L, C)
        cur = x.reshape(m, c) + o.reshape(m, c) @ p["w_o"] + p["b_o"]  # (M, C)
        if self.config.ffn_mult:
            cur = cur + silu_numpy(cur @ p["w_ffn1"] + p["b_ffn1"]) @ p["w_ffn2"] + p["b_ffn2"]  # (M, C)
        return cur.reshape(b, length, c)

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
