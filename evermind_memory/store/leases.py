"""Leases: which process runs a store's background job now (one at a time, taken over when its holder dies).

Many processes write one store. The jobs that must not run twice at once, and must be finished by someone else
when their process is killed (a re-embed into a new generation, an adaptation round, a WAL checkpoint), are
claimed through a row of the backend's `leases` table: name, owner, expiry. An owner names its process
(host, pid, the process's start time) and one open store (a random token), so a lease is taken over when it
expires or at once when its owner is provably gone (same host, and that pid no longer runs that process, or
this process no longer has that store open). Every job run under a lease is idempotent: a takeover redoes at
most the batch in flight. Facts waiting for a vector carry their owner the same way (see embedding.py).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
import weakref
from dataclasses import dataclass

from .backend.base import Backend

LEASE_TTL = 30.0  # seconds a claim lasts without renewal; holders renew at half of it

def _host() -> str:
    """This machine and pid namespace ("name/pid:[inode]"): pids are comparable only within one namespace, so
    containers sharing a volume (and perhaps a host name) never judge each other's processes by pid."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return f"{socket.gethostname()}/{ns}".replace(":", "=")


_HOST = _host()
_open_tokens: "weakref.WeakValueDictionary[str, Owner]" = weakref.WeakValueDictionary()  # this process's stores
_tokens_lock = threading.Lock()


def _process_start(pid: int) -> str:
    """The start time of process `pid` (clock ticks since boot, from /proc), "" where unknown, "zombie" for a
    process that has exited but not been reaped yet (it runs nothing: its leases may be taken over).

    With the pid it names one process for good: a pid reused by another process has another start time.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()  # counted after the command name, which may hold spaces
        return "zombie" if fields[0] in (b"Z", b"X") else fields[19].decode()  # state, starttime (field 22)
    except (OSError, ValueError, IndexError):
        return ""


@dataclass(frozen=True)
class Owner:
    """Who holds a lease or a waiting fact: one open store in one process.

    Attributes:
        token: "host:pid:start:random" (host: machine and pid namespace), stored in the database.
    """

    token: str

    @classmethod
    def new(cls) -> "Owner":
        """A fresh owner for a store opened by this process (registered until it is closed or collected)."""
        pid = os.getpid()
        owner = cls(f"{_HOST}:{pid}:{_process_start(pid)}:{secrets.token_hex(8)}")
        with _tokens_lock:
            _open_tokens[owner.token] = owner
        return owner

    def retire(self) -> None:
        """The store closed: what it still owns may be taken over by any process."""
        with _tokens_lock:
            _open_tokens.pop(self.token, None)


def owner_alive(token: str | None) -> bool | None:
    """Whether the owner `token` still runs: True, False, or None when it cannot be told (another host, or
    no /proc): then only its lease's expiry counts."""
    if not token:
        return False
    parts = token.split(":")
    if len(parts) != 4 or not parts[1].isdigit():
        return False  # not ours (an older store, or a damaged row): nobody runs it
    host, pid, start = parts[0], int(parts[1]), parts[2]
    if host != _HOST:
        return None
    if pid == os.getpid():
        with _tokens_lock:
            return token in _open_tokens
    now = _process_start(pid)
    if now and start:
        return now == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return None


def may_take_over(holder: str, expires: float, owner: Owner, now: float) -> bool:
    """Whether `owner` may claim a lease held by `holder` until `expires`."""
    if holder == owner.token or expires <= now:
        return True
    return owner_alive(holder) is False


class Leases:
    """Claim, renew and release named leases of one store for one owner. Thread-safe.

    Args:
        db: the backend (its transactions serialise every claim with every other process's).
        owner: this store's owner.
    """

    def __init__(self, db: Backend, owner: Owner) -> None:
        self._db = db
        self.owner = owner

    def claim(self, name: str, ttl: float = LEASE_TTL) -> bool:
        """Take lease `name` for `ttl` seconds unless a live owner holds an unexpired claim; True if ours now."""
        with self._db.transaction() as tx:
            now = time.time()
            row = tx.lease(name)
            if row is not None and not may_take_over(row.owner, row.expires, self.owner, now):
                return False
            tx.set_lease(name, self.owner.token, now + ttl)
            return True

    def renew(self, name: str, ttl: float = LEASE_TTL) -> bool:
        """Extend our claim on `name`; False when it is no longer ours (it expired and was taken over)."""
        with self._db.transaction() as tx:
            row = tx.lease(name)
            if row is None or row.owner != self.owner.token:
                return False
            tx.set_lease(name, self.owner.token, time.time() + ttl)
            return True

    def release(self, name: str) -> None:
        """Give lease `name` back (nothing happens when it is not ours)."""
        with self._db.transaction() as tx:
            tx.drop_lease(name, self.owner.token)

    def holder(self, name: str) -> tuple[str, float] | None:
        """(owner token, expiry) of a live claim on `name`, or None when free (unclaimed, expired or dead)."""
        with self._db.reading() as r:
            row = r.lease(name)
        if row is None or may_take_over(row.owner, row.expires, Owner(""), time.time()):
            return None
        return row.owner, row.expires


class Heartbeat:
    """Renews a lease at most every ttl/2 seconds when `beat()` is called (from a loop's polling point)."""

    def __init__(self, leases: Leases, name: str, ttl: float = LEASE_TTL) -> None:
        self._leases, self._name, self._ttl = leases, name, ttl
        self._next = time.monotonic() + ttl / 2
        self.lost = False

    def beat(self) -> bool:
        """Renew when due; returns False once the lease was lost (the caller stops: another process has it)."""
        if not self.lost and time.monotonic() >= self._next:
            self.lost = not self._leases.renew(self._name, self._ttl)
            self._next = time.monotonic() + self._ttl / 2
        return not self.lost
