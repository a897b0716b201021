"""A small stacked sequence model (the reference's `mamba_model.ts`): token embedding, a stack of sequence
blocks (one type, or a per-layer schedule, named in the config), then a final RMSNorm.

It is an alternative backbone: `forward` gives the final hidden states (B, L, C) on the GPU in one submit,
`forward_numpy` the reference. No LM head, training or checkpoint format; the embedder does not use it yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.attention import AttentionBlock, AttentionConfig
from evermind_memory.gpu.blocks.mamba1 import Mamba1Block, Mamba1Config
from evermind_memory.gpu.blocks.mamba2 import Mamba2Block, Mamba2Config
from evermind_memory.gpu.blocks.mamba3 import Mamba3Block, Mamba3Config
from evermind_memory.gpu.blocks.sequence_layer import LAYER_TYPES, RMS_EPS, SequenceLayer
from evermind_memory.gpu.device import get_device
from evermind_memory.gpu.ops import rmsnorm_numpy

__all__ = ["SequenceModelConfig", "SequenceModel", "build_block"]


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
        for name in ("vocab_size", "d_model", "n_layers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidInput(f"SequenceModelConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        schedule = self.schedule
        if len(schedule) != self.n_layers or any(kind not in LAYER_TYPES for kind in schedule):
            raise InvalidInput(
                f"SequenceModelConfig.block must be one of {LAYER_TYPES} or a tuple of {self.n_layers} of them, "
                f"got {self.block!r}"
            )

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


def build_block(kind: str, cfg: SequenceModelConfig, rng: np.random.Generator) -> SequenceLayer:
    """A freshly initialised block of the given type with the model's shared sizes.

    Args:
        kind: one of LAYER_TYPES.
        cfg: the model config (sizes).
        rng: generator for the initial weights.

    Returns:
        The block.

    Raises:
        InvalidInput: an unknown kind or inconsistent sizes.
    """
    if kind == "mamba1":
        return Mamba1Block(Mamba1Config(cfg.d_model, cfg.d_state, cfg.d_conv, cfg.expand), rng=rng)
    if kind in ("mamba2", "mamba3"):
        cls, conf = (Mamba2Block, Mamba2Config) if kind == "mamba2" else (Mamba3Block, Mamba3Config)
        return cls(conf(cfg.d_model, cfg.d_state, cfg.d_conv, cfg.expand, cfg.n_heads, cfg.n_groups, cfg.chunk_len),
                   rng=rng)
    if kind == "attention":
        return AttentionBlock(AttentionConfig(cfg.d_model, cfg.n_heads, cfg.ffn_mult), rng=rng)
    raise InvalidInput(f"unknown block type {kind!r}; expected one of {LAYER_TYPES}")


class SequenceModel:
    """Embedding -> stacked sequence blocks -> final RMSNorm, on the GPU with a numpy reference.

    Example:
        model = SequenceModel(SequenceModelConfig(vocab_size=256, d_model=64, n_layers=2, block="mamba2"))
        hidden = model.forward(np.array([[1, 2, 3]]))  # (1, 3, 64)
    """

    def __init__(self, config: SequenceModelConfig, rng: np.random.Generator | None = None) -> None:
        """Initialise every weight from `rng` (a seed-0 generator when None), as the reference does.

        Args:
            config: the model's shape and block schedule.
            rng: generator for the initial weights.

        Raises:
            InvalidInput: inconsistent sizes for a block type.
        """
        rng = rng or np.random.default_rng(0)
        self.config = config
        self.embedding = (rng.standard_normal((config.vocab_size, config.d_model))
                          / np.sqrt(config.d_model)).astype(np.float32)  # (V, C)
        self.layers = [build_block(kind, config, rng) for kind in config.schedule]
        self.final_norm = np.ones(config.d_model, np.float32)  # (C,)

    def parameters(self) -> dict[str, np.ndarray]:
        """Every parameter by name: "embedding", "layer{i}.{name}", "final_norm"."""
        params = {"embedding": self.embedding}
        for i, layer in enumerate(self.layers):
            params |= {f"layer{i}.{name}": arr for name, arr in layer.parameters().items()}
        params["final_norm"] = self.final_norm
        return params

    def _check_ids(self, ids: np.ndarray) -> np.ndarray:
        if not isinstance(ids, np.ndarray) or not np.issubdtype(ids.dtype, np.integer) or ids.ndim != 2:
            got = f"{ids.dtype} {ids.shape}" if isinstance(ids, np.ndarray) else type(ids).__name__
            raise InvalidInput(f"token ids must be an integer (B, L) array, got {got}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise InvalidInput(f"token ids must lie in [0, {self.config.vocab_size}), "
                               f"got [{ids.min()}, {ids.max()}]")
        return ids

    def forward_numpy(self, ids: np.ndarray) -> np.ndarray:
        """The numpy reference of `forward`.

        Args:
            ids: integer (B, L) token ids.

        Returns:
            (B, L, C) float32 final hidden states.

        Raises:
            InvalidInput: ids not an integer (B, L) array inside the vocabulary.
        """
        h = self.embedding[self._check_ids(ids)]  # (B, L, C)
        for layer in self.layers:
            h = layer.forward_numpy(h)  # (B, L, C)
        return rmsnorm_numpy(h, self.final_norm, RMS_EPS)

    def forward(self, ids: np.ndarray) -> np.ndarray:
        """The final hidden states on the GPU: every layer recorded into one command batch, one read back.

        Args:
            ids: integer (B, L) token ids.

        Returns:
            (B, L, C) float32.

        Raises:
            InvalidInput: ids not an integer (B, L) array inside the vocabulary.
            GpuUnavailable: no GPU device.
        """
        x = self.embedding[self._check_ids(ids)]  # (B, L, C) the lookup is a host gather
        if x.size == 0:
            return x
        b, length, c = x.shape
        dev = get_device()
        x_buf, norm_buf, out_buf = dev.upload(x), dev.upload(self.final_norm), dev.storage(x.nbytes)
        try:
            batch = dev.batch()
            cur = x_buf
            for layer in self.layers:
                nxt = batch.scratch(x.nbytes)
                layer.record_forward(batch, cur, nxt, b, length)
                cur = nxt
            so.record_rmsnorm(batch, cur, norm_buf, out_buf, b * length, c, RMS_EPS)
            batch.submit()
            return dev.read(out_buf, np.float32, x.shape)
        finally:
            for buf in (x_buf, norm_buf, out_buf):
                dev.release(buf)
