"""Sequence blocks in numpy and the stacked sequence backbone: Mamba-1 (selective scan), Mamba-2 (SSD),
Mamba-3 (complex SSD) and causal attention, then `SequenceBackbone` (token embedding -> blocks -> final
RMSNorm -> (B, L, C) hidden states), the alternative embedder backbone to EvermindLM.

This file is the definition: gpu/blocks holds the WGSL twins and tests them against these functions. It needs
numpy only. Forward only (plus the selective scan's backward); training these blocks is not here yet.
Shapes: B batch, L time, C d_model, D inner width, N states, H heads, P head width, G groups, K conv width,
V vocab, M = B * L rows. Scans run chunk by chunk with the closed form inside a chunk, never step by step.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.lm.checkpoint import DEFAULT_MAX_BYTES
from evermind_memory.lm.layers import RMS_EPS, conv_forward, rmsnorm_forward
from evermind_memory.lm.model_file import SEQUENCE_BACKBONE, Backbone, load_model_file, save_model_file
from evermind_memory.lm.scan import (  # noqa: F401 (re-exported: the kernel references' public home was here)
    A_LOG_MAX,
    A_LOG_MIN,
    silu,
    causal_attention_numpy,
    complex_ssd_numpy,
    linear_scan_numpy,
    selective_scan_backward_numpy,
    selective_scan_numpy,
    softplus_numpy,
    ssd_numpy,
)

__all__ = [
    "RMS_EPS",
    "LAYER_TYPES",
    "MAX_STATE",
    "softplus_numpy",
    "linear_scan_numpy",
    "selective_scan_numpy",
    "selective_scan_backward_numpy",
    "ssd_numpy",
    "complex_ssd_numpy",
    "causal_attention_numpy",
    "Mamba1Config",
    "Mamba2Config",
    "Mamba3Config",
    "AttentionConfig",
    "block_config",
    "block_kind",
    "block_param_shapes",
    "init_block_params",
    "block_forward",
    "SequenceModelConfig",
    "sequence_param_shapes",
    "init_sequence_params",
    "SequenceBackbone",
    "SEQUENCE_FILE",
    "save_sequence_model",
    "load_sequence_model",
]

LAYER_TYPES = ("mamba1", "mamba2", "mamba3", "attention")
MAX_STATE = 64  # the GPU scans keep N (or Nc) states per lane in a fixed array; configs keep to it so
# every checkpoint also runs on the GPU


# ── block configs ──────────────────────────────────────────────────────────────────────────────────


def _positive_ints(cfg: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(f"{type(cfg).__name__}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class Mamba1Config:
    """Shape of a Mamba-1 block."""

    d_model: int  # C, the block's input and output width
    d_state: int = 16  # N, state size per inner channel
    d_conv: int = 4  # K, causal conv width
    expand: int = 2  # inner width D = expand * C
    dt_rank: int = 0  # R, rank of the time-step projection; 0 means ceil(C / 16)

    def __post_init__(self) -> None:
        _positive_ints(self, ("d_model", "d_state", "d_conv", "expand"))
        if isinstance(self.dt_rank, bool) or not isinstance(self.dt_rank, int) or self.dt_rank < 0:
            raise InvalidInput(f"Mamba1Config.dt_rank must be an int >= 0, got {self.dt_rank!r}")

    @property
    def d_inner(self) -> int:
        """D = expand * d_model."""
        return self.expand * self.d_model

    @property
    def rank(self) -> int:
        """R, the resolved dt rank."""
        return self.dt_rank or math.ceil(self.d_model / 16)


@dataclass(frozen=True)
class Mamba2Config:
    """Shape of a Mamba-2 block."""

    d_model: int  # C, the block's input and output width
    d_state: int = 16  # N, state size per head (at most MAX_STATE)
    d_conv: int = 4  # K, causal conv width
    expand: int = 2  # inner width D = expand * C
    n_heads: int = 4  # H, divides D; head width P = D / H
    n_groups: int = 1  # G, B/C groups shared by consecutive heads; divides H
    chunk_len: int = 64  # time steps per SSD chunk on the GPU (does not change the result)

    def __post_init__(self) -> None:
        _positive_ints(self, ("d_model", "d_state", "d_conv", "expand", "n_heads", "n_groups", "chunk_len"))
        if self.d_inner % self.n_heads or self.n_heads % self.n_groups:
            raise InvalidInput(
                f"{type(self).__name__}: n_heads ({self.n_heads}) must divide d_inner ({self.d_inner}) and "
                f"n_groups ({self.n_groups}) must divide n_heads"
            )
        if self.d_state > MAX_STATE:
            raise InvalidInput(f"{type(self).__name__}.d_state must be at most {MAX_STATE}, got {self.d_state}")

    @property
    def d_inner(self) -> int:
        """D = expand * d_model."""
        return self.expand * self.d_model

    @property
    def d_head(self) -> int:
        """P = D / H."""
        return self.d_inner // self.n_heads


@dataclass(frozen=True)
class Mamba3Config(Mamba2Config):
    """Shape of a Mamba-3 block; d_state is Nc, the number of complex states per head (at most MAX_STATE)."""


@dataclass(frozen=True)
class AttentionConfig:
    """Shape of an attention block."""

    d_model: int  # C, the block's input and output width
    n_heads: int = 4  # H, divides C; head width P = C / H
    ffn_mult: int = 0  # hidden width of the SiLU feed-forward sublayer in units of C; 0 leaves it out

    def __post_init__(self) -> None:
        _positive_ints(self, ("d_model", "n_heads"))
        if isinstance(self.ffn_mult, bool) or not isinstance(self.ffn_mult, int) or self.ffn_mult < 0:
            raise InvalidInput(f"AttentionConfig.ffn_mult must be an int >= 0, got {self.ffn_mult!r}")
        if self.d_model % self.n_heads:
            raise InvalidInput(f"AttentionConfig: n_heads ({self.n_heads}) must divide d_model ({self.d_model})")


# ── blocks: parameter shapes, initial weights, forward ────────────────────────────────────────────
# Every block maps (B, L, C) -> (B, L, C) with its own pre-norm and residual.


def _gaussian(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _norm_rows(x: np.ndarray, gain: np.ndarray) -> np.ndarray:
    return rmsnorm_forward(x, gain)[0]  # (M, C) the forward half only: nothing is trained here


def _conv(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return conv_forward(x, w)[0] + bias  # (B, L, D) causal depthwise, so right padding never leaks back


def _mamba1_shapes(cfg: Mamba1Config) -> dict[str, tuple[int, ...]]:
    c, d, n, k, r = cfg.d_model, cfg.d_inner, cfg.d_state, cfg.d_conv, cfg.rank
    return {
        "norm": (c,), "w_in": (c, 2 * d), "b_in": (2 * d,), "w_conv": (k, d), "b_conv": (d,),
        "w_x": (d, r + 2 * n), "b_x": (r + 2 * n,), "w_dt": (r, d), "b_dt": (d,),
        "a_log": (d, n), "d": (d,), "w_out": (d, c), "b_out": (c,),
    }


def _mamba1_init(cfg: Mamba1Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = _mamba1_shapes(cfg)
    d, n = cfg.d_inner, cfg.d_state
    std = {"w_in": 0.02, "w_conv": 0.01, "w_x": 0.01, "w_dt": 0.02, "w_out": 0.02}
    params = {name: _gaussian(rng, shapes[name], s) for name, s in std.items()}
    params |= {name: np.zeros(shapes[name], np.float32) for name in ("b_in", "b_conv", "b_x", "b_dt", "b_out")}
    params["norm"] = np.ones(shapes["norm"], np.float32)  # (C,)
    params["d"] = np.ones(d, np.float32)  # (D,)
    params["a_log"] = np.broadcast_to(np.log(np.arange(1, n + 1, dtype=np.float32)), (d, n)).copy()  # (D, N)
    return {name: params[name] for name in shapes}


def _mamba1_forward(cfg: Mamba1Config, p: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """x + out_proj(scan(silu(conv(x_part)), dt_proj(dt_part), B, C) * silu(z)), x_part | z = in_proj(norm(x))."""
    b, length, c = x.shape
    d, n, r = cfg.d_inner, cfg.d_state, cfg.rank
    m = b * length
    xz = _norm_rows(x.reshape(m, c), p["norm"]) @ p["w_in"] + p["b_in"]  # (M, 2D)
    xs, z = xz[:, :d], xz[:, d:]  # (M, D) each: column slices, not prefix copies (seed-001)
    u = silu(_conv(xs.reshape(b, length, d), p["w_conv"], p["b_conv"]))  # (B, L, D)
    dbc = u.reshape(m, d) @ p["w_x"] + p["b_x"]  # (M, R + 2N)
    delta = dbc[:, :r] @ p["w_dt"] + p["b_dt"]  # (M, D)
    bm, cm = dbc[:, r:r + n], dbc[:, r + n:]  # (M, N) each
    y = selective_scan_numpy(u, delta.reshape(b, length, d), p["a_log"], bm.reshape(b, length, n),
                             cm.reshape(b, length, n), p["d"], z.reshape(b, length, d))  # (B, L, D)
    return x + (y.reshape(m, d) @ p["w_out"] + p["b_out"]).reshape(b, length, c)


def _state_width(cfg: Mamba2Config) -> int:
    return 2 if isinstance(cfg, Mamba3Config) else 1  # floats per state: (re, im) pairs for Mamba-3


def _mamba2_shapes(cfg: Mamba2Config) -> dict[str, tuple[int, ...]]:
    c, d, h, k = cfg.d_model, cfg.d_inner, cfg.n_heads, cfg.d_conv
    conv_d = d + 2 * cfg.n_groups * cfg.d_state * _state_width(cfg)
    a_log = (h, 2) if isinstance(cfg, Mamba3Config) else (h,)
    return {
        "pre_norm": (c,), "w_in": (c, conv_d + h), "w_conv": (k, conv_d), "b_conv": (conv_d,),
        "a_log": a_log, "dt_bias": (h,), "d": (h,), "norm": (d,), "w_out": (d, c),
    }


def _mamba2_init(cfg: Mamba2Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = _mamba2_shapes(cfg)
    h = cfg.n_heads
    if isinstance(cfg, Mamba3Config):
        # Decaying (Re A = -1; the reference's 0 never decays) with phases spread evenly, as the reference.
        a_log = np.stack([np.full(h, -1.0), 2 * np.pi * np.arange(h) / h], axis=1).astype(np.float32)  # (H, 2)
    else:
        a_log = np.zeros(h, np.float32)  # (H,) softplus(0) = log 2 per head
    return {
        "pre_norm": np.ones(shapes["pre_norm"], np.float32),
        "w_in": _gaussian(rng, shapes["w_in"], 0.02),
        "w_conv": _gaussian(rng, shapes["w_conv"], 0.01),
        "b_conv": np.zeros(shapes["b_conv"], np.float32),
        "a_log": a_log,
        "dt_bias": np.zeros(shapes["dt_bias"], np.float32),
        "d": np.ones(shapes["d"], np.float32),
        "norm": np.ones(shapes["norm"], np.float32),
        "w_out": _gaussian(rng, shapes["w_out"], 0.02),
    }


def _mamba2_forward(cfg: Mamba2Config, p: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """x + out_proj(norm(scan(x_c, dt, B_c, C_c))), (x | B | C) | dt = in_proj(norm(x)), x_c | B_c | C_c = conv."""
    b, length, c = x.shape
    d, h = cfg.d_inner, cfg.n_heads
    bcw = cfg.n_groups * cfg.d_state * _state_width(cfg)
    m, conv_d = b * length, d + 2 * bcw
    proj = _norm_rows(x.reshape(m, c), p["pre_norm"]) @ p["w_in"]  # (M, conv_d + H)
    xbc, dt = proj[:, :conv_d], proj[:, conv_d:]  # (M, conv_d), (M, H)
    conv = _conv(xbc.reshape(b, length, conv_d), p["w_conv"], p["b_conv"])  # (B, L, conv_d)
    xs, bm, cm = conv[..., :d], conv[..., d:d + bcw], conv[..., d + bcw:]  # (B, L, D), (B, L, bcw) x 2
    scan = complex_ssd_numpy if isinstance(cfg, Mamba3Config) else ssd_numpy
    y = scan(xs, dt.reshape(b, length, h), p["a_log"], p["dt_bias"], bm, cm, p["d"],
             n_groups=cfg.n_groups)  # (B, L, D)
    yn = _norm_rows(y.reshape(m, d), p["norm"])  # (M, D)
    return x + (yn @ p["w_out"]).reshape(b, length, c)


def _attention_shapes(cfg: AttentionConfig) -> dict[str, tuple[int, ...]]:
    c, f = cfg.d_model, cfg.ffn_mult * cfg.d_model
    shapes = {"norm": (c,), "w_qkv": (c, 3 * c), "b_qkv": (3 * c,), "w_o": (c, c), "b_o": (c,)}
    if f:
        shapes |= {"w_ffn1": (c, f), "b_ffn1": (f,), "w_ffn2": (f, c), "b_ffn2": (c,)}
    return shapes


def _attention_init(cfg: AttentionConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    params = {}
    for name, shape in _attention_shapes(cfg).items():
        if name.startswith("w_"):
            params[name] = _gaussian(rng, shape, 0.02)
        else:
            params[name] = (np.ones if name == "norm" else np.zeros)(shape, np.float32)
    return params


def _attention_forward(cfg: AttentionConfig, p: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """x + o_proj(causal_attention(q, k, v)), q | k | v = qkv(norm(x)); then the optional SiLU feed-forward."""
    b, length, c = x.shape
    m = b * length
    qkv = _norm_rows(x.reshape(m, c), p["norm"]) @ p["w_qkv"] + p["b_qkv"]  # (M, 3C)
    q, k, v = (qkv[:, i * c:(i + 1) * c].reshape(b, length, c) for i in range(3))  # (B, L, C) each
    o = causal_attention_numpy(q, k, v, cfg.n_heads)  # (B, L, C)
    cur = x.reshape(m, c) + o.reshape(m, c) @ p["w_o"] + p["b_o"]  # (M, C)
    if cfg.ffn_mult:
        cur = cur + silu(cur @ p["w_ffn1"] + p["b_ffn1"]) @ p["w_ffn2"] + p["b_ffn2"]  # (M, C)
    return cur.reshape(b, length, c)


_BlockConfig = Mamba1Config | Mamba2Config | AttentionConfig
# kind -> (param shapes, initial weights, forward); Mamba-3 shares Mamba-2's functions (they read the config)
_BLOCKS: dict[str, tuple[Callable, Callable, Callable]] = {
    "mamba1": (_mamba1_shapes, _mamba1_init, _mamba1_forward),
    "mamba2": (_mamba2_shapes, _mamba2_init, _mamba2_forward),
    "mamba3": (_mamba2_shapes, _mamba2_init, _mamba2_forward),
    "attention": (_attention_shapes, _attention_init, _attention_forward),
}
_CONFIG_KIND = {Mamba1Config: "mamba1", Mamba2Config: "mamba2", Mamba3Config: "mamba3", AttentionConfig: "attention"}


def block_kind(cfg: Any) -> str:
    """The block type ("mamba1", "mamba2", "mamba3" or "attention") a block config describes.

    Raises:
        InvalidInput: cfg is not a block config.
    """
    kind = _CONFIG_KIND.get(type(cfg))
    if kind is None:
        raise InvalidInput(f"expected a block config ({', '.join(c.__name__ for c in _CONFIG_KIND)}), "
                           f"got {type(cfg).__name__}")
    return kind


def block_param_shapes(cfg: _BlockConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of the block `cfg` describes, in a fixed order.

    Raises:
        InvalidInput: cfg is not a block config.
    """
    return _BLOCKS[block_kind(cfg)][0](cfg)


