"""The Mamba-1 block (S6 selective scan), as the reference's `mamba1_block.ts` with seed-001's fixes.

x + out_proj(scan(silu(conv(x_part)), dt_proj(dt_part), B, C) * silu(z)) where x_part | z = in_proj(rmsnorm(x))
and dt_part | B | C = x_proj(...): both splits are strided column slices, the conv uniform has five fields,
and the scan runs on a D x N x B grid. Forward only; the numpy reference and the config are in
lm.sequence.
"""

from __future__ import annotations

from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.sequence_layer import RMS_EPS, SequenceLayer
from evermind_memory.gpu.device import Batch, GpuBuffer
from evermind_memory.lm.sequence import Mamba1Config

__all__ = ["Mamba1Config", "Mamba1Block"]


class Mamba1Block(SequenceLayer):
    """Mamba-1 mixer block with its pre-norm and residual (see the module docstring)."""

    layer_type = "mamba1"

    def record_forward(self, batch: Batch, x: GpuBuffer, y: GpuBuffer, b: int, length: int) -> None:
        w = self.gpu_weights()
        cfg = self.config
        c, d, n, k, r = cfg.d_model, cfg.d_inner, cfg.d_state, cfg.d_conv, cfg.rank
        m = b * length
        s = batch.scratch
        xn, xz, xs, z = s(m * c * 4), s(m * 2 * d * 4), s(m * d * 4), s(m * d * 4)
        so.record_rmsnorm(batch, x, w["norm"], xn, m, c, RMS_EPS)
        so.record_linear(batch, xn, w["w_in"], w["b_in"], xz, m, c, 2 * d)
        so.record_column_slice(batch, xz, xs, m, 2 * d, 0, d)
        so.record_column_slice(batch, xz, z, m, 2 * d, d, d)
        xc, u = s(m * d * 4), s(m * d * 4)
        so.record_conv1d(batch, xs, w["w_conv"], w["b_conv"], xc, b, length, d, k)
        so.record_silu(batch, xc, u, m * d)
        dbc, dt_low, bm, cm, delta = s(m * (r + 2 * n) * 4), s(m * r * 4), s(m * n * 4), s(m * n * 4), s(m * d * 4)
        so.record_linear(batch, u, w["w_x"], w["b_x"], dbc, m, d, r + 2 * n)
        so.record_column_slice(batch, dbc, dt_low, m, r + 2 * n, 0, r)
        so.record_column_slice(batch, dbc, bm, m, r + 2 * n, r, n)
        so.record_column_slice(batch, dbc, cm, m, r + 2 * n, r + n, n)
        so.record_linear(batch, dt_low, w["w_dt"], w["b_dt"], delta, m, r, d)
        scan_y = s(m * d * 4)
        so.record_selective_scan(batch, u, delta, w["a_log"], bm, cm, w["d"], z, scan_y, b, length, d, n)
        batch.copy(x, 0, y, 0, m * c * 4)  # the residual: out_proj accumulates onto x
        so.record_linear(batch, scan_y, w["w_out"], w["b_out"], y, m, d, c, accumulate=True)
