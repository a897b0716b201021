"""Locks: the in-process readers-writer lock (around every graph call, R7), and the filesystem check that
goes with SQLite's own locking (R14: WAL and its shared memory need a local disk). Across processes the
database orders writes and leases pick who runs a job (store/leases.py). The named crash points of
fault-injection tests are in evermind_memory/_crash.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from typing import Iterator


# Filesystems where SQLite's WAL shared memory and its locks are unreliable (network or FUSE mounts).
REMOTE_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "9p", "ceph", "glusterfs", "lustre", "gpfs",
    "beegfs", "davfs", "fuse", "fuseblk", "virtiofs",
})


def filesystem_type(path: str | os.PathLike, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem holding path (e.g. "ext4", "nfs4", "fuse.sshfs"), or None where unknown.

    Reads Linux's mountinfo and takes the longest mount point that contains path; elsewhere returns None.
    """
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read(4 << 20).splitlines()  # a few MB at most, even with thousands of mounts
    except OSError:
        return None
    target = os.path.realpath(path)
    best, best_type = "", None
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040 is a space
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, best_type = mount, tail.split()[0]
    return best_type


def is_remote_filesystem(fs_type: str | None) -> bool:
    """Whether a filesystem type names a network or FUSE mount (R14: keep stores on a local disk)."""
    return fs_type is not None and (fs_type in REMOTE_FILESYSTEMS or fs_type.startswith("fuse."))


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
