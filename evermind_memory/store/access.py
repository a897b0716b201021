"""What this process may do with a store, decided once when it opens: the one place that answers "who may write".

Any number of processes open a store read-write; the database serialises their commits, and the jobs that
must run in one process at a time are claimed through leases (store/leases.py). `read_only=True` opens a
reader: no writes, no snapshot saves, no background jobs. An in-memory store has one writer and no file; a
PostgreSQL store (`remote`) has nodes on any machine and no files: each node builds its index from the database.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from ..errors import EvermindError, InvalidInput, StoreWarning
from .backend.base import is_server_url
from .lock import filesystem_type, is_remote_filesystem


@dataclass(frozen=True)
class Access:
    """One process's rights on one store.

    Args:
        path: the database path (canonical, see store/identity.py), or ":memory:".
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
    def remote(self) -> bool:
        """A database server (PostgreSQL): nodes on any machine, no files beside a database."""
        return is_server_url(self.path)

    @property
    def snapshot_files(self) -> bool:
        """Whether the index has snapshot files beside the database (a file store)."""
        return not self.memory and not self.remote

    @property
    def writes(self) -> bool:
        """May commit changes (facts, vectors, meta)."""
        return not self.read_only

    @property
    def saves_index(self) -> bool:
        """May write the HNSW snapshot and its manifest beside the database (compare-and-swap on the watermark)."""
        return not self.read_only and self.snapshot_files

    @property
    def embeds_in_background(self) -> bool:
        """remember() commits and returns; a background thread embeds (a writer that asked for it)."""
        return self.background_embedding and not self.read_only

    @property
    def embeds_waiting(self) -> bool:
        """Takes over the facts whose owner died before embedding them (at open, and from the vector thread)."""
        return not self.read_only

    @property
    def runs_jobs(self) -> bool:
        """May claim leases: WAL checkpoints, re-embeds into a new generation, adaptation rounds."""
        return not self.read_only

    def require_writer(self, method: str) -> None:
        """Raise unless this process may write.

        Raises:
            EvermindError: a read-only store.
        """
        if self.read_only:
            raise EvermindError(f"{method}() needs a writer; {self.path} was opened with read_only=True.")


def locate(path: str, read_only: bool, background_embedding: bool) -> tuple[Access, str | None]:
    """MemoryStore()'s Access to the store at `path` (as given: the backend names the canonical path) and the type
    of the filesystem holding its file (None: no file, or unknown). Warns (StoreWarning) when that is a network or
    FUSE mount, where SQLite's WAL and locks are unreliable (R14).

    Raises:
        InvalidInput: ":memory:" read-only, a missing directory, or a directory where the file should be.
    """
    access = Access(path, read_only, background_embedding)
    if access.memory and read_only:
        raise InvalidInput("MemoryStore(':memory:', read_only=True) has nothing to read; drop read_only.")
    if not access.snapshot_files:
        return access, None
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        if str(path).startswith("~"):  # Python paths, as open()'s, take "~" literally; the CLI expands it
            raise InvalidInput(f"MemoryStore() takes {path!r} literally, as open() does: pass "
                               "os.path.expanduser(path) for your home directory.")
        raise InvalidInput(f"MemoryStore() expected the directory {parent} to exist; create it first.")
    if Path(path).is_dir():
        raise InvalidInput(f"MemoryStore() expected a file path, got the directory {path}.")
    fs_type = filesystem_type(parent)
    if is_remote_filesystem(fs_type):
        warnings.warn(
            f"{path} is on a {fs_type} mount: SQLite's WAL and the writer lock are unreliable on "
            "network and FUSE filesystems, so the store can be corrupted. Keep it on a local disk.",
            StoreWarning, stacklevel=3)  # (the caller of MemoryStore())
    return access, fs_type
