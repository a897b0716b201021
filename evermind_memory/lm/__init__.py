"""EvermindLM, the sequence backbone (Mamba / attention blocks) and the byte-level BPE tokenizer: numpy only
(plus `regex` for pre-tokenizing).

Checkpoints (lm.checkpoint) and the inference side of LoRA adapters (lm.adapter) live here too, so that
loading an adapted model never imports `training`.
"""

from __future__ import annotations

from evermind_memory.lm.model import EvermindLM, LMConfig, param_shapes
from evermind_memory.lm.sequence import SequenceBackbone, SequenceModelConfig
from evermind_memory.lm.tokenizer import BPETokenizer

__all__ = ["BPETokenizer", "EvermindLM", "LMConfig", "SequenceBackbone", "SequenceModelConfig", "param_shapes"]
