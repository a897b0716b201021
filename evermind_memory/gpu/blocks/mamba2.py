"""The Mamba-2 block (chunked SSD, one scalar decay per head), as the reference's `mamba2_block.ts` with
seed-001's fixes: the fused in_proj output and the conv output are split by strided column slices.

x + out_proj(rmsnorm_inner(ssd(x_c, dt, B_c, C_c))) where (x | B | C) | dt = in_proj(rmsnorm(x)) and
x_c | B_c | C_c = conv((x | B | C)); no z gate, no bias on the projections (as the reference). Forward
only; the numpy reference and the config are in lm.sequence.
"""

from __future__ import annotations

from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.sequence_layer import RMS_EPS, SequenceLayer
from evermind_memory.gpu.device import Batch, GpuBuffer
from evermind_memory.lm.sequence import Mamba2Config

__all__ = ["Mamba2Config", "Mamba2Block"]


class Mamba2Block(SequenceLayer):
    """Mamba-2 mixer block with its pre-norm, inner norm and residual (see the module docstring)."""

    layer_type = "mamba2"
    _state_width = 1  # floats per state element: 1 real, 2 for Mamba-3's complex states

    @property
    def bc_width(self) -> int:
        """Columns of B (and of C) in the projection: G * N (times 2 for complex states)."""
        return self.config.n_groups * self.config.d_state * self._state_width

    def record_scan(self, batch: Batch, xs: GpuBuffer, dt: GpuBuffer, bm: GpuBuffer, cm: GpuBuffer, y: GpuBuffer,
                    b: int, length: int) -> None:
        w, cfg = self.gpu_weights(), self.config
        so.record_ssd(batch, xs, dt, bm, cm, w["a_log"], w["dt_bias"], w["d"], y, b, length, cfg.n_heads,
                      cfg.d_head, cfg.n_groups, cfg.d_state, cfg.chunk_len)

    def record_forward(self, batch: Batch, x: GpuBuffer, y: GpuBuffer, b: int, length: int) -> None:
        w = self.gpu_weights()
        cfg, bcw = self.config, self.bc_width
        c, d, h, k = cfg.d_model, cfg.d_inner, cfg.n_heads, cfg.d_conv
        m, conv_d = b * length, d + 2 * bcw
        s = batch.scratch
        xn, proj, xbc, dt = s(m * c * 4), s(m * (conv_d + h) * 4), s(m * conv_d * 4), s(m * h * 4)
        so.record_rmsnorm(batch, x, w["pre_norm"], xn, m, c, RMS_EPS)
        so.record_linear(batch, xn, w["w_in"], None, proj, m, c, conv_d + h)
        so.record_column_slice(batch, proj, xbc, m, conv_d + h, 0, conv_d)
        so.record_column_slice(batch, proj, dt, m, conv_d + h, conv_d, h)
        conv, xs, bm, cm = s(m * conv_d * 4), s(m * d * 4), s(m * bcw * 4), s(m * bcw * 4)
        so.record_conv1d(batch, xbc, w["w_conv"], w["b_conv"], conv, b, length, conv_d, k)
        so.record_column_slice(batch, conv, xs, m, conv_d, 0, d)
        so.record_column_slice(batch, conv, bm, m, conv_d, d, bcw)
        so.record_column_slice(batch, conv, cm, m, conv_d, d + bcw, bcw)
        scan_y, yn = s(m * d * 4), s(m * d * 4)
        self.record_scan(batch, xs, dt, bm, cm, scan_y, b, length)
        so.record_rmsnorm(batch, scan_y, w["norm"], yn, m, d, RMS_EPS)
        batch.copy(x, 0, y, 0, m * c * 4)  # the residual: out_proj accumulates onto x
        so.record_linear(batch, yn, w["w_out"], None, y, m, d, c, accumulate=True)
