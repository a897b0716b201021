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


class StoreCorrupt(EvermindError):
    """A store's files are damaged: the database (its header, pages, schema or a fact row), its write-ahead log,
    or sidecar evidence that the database lost its contents. The message names the part; `store.repair()` or
    `evermind repair PATH` keeps every readable fact and quarantines the rest.

    Attributes:
        path: the database file.
        part: which part is damaged ("database", "database header", "schema", "full-text index", "fact row", ...).
    """

    def __init__(self, message: str, *, path: str | None = None, part: str = "database") -> None:
        super().__init__(message)
        self.path = path
        self.part = part


class RowDamaged(StoreCorrupt):
    """One fact row is unreadable (a damaged timestamp, tags or text). Reads that return many facts skip such
    rows with a StoreWarning; `get()` of one raises this; `check()` counts them; repair fixes or quarantines them."""


class StorageError(EvermindError, OSError):
    """The operating system refused a file operation of the store: permission denied, a read-only or full
    filesystem, an I/O error. Also an OSError (its errno is kept where there is one)."""


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
    "StoreCorrupt",
    "RowDamaged",
    "StorageError",
    "CheckpointError",
    "TokenizerError",
    "GpuUnavailable",
]


class StoreWarning(UserWarning):
    """A store opened, but somewhere its guarantees are weaker (e.g. a network filesystem)."""
