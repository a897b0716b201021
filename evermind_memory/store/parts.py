"""What one open store is made of: the arguments it was opened with (Opening), the backend and the rooms built on
it, and its life in this process (StoreParts). MemoryStore builds them (connect) when it opens, and again when
repair() has salvaged the file; it shares them with its scope views and passes them to the modules that work on
more than one room (closing.py, maintenance.py, study.py), so none of those reaches into the front.
It leaves out what a handle holds for itself: its scope and whether a view was closed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ..errors import EvermindError, StorageError
from . import closing
from .access import Access
from .backend import open_backend
from .checkpoints import Checkpoints
from .embedding import VectorWorker
from .generations import Generations
from .leases import Leases, Owner
from .maintenance import SWEEP_INTERVAL, SWEEP_LEASE, Sweeper
from .search import Search
from .vectors import VectorCache
from .writer import Writer

if TYPE_CHECKING:
    from ..adaptation import Adaptation
    from ..embedder.base import Embedder
    from .backend.base import Backend
    from .index_config import IndexConfig


@dataclass(frozen=True)
class Opening:
    """A store's opening arguments, checked once by MemoryStore.__init__ (and kept for repair() to reopen with)."""

    path: str  # as given (a PostgreSQL URL with its password)
    shown: str  # as shown: a URL without its password
    access: Access  # as located, before the backend names the file canonically
    embedder: Embedder
    fingerprint: str
    dim: int
    durability: str  # "normal" or "full"
    on_mismatch: str  # "reembed" or "raise"
    index_config: IndexConfig
    busy_timeout: float  # seconds
    fs_type: str | None  # the file system the store lies on, for info() (None: no file, or unknown)
    hybrid_weight: float  # the embedder's weight of the vector score in hybrid recall


@dataclass(eq=False)
class StoreParts:
    """The parts of one open store, shared by the MemoryStore that opened it and its scope views."""

    opening: Opening
    access: Access  # who may write (canonical path)
    db: Backend  # every SQL statement
    holder: Owner  # this open store's lease owner: waiting facts and leases name it
    leases: Leases
    checkpoints: Checkpoints  # WAL checkpoints: every write passes through
    vectors: VectorCache  # the serving generation's HNSW cache
    gens: Generations  # which model serves, and how another replaces it
    worker: VectorWorker  # the background vector thread
    search: Search
    writer: Writer
    sweeper: Sweeper = field(init=False)  # the thread that deletes expired facts
    pid: int = field(default_factory=os.getpid)  # the process that opened it (a forked child may not use it)
    closed: bool = False
    adaptation: Adaptation | None = None  # the Adaptation started last
    adapt_rounds: int = 0  # adapt_now() calls so far (numbers the reports)

    def __post_init__(self) -> None:
        self.sweeper = Sweeper(self.sweep_expired)  # (it holds the parts weakly: a dropped store is collected)

    def sync(self, *, index: bool = True) -> None:
        """Serve the generation the database names and replay the changes after our watermark (every process,
        before it answers; for the only writer of a store both are one cheap read). index=False (a lexical
        recall): leave an index not loaded yet as it is."""
        self.gens.follow()
        if index or self.vectors.loaded:
            self.vectors.catch_up()

    def start_sweeper(self, expires: str | None) -> None:
        """Run the sweeper thread once this writer's store has a fact that can expire (`expires` None: look)."""
        if self.access.writes:
            self.sweeper.start_if_needed(self.db, known=expires is not None)

    def sweep_expired(self) -> int:
        """The background sweeper's pass: every expired fact of the store, by one writer process per interval
        (the "sweep" lease is left to expire, so the other processes' sweepers skip that round)."""
        if not self.leases.claim(SWEEP_LEASE, SWEEP_INTERVAL):
            return 0
        return self.writer.sweep("", datetime.now(timezone.utc))


def connect(opening: Opening, owner: object) -> StoreParts:
    """Open the database and build the parts that work on it; serve, adopt the facts a dead process left waiting,
    start the sweeper, and (a server) follow the other nodes. `owner` (the MemoryStore) bounds the vector thread's
    life.

    Raises:
        StorageError: the operating system refused opening it; or whatever opening the backend raised.
    """
    access, embedder, holder, db = opening.access, opening.embedder, Owner.new(), None
    try:
        db = open_backend(opening.path, read_only=access.read_only, durability=opening.durability,
                          busy_timeout=opening.busy_timeout)
        access = Access(db.path, access.read_only, access.background_embedding)  # canonical
        leases = Leases(db, holder)
        checkpoints = Checkpoints(db, leases, access)
        vectors = VectorCache(db, access, dim=opening.dim, config=opening.index_config, embedder=embedder,
                              fingerprint=opening.fingerprint, leases=leases)
        gens = Generations(db, vectors, access, embedder, leases)
        worker = VectorWorker(db, vectors, owner=owner, holder=holder)
        search = Search(db, opening.dim, embedder)
        writer = Writer(db, vectors, worker, search, checkpoints, holder.token)
        parts = StoreParts(opening, access, db, holder, leases, checkpoints, vectors, gens, worker, search, writer)
        _open(parts)
        if access.remote:  # other nodes commit from other machines: follow them in the background too
            db.follow(closing.follower(parts))
    except BaseException as exc:
        closing.release(db, holder)
        if isinstance(exc, OSError) and not isinstance(exc, EvermindError):
            err = StorageError(f"{opening.shown}: the operating system refused opening the store ({exc}). Check the "
                               "permissions and free space of its directory, then retry.")
            err.errno = exc.errno
            raise err from exc
        raise
    closing.track(parts)
    return parts


def _open(parts: StoreParts) -> None:
    with parts.db.reading() as r:
        parts.vectors.store_id = r.meta("store_id")
    parts.gens.settle(parts.opening.on_mismatch)  # which model serves; build the generation of ours if it differs
    # (the index is loaded on its first use, not here: commands that read rows never need it; issue 19)
    if parts.access.embeds_waiting and parts.worker.adopt_orphans():
        # remembered without a vector by a process that died (or whose embedder failed on them): retry now
        if parts.access.embeds_in_background:
            parts.worker.start()
        else:
            parts.worker.drain()
    parts.start_sweeper(None)

