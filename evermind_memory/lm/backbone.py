"""Read a model file of either backbone: the header's meta says whether it holds an EvermindLM or a
SequenceBackbone (lm.model_file), and the matching config type parses it."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from evermind_memory.lm.checkpoint import DEFAULT_MAX_BYTES
from evermind_memory.lm.model import LM_FILE
from evermind_memory.lm.model_file import load_model_file
from evermind_memory.lm.sequence import SEQUENCE_FILE

__all__ = ["load_backbone"]


def load_backbone(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[Any, dict[str, np.ndarray]]:
    """Load a model file of either backbone; the header's meta says which.

    Args:
        path: the checkpoint file.
        max_bytes: refuse files larger than this.

    Returns:
        (config, params): an LMConfig (EvermindLM) or a SequenceModelConfig, and its float32 params.

    Raises:
        CheckpointError: as load_model.
    """
    _, config, params = load_model_file(path, [LM_FILE, SEQUENCE_FILE], max_bytes=max_bytes)
    return config, params
