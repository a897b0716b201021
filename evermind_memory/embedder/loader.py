"""The one place embedders are built: the shipped model (lazily), a model + tokenizer pair (objects or files,
either backbone) and a base embedder + LoRA adapter.

    default_embedder()                         the shipped model; weights read on the first embed
    load_embedder("m.evlm", "tokenizer.json")  files; the model file's header says which backbone
    embedder_for(model, tokenizer)             objects already in memory (a freshly trained model)
    adapted_embedder(base, weights)            base + LoRA adapter merged; the fingerprint covers it
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ..errors import InvalidInput
from .base import DEFAULT_HYBRID_WEIGHT
from .lazy import LazyEmbedder
from .lm_embedder import DEFAULT_BATCH, LMEmbedder
from .sequence_embedder import SequenceEmbedder
from .shipped import card, shipped_path


def _check_tokenizer(tokenizer: Any, where: str) -> None:
    if not all(hasattr(tokenizer, a) for a in ("encode", "digest", "bos_id")):
        raise InvalidInput(f"{where} expected a BPETokenizer or a tokenizer.json path, got {type(tokenizer).__name__}.")


def embedder_for(
    model: Any, tokenizer: Any, *, max_tokens: int = 128, hybrid_weight: float = DEFAULT_HYBRID_WEIGHT,
    adapter: Any = None, max_chunks: int = 1, first_chunk_weight: float = 1.0, lexicon: Any = None,
    lexicon_weight: float = 1.0, query_map: Any = None,
) -> LMEmbedder | SequenceEmbedder:
    """Wrap a model already in memory with its tokenizer as an embedder.

    Args:
        model: an EvermindLM or a SequenceBackbone.
        tokenizer: its BPETokenizer.
        max_tokens: texts are truncated to this many tokens (per window when max_chunks > 1).
        hybrid_weight: weight of the cosine score against BM25 in hybrid recall.
        adapter: lm.adapter.LoRAWeights to merge into an EvermindLM, or None.
        max_chunks: an EvermindLM reads up to this many windows of max_tokens (LMEmbedder); 1 truncates.
        first_chunk_weight: the first window's weight in the pooled vector (LMEmbedder).
        lexicon: an lm.lexicon.Lexicon (or its file's path) whose vector follows the model's (LMEmbedder), or None.
        lexicon_weight: the lexicon vector's weight against the model's.
        query_map: an lm.query_map.QueryMap (or its file's path) for recall queries (LMEmbedder), or None.
    Returns:
        An LMEmbedder (EvermindLM) or a SequenceEmbedder (SequenceBackbone).
    Raises:
        InvalidInput: an unknown model type, a tokenizer without encode/digest/bos_id, an adapter, a lexicon or a
            query map on a sequence backbone, an adapter that does not fit the model, or a query map of other
            dimensions than the vectors.
        CheckpointError: a lexicon or query map file is missing or damaged.
    """
    from ..lm.model import EvermindLM
    from ..lm.sequence import SequenceBackbone

    _check_tokenizer(tokenizer, "embedder_for")
    if isinstance(model, SequenceBackbone):
        if adapter is not None or lexicon is not None or query_map is not None:
            raise InvalidInput("LoRA adapters, lexicons and query maps apply to EvermindLM models only; this is a "
                               "sequence backbone.")
        if max_chunks != 1 or first_chunk_weight != 1.0:
            raise InvalidInput(f"max_chunks applies to EvermindLM models only; got max_chunks={max_chunks!r}, "
                               f"first_chunk_weight={first_chunk_weight!r} for a sequence backbone (pass 1 and 1.0).")
        return SequenceEmbedder(model, tokenizer, max_tokens=max_tokens, hybrid_weight=hybrid_weight)
    if not isinstance(model, EvermindLM):
        raise InvalidInput(f"embedder_for expected an EvermindLM or a SequenceBackbone, got {type(model).__name__}.")
    if isinstance(lexicon, (str, os.PathLike)):
        from ..lm.lexicon import Lexicon

        lexicon = Lexicon.load(lexicon)
    if isinstance(query_map, (str, os.PathLike)):
        from ..lm.query_map import QueryMap

        query_map = QueryMap.load(query_map)
    if adapter is None:
        return LMEmbedder(model, tokenizer, max_tokens=max_tokens, max_chunks=max_chunks,
                          first_chunk_weight=first_chunk_weight, hybrid_weight=hybrid_weight, lexicon=lexicon,
                          lexicon_weight=lexicon_weight, query_map=query_map)
    from ..lm.adapter import adapter_digest, merge_adapter

    return LMEmbedder(merge_adapter(model, adapter), tokenizer, max_tokens=max_tokens, max_chunks=max_chunks,
                      first_chunk_weight=first_chunk_weight, adapter_digest=adapter_digest(adapter),
                      hybrid_weight=hybrid_weight, lexicon=lexicon, lexicon_weight=lexicon_weight,
                      query_map=query_map)


def load_embedder(
    path: str | os.PathLike[str], tokenizer: Any, *, max_tokens: int = 128,
    hybrid_weight: float = DEFAULT_HYBRID_WEIGHT, adapter: Any = None, max_chunks: int = 1,
    first_chunk_weight: float = 1.0, lexicon: Any = None, lexicon_weight: float = 1.0, query_map: Any = None,
) -> LMEmbedder | SequenceEmbedder:
    """Load a model checkpoint (.evlm) of either backbone as an embedder.

    Args:
        path: the model file (save_model / save_sequence_model).
        tokenizer: a BPETokenizer, or the path of its tokenizer.json.
        max_tokens: texts are truncated to this many tokens.
        hybrid_weight: weight of the cosine score against BM25 in hybrid recall.
        adapter: LoRAWeights, or the path of an adapter file (lm.adapter.save_adapter), to merge; or None.
        max_chunks: windows of max_tokens an EvermindLM reads per text (see LMEmbedder); 1 truncates.
        first_chunk_weight: the first window's weight in the pooled vector (LMEmbedder).
        lexicon: an lm.lexicon.Lexicon or the path of a lexicon file (LMEmbedder), or None.
        lexicon_weight: the lexicon vector's weight against the model's.
        query_map: an lm.query_map.QueryMap or the path of a query map file (LMEmbedder), or None.
    Returns:
        An LMEmbedder for an EvermindLM file, a SequenceEmbedder for a sequence-backbone file.
    Raises:
        CheckpointError: the model, tokenizer, adapter, lexicon or query map file is missing, damaged or of an
            unknown kind.
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
    _check_tokenizer(tokenizer, "load_embedder")
    config, params = load_backbone(path)
    model = EvermindLM.from_params(config, params) if isinstance(config, LMConfig) else SequenceBackbone(config, params)
    if isinstance(adapter, (str, os.PathLike)):
        from ..lm.adapter import load_adapter

        adapter = load_adapter(adapter, model=model)
    return embedder_for(model, tokenizer, max_tokens=max_tokens, hybrid_weight=hybrid_weight, adapter=adapter,
                        max_chunks=max_chunks, first_chunk_weight=first_chunk_weight, lexicon=lexicon,
                        lexicon_weight=lexicon_weight, query_map=query_map)


def adapted_embedder(base: Any, weights: Any) -> LMEmbedder:
    """An LMEmbedder running base + LoRA adapter (merged), its fingerprint covering the adapter (R11).

    Args:
        base: the base LMEmbedder (or the default LazyEmbedder, which loads here).
        weights: lm.adapter.LoRAWeights fitted on base.model.
    Returns:
        A new LMEmbedder with base's tokenizer, max_tokens, max_chunks, first_chunk_weight, hybrid weight, batch
        size, lexicon and query map (base is not changed).
    Raises:
        InvalidInput: the adapter does not fit the model or the merged weights are not finite.
    """
    from ..lm.adapter import adapter_digest, merge_adapter

    return LMEmbedder(
        merge_adapter(base.model, weights), base.tokenizer, max_tokens=base.max_tokens,
        max_chunks=getattr(base, "max_chunks", 1), first_chunk_weight=getattr(base, "first_chunk_weight", 1.0),
        adapter_digest=adapter_digest(weights),
        hybrid_weight=getattr(base, "hybrid_weight", DEFAULT_HYBRID_WEIGHT),
        batch_size=getattr(base, "batch_size", DEFAULT_BATCH),
        lexicon=getattr(base, "lexicon", None), lexicon_weight=getattr(base, "lexicon_weight", 1.0),
        query_map=getattr(base, "query_map", None),
    )


def _load_shipped(meta: dict[str, Any]) -> LMEmbedder | SequenceEmbedder:
    lexicon = query_map = None
    if meta.get("lexicon_file"):
        from ..lm.lexicon import Lexicon

        with shipped_path(meta["lexicon_file"]) as lex_path:
            lexicon = Lexicon.load(lex_path)
    if meta.get("query_map_file"):
        from ..lm.query_map import QueryMap

        with shipped_path(meta["query_map_file"]) as map_path:
            query_map = QueryMap.load(map_path)
    with shipped_path(meta["model_file"]) as model_path, shipped_path(meta["tokenizer_file"]) as tok_path:
        return load_embedder(model_path, tok_path, max_tokens=int(meta["max_tokens"]),
                             max_chunks=int(meta.get("max_chunks", 1)),
                             first_chunk_weight=float(meta.get("first_chunk_weight", 1.0)),
                             hybrid_weight=float(meta["hybrid_weight"]), lexicon=lexicon,
                             lexicon_weight=float(meta.get("lexicon_weight", 1.0)), query_map=query_map)


@functools.lru_cache(maxsize=1)
def default_embedder() -> LazyEmbedder:
    """The shipped default embedder, one per process; its weights are read on the first embed.

    `fingerprint`, `dimensions`, `max_tokens` and `hybrid_weight` come from the model card (model.json), so
    opening a store or running a command that needs no vectors does not load the model. The first embed
    (from any thread) reads model.evlm and tokenizer.json once and checks that they give the card's fingerprint.

    Returns:
        A LazyEmbedder over the shipped model.
    Raises:
        EvermindError: no default model is shipped in this installation.
        CheckpointError: the card is damaged (here), or the files are (at the first embed).
    """
    meta = card()
    dimensions = int(meta.get("dimensions", meta["config"]["d_model"]))  # d_model + the lexicon's dims, if any
    return LazyEmbedder(fingerprint=meta["fingerprint"], dimensions=dimensions,
                        load=functools.partial(_load_shipped, meta), max_tokens=int(meta["max_tokens"]),
                        max_chunks=int(meta.get("max_chunks", 1)),
                        first_chunk_weight=float(meta.get("first_chunk_weight", 1.0)),
                        hybrid_weight=float(meta["hybrid_weight"]),
                        model_dimensions=int(meta["config"]["d_model"]) if meta.get("lexicon_file") else None)
