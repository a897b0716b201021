"""Embedders: the protocol a store needs, the EvermindLM and sequence-backbone embedders, and the one loader
(embedder/loader.py) that builds them: the shipped default (lazily), a model + tokenizer pair, base + adapter.

Importing this package loads no model: the lm modules are imported when an embedder is built.
"""

from __future__ import annotations

from .base import Embedder, check_embedder, checked_vectors
from .lazy import LazyEmbedder
from .lm_embedder import LMEmbedder
from .loader import adapted_embedder, default_embedder, embedder_for, load_embedder
from .sequence_embedder import SequenceEmbedder
from .shipped import card

__all__ = [
    "Embedder",
    "LMEmbedder",
    "LazyEmbedder",
    "SequenceEmbedder",
    "adapted_embedder",
    "card",
    "check_embedder",
    "checked_vectors",
    "default_embedder",
    "embedder_for",
    "load_embedder",
]
