"""The Mamba-1 block (S6 selective scan), as the reference's `mamba1_block.ts` with seed-001's fixes.

x + out_proj(scan(silu(conv(x_part)), dt_proj(dt_part), B, C) * silu(z)) where x_part | z = in_proj(rmsnorm(x))
and dt_part | B | C = x_proj(...): both splits are strided column slices, the conv uniform has five fields,
and the scan runs on a D x N x B grid. Forward only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.reference import selective_scan_numpy
from evermind_memory.gpu.blocks.sequence_layer import RMS_EPS, SequenceLayer, gaussian
from evermind_memory.gpu.device import Batch, GpuBuffer
from evermind_memory.gpu.ops import column_slice_numpy, conv1d_causal_numpy, rmsnorm_numpy, silu_numpy

__all__ = ["Mamba1Config", "Mamba1Block"]


@dataclass(frozen=True)
class Mamba1Config:
    """Shape of a Mamba-1 block."""

    d_model: int  # C, the block's input and output width
    d_state: int = 16  # N, state size per inner channel
    d_conv: int = 4  # K, causal conv width
    expand: int = 2  # inner width D = expand * C
    dt_rank: int = 0  # R, rank of the time-step projection; 0 means ceil(C / 16)

    def __post_init__(self) -> None:
        for name in ("d_model", "d_state", "d_conv", "expand"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidInput(f"Mamba1Config.{name} must be a positive int, got {getattr(self, name)!r}")
        if not isinstance(self.dt_rank, int) or self.dt_rank < 0:
            raise InvalidInput(f"Mamba1Config.dt_rank must be an int >= 0, got {self.dt_rank!r}")

    @property
    def d_inner(self) -> int:
        """D = expand * d_model."""
        return self.expand * self.d_model

    @property
    def rank(self) -> int:
        """R, the resolved dt rank."""
        return self.dt_rank or math.ceil(self.d_model / 16)


class Mamba1Block(SequenceLayer):
    """Mamba-1 mixer block with its pre-norm and residual (see the module docstring)."""

    layer_type = "mamba1"

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        cfg = self.config
        c, d, n, k, r = cfg.d_model, cfg.d_inner, cfg.d_state, cfg.d_conv, cfg.rank
        return {
            "norm": (c,), "w_in": (c, 2 * d), "b_in": (2 * d,), "w_conv": (k, d), "b_conv": (d,),
            "w_x": (d, r + 2 * n), "b_x": (r + 2 * n,), "w_dt": (r, d), "b_dt": (d,),
            "a_log": (d, n), "d": (d,), "w_out": (d, c), "b_out": (c,),
        }

    def _init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shapes = self.param_shapes()
        d, n = self.config.d_inner, self.config.d_state
        std = {"w_in": 0.02, "w_conv": 0.01, "w_x": 0.01, "w_dt": 0.02, "w_out": 0.02}
        params = {name: gaussian(rng, shapes[name], s) for name, s in std.items()}
        params |= {name: np.zeros(shapes[name], np.float32) for name in ("b_in", "b_conv", "b_x", "b_dt", "b_out")}
        params["norm"] = np.ones(shapes["norm"], np.float32)  # (C,)
        params["d"] = np.ones(d, np.float32)  # (D,)
        params["a_log"] = np.broadcast_to(np.log(np.arange(1, n + 1, dtype=np.float32)), (d, n)).copy()  # (D, N)
        return params

    def forward_numpy(self, x: np.ndarray) -> np.ndarray:
        """The numpy reference of `forward` (same steps, the kernels' numpy twins)."""
        p = self._params
        b, length = self.reference_dims(x)
        c, d, n, r = self.config.d_model, self.config.d_inner, self.config.d_state, self.config.rank
        m = b * length
        xn = rmsnorm_numpy(x.reshape(m, c), p["norm"], RMS_EPS)  # (M, C)
        xz = xn @ p["w_in"] + p["b_in"]  # (M, 2D)
        xs = column_slice_numpy(xz, 0, d)  # (M, D)
        z = column_slice_numpy(xz, d, d)  # (M, D)
        u = silu_numpy(conv1d_causal_numpy(xs.reshape(b, length, d), p["w_conv"], p["b_conv"]))  # (B, L, D)
        dbc = u.reshape(m, d) @ p["w_x"] + p["b_x"]  # (M, R + 2N)
        dt_low = column_slice_numpy(dbc, 0, r)  # (M, R)
        bm = column_slice_numpy(dbc, r, n)  # (M, N)
        cm = column_slice_numpy(dbc, r + n, n)  # (M, N)
        delta = dt_low @ p["w_dt"] + p["b_dt"]  # (M, D)
        y = selective_scan_numpy(u, delta.reshape(b, length, d), p["a_log"], bm.reshape(b, length, n),
                                 cm.reshape(b, length, n), p["d"], z.reshape(b, length, d))  # (B, L, D)
        return x + (y.reshape(m, d) @ p["w_out"] + p["b_out"]).reshape(b, length, c)

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
