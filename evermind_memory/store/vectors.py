"""The vector cache: the HNSW index over the vectors in SQLite, kept up to date from the change feed.

The truth is the backend (facts, vectors, fingerprints, the change sequence); this process's index is a cache of it.
The serving `Generation` is one value (model, fingerprint, index, watermark) replaced as a whole: a rebuild or a
model swap installs a new one, and applying a change advances the watermark (a process's own commit that only adds
vectors is indexed at once even when others committed first: apply()). Any process catches up by replaying the
changes after its watermark (R3) before it answers, stepping over labels its index already holds; a loaded snapshot
is validated first (R6) and trusted when its manifest matches the database (issue 34: the comparison of every vector
with SQLite runs in verify(), from check() and from a background pass), else rebuilt. That load happens on the first
vector use, not at open (issue 19: commands that only read rows never import numpy or usearch, nor read the
snapshot). A process behind by more changes than a newer saved snapshot costs to load adopts that snapshot, checked
the same way, instead of replaying; one far behind with no such snapshot rebuilds. A snapshot is saved with
compare-and-swap on the watermark, so a stale process never overwrites a newer index (R13). Any number of processes
write the store: each one's index follows every process's commits through the same feed. Model changes themselves
are in generations.py.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, cast

from .._crash import crash_point
from .._lazy import lazy_import
from ..errors import InvalidInput
from .access import Access
from .backend import vector_blobs
from .backend.base import Backend
from .index import IndexRejected, VectorIndex, read_manifest
from .index_config import IndexConfig
from .index_feed import between, compare_labels, disagreement, feed_after, pruned_past, replay
from .leases import Leases
from .lock import RWLock

if TYPE_CHECKING:
    import numpy as np

    from ..embedder.base import Embedder
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

SAVE_AFTER_REPLAY = 1000  # a loaded snapshot that needed this many changes replayed is saved again
# A node this far behind adopts a newer snapshot another process saved, or else rebuilds its index from the
# vectors table, instead of replaying the feed: more pending
# changes than REBUILD_BEHIND_RATIO x the vectors it serves (and at least REBUILD_BEHIND_MIN). An insert costs
# about the same either way (benchmarks/catch_up.py, tiny model, 10k facts: replaying 10k changes 0.9 s against
# a rebuild's 1.3 s; 100k changes 13.8 s against 10.6 s), so only a node several times its index behind gains:
# the rebuild's graph holds no retired vectors, and its build runs outside the write mutex.
REBUILD_BEHIND_RATIO = 2.0
REBUILD_BEHIND_MIN = 1000
# A node at least REBUILD_BEHIND_MIN changes behind adopts a newer saved snapshot (when one validates) as soon as
# the changes it would skip number more than ADOPT_BEHIND_RATIO x the snapshot's vectors: a trusted load costs a
# few microseconds a vector, a replayed insert about 90 (benchmarks/catch_up.py).
ADOPT_BEHIND_RATIO = 0.1
VERIFY_CHUNK = 1024  # vectors compared at a time by verify() (bounds the rows read back at a time)
HASH_MISMATCH = "index file sha256 does not match the manifest"
VERIFY_DELAY = 5.0  # seconds after a trusted load before the background pass compares every vector with SQLite
VERIFY_PAUSE = 2.0  # the background pass rests this many times as long as each chunk took (a third of one core)
SNAPSHOT_LEASE = "snapshot"


@dataclass(frozen=True)
class Generation:
    """What answers vector recall: a model, the fingerprint its vectors carry, and the index over them.

    Attributes:
        embedder: the model that embeds queries (and new facts).
        fingerprint: its fingerprint; only vectors carrying it are in the index.
        index: the HNSW cache (None only inside a VectorCache not loaded yet: `current` never returns that).
        watermark: the highest change seq the index reflects.
    """

    embedder: Embedder
    fingerprint: str
    index: VectorIndex
    watermark: int


BUILD_PROGRESS_MIN = 20_000  # vectors from which a build on a terminal shows a progress bar (~5 s and more)


def build_index(dim: int, config: IndexConfig, labels: np.ndarray, vectors: np.ndarray) -> VectorIndex:
    """A new index holding `vectors` (N, D) under `labels` (N,). A large build shows a progress bar on a
    terminal's stderr (89 s at a million facts, on 2 cores)."""
    index = VectorIndex(dim, config)
    if len(labels) < BUILD_PROGRESS_MIN or not sys.stderr.isatty():
        index.add(labels, vectors)
        return index
    from tqdm.auto import tqdm

    with tqdm(total=len(labels), desc="building the vector index", unit="vector", leave=False) as bar:
        def shown(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        index.add(labels, vectors, progress=shown)
    return index


class VectorCache:
    """This process's index of one store, and the lock that keeps a recall on one generation.

    The index is loaded on first use, not at open: `current`, `serving()`, `catch_up()` and the first commit
    this process mirrors (apply(), advance()) load it, under the write mutex, once. A process that only reads
    rows never loads it: save() then has nothing to save (the snapshot on disk stays as it is), and `model`
    names the serving model without loading anything.

    Thread-safety: catch_up, apply, advance, rebuild and save run under the backend's write mutex (they take
    it, or their caller holds it; a catch-up far behind builds its new index outside it, then takes it to replay
    what arrived meanwhile and swap); recalls hold `serving()` for their whole run and a model swap holds
    `swapping()`, so a recall never sees half of a swap.

    Args:
        db: the backend.
        access: what this process may do (whether it saves snapshots).
        dim: vector length.
        config: HNSW parameters.
        embedder: the model that serves at first.
        fingerprint: its fingerprint.
        leases: the store's leases (a snapshot save holds "snapshot", so two processes never save at once).
    """

    def __init__(self, db: Backend, access: Access, *, dim: int, config: IndexConfig, embedder: Embedder,
                 fingerprint: str, leases: Leases | None = None) -> None:
        self._db = db
        self._leases = leases
        self._access = access
        self.dim = dim
        self.config = config
        self.store_id: str | None = None  # set at open, from the database: the manifest must name the same store
        self.status = "new"
        # The index comes on first use (ensure_loaded): until then `model` hands out this generation, whose index
        # is None, for its embedder and fingerprint only; `current` never returns it.
        self._gen = Generation(embedder, fingerprint, cast(VectorIndex, None), 0)
        self._loaded = False  # set, under the write mutex, once a loaded (or built) index serves
        self._saved_watermark = -1
        self._lock = RWLock()  # recalls share it; a generation swap takes it exclusively
        self._behind = threading.Lock()  # one far-behind rebuild at a time (it runs outside the write mutex)
        self._indexed_ahead = 0  # the last seq apply() indexed ahead of the watermark (a snapshot needs it caught up)
        self._refused_snapshot: tuple = ()  # (file, watermark) of a snapshot that failed a check: not tried again
        self._verify_stop = threading.Event()  # set at close: the background verify pass ends
        self._verify_thread: threading.Thread | None = None
        self.verified = ""  # the background pass: "" (none yet), "running", "agreed", or why it rebuilt

    # ---- the serving generation ----------------------------------------------------------------------------
    @property
    def current(self) -> Generation:
        """The serving generation (a value: read it once and use that); loads the index on first use."""
        if not self._loaded:
            self.ensure_loaded()
        return self._gen

    @property
    def loaded(self) -> bool:
        """Whether the index was loaded (or built) yet."""
        return self._loaded

    @property
    def model(self) -> Generation:
        """The serving generation without loading the index: read only its embedder and fingerprint (its index is
        None before the first vector use)."""
        return self._gen

    def serve_model(self, embedder: Embedder, fingerprint: str) -> None:
        """At open, before the index is loaded: serve this model (the stored adapter on our base embedder)."""
        self._gen = replace(self._gen, embedder=embedder, fingerprint=fingerprint)

    def ensure_loaded(self) -> None:
        """Load the index now if it is not loaded yet (once; other threads wait for it). Never call it holding
        serving(): a model swap holds the write mutex while it waits for the readers to leave."""
        if self._loaded:
            return
        with self._db.write_mutex:  # apply() and advance() run under it too: none slips between load and serve
            if not self._loaded:
                self.load()
                self._loaded = True

    @contextlib.contextmanager
    def serving(self, *, load: bool = True) -> Iterator[Generation]:
        """Hold the shared side: the generation yielded stays the serving one until the block ends.

        load=False (a lexical recall): yield the generation as it is, its index None when not loaded yet.
        """
        if load:
            self.ensure_loaded()  # (before the shared side: see ensure_loaded)
        with self._lock.read():
            yield self._gen

    def swapping(self) -> Any:
        """The exclusive side: recalls wait while the holder installs a new generation."""
        return self._lock.write()

    def install(self, generation: Generation, status: str) -> None:
        """Serve `generation` (with its index) from now on (the caller holds the write mutex, and swapping() for a
        model change)."""
        self._gen = generation
        self.status = status
        self._loaded = True

    def advance(self, before: int, top: int) -> None:
        """Our committed change (seqs before+1..top) left nothing to index: move the watermark to `top` when it
        stood at `before` (write mutex held). When another process committed since, the watermark stays: the next
        catch-up (a recall's, or the follower's) replays their changes and steps over ours, which changes nothing
        in the index, so a remember never waits for a catch-up (issue 34)."""
        if not self._loaded:
            self.ensure_loaded()  # its replay of the feed includes our change
            return
        if self._gen.watermark == before:
            self._gen = replace(self._gen, watermark=top)

    # ---- keeping up with the database ----------------------------------------------------------------------
    def load(self) -> None:
        """Load the saved snapshot if it validates, replay newer changes, else rebuild (ensure_loaded() calls it,
        under the write mutex).

        A snapshot is trusted when its manifest matches the database: this store and model, a watermark the change
        feed still holds, the file's size and parsed structure, and after the replay as many live vectors as
        SQLite holds for the model. Comparing every vector with SQLite (what an open did before: 1 s of every open
        at 100k facts) and the file's sha256 (0.46 s at a million facts) are left to verify(): check() runs it, and
        so does a background pass VERIFY_DELAY seconds after the load."""
        if not self._access.snapshot_files:  # ":memory:", or a server whose nodes keep no files: from the database
            self.rebuild("new in-memory store" if self._access.memory else "built from the database")
            return
        directory, stem = self._files()
        with self._db.reading() as r:
            top = r.max_seq()
        try:
            index, manifest = VectorIndex.load(directory, stem, expect=self.expect(), config=self.config, max_seq=top,
                                               defer_hash=True)
        except IndexRejected as exc:
            self.rebuild(str(exc))
            return
        except (OSError, RuntimeError, MemoryError) as exc:  # usearch refusing a file we validated, or I/O
            self.rebuild(f"index could not be loaded ({exc})")
            return
        if self._far_behind(top - manifest["watermark"], index.live_count):
            self.rebuild(f"snapshot was {top - manifest['watermark']} changes behind")
            return
        self._gen = replace(self._gen, index=index, watermark=manifest["watermark"])
        self._saved_watermark = manifest["watermark"]
        replayed = self.catch_up(verify="count")
        self._loaded = True  # (a rebuild in catch_up installed its own index)
        if replayed is None:
            return
        self.status = f"loaded (replayed {replayed} changes)"
        self._start_verify_pass()
        if replayed >= SAVE_AFTER_REPLAY and self._access.saves_index:
            self.save()

    def catch_up(self, *, verify: str = "", mutex_held: bool = False) -> int | None:
        """Replay the changes after the watermark (R3); every process does this before it answers.

        Args:
            verify: "" (none), "count" (after loading a snapshot: the live count must be SQLite's, else "full"
                runs) or "full" (compare every label and vector with SQLite).
            mutex_held: the caller holds the write mutex (then a far-behind index is replayed when another thread
                is rebuilding it right now, instead of waiting for that thread).
        Returns:
            how many changes were replayed, or None when the index disagreed and was rebuilt (or was loaded now).
        """
        if not self._loaded and not verify:  # (load() itself checks)
            self.ensure_loaded()
            return None
        db = self._db
        if not verify:
            with db.reading() as r:
                behind = r.max_seq() - self._gen.watermark
            if behind <= 0:
                return 0
            if behind >= REBUILD_BEHIND_MIN and self._snapshot_ahead():
                if self._behind.acquire(blocking=not mutex_held):
                    try:
                        if self._catch_up_by_snapshot():
                            return None
                    finally:
                        self._behind.release()
            if self._far_behind(behind, self._gen.index.live_count):
                # One rebuild at a time: a thread that waited finds the index rebuilt, or still far behind. A
                # caller holding the write mutex never waits here (the rebuilding thread needs the mutex to swap).
                if self._behind.acquire(blocking=not mutex_held):
                    try:
                        with db.reading() as r:
                            behind = r.max_seq() - self._gen.watermark
                        if self._far_behind(behind, self._gen.index.live_count):
                            self._rebuild_behind(f"{behind} changes behind")
                            return None
                    finally:
                        self._behind.release()
        with db.write_mutex:  # one catch-up or rebuild at a time, so the watermark only moves forward
            gen = self._gen
            with contextlib.ExitStack() as held:
                r = held.enter_context(db.snapshot())
                top = r.max_seq()
                changes = r.changes_after(gen.watermark, top)
                # (a label the index holds past its watermark was added ahead by apply(): its vector is not read)
                added = [c.seq for c in changes if c.vector_added and c.seq not in gen.index]
                removed = [c.label_removed for c in changes if c.label_removed is not None]
                labels, vectors = r.vectors(gen.fingerprint, self.dim, labels=added)
                if verify == "count":
                    truth_count = r.count(gen.fingerprint)
                reason = pruned_past(r, gen.watermark)
                if verify != "full":
                    held.close()  # (the full comparison reads the same snapshot after the replay)
                if reason is None and not verify and self._sparse_after(gen.index, labels, removed):
                    reason = f"{len(changes)} changes behind, {len(removed)} of them retiring vectors"
                if reason is None:
                    try:
                        replay(gen.index, labels, vectors, removed)
                        self._gen = replace(gen, watermark=top)
                    except (InvalidInput, RuntimeError, MemoryError) as exc:
                        reason = f"replay failed ({exc})"
                if verify == "full" and reason is None:
                    reason = disagreement(r, gen.index, gen.fingerprint, self.dim, VERIFY_CHUNK)
            if reason is not None:
                self.rebuild(reason)
                return None
            if verify == "count" and gen.index.live_count != truth_count:
                # (a fact whose stored vector is damaged counts here but is left out of the index: compare all)
                return None if self.catch_up(verify="full", mutex_held=True) is None else len(changes)
            if changes:
                self._rebuild_if_sparse()
        return len(changes)

    @staticmethod
    def _far_behind(behind: int, live: int) -> bool:
        """Whether `behind` pending changes cost more to replay into an index of `live` vectors than a rebuild."""
        return behind >= REBUILD_BEHIND_MIN and behind > REBUILD_BEHIND_RATIO * live

    def _sparse_after(self, index: VectorIndex, labels: np.ndarray, removed: list[int]) -> bool:
        """Whether replaying (add `labels`, retire `removed`) would leave the index sparse enough to be rebuilt
        right after (so rebuild at once instead of doing both)."""
        if len(labels) + len(removed) < REBUILD_BEHIND_MIN:
            return False
        retired = index.retired_count + sum(1 for label in removed if label in index)  # (nodes; labels for removed)
        total = index.element_count + len(labels)
        return total >= 64 and retired / total > self.config.rebuild_deleted_ratio

    def _rebuild_behind(self, reason: str) -> None:
        """Catch up a far-behind index: adopt a newer snapshot another process saved (when one validates, is not
        itself far behind, and holds as many vectors as SQLite after its replay), else build a new index from the
        vectors table; then swap it in.

        The load or build runs outside the write mutex (this process's writes and recalls go on with the current
        index meanwhile); under the mutex, the changes committed since are replayed onto the new index and it is
        installed as one value."""
        gen = self._gen
        adopted = self._adopt_snapshot(gen)
        if adopted is not None:
            self._swap_in(gen, *adopted, save=False)
            return
        with self._db.snapshot() as r:
            top = r.max_seq()
            labels, vectors = r.vectors(gen.fingerprint, self.dim)
        self._swap_in(gen, build_index(self.dim, self.config, labels, vectors), top, f"rebuilt ({reason})", save=True)

    def _catch_up_by_snapshot(self) -> bool:
        """Adopt the newer snapshot on disk instead of replaying the feed (it skips more changes than its load
        costs: see _snapshot_ahead); False when there is none or it fails a check (the caller replays)."""
        gen = self._gen
        if not self._snapshot_ahead():  # (again: another thread may have adopted it meanwhile)
            return False
        adopted = self._adopt_snapshot(gen)
        if adopted is None:
            return False
        self._swap_in(gen, *adopted, save=False)
        return True

    def _swap_in(self, gen: Generation, index: VectorIndex, top: int, status: str, *, save: bool) -> None:
        """Under the write mutex: replay onto `index` (which reflects seq `top`) the changes committed since, and
        serve it, unless another thread swapped models since `gen` was read."""
        db = self._db
        with db.write_mutex:
            now = self._gen
            if now.fingerprint != gen.fingerprint:
                return  # another thread swapped models meanwhile (and built that generation's index)
            with db.snapshot() as r:
                head = r.max_seq()
                new_labels, new_vectors, removed, _ = feed_after(r, gen.fingerprint, self.dim, top, head)
                pruned = pruned_past(r, top)
            if pruned is not None:
                self.rebuild(pruned)
                return
            try:
                replay(index, new_labels, new_vectors, removed)
            except (InvalidInput, RuntimeError, MemoryError) as exc:
                self.rebuild(f"replay failed ({exc})")
                return
            crash_point("rebuild.before_swap")
            self.install(Generation(now.embedder, now.fingerprint, index, max(head, top)), status)
            if save and self._access.saves_index:
                self.save()

    def _snapshot_ahead(self) -> bool:
        """Whether the snapshot on disk is this generation's and far enough ahead of our index to be worth adopting
        instead of replaying (it skips at least REBUILD_BEHIND_MIN changes and ADOPT_BEHIND_RATIO x its vectors),
        and was not already refused (reads its manifest only)."""
        saved = self._saved_manifest(self._gen.fingerprint)
        if saved is None:
            return False
        _, _, manifest, mark, live = saved
        if (manifest.get("file"), mark) == self._refused_snapshot:
            return False
        skipped = mark - self._gen.watermark
        return skipped >= REBUILD_BEHIND_MIN and skipped > ADOPT_BEHIND_RATIO * live

    def _saved_manifest(self, fingerprint: str) -> tuple[Path, str, dict, int, int] | None:
        """The saved snapshot's manifest when it is this store's and `fingerprint`'s: (directory, stem, manifest,
        watermark, live vectors); None when snapshots are not kept, there is none, it does not parse, or it names
        another store or model."""
        if not self._access.snapshot_files:
            return None
        directory, stem = self._files()
        try:
            manifest = read_manifest(directory / f"{stem}.json")
        except IndexRejected:
            return None
        mark, live = manifest.get("watermark"), manifest.get("live")
        if (manifest.get("store_id") != self.store_id or manifest.get("fingerprint") != fingerprint
                or not isinstance(mark, int) or not isinstance(live, int)):
            return None
        return directory, stem, manifest, mark, live

    def _adopt_snapshot(self, gen: Generation) -> tuple[VectorIndex, int, str] | None:
        """The snapshot on disk, when another process saved one newer than `gen`'s index that is not itself far
        behind the feed: loaded only after it validates (R6), the changes after its watermark replayed, and then
        trusted as an open trusts it (as many live vectors as SQLite holds for the model; verify() compares them
        all). Returns (index, the seq it reflects, status), or None (no such snapshot, or it failed a check: the
        caller rebuilds or replays)."""
        saved = self._saved_manifest(gen.fingerprint)
        if saved is None:
            return None
        directory, stem, manifest, mark, live = saved
        with self._db.reading() as r:
            top = r.max_seq()
        if not gen.watermark < mark <= top or self._far_behind(top - mark, live):
            return None
        refused = (manifest.get("file"), mark)
        try:
            index, manifest = VectorIndex.load(directory, stem, expect=self.expect(gen.fingerprint), config=self.config,
                                               max_seq=top)  # (hashed now: it replaces an index that works)
        except (IndexRejected, OSError, RuntimeError, MemoryError):
            self._refused_snapshot = refused
            return None
        mark = manifest["watermark"]
        with self._db.snapshot() as r:
            top = r.max_seq()
            labels, vectors, removed, count = feed_after(r, gen.fingerprint, self.dim, mark, top)
            truth_count = r.count(gen.fingerprint)
            pruned = pruned_past(r, mark)
        if pruned is not None:
            return None
        try:
            replay(index, labels, vectors, removed)
        except (InvalidInput, RuntimeError, MemoryError):
            self._refused_snapshot = refused
            return None
        if index.live_count != truth_count:
            self._refused_snapshot = refused
            return None
        self._start_verify_pass()
        return index, top, f"adopted a saved index (seq {mark}, replayed {count} changes; was {gen.watermark})"

    def apply(self, added: np.ndarray, vectors: np.ndarray, removed: list[int], before: int, top: int) -> None:
        """Mirror a change this process committed (under the write mutex): add `vectors` (N, D) under `added`
        (N,), retire `removed`, advance to `top`; rebuild if the index refuses or holds too many deleted.

        `before` is the seq just before the change's own. When the watermark is behind it, another process
        committed in between. A change that only adds vectors is indexed now all the same, ahead of the watermark,
        which stays where it is: the next catch-up replays the feed in order and skips the labels the index holds
        without reading their vectors again (issue 34: on PostgreSQL, with several nodes writing, every batch of
        the embedding worker used to catch up the whole feed under the write mutex, its own vectors read back over
        the network). A change that retires labels is not applied ahead: a label it retires may come from a change
        this index has not seen yet, so the feed is replayed instead (our change is in it), and the watermark never
        moves past a change this index has not seen. The first change loads the index (its replay of the feed
        includes this change)."""
        if not self._loaded:
            self.ensure_loaded()
            return
        gen = self._gen
        if gen.watermark > before:
            # A catch-up (of a recall, say: the embedding worker commits outside the mutex) replayed the feed past
            # our change already, and with it whatever came after: a forget of our fact by another process, which
            # adding our vectors now would bring back to life.
            return
        if gen.watermark != before and removed:
            self.catch_up(mutex_held=True)
            return
        try:
            if removed:  # (the index calls take a lock and validate even when there is nothing to do)
                gen.index.mark_deleted(removed)
            if len(added):
                gen.index.add(added, vectors)
            if gen.watermark == before:
                self._gen = replace(gen, watermark=top)
            else:
                self._indexed_ahead = max(self._indexed_ahead, top)
        except (InvalidInput, RuntimeError, MemoryError) as exc:
            self.rebuild(f"index update failed ({exc})")
            return
        self._rebuild_if_sparse()

    def _rebuild_if_sparse(self) -> None:
        index = self._gen.index
        if index.element_count >= 64 and index.deleted_ratio() > self.config.rebuild_deleted_ratio:
            self.rebuild("too many deleted elements")

    def rebuild(self, reason: str, *, model: tuple[Any, str] | None = None) -> int:
        """Build a fresh index from the vectors in SQLite and serve it; save it when this process may.

        Args:
            reason: shown in info()["index_status"].
            model: (embedder, fingerprint) to serve from now on (another process swapped models); None: the same.
        Returns:
            how many vectors the new index holds.
        """
        with self._db.write_mutex:
            embedder, fingerprint = model or (self._gen.embedder, self._gen.fingerprint)
            with self._db.snapshot() as r:
                top = r.max_seq()
                labels, vectors = r.vectors(fingerprint, self.dim)
            index = build_index(self.dim, self.config, labels, vectors)
            crash_point("rebuild.before_swap")
            self.install(Generation(embedder, fingerprint, index, top), f"rebuilt ({reason})")
            if self._access.saves_index:
                self.save()
            return len(labels)

    # ---- the full cross-check ------------------------------------------------------------------------------
    def verify(self) -> str | None:
        """Compare every label and vector of the index with SQLite (after catching up) and rebuild it on any
        disagreement (R6: a cache is never repaired in place). Thread-safe: takes the write mutex.

        Returns:
            why it rebuilt (the new index_status), or None when they agree or the index was never loaded.
        """
        if not self._loaded:
            return None
        with self._db.write_mutex:
            index = self._gen.index
            if index is not None and not index.file_agrees():
                self.rebuild(HASH_MISMATCH)
                return self.status
            if self.catch_up(verify="full", mutex_held=True) is None:
                return self.status
        return None

    def verify_paced(self, stop: threading.Event) -> str | None:
        """verify() a chunk at a time: the background pass after a trusted load. At a million facts the comparison
        in one piece took 15 s, held the write mutex all along (every write of this process waited) and made
        recalls seven times slower. Here each chunk of VERIFY_CHUNK of the labels SQLite listed at the start is
        compared under the mutex at a point where the index has replayed the whole feed, with the labels the index
        held at the start in the same range (so a label the index holds and SQLite does not is found too); the
        mutex is released between chunks, and the pass rests VERIFY_PAUSE times as long as each chunk took. Labels
        added after the start came from the feed, not from the snapshot file, and are not compared. Stops when
        `stop` is set or the index is replaced (a rebuild, a model swap); a chunk whose feed keeps moving is
        skipped (check() compares everything at once).

        Returns:
            why it rebuilt (the new index_status), or None.
        """
        if not self._loaded:
            return None
        self.verified = "running"
        index, fingerprint = self._gen.index, self._gen.fingerprint
        if index is not None and not index.file_agrees():  # (the file is never written again: read it unlocked)
            with self._db.write_mutex:
                if self._gen.index is index:
                    self.rebuild(HASH_MISMATCH)
                    self.verified = HASH_MISMATCH
                    return self.status
        if index is not None:
            index.settle()  # (its node hashes, read from the file it was loaded from, which is then closed)
        with self._db.reading() as r:
            listed = np.sort(np.fromiter(r.labels(fingerprint), dtype=np.int64))  # (L,)
        held = index.live_label_array()  # (H,)
        starts = listed[::VERIFY_CHUNK]  # (C,) each chunk's first listed label
        for i in range(max(1, len(starts))):
            lo = -1 if i == 0 else int(starts[i])  # (labels are change seqs: never negative)
            hi = int(starts[i + 1]) if i + 1 < len(starts) else None  # (None: no upper end)
            t0 = time.monotonic()
            with self._db.write_mutex:
                if self._gen.index is not index:
                    self.verified = ""
                    return None
                reason = self._verify_range(index, fingerprint, between(listed, lo, hi), between(held, lo, hi))
                if reason is not None:
                    self.rebuild(reason)
                    self.verified = reason
                    return self.status
            if stop.wait(VERIFY_PAUSE * (time.monotonic() - t0)):
                self.verified = ""
                return None
        self.verified = "agreed"
        return None

    def _verify_range(self, index: VectorIndex, fingerprint: str, listed: np.ndarray, held: np.ndarray) -> str | None:
        """Under the write mutex: why `index` disagrees with SQLite on the labels `listed` (SQLite's, at the pass's
        start) and `held` (the index's then), or None (also when the feed kept moving: the chunk is skipped)."""
        for _ in range(3):
            if self.catch_up(mutex_held=True) is None or self._gen.index is not index:
                return None  # rebuilt or replaced meanwhile: nothing of the loaded file is left to compare
            with self._db.snapshot() as r:
                if r.max_seq() != self._gen.watermark:
                    continue  # another process committed since the replay: replay again
                live = held[index.holds(held)]  # (retired since the start: gone)
                wanted = np.union1d(listed, live).tolist()
                missing, extra, differ = compare_labels(r, index, fingerprint, self.dim, wanted)
            if differ:
                return "index vectors disagree with SQLite"
            return f"index disagrees with SQLite ({missing} missing, {extra} extra)" if missing or extra else None
        return None

    def _start_verify_pass(self) -> None:
        """After a trusted load or adoption: verify() once, VERIFY_DELAY seconds later, in a daemon thread; a
        process closed sooner skips it (check() runs the same comparison on demand)."""
        if self._verify_thread is not None or self._verify_stop.is_set():
            return
        ref, stop = weakref.ref(self), self._verify_stop

        def run() -> None:
            if stop.wait(VERIFY_DELAY):
                return
            cache = ref()
            if cache is None:
                return
            try:
                cache.verify_paced(stop)
            except Exception:  # noqa: BLE001 - a store closed meanwhile, a busy database: best effort, check() reruns it
                cache.verified = ""

        self._verify_thread = threading.Thread(target=run, name="evermind-verify-index", daemon=True)
        self._verify_thread.start()

    def close_index(self) -> None:
        """At the store's close: the serving graph finishes its calls in flight and refuses new ones."""
        index = self._gen.index
        if index is not None:
            index.close()

    def stop_background(self, *, wait: bool = True) -> None:
        """End the background verify pass (at close); wait for one running now unless `wait` is False."""
        self._verify_stop.set()
        thread = self._verify_thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    # ---- snapshots on disk ---------------------------------------------------------------------------------
    def expect(self, fingerprint: str | None = None) -> dict:
        """The manifest fields a snapshot must carry to be this store's, of this generation (or of the generation
        with `fingerprint`); a tuple names the values any of which will do."""
        return {"store_id": self.store_id, "fingerprint": fingerprint or self._gen.fingerprint, "dim": self.dim,
                # a snapshot of float32 rows (before schema 5) is rebuilt once; one of float16 rows is kept
                "vectors": vector_blobs.COMPATIBLE_FORMATS}

    def _files(self) -> tuple[Path, str]:
        path = Path(self._access.path)
        return path.resolve().parent, path.name

    def save(self) -> None:
        """Persist the index unless the snapshot on disk is already newer (compare-and-swap, R13).

        The compare and the swap run under the "snapshot" lease, so two processes never interleave them; when
        another process is saving right now, this save is skipped (the index is a cache: the next open replays).
        An index never loaded is not saved: the snapshot on disk stays as it is.
        """
        if not self._access.saves_index or not self._loaded:
            return
        leases = self._leases
        if leases is not None and not leases.claim(SNAPSHOT_LEASE):
            return
        try:
            self._save()
        finally:
            if leases is not None:
                leases.release(SNAPSHOT_LEASE)

    def _save(self) -> None:
        directory, stem = self._files()
        with self._db.write_mutex:
            if self._indexed_ahead > self._gen.watermark:  # a snapshot holds no label past its watermark (R6)
                self.catch_up(mutex_held=True)
            gen = self._gen
            try:
                on_disk = read_manifest(directory / f"{stem}.json")
                with self._db.reading() as r:
                    top = r.max_seq()
                newer = on_disk.get("watermark")
                if (on_disk.get("store_id") == self.store_id and on_disk.get("fingerprint") == gen.fingerprint
                        and isinstance(newer, int) and gen.watermark < newer <= top):
                    return  # a newer snapshot is already saved: never regress the index (R13)
            except IndexRejected:
                pass
            gen.index.save(directory, stem,
                           {**self.expect(), "vectors": vector_blobs.FORMAT, "watermark": gen.watermark})
            self._saved_watermark = gen.watermark

    @property
    def unsaved(self) -> bool:
        """Whether the index moved since it was last loaded or saved (never before it is loaded)."""
        return self._loaded and self._gen.watermark != self._saved_watermark
