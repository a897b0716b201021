"""evermind_memory: a local memory with semantic recall for agents.

    from evermind_memory import MemoryStore
    with MemoryStore("agent.db") as store:
        store.remember("Ada prefers green tea", tags={"user": "ada"})
        hits = store.recall("what does Ada drink?", k=3)
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
    StoreLocked,
    TokenizerError,
)

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "EmbedderMismatch",
    "EmbedderOutputInvalid",
    "EvermindError",
    "FactNotFound",
    "GpuUnavailable",
    "InvalidInput",
    "StoreLocked",
    "TokenizerError",
    "__version__",
]
