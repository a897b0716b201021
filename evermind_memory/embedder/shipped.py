"""The shipped model's card: evermind_memory/models/model.json, read as package data.

The card names the files (model.evlm, tokenizer.json, and lexicon.evlx when the vector has a lexicon part), the
embedder's fingerprint and dimensions, and the settings the store needs (max_tokens, hybrid_weight,
lexicon_weight), so `default_embedder()` can answer for its identity without reading the weights. The recipe that
made the files is in the repository's recipe/ folder.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

from ..errors import CheckpointError, EvermindError

MODELS_PACKAGE = "evermind_memory.models"  # where the shipped files are installed (data only)
_CARD = "model.json"
_CARD_MAX_BYTES = 1 << 20
_REQUIRED: dict[str, type | tuple[type, ...]] = {"model_file": str, "tokenizer_file": str, "fingerprint": str,
                                                 "config": dict, "max_tokens": int,
             "hybrid_weight": (int, float)}


def card() -> dict[str, Any]:
    """The shipped model's card (config, files, fingerprint, training summary, hybrid weight, figures).

    Returns:
        The parsed model.json.
    Raises:
        EvermindError: no model is shipped in this installation.
        CheckpointError: the card is unreadable or lacks a field the loader needs.
    """
    path = shipped_file(_CARD)
    if not path.is_file():
        raise EvermindError(
            "No default model is shipped in this installation of evermind_memory, so MemoryStore(path) needs "
            "an embedder. Pass embedder=load_embedder(model_path, tokenizer_path) (or any object with embed, "
            "embed_many, dimensions and fingerprint)."
        )
    raw = path.read_bytes()
    if len(raw) > _CARD_MAX_BYTES:
        raise CheckpointError(f"the shipped model card {_CARD} is {len(raw)} bytes; expected at most "
                              f"{_CARD_MAX_BYTES}.")
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise CheckpointError(f"the shipped model card {_CARD} is not JSON ({e}); reinstall evermind_memory.") from e
    wrong = [key for key, kind in _REQUIRED.items()
             if not isinstance(data, dict) or not isinstance(data.get(key), kind) or isinstance(data.get(key), bool)]
    chunks = data.get("max_chunks", 1) if isinstance(data, dict) else 1
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
        wrong.append("max_chunks")
    lexicon = data.get("lexicon_file") if isinstance(data, dict) else None
    if lexicon is not None and not (isinstance(lexicon, str) and isinstance(data.get("dimensions"), int)
                                    and isinstance(data.get("lexicon_weight"), (int, float))):
        wrong.append("lexicon_file/dimensions/lexicon_weight")
    query_map = data.get("query_map_file") if isinstance(data, dict) else None
    if query_map is not None and not isinstance(query_map, str):
        wrong.append("query_map_file")
    first = data.get("first_chunk_weight", 1.0) if isinstance(data, dict) else 1.0
    if not isinstance(first, (int, float)) or isinstance(first, bool) or not 0 < first <= 1e6:
        wrong.append("first_chunk_weight")
    if wrong or "d_model" not in data["config"]:
        raise CheckpointError(
            f"the shipped model card {_CARD} lacks or mistypes {wrong or ['config.d_model']}; reinstall "
            "evermind_memory."
        )
    return data


def shipped_file(name: str) -> Any:
    """One of the shipped files: a Path in an ordinary installation, else (a zipped one) an importlib.resources
    Traversable. Use shipped_path() where a real file is needed."""
    from .. import models  # (data only)

    folder = Path(models.__file__).parent
    if folder.is_dir():  # importlib.resources costs ~15 ms of every start-up (issue 19): only where it is needed
        return folder / name
    from importlib import resources

    return resources.files(MODELS_PACKAGE).joinpath(name)


@contextlib.contextmanager
def shipped_path(name: str) -> Iterator[Path]:
    """A real file path of one of the shipped files for the duration of the block (extracted from a zipped
    installation, and removed after)."""
    path = shipped_file(name)
    if isinstance(path, Path):
        yield path
        return
    from importlib import resources

    with resources.as_file(path) as real:
        yield real

