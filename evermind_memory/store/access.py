"""What this process may do with a store, decided once when it opens: the one place that answers "who may write".

Today a store has one writer process (it holds `<db>.lock`) and any number of `read_only=True` readers; an
in-memory store has one writer and no file. Everything else in the store asks an `Access` instead of testing
`read_only` itself, so that letting many processes write (issue 17, phase B: SQLite serialises commits, leases
pick who runs background jobs) changes this file and the lease calls, not every method.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import EvermindError
from .lock import WriterLock


@dataclass(frozen=True)
class Access:
    """One process's rights on one store.

    Args:
        path: the database path (or ":memory:").
        read_only: opened with read_only=True.
        background_embedding: the caller asked for background embedding.
    """

    path: str
    read_only: bool
    background_embedding: bool

    @property
    def memory(self) -> bool:
        """An in-memory store: nothing on disk, no other process."""
        return self.path == ":memory:"

    @property
    def writes(self) -> bool:
        """May commit changes (facts, vectors, meta)."""
        return not self.read_only

    @property
    def saves_index(self) -> bool:
        """May write the HNSW snapshot and its manifest beside the database."""
        return not self.read_only and not self.memory

    @property
    def embeds_in_background(self) -> bool:
        """remember() commits and returns; a background thread embeds (a writer that asked for it)."""
        return self.background_embedding and not self.read_only

    @property
    def embeds_waiting(self) -> bool:
        """Picks up the facts left without a vector (by a crash, or a failing embedder) when it opens."""
        return not self.read_only

    def require_writer(self, method: str) -> None:
        """Raise unless this process may write.

        Raises:
            EvermindError: a read-only store.
        """
        if self.read_only:
            raise EvermindError(f"{method}() needs a writer; {self.path} was opened with read_only=True.")

    def lock(self, timeout: float) -> WriterLock | None:
        """Take the one-writer-per-store lock (`<db>.lock`) when this process writes a file; None otherwise.

        Raises:
            StoreLocked: another writer holds it after `timeout` seconds.
        """
        if self.memory or self.read_only:
            return None
        return WriterLock(Path(self.path + ".lock"), float(timeout))
