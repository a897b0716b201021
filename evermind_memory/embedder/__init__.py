"""Embedders: the protocol a store needs, the EvermindLM embedder, and the default one."""

from __future__ import annotations

from ..errors import EvermindError
from .base import Embedder, check_embedder, checked_vectors
from .lm_embedder import LMEmbedder


def default_embedder() -> Embedder:
    """Return the shipped default embedder (the packaged tokenizer + weights).

    Returns:
        An Embedder.
    Raises:
        EvermindError: no default model is shipped yet.
    """
    raise EvermindError(
        "No default model is shipped with evermind_memory yet, so MemoryStore(path) needs an embedder. "
        "Pass embedder=LMEmbedder(model, tokenizer) (or any object with embed, embed_many, dimensions "
        "and fingerprint)."
    )


__all__ = ["Embedder", "LMEmbedder", "check_embedder", "checked_vectors", "default_embedder"]
