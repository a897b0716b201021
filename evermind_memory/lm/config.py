"""LMConfig and the parameter layout of an EvermindLM: names, shapes and initial values.

Shape letters as in model.py: V vocab, C channels, K conv width, H expert hidden, E experts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from evermind_memory.errors import InvalidInput

__all__ = ["LMConfig", "param_shapes", "init_param"]


@dataclass(frozen=True)
class LMConfig:
    """Shape of an EvermindLM; validated on construction (InvalidInput)."""

    vocab_size: int  # V: token ids are in [0, vocab_size)
    d_model: int = 64  # C: channels of the residual stream and of the tied embedding
    n_layers: int = 2  # conv + MoE blocks
    conv_kernel: int = 3  # K: causal conv width (tap k reads the input k steps back)
    hidden_dim: int = 128  # H: hidden width of every expert FFN (shared and routed)
    n_experts: int = 4  # E: routed experts per layer
    top_k: int = 2  # routed experts active per position, 1 <= top_k <= n_experts
    attn_heads: int = 0  # heads of the bidirectional attention block before pooling; 0: plain mean pooling

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InvalidInput(
                    f"LMConfig expected an int for {f.name}, got {value!r} ({type(value).__name__})."
                )
            lowest = 0 if f.name == "attn_heads" else 1
            if value < lowest:
                raise InvalidInput(f"LMConfig expected {f.name} >= {lowest}, got {f.name}={value}.")
            object.__setattr__(self, f.name, int(value))
        if self.attn_heads and self.d_model % self.attn_heads:
            raise InvalidInput(
                f"LMConfig expected d_model divisible by attn_heads, got d_model={self.d_model}, "
                f"attn_heads={self.attn_heads}."
            )
        if self.top_k > self.n_experts:
            raise InvalidInput(
                f"LMConfig expected top_k <= n_experts, got top_k={self.top_k}, n_experts={self.n_experts}. "
                "Lower top_k or add experts."
            )

    def to_dict(self) -> dict[str, int]:
        """Return the config as a plain dict (JSON-ready).

        Returns:
            {field name: int} in field order.
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LMConfig:
        """Build a config from a dict such as `to_dict()` returns.

        Args:
            d: mapping of field names to ints; vocab_size is required, the rest default.

        Returns:
            The validated LMConfig.

        Raises:
            InvalidInput: not a mapping, unknown or missing keys, wrong types or ranges.
        """
        if not isinstance(d, Mapping):
            raise InvalidInput(f"LMConfig.from_dict expected a dict, got {type(d).__name__}.")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidInput(
                f"LMConfig.from_dict got unknown keys {unknown}; expected a subset of {sorted(known)}."
            )
        if "vocab_size" not in d:
            raise InvalidInput("LMConfig.from_dict expected a 'vocab_size' key; it is missing.")
        return cls(**d)


def param_shapes(config: LMConfig) -> dict[str, tuple[int, ...]]:
    """The canonical parameter names and shapes, in canonical order.

    Args:
        config: the model shape.

    Returns:
        {name: shape}: "emb" (V, C), then per layer l: conv_norm (C,), conv (K, C), moe_norm (C,),
        router (C, E), shared.{w1 (C, H), b1 (H,), w2 (H, C), b2 (C,)} and the same for expert0..E-1.
    """
    v, c, k, h, e = config.vocab_size, config.d_model, config.conv_kernel, config.hidden_dim, config.n_experts
    shapes: dict[str, tuple[int, ...]] = {"emb": (v, c)}
    for layer in range(config.n_layers):
        p = f"layers.{layer}."
        shapes[p + "conv_norm"] = (c,)
        shapes[p + "conv"] = (k, c)
        shapes[p + "moe_norm"] = (c,)
        shapes[p + "router"] = (c, e)
        for expert in ["shared"] + [f"expert{i}" for i in range(e)]:
            shapes[p + expert + ".w1"] = (c, h)
            shapes[p + expert + ".b1"] = (h,)
            shapes[p + expert + ".w2"] = (h, c)
            shapes[p + expert + ".b2"] = (c,)
    if config.attn_heads:  # the embedder's pooling block: h += attn(norm(h)); h = norm(h); mean
        shapes["pool.attn_norm"] = (c,)
        shapes["pool.wqkv"] = (c, 3 * c)
        shapes["pool.wo"] = (c, c)
        shapes["pool.out_norm"] = (c,)
    return shapes


def init_param(name: str, shape: tuple[int, ...], rng: np.random.Generator, d_model: int) -> np.ndarray:
    """Initial value of one parameter (draws from rng only for the random ones)."""
    leaf = name.rsplit(".", 1)[-1]
    if name == "emb" or leaf in ("router", "w2"):
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)
    if leaf == "w1":  # He init for the ReLU layer
        return rng.normal(0.0, math.sqrt(2.0 / d_model), size=shape).astype(np.float32)
    if leaf in ("conv_norm", "moe_norm", "attn_norm", "out_norm"):
        return np.ones(shape, dtype=np.float32)
    if leaf == "wqkv":
        return rng.normal(0.0, 1.0 / math.sqrt(d_model), size=shape).astype(np.float32)
    if leaf == "wo":  # small, so the untrained block starts close to a residual no-op
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)
    if leaf == "conv":  # identity pass-through: an untrained block is close to a residual no-op
        w = np.zeros(shape, dtype=np.float32)  # (K, C)
        w[0] = 1.0
        return w
    return np.zeros(shape, dtype=np.float32)  # biases
