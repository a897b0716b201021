"""Locks: an in-process readers-writer lock (around every hnswlib call, R7) and the cross-process writer
lock file (`fcntl.flock` on `<db>.lock`, R13), plus the named crash points used by fault-injection tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

from ..errors import StoreLocked

try:  # POSIX only; on other systems the writer lock degrades to in-process exclusion
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


class RWLock:
    """Many readers or one writer; a waiting writer blocks new readers (no writer starvation).

    Not re-entrant: a thread holding the write side must not take the read side.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        """Hold the shared side for the duration of the block."""
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        """Hold the exclusive side for the duration of the block."""
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class WriterLock:
    """The one-writer-per-store lock: an exclusive `flock` on a separate `<db>.lock` file.

    Args:
        path: the lock file.
        timeout: seconds to wait for another writer to let go.
    Raises:
        StoreLocked: still held by someone else after `timeout` seconds.
    """

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise StoreLocked(
                        f"{self.path.name} is held by another writer (waited {timeout:g} s). Close the other "
                        "MemoryStore, open this one with read_only=True, or pass a larger lock_timeout."
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass  # the pid is informative only
        self._fd = fd

    def release(self) -> None:
        """Let go of the lock (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


_CRASH_COUNTS: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Fault injection: SIGKILL this process at the n-th hit of `name` when EVERMIND_CRASH_AT="name:n".

    Costs one environment lookup when unset. Used only by crash tests in child processes.
    """
    spec = os.environ.get("EVERMIND_CRASH_AT")
    if not spec:
        return
    point, _, nth = spec.rpartition(":")
    if point != name:
        return
    _CRASH_COUNTS[name] = _CRASH_COUNTS.get(name, 0) + 1
    if _CRASH_COUNTS[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
