"""Every exception a user of evermind_memory can catch.

All derive from `EvermindError`. Input errors also derive from `ValueError`, a missing fact from
`LookupError`, so code that does not know our names can still catch them.
"""

from __future__ import annotations


class EvermindError(Exception):
    """Base class of every error raised by evermind_memory."""


class InvalidInput(EvermindError, ValueError):
    """An argument at the public boundary was not what was expected."""


class EmbedderOutputInvalid(InvalidInput):
    """An embedder returned a vector that cannot be stored or searched (NaN, Inf, zero, wrong shape)."""


class FactNotFound(EvermindError, LookupError):
    """No fact with the given id exists (or it was forgotten)."""


class EmbedderMismatch(EvermindError):
    """The store's vectors were made by another embedder than the one given."""


class StoreLocked(EvermindError):
    """Another process held the store's write lock for longer than the store's busy_timeout."""


class StoreMoved(EvermindError):
    """A store's database file cannot be used safely through this path: it has another name in use (hard links,
    a rename while open), or it was deleted or replaced while open."""


class CheckpointError(EvermindError):
    """A model checkpoint, adapter or tokenizer file is corrupt, truncated or of an unknown format."""


class TokenizerError(EvermindError):
    """A tokenizer could not be trained, loaded or applied."""


class GpuUnavailable(EvermindError):
    """No usable GPU adapter was found (or EVERMIND_GPU=0 disabled it)."""


__all__ = [
    "EvermindError",
    "InvalidInput",
    "EmbedderOutputInvalid",
    "FactNotFound",
    "EmbedderMismatch",
    "StoreLocked",
    "StoreMoved",
    "CheckpointError",
    "TokenizerError",
    "GpuUnavailable",
]


class StoreWarning(UserWarning):
    """A store opened, but somewhere its guarantees are weaker (e.g. a network filesystem)."""
