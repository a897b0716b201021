"""EvermindLM, the sequence backbone (Mamba / attention blocks) and the byte-level BPE tokenizer: numpy only
(plus `regex` for pre-tokenizing).

Checkpoints (lm.checkpoint) and the inference side of LoRA adapters (lm.adapter) live here too, so that
loading an adapted model never imports `training`. The names below are imported when first used, so importing
one submodule (the tokenizer, the checkpoint format) does not import the models.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {"EvermindLM": "model", "LMConfig": "model", "param_shapes": "model", "SequenceBackbone": "sequence",
         "SequenceModelConfig": "sequence", "BPETokenizer": "tokenizer"}

__all__ = ["BPETokenizer", "EvermindLM", "LMConfig", "SequenceBackbone", "SequenceModelConfig", "param_shapes"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
