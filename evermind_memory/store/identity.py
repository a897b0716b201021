"""Which file a store is: its database file (device + inode, and the store_id inside it), never the path string.

SQLite names its WAL and shared-memory files after the path it was given (`<path>-wal`, `<path>-shm`), and
our index snapshot and adapters sit beside that path too. Two names for one database file (a hard link, or a
file renamed while a process has it open) would give two WALs over one file: unsynchronised writers, lost
commits, "database disk image is malformed". So every process opens a store through one canonical path:
- symlinks and relative paths are resolved (`os.path.realpath`); SQLite itself follows symlinks the same way;
- a file with one name (st_nlink == 1) is opened through that name;
- a file whose recorded name (meta "path", read without WAL or locks) is the same file is opened through that
  name (a hard link, a bind mount); a file with several names (hard links) none of which is recorded is refused;
- a store whose recorded name is gone but whose old `-wal`/`-shm` still exist is refused: it is open (or was
  left mid-write) under its old name, and opening it under a new one would fork its WAL;
- while open, a write first checks that the path still names the file this process opened (a deleted and
  recreated or replaced file is refused rather than written to a file no one will read again).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..errors import EvermindError, StoreMoved


@dataclass(frozen=True)
class FileIdentity:
    """The canonical path of a store's database file and the file it named when the store opened."""

    path: str  # canonical: every process opens the store through this name
    dev: int
    ino: int

    def still_here(self) -> bool:
        """Whether `path` still names the file that was opened (not deleted, replaced or renamed away)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (self.dev, self.ino)

    def require_here(self) -> None:
        """Raise unless the database file is still where it was opened.

        Raises:
            StoreMoved: it was deleted, replaced or renamed while open.
        """
        if not self.still_here():
            raise StoreMoved(
                f"{self.path} was deleted, replaced or renamed while this MemoryStore had it open; nothing was "
                "written (it would have gone to a file no one reads). Close this MemoryStore and open the store again."
            )


def recorded_path(path: str) -> str | None:
    """The canonical path recorded in the database at `path` (meta "path"), read without touching its WAL.

    `immutable=1` reads the main file only: no -wal or -shm is created under this (possibly alias) name, and no
    lock is taken. The recorded path changes only when a store is moved, and is checkpointed into the main file
    then, so this read sees it. None when unreadable or not recorded.
    """
    uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
    for _ in range(3):  # a concurrent checkpoint may be rewriting a page: try again
        try:
            conn = sqlite3.connect(uri, uri=True)
            try:
                row = conn.execute("SELECT value FROM meta WHERE key = 'path'").fetchone()
            finally:
                conn.close()
            return None if row is None else row[0]
        except sqlite3.DatabaseError:
            continue
    return None


def resolve(path: str) -> FileIdentity | None:
    """The canonical identity of the store file at `path` (None when it does not exist yet).

    Raises:
        StoreMoved: the file has several names and the recorded one is not one of them, or it was renamed while
            open under its old name.
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return None
    recorded = recorded_path(real) if st.st_size > 0 else None
    if recorded and recorded != real and _same_file(recorded, st):
        return FileIdentity(recorded, st.st_dev, st.st_ino)  # a hard link or a bind mount: use the one name
    if st.st_nlink > 1 and recorded != real:
        raise StoreMoved(
            f"{path} has {st.st_nlink} names (hard links), and the name recorded in it ({recorded}) is not one of "
            "them, so processes could open it under different names with separate WAL files and corrupt it. "
            "Remove the extra links (keep one name), or open the store through its recorded name."
        )
    if recorded and recorded != real and not os.path.exists(recorded):
        stale = [s for s in ("-wal", "-shm") if os.path.exists(recorded + s)]
        if stale:
            raise StoreMoved(
                f"{path} was renamed from {recorded}, whose {' and '.join(recorded + s for s in stale)} still exist: "
                "a process may have it open under the old name, or left commits in that WAL. Close that process "
                "(or move those files beside the new name), then open it again."
            )
    return FileIdentity(real, st.st_dev, st.st_ino)


def _same_file(path: str, st: os.stat_result) -> bool:
    try:
        other = os.stat(path)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def identify(path: str) -> FileIdentity:
    """The identity of the store file at `path`, which exists (after the backend created it).

    Raises:
        StoreMoved: as resolve().
        EvermindError: the file vanished between creating and identifying it.
    """
    found = resolve(path)
    if found is None:
        raise EvermindError(f"{path} disappeared while the store was being opened.")
    return found