def init_block_params(cfg: _BlockConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Initial float32 weights of a block, drawn from rng as the reference initialises them.

    Raises:
        InvalidInput: cfg is not a block config.
    """
    return _BLOCKS[block_kind(cfg)][1](cfg, rng)


def block_forward(cfg: _BlockConfig, params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """One block, residual included: x (B, L, C) -> (B, L, C) in x's dtype (params trusted to fit cfg).

    Args:
        cfg: the block's config.
        params: name -> array with the shapes of `block_param_shapes(cfg)`.
        x: (B, L, C) float input.

    Returns:
        (B, L, C).

    Raises:
        InvalidInput: cfg is not a block config.
    """
    return _BLOCKS[block_kind(cfg)][2](cfg, params, x)


# ── the stacked backbone ───────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class SequenceModelConfig:
    """Shape of a stacked sequence model; `block` names the block type of every layer."""

    vocab_size: int  # V
    d_model: int  # C
    n_layers: int  # number of stacked blocks
    block: str | tuple[str, ...] = "mamba2"  # one of LAYER_TYPES, or one per layer (a hybrid schedule)
    d_state: int = 16  # N for Mamba-1/2, Nc (complex states) for Mamba-3
    d_conv: int = 4  # K, the Mamba blocks' conv width
    expand: int = 2  # Mamba inner width = expand * C
    n_heads: int = 4  # heads of Mamba-2/3 and attention
    n_groups: int = 1  # B/C groups of Mamba-2/3
    chunk_len: int = 64  # SSD chunk length on the GPU
    ffn_mult: int = 0  # attention blocks' feed-forward width in units of C (0: none)

    def __post_init__(self) -> None:
        _positive_ints(self, ("vocab_size", "d_model", "n_layers"))
        if isinstance(self.block, list):
            object.__setattr__(self, "block", tuple(self.block))  # a JSON header gives a list
        schedule = self.schedule
        if len(schedule) != self.n_layers or any(not isinstance(k, str) or k not in LAYER_TYPES for k in schedule):
            raise InvalidInput(
                f"SequenceModelConfig.block must be one of {LAYER_TYPES} or a tuple of {self.n_layers} of them, "
                f"got {self.block!r}"
            )
        for kind in dict.fromkeys(schedule):  # every block type in use checks its sizes now, not at build time
            block_config(kind, self)

    @property
    def schedule(self) -> tuple[str, ...]:
        """The block type of each layer."""
        return (self.block,) * self.n_layers if isinstance(self.block, str) else tuple(self.block)

    @property
    def architecture(self) -> str:
        """A stable description of the architecture (for a fingerprint): every field, in order."""
        blocks = "+".join(self.schedule)
        return (f"seqmodel/{blocks}/V{self.vocab_size}-C{self.d_model}-N{self.d_state}-K{self.d_conv}-"
                f"E{self.expand}-H{self.n_heads}-G{self.n_groups}-Q{self.chunk_len}-F{self.ffn_mult}")

    def to_dict(self) -> dict[str, Any]:
        """The config as a JSON-ready dict (a schedule becomes a list)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if not isinstance(out["block"], str):
            out["block"] = list(out["block"])
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SequenceModelConfig:
        """Build a config from a dict such as `to_dict()` returns.

        Raises:
            InvalidInput: not a mapping, unknown or missing keys, wrong types or sizes.
        """
        if not isinstance(d, Mapping):
            raise InvalidInput(f"SequenceModelConfig.from_dict expected a dict, got {type(d).__name__}.")
        known = [f.name for f in fields(cls)]
        unknown, missing = sorted(set(d) - set(known)), [k for k in known if k not in d]
        if unknown or missing:
            raise InvalidInput(f"SequenceModelConfig.from_dict expected exactly the keys {known}; "
                               f"unknown {unknown}, missing {missing}.")
        ints = [k for k in known if k != "block"]
        bad = [k for k in ints if isinstance(d[k], bool) or not isinstance(d[k], int)]
        if bad:
            raise InvalidInput(f"SequenceModelConfig.from_dict expected ints for {bad}, got "
                               f"{[type(d[k]).__name__ for k in bad]}.")
        block = d["block"]
        if not isinstance(block, (str, list, tuple)):
            raise InvalidInput(f"SequenceModelConfig.from_dict expected 'block' a string or a list, got {block!r:.60}.")
        return cls(**{**d, "block": block if isinstance(block, str) else tuple(block)})


def block_config(kind: str, cfg: SequenceModelConfig) -> _BlockConfig:
    """The config of one block of type `kind` with the model's shared sizes.

    Raises:
        InvalidInput: an unknown kind or inconsistent sizes.
    """
    if kind == "mamba1":
        return Mamba1Config(cfg.d_model, cfg.d_state, cfg.d_conv, cfg.expand)
    if kind in ("mamba2", "mamba3"):
        conf = Mamba2Config if kind == "mamba2" else Mamba3Config
        return conf(cfg.d_model, cfg.d_state, cfg.d_conv, cfg.expand, cfg.n_heads, cfg.n_groups, cfg.chunk_len)
    if kind == "attention":
        return AttentionConfig(cfg.d_model, cfg.n_heads, cfg.ffn_mult)
    raise InvalidInput(f"unknown block type {kind!r}; expected one of {LAYER_TYPES}")


def sequence_param_shapes(config: SequenceModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every backbone parameter: "embedding", "layer{i}.{name}", "final_norm", in order."""
    shapes: dict[str, tuple[int, ...]] = {"embedding": (config.vocab_size, config.d_model)}
    for i, kind in enumerate(config.schedule):
        shapes |= {f"layer{i}.{n}": s for n, s in block_param_shapes(block_config(kind, config)).items()}
    shapes["final_norm"] = (config.d_model,)
    return shapes


def init_sequence_params(config: SequenceModelConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Initial float32 weights of the whole backbone: the embedding, then each block in order, from rng."""
    params = {"embedding": (rng.standard_normal((config.vocab_size, config.d_model))
                            / np.sqrt(config.d_model)).astype(np.float32)}  # (V, C)
    for i, kind in enumerate(config.schedule):
        block = init_block_params(block_config(kind, config), rng)
        params |= {f"layer{i}.{n}": a for n, a in block.items()}
    params["final_norm"] = np.ones(config.d_model, np.float32)  # (C,)
    return params


class SequenceBackbone:
    """Token ids -> (B, L, C) hidden states: embedding, the block schedule, a final RMSNorm (numpy, forward).

    Every block is causal, so a position's hidden state does not depend on anything to its right: batches
    padded on the right give the real positions exactly the states they have alone. Read-only after
    construction, so concurrent `forward` calls are safe.

    Example:
        backbone = SequenceBackbone.init(SequenceModelConfig(vocab_size=256, d_model=32, n_layers=2))
        hidden = backbone.forward(np.array([[1, 2, 3]]))  # (1, 3, 32)
    """

    def __init__(self, config: SequenceModelConfig, params: Mapping[str, np.ndarray]) -> None:
        """Build a backbone from parameters (copied to float32).

        Args:
            config: the model's shape and block schedule.
            params: name -> array, exactly the names and shapes of `sequence_param_shapes(config)`.

        Raises:
            InvalidInput: wrong config type, missing or unknown names, wrong shapes, non-float or non-finite values.
        """
        if not isinstance(config, SequenceModelConfig):
            raise InvalidInput(f"SequenceBackbone expected a SequenceModelConfig, got {type(config).__name__}.")
        shapes = sequence_param_shapes(config)
        missing, unknown = [n for n in shapes if n not in params], [n for n in params if n not in shapes]
        if missing or unknown:
            raise InvalidInput(f"SequenceBackbone expected the names of sequence_param_shapes(config); "
                               f"missing {missing[:5]}, unknown {unknown[:5]}.")
        checked = {}
        for name, shape in shapes.items():
            arr = np.asarray(params[name])
            if arr.shape != shape:
                raise InvalidInput(
                    f"SequenceBackbone: params[{name!r}] has shape {arr.shape}, the config needs {shape}."
                )
            if arr.dtype.kind != "f" or not np.all(np.isfinite(arr)):
                raise InvalidInput(f"SequenceBackbone: params[{name!r}] must be finite floats, got {arr.dtype}.")
            checked[name] = np.array(arr, dtype=np.float32, order="C")  # a copy: later edits to params do not leak
        self.config = config
        self.params = checked
        self._blocks = [
            (block_config(kind, config), {n[len(f"layer{i}."):]: a for n, a in checked.items()
                                          if n.startswith(f"layer{i}.")})
            for i, kind in enumerate(config.schedule)
        ]

    @classmethod
    def init(cls, config: SequenceModelConfig, rng: np.random.Generator | None = None) -> SequenceBackbone:
        """A freshly initialised backbone (weights from `rng`, a seed-0 generator when None)."""
        return cls(config, init_sequence_params(config, rng or np.random.default_rng(0)))

    def forward(self, ids: np.ndarray) -> np.ndarray:
        """The final hidden states.

        Args:
            ids: integer (B, L) token ids in [0, V).

        Returns:
            (B, L, C) float32.

        Raises:
            InvalidInput: ids not an integer (B, L) array inside the vocabulary.
        """
        if not isinstance(ids, np.ndarray) or not np.issubdtype(ids.dtype, np.integer) or ids.ndim != 2:
            got = f"{ids.dtype} {ids.shape}" if isinstance(ids, np.ndarray) else type(ids).__name__
            raise InvalidInput(f"token ids must be an integer (B, L) array, got {got}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise InvalidInput(f"token ids must lie in [0, {self.config.vocab_size}), got [{ids.min()}, {ids.max()}]")
        h = self.params["embedding"][ids]  # (B, L, C)
        if h.size == 0:
            return h
        for cfg, p in self._blocks:
            h = block_forward(cfg, p, h)  # (B, L, C)
        b, length, c = h.shape
        return _norm_rows(h.reshape(b * length, c), self.params["final_norm"]).reshape(b, length, c)

    def save(self, path: Any, *, fp16: bool = False) -> None:
        """Write the config and weights to a .evlm checkpoint (see save_sequence_model).

        Raises:
            CheckpointError: the file could not be written.
        """
        save_sequence_model(path, self.config, self.params, fp16=fp16)

    @classmethod
    def load(cls, path: Any) -> SequenceBackbone:
        """Read a backbone from a checkpoint written by `save`.

        Raises:
            CheckpointError: missing, corrupt, truncated, another format, or not a sequence backbone.
        """
        return cls(*load_sequence_model(path))


# ── model files ────────────────────────────────────────────────────────────────────────────────────

SEQUENCE_FILE = Backbone(SEQUENCE_BACKBONE, SequenceModelConfig, sequence_param_shapes)


def save_sequence_model(
    path: str | os.PathLike[str], config: SequenceModelConfig, params: Mapping[str, np.ndarray], *,
    fp16: bool = False,
) -> None:
    """Save a SequenceBackbone's config and parameters atomically, in the model file format.

    The header meta is {"backbone": "sequence", "config": SequenceModelConfig fields}; EvermindLM files
    have no "backbone" key.

    Args:
        path: destination file (conventionally *.evlm).
        config: the SequenceModelConfig.
        params: name -> array, exactly the names and shapes of sequence_param_shapes(config).
        fp16: store weights as float16 (half the size; loaded back as float32).

    Raises:
        InvalidInput: params do not match the config, are not finite floats, or cannot be stored.
        CheckpointError: the file system refused the write (an existing file is left as it was).
    """
    save_model_file(path, SEQUENCE_FILE, config, params, fp16=fp16, what="save_sequence_model")


def load_sequence_model(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[SequenceModelConfig, dict[str, np.ndarray]]:
    """Load and validate a SequenceBackbone checkpoint written by save_sequence_model.

    Args:
        path: the checkpoint file.
        max_bytes: refuse files larger than this.

    Returns:
        (config, params): the SequenceModelConfig and name -> float32 array in sequence_param_shapes order.

    Raises:
        CheckpointError: as load_model, or the file holds an EvermindLM.
    """
    _, config, params = load_model_file(path, [SEQUENCE_FILE], max_bytes=max_bytes)
    return config, params
