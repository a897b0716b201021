"""Embedders: the protocol a store needs, the EvermindLM and sequence-backbone embedders, a loader that picks
between them from a checkpoint, and the default one."""

from __future__ import annotations

from .base import Embedder, check_embedder, checked_vectors
from .lm_embedder import LMEmbedder
from .loader import load_embedder
from .sequence_embedder import SequenceEmbedder


def default_embedder() -> Embedder:
    """Return the shipped default embedder (the packaged tokenizer + weights), loaded once per process.

    Returns:
        An LMEmbedder over the shipped model, with the hybrid weight calibrated for it.
    Raises:
        EvermindError: no default model is shipped in this installation.
        CheckpointError: the shipped files are damaged.
    """
    from ..models import load_default

    return load_default()


__all__ = [
    "Embedder",
    "LMEmbedder",
    "SequenceEmbedder",
    "check_embedder",
    "checked_vectors",
    "default_embedder",
    "load_embedder",
]
