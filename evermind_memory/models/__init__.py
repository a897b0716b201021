"""The shipped default model: tokenizer.json, model.evlm and model.json (its card) as package data.

`load_default()` reads them once per process. The recipe that made them is in the repository's recipe/
folder; model.json records the data, sizes, steps, losses and benchmark figures.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from evermind_memory.errors import CheckpointError, EvermindError

_CARD = "model.json"
_CARD_MAX_BYTES = 1 << 20


def card() -> dict[str, Any]:
    """The shipped model's card (config, files, training summary, hybrid weight, benchmark figures).

    Raises:
        EvermindError: no model is shipped in this installation.
        CheckpointError: the card is unreadable.
    """
    path = resources.files(__name__).joinpath(_CARD)
    if not path.is_file():
        raise EvermindError(
            "No default model is shipped in this installation of evermind_memory, so MemoryStore(path) needs "
            "an embedder. Pass embedder=LMEmbedder(model, tokenizer) (or any object with embed, embed_many, "
            "dimensions and fingerprint)."
        )
    raw = path.read_bytes()
    if len(raw) > _CARD_MAX_BYTES:
        raise CheckpointError(f"the shipped model card {_CARD} is {len(raw)} bytes; expected at most {_CARD_MAX_BYTES}.")
    try:
        data = json.loads(raw)
        for key in ("model_file", "tokenizer_file", "max_tokens", "hybrid_weight"):
            data[key]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"the shipped model card {_CARD} is unreadable ({e}); reinstall evermind_memory.") from e
    return data


@functools.lru_cache(maxsize=1)
def load_default():
    """The shipped model as an LMEmbedder, loaded once per process (thread-safe after the first call)."""
    from evermind_memory.embedder.lm_embedder import LMEmbedder
    from evermind_memory.lm.model import EvermindLM
    from evermind_memory.lm.tokenizer import BPETokenizer

    meta = card()
    root = resources.files(__name__)
    with resources.as_file(root.joinpath(meta["model_file"])) as model_path:
        model = EvermindLM.load(model_path)
    with resources.as_file(root.joinpath(meta["tokenizer_file"])) as tok_path:
        tokenizer = BPETokenizer.load(tok_path)
    return LMEmbedder(model, tokenizer, max_tokens=int(meta["max_tokens"]),
                      hybrid_weight=float(meta["hybrid_weight"]))


_FUSION = "fusion.json"


@functools.lru_cache(maxsize=1)
def fusion_params():
    """The shipped model's fitted hybrid rule (fusion.json, written by recipe/calibrate_fusion.py), or None when
    this installation has none. Raises CheckpointError when the file is there but malformed."""
    from evermind_memory.store.fusion import load_params

    path = resources.files(__name__).joinpath(_FUSION)
    if not path.is_file():
        return None
    with resources.as_file(path) as real:
        return load_params(real)
