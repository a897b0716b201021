"""WAL checkpoints with many writer processes: every commit passes through `Checkpoints.after_commit`, which
checkpoints one process at a time, by lease, every CHECKPOINT_EVERY changes (benchmarks/wal_checkpoint.py).
Kept apart from maintenance.py, which only the maintenance calls need.
"""

from __future__ import annotations

from .access import Access
from .backend.base import Backend
from .leases import Leases

# changes (any process's) between two checkpoints: about 7 MB of WAL (benchmarks/wal_checkpoint.py)
CHECKPOINT_EVERY = 200
CHECKPOINT_LEASE = "checkpoint"
CHECKPOINT_COOLDOWN_S = 1.0  # the lease is kept this long after a checkpoint: a burst of writers checkpoints once


class Checkpoints:
    """Keeps the WAL bounded with many writer processes: after a commit that took the change feed
    CHECKPOINT_EVERY changes past this process's last attempt, claim the "checkpoint" lease and checkpoint
    (backend.checkpoint: under the writer lock, so never beside a commit: the WAL-reset bug). The lease is
    left to expire after CHECKPOINT_COOLDOWN_S, so the other writers crossing the same mark skip it; one
    killed mid-checkpoint is taken over at once (its process is gone). Thread-safe.

    Args:
        db: the backend.
        leases: this store's leases.
        access: what this process may do (readers never checkpoint).
    """

    def __init__(self, db: Backend, leases: Leases, access: Access) -> None:
        self._db, self._leases = db, leases
        self._enabled = access.runs_jobs and access.snapshot_files  # (a server checkpoints its own log)
        self._next_at = CHECKPOINT_EVERY
        self.done = 0  # checkpoints this process ran (for tests and info)

    def after_commit(self, top: int) -> None:
        """Checkpoint when the change feed head `top` passed the next mark and no one else just did."""
        if not self._enabled or top < self._next_at:
            return
        self._next_at = top + CHECKPOINT_EVERY
        self._run()

    def at_close(self) -> None:
        """A last checkpoint as the store closes (skipped while another process holds the lease)."""
        if self._enabled:
            self._run()

    def now(self) -> None:
        """A checkpoint now, e.g. after compact()'s VACUUM (skipped while another process holds the lease)."""
        if self._enabled:
            self._run()

    def _run(self) -> None:
        if self._leases.claim(CHECKPOINT_LEASE, CHECKPOINT_COOLDOWN_S):
            self._db.checkpoint()
            self.done += 1
