"""A small stacked sequence model (the reference's `mamba_model.ts`) on the GPU: token embedding, a stack of
sequence blocks (one type, or a per-layer schedule, named in the config), then a final RMSNorm.

`forward` gives the final hidden states (B, L, C) in one submit. The config, the initial weights and the
numpy reference (`forward_numpy`) are `lm.sequence` (`SequenceModelConfig`, `SequenceBackbone`), which is
also the embedder's CPU backbone (embedder.SequenceEmbedder) and has a checkpoint format. No LM head or
training here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.blocks import sequence_ops as so
from evermind_memory.gpu.blocks.attention import AttentionBlock
from evermind_memory.gpu.blocks.mamba1 import Mamba1Block
from evermind_memory.gpu.blocks.mamba2 import Mamba2Block
from evermind_memory.gpu.blocks.mamba3 import Mamba3Block
from evermind_memory.gpu.blocks.sequence_layer import RMS_EPS, SequenceLayer
from evermind_memory.gpu.device import get_device
from evermind_memory.lm.sequence import (
    SequenceBackbone,
    SequenceModelConfig,
    block_config,
    init_sequence_params,
)

__all__ = ["SequenceModelConfig", "SequenceModel", "build_block"]

_BLOCK_CLASSES: dict[str, type[SequenceLayer]] = {
    "mamba1": Mamba1Block, "mamba2": Mamba2Block, "mamba3": Mamba3Block, "attention": AttentionBlock,
}


def build_block(kind: str, cfg: SequenceModelConfig, rng: np.random.Generator,
                params: Mapping[str, np.ndarray] | None = None) -> SequenceLayer:
    """A block of the given type with the model's shared sizes, freshly initialised or from `params`.

    Args:
        kind: one of LAYER_TYPES.
        cfg: the model config (sizes).
        rng: generator for the initial weights (unused when params are given).
        params: the block's parameters by name, or None to initialise them.

    Returns:
        The block.

    Raises:
        InvalidInput: an unknown kind, inconsistent sizes or parameters that do not fit.
    """
    conf = block_config(kind, cfg)  # raises for an unknown kind
    return _BLOCK_CLASSES[kind](conf, params=params, rng=rng)


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
        self._setup(config, init_sequence_params(config, rng or np.random.default_rng(0)))

    def _setup(self, config: SequenceModelConfig, params: Mapping[str, np.ndarray]) -> None:
        self.config = config
        self.embedding = np.ascontiguousarray(params["embedding"], dtype=np.float32)  # (V, C)
        rng = np.random.default_rng(0)  # unused: every block gets its parameters
        self.layers = [
            build_block(kind, config, rng, {n[len(f"layer{i}."):]: a for n, a in params.items()
                                            if n.startswith(f"layer{i}.")})
            for i, kind in enumerate(config.schedule)
        ]
        self.final_norm = np.ascontiguousarray(params["final_norm"], dtype=np.float32)  # (C,)

    @classmethod
    def from_backbone(cls, backbone: SequenceBackbone) -> SequenceModel:
        """The GPU twin of a numpy `SequenceBackbone` (e.g. one loaded from a checkpoint), same weights.

        Raises:
            InvalidInput: backbone is not a SequenceBackbone.
        """
        if not isinstance(backbone, SequenceBackbone):
            raise InvalidInput(
                f"SequenceModel.from_backbone expected a SequenceBackbone, got {type(backbone).__name__}"
            )
        model = cls.__new__(cls)
        model._setup(backbone.config, backbone.params)
        return model

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
        return SequenceBackbone(self.config, self.parameters()).forward(self._check_ids(ids))

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
