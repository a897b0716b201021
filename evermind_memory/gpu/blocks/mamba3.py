"""The Mamba-3 block: Mamba-2's data flow with complex-valued states (the reference's `mamba3_block.ts`).

A per head is complex (a_log (H, 2) = real and imaginary parts, continuous time); B and C carry (re, im)
pairs, so the projection holds 2 * G * Nc columns for each. The scan discretises with the exact zero-order
hold (exp(dt A) - 1) / A; the reference multiplied by exp(-A) instead, and its softplus could overflow.
"""

from __future__ import annotations

from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.mamba2 import Mamba2Block
from evermind_memory.gpu.device import Batch, GpuBuffer
from evermind_memory.lm.sequence import Mamba3Config

__all__ = ["Mamba3Config", "Mamba3Block"]


class Mamba3Block(Mamba2Block):
    """Mamba-3 mixer block: Mamba-2's pre-norm, conv, inner norm and residual around a complex scan."""

    layer_type = "mamba3"
    _state_width = 2

    def record_scan(self, batch: Batch, xs: GpuBuffer, dt: GpuBuffer, bm: GpuBuffer, cm: GpuBuffer, y: GpuBuffer,
                    b: int, length: int) -> None:
        w, cfg = self.gpu_weights(), self.config
        so.record_complex_ssd(batch, xs, dt, bm, cm, w["a_log"], w["dt_bias"], w["d"], y, b, length, cfg.n_heads,
                              cfg.d_head, cfg.n_groups, cfg.d_state, cfg.chunk_len)
