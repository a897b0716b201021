"""Atomic file writes: a temp file in the target's directory, fsync (F_FULLFSYNC on macOS), os.replace, then an
fsync of the directory, so a crash leaves either the old file or the new one, never a half-written file
(docs/reliability.md R4). A leaf module: it imports nothing from the package, so any part of it may use it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import IO, Iterator


def full_fsync(fd: int) -> None:
    """Flush a file descriptor to stable storage (F_FULLFSYNC where it exists: macOS's fsync stops at the drive
    cache)."""
    try:
        import fcntl

        if hasattr(fcntl, "F_FULLFSYNC"):
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
            return
    except (ImportError, OSError):
        pass
    os.fsync(fd)


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file given by path (e.g. one a library wrote by name)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        full_fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: str | os.PathLike) -> None:
    """fsync a directory so a rename in it is durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, *, text: bool = False) -> Iterator[IO]:
    """Yield a new file beside `path`; when the block ends normally, make it `path` durably.

    The temp file is `<name>.<random>.tmp` in the same directory (created exclusively). On a normal exit it is
    flushed, fsynced, renamed over `path`, and the directory is fsynced; if the block raises, the temp file is
    removed and `path` is left as it was.

    Args:
        path: the file to write (replaced if it exists).
        text: a UTF-8 text file (newline "\\n") instead of a binary one.
    Raises:
        OSError: the file system refused the write (path is unchanged).
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        with os.fdopen(fd, "w" if text else "wb", **({"encoding": "utf-8", "newline": "\n"} if text else {})) as fh:
            yield fh
            fh.flush()
            full_fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically and durably (see atomic_write)."""
    with atomic_write(path) as fh:
        fh.write(data)
