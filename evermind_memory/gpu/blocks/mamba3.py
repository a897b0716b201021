"""The Mamba-3 block: Mamba-2's data flow with complex-valued states (the reference's `mamba3_block.ts`).

A per head is complex (a_log (H, 2) = real and imaginary parts, continuous time); B and C carry (re, im)
pairs, so the projection holds 2 * G * Nc columns for each. The scan discretises with the exact zero-order
hold (exp(dt A) - 1) / A; the reference multiplied by exp(-A) instead, and its softplus could overflow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.mamba2 import Mamba2Block, Mamba2Config
from evermind_memory.gpu.blocks.reference import complex_ssd_numpy
from evermind_memory.gpu.device import Batch, GpuBuffer

__all__ = ["Mamba3Config", "Mamba3Block"]


@dataclass(frozen=True)
class Mamba3Config(Mamba2Config):
    """Shape of a Mamba-3 block; d_state is Nc, the number of complex states per head (at most 64)."""


class Mamba3Block(Mamba2Block):
    """Mamba-3 mixer block: Mamba-2's pre-norm, conv, inner norm and residual around a complex scan."""

    layer_type = "mamba3"
    _state_width = 2

    def a_log_shape(self) -> tuple[int, ...]:
        return (self.config.n_heads, 2)

    def init_a_log(self) -> np.ndarray:
        h = self.config.n_heads
        # Decaying (Re A = -1; the reference's 0 never decays) with phases spread evenly, as the reference.
        return np.stack([np.full(h, -1.0), 2 * np.pi * np.arange(h) / h], axis=1).astype(np.float32)  # (H, 2)

    def scan_numpy(self, xs: np.ndarray, dt: np.ndarray, bm: np.ndarray, cm: np.ndarray) -> np.ndarray:
        p = self._params
        return complex_ssd_numpy(xs, dt, p["a_log"], p["dt_bias"], bm, cm, p["d"], n_groups=self.config.n_groups)

    def record_scan(self, batch: Batch, xs: GpuBuffer, dt: GpuBuffer, bm: GpuBuffer, cm: GpuBuffer, y: GpuBuffer,
                    b: int, length: int) -> None:
        w, cfg = self.gpu_weights(), self.config
        so.record_complex_ssd(batch, xs, dt, bm, cm, w["a_log"], w["dt_bias"], w["d"], y, b, length, cfg.n_heads,
                              cfg.d_head, cfg.n_groups, cfg.d_state, cfg.chunk_len)
