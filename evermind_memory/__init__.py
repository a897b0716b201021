"""evermind_memory: a local memory with semantic recall for agents.

    from evermind_memory import MemoryStore
    with MemoryStore("agent.db") as store:
        ada = store.scope(user="ada")                     # Ada's memories: the one meaning of "user"
        ada.remember("Ada prefers green tea", tags={"topic": "drinks"})
        hits = ada.recall("what does Ada drink?", k=3)
"""

from __future__ import annotations

from .errors import (
    CheckpointError,
    EmbedderMismatch,
    EmbedderOutputInvalid,
    EvermindError,
    FactNotFound,
    GpuUnavailable,
    InvalidInput,
    RowDamaged,
    StorageError,
    StoreCorrupt,
    StoreLocked,
    StoreMoved,
    StoreWarning,
    TokenizerError,
)

__version__ = "0.1.0"

_LAZY = {"MemoryStore": "store", "Fact": "store", "Recall": "store", "default_embedder": "embedder",
         "AsyncMemoryStore": "integrations.async_store", "repair_store": "store"}


def __getattr__(name: str):
    # The store pulls in sqlite-utils and usearch; importing it lazily keeps `import evermind_memory.lm`
    # (the model alone, e.g. in a training job) free of them.
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "AsyncMemoryStore",
    "CheckpointError",
    "EmbedderMismatch",
    "EmbedderOutputInvalid",
    "EvermindError",
    "Fact",
    "FactNotFound",
    "GpuUnavailable",
    "InvalidInput",
    "MemoryStore",
    "Recall",
    "RowDamaged",
    "default_embedder",
    "repair_store",
    "StorageError",
    "StoreCorrupt",
    "StoreLocked",
    "StoreMoved",
    "StoreWarning",
    "TokenizerError",
    "__version__",
]
