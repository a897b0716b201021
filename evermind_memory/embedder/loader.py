"""One loader for an embedder from files: the model file's header says which backbone it holds (EvermindLM
or a SequenceBackbone), and the matching embedder wraps it with the tokenizer.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import InvalidInput
from .lm_embedder import LMEmbedder
from .sequence_embedder import SequenceEmbedder


def load_embedder(
    path: str | os.PathLike[str], tokenizer: Any, *, max_tokens: int = 128, hybrid_weight: float = 2.0
) -> LMEmbedder | SequenceEmbedder:
    """Load a model checkpoint (.evlm) of either backbone as an embedder.

    Args:
        path: the model file (save_model / save_sequence_model).
        tokenizer: a BPETokenizer, or the path of its tokenizer.json.
        max_tokens: texts are truncated to this many tokens.
        hybrid_weight: weight of the cosine score against BM25 in hybrid recall.
    Returns:
        An LMEmbedder for an EvermindLM file, a SequenceEmbedder for a sequence-backbone file.
    Raises:
        CheckpointError: the model or tokenizer file is missing, damaged or of an unknown kind.
        InvalidInput: tokenizer is neither a tokenizer nor a path, or does not fit the model.

    Example:
        store = MemoryStore("agent.db", embedder=load_embedder("seq.evlm", "tokenizer.json"))
    """
    from ..lm.backbone import load_backbone
    from ..lm.model import EvermindLM, LMConfig
    from ..lm.sequence import SequenceBackbone
    from ..lm.tokenizer import BPETokenizer

    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = BPETokenizer.load(tokenizer)
    if not all(hasattr(tokenizer, a) for a in ("encode", "digest", "bos_id")):
        raise InvalidInput(
            f"load_embedder expected a BPETokenizer or a tokenizer.json path, got {type(tokenizer).__name__}."
        )
    config, params = load_backbone(path)
    if isinstance(config, LMConfig):
        return LMEmbedder(EvermindLM.from_params(config, params), tokenizer, max_tokens=max_tokens,
                          hybrid_weight=hybrid_weight)
    return SequenceEmbedder(SequenceBackbone(config, params), tokenizer, max_tokens=max_tokens,
                            hybrid_weight=hybrid_weight)
