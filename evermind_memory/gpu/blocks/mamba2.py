"""The Mamba-2 block (chunked SSD, one scalar decay per head), as the reference's `mamba2_block.ts` with
seed-001's fixes: the fused in_proj output and the conv output are split by strided column slices.

x + out_proj(rmsnorm_inner(ssd(x_c, dt, B_c, C_c))) where (x | B | C) | dt = in_proj(rmsnorm(x)) and
x_c | B_c | C_c = conv((x | B | C)); no z gate, no bias on the projections (as the reference). Forward only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.reference import ssd_numpy
from evermind_memory.gpu.blocks.sequence_layer import RMS_EPS, SequenceLayer, gaussian
from evermind_memory.gpu.device import Batch, GpuBuffer
from evermind_memory.gpu.ops import column_slice_numpy, conv1d_causal_numpy, rmsnorm_numpy

__all__ = ["Mamba2Config", "Mamba2Block"]


@dataclass(frozen=True)
class Mamba2Config:
    """Shape of a Mamba-2 block."""

    d_model: int  # C, the block's input and output width
    d_state: int = 16  # N, state size per head (at most 64 on the GPU)
    d_conv: int = 4  # K, causal conv width
    expand: int = 2  # inner width D = expand * C
    n_heads: int = 4  # H, divides D; head width P = D / H
    n_groups: int = 1  # G, B/C groups shared by consecutive heads; divides H
    chunk_len: int = 64  # time steps per SSD chunk on the GPU (does not change the result)

    def __post_init__(self) -> None:
        for name in ("d_model", "d_state", "d_conv", "expand", "n_heads", "n_groups", "chunk_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidInput(f"{type(self).__name__}.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.d_inner % self.n_heads or self.n_heads % self.n_groups:
            raise InvalidInput(
                f"{type(self).__name__}: n_heads ({self.n_heads}) must divide d_inner ({self.d_inner}) and "
                f"n_groups ({self.n_groups}) must divide n_heads"
            )
        if self.d_state > so.MAX_STATE:
            raise InvalidInput(f"{type(self).__name__}.d_state must be at most {so.MAX_STATE}, got {self.d_state}")

    @property
    def d_inner(self) -> int:
        """D = expand * d_model."""
        return self.expand * self.d_model

    @property
    def d_head(self) -> int:
        """P = D / H."""
        return self.d_inner // self.n_heads


class Mamba2Block(SequenceLayer):
    """Mamba-2 mixer block with its pre-norm, inner norm and residual (see the module docstring)."""

    layer_type = "mamba2"
    _state_width = 1  # floats per state element: 1 real, 2 for Mamba-3's complex states

    @property
    def bc_width(self) -> int:
        """Columns of B (and of C) in the projection: G * N (times 2 for complex states)."""
        return self.config.n_groups * self.config.d_state * self._state_width

    def a_log_shape(self) -> tuple[int, ...]:
        return (self.config.n_heads,)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        c, d, h, k = self.config.d_model, self.config.d_inner, self.config.n_heads, self.config.d_conv
        conv_d = d + 2 * self.bc_width
        return {
            "pre_norm": (c,), "w_in": (c, conv_d + h), "w_conv": (k, conv_d), "b_conv": (conv_d,),
            "a_log": self.a_log_shape(), "dt_bias": (h,), "d": (h,), "norm": (d,), "w_out": (d, c),
        }

    def init_a_log(self) -> np.ndarray:
        return np.zeros(self.config.n_heads, np.float32)  # (H,) softplus(0) = log 2 per head

    def _init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shapes = self.param_shapes()
        return {
            "pre_norm": np.ones(shapes["pre_norm"], np.float32),
            "w_in": gaussian(rng, shapes["w_in"], 0.02),
            "w_conv": gaussian(rng, shapes["w_conv"], 0.01),
            "b_conv": np.zeros(shapes["b_conv"], np.float32),
            "a_log": self.init_a_log(),
            "dt_bias": np.zeros(shapes["dt_bias"], np.float32),
            "d": np.ones(shapes["d"], np.float32),
            "norm": np.ones(shapes["norm"], np.float32),
            "w_out": gaussian(rng, shapes["w_out"], 0.02),
        }

    def scan_numpy(self, xs: np.ndarray, dt: np.ndarray, bm: np.ndarray, cm: np.ndarray) -> np.ndarray:
        """The block's scan on numpy arrays: xs (B, L, D), dt (B, L, H), bm/cm (B, L, bc_width) -> (B, L, D)."""
        p = self._params
        return ssd_numpy(xs, dt, p["a_log"], p["dt_bias"], bm, cm, p["d"], n_groups=self.config.n_groups)

    def record_scan(self, batch: Batch, xs: GpuBuffer, dt: GpuBuffer, bm: GpuBuffer, cm: GpuBuffer, y: GpuBuffer,
                    b: int, length: int) -> None:
        w, cfg = self.gpu_weights(), self.config
        so.record_ssd(batch, xs, dt, bm, cm, w["a_log"], w["dt_bias"], w["d"], y, b, length, cfg.n_heads,
                      cfg.d_head, cfg.n_groups, cfg.d_state, cfg.chunk_len)

    def forward_numpy(self, x: np.ndarray) -> np.ndarray:
        """The numpy reference of `forward` (same steps, the kernels' numpy twins)."""
        p = self._params
        b, length = self.reference_dims(x)
        c, d, h, bcw = self.config.d_model, self.config.d_inner, self.config.n_heads, self.bc_width
        m, conv_d = b * length, d + 2 * bcw
        proj = rmsnorm_numpy(x.reshape(m, c), p["pre_norm"], RMS_EPS) @ p["w_in"]  # (M, conv_d + H)
        xbc = column_slice_numpy(proj, 0, conv_d)  # (M, conv_d)
        dt = column_slice_numpy(proj, conv_d, h)  # (M, H)
        conv = conv1d_causal_numpy(xbc.reshape(b, length, conv_d), p["w_conv"], p["b_conv"])  # (B, L, conv_d)
        conv = conv.reshape(m, conv_d)  # (M, conv_d)
        xs = column_slice_numpy(conv, 0, d)  # (M, D)
        bm = column_slice_numpy(conv, d, bcw)  # (M, bc_width)
        cm = column_slice_numpy(conv, d + bcw, bcw)  # (M, bc_width)
        y = self.scan_numpy(xs.reshape(b, length, d), dt.reshape(b, length, h), bm.reshape(b, length, bcw),
                            cm.reshape(b, length, bcw))  # (B, L, D)
        yn = rmsnorm_numpy(y.reshape(m, d), p["norm"], RMS_EPS)  # (M, D)
        return x + (yn @ p["w_out"]).reshape(b, length, c)

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
