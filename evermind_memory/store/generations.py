"""The model generation: which embedder serves, how it is replaced with no gap in service, and how a process
follows a swap made by another one.

A generation is the value (embedder, fingerprint, index, watermark) that vectors.VectorCache serves. A new
model gets a new generation: every memory is re-embedded into a side table while the current generation keeps
serving, the new index is built and caught up with the writes made meanwhile, and one transaction adopts the
new vectors while recalls wait on the exclusive lock (R12). The target is recorded in meta first, so a publish
cut short by a crash or stop() resumes where it stopped. `Generations` is the public API adaptation
(evermind_memory.adaptation) uses; it never reaches further into the store. Opening a store with another model
builds its generation the same way (`settle`); `MemoryStore.reembed()` re-embeds stale facts in place.

Many processes serve one store. Only one builds a generation at a time: it holds the "generation" lease
(renewed as it works; taken over, and the build resumed from its committed batches, when its process dies).
Every other process keeps serving the complete current generation until the swap commits, then follows it
before its next answer (`follow`), or, when it cannot build the new model (it was opened with another base
embedder), raises EmbedderMismatch rather than answer with vectors of two models. Its writes meanwhile keep
their text; their vectors are left to a process that serves the new model.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

from .._crash import crash_point
from .._lazy import lazy_import
from ..embedder.base import Embedder, is_adaptable
from ..errors import CheckpointError, EmbedderMismatch, EmbedderOutputInvalid, EvermindError, InvalidInput
from .access import Access
from .adapter_state import (
    META_ADAPT_SEQ,
    META_ADAPTER,
    META_BASE_FP,
    META_PENDING,
    AdapterState,
    resolve_embedder,
)
from .backend.base import Backend, FeedReads, GenerationRows, Writes, utc_now
from .embedding import embed_texts
from .leases import Heartbeat, Leases
from .vectors import Generation, VectorCache, build_index

if TYPE_CHECKING:
    from .index import VectorIndex

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

REEMBED_BATCH = 256
GENERATION_LEASE = "generation"  # held while building a new generation: a re-embed, an adaptation round, a rollback
WAIT_POLL_S = 0.2


class PublishReport(Protocol):
    """The fields of a report (adaptation.AdaptationReport) that publish() and resume() fill in."""

    kind: str  # "round", "resume" or "rollback" (read)
    status: str  # set to "swapped", "stopped", "refused", "vetoed" or "abandoned"
    reason: str
    fingerprint_after: str
    base_fingerprint: str
    adapter_id: str | None
    resumed: bool
    reembedded: int
    replayed: int
    reembed_seconds: float
    index_seconds: float
    swap_seconds: float
    swapped_at: str | None


@dataclass
class RebuildReport:
    """A PublishReport for a generation built at open because the store was opened with another model."""

    kind: str = "reembed"
    status: str = "running"
    reason: str = ""
    fingerprint_after: str = ""
    base_fingerprint: str = ""
    adapter_id: str | None = None
    resumed: bool = False
    reembedded: int = 0
    replayed: int = 0
    reembed_seconds: float = 0.0
    index_seconds: float = 0.0
    swap_seconds: float = 0.0
    swapped_at: str | None = None


class RoundLock:
    """One adaptation round, resume or rollback at a time in a process. A round started from inside one (a hook
    calling adapt_now) is refused with InvalidInput: a plain lock waited for itself forever."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None

    def __enter__(self) -> "RoundLock":
        if self._owner == threading.get_ident():
            raise InvalidInput("an adaptation round, resume or rollback was started from inside one (from a hook): "
                               "hooks must not start another; start it after adapt_now() returns.")
        self._lock.acquire()
        self._owner = threading.get_ident()
        return self

    def __exit__(self, *exc: object) -> None:
        self._owner = None
        self._lock.release()


class ModelSwapped(EmbedderMismatch):
    """A write met a model another process swapped in since this one last followed (MemoryStore follows the swap
    and writes once more; the error reaches the caller only if the write still cannot be made)."""


class Generations(AdapterState):
    """The serving model of one store and the ways to replace it (the public generation API).

    What adaptation uses: current, embedder, fingerprint, base_embedder, adapter_history(), closed, round_lock;
    claimed() and keep_lease() (the "generation" lease: one builder across processes);
    pending(), active_adapter(), active_adapter_id(), max_seq(), adapted_upto(), remembered_since();
    adaptable_base(), memories(), feedback_pairs(), load_adapter(), adapted_embedder() (those reads are
    AdapterState's, in adapter_state.py); publish(), resume().
    The store itself also calls settle() (open), follow() (before answering), reembed() and
    clear_adaptation_state().

    Thread-safety: every method may be called from any thread; `round_lock` keeps adaptation rounds,
    resumes and rollbacks to one at a time, publish() serialises with writes through the write mutex.

    Args:
        db: the backend.
        cache: the vector cache whose generation this replaces.
        access: what this process may do.
        base: the embedder the store was opened with (adapters sit on it).
        leases: the store's leases ("generation" is held while a new generation is built).
    """

    def __init__(self, db: Backend, cache: VectorCache, access: Access, base: Embedder, leases: Leases) -> None:
        self._db = db
        self._cache = cache
        self._access = access
        self._leases = leases
        self._heartbeat: Heartbeat | None = None
        self.base_embedder = base
        self.round_lock = RoundLock()  # one adaptation round, resume or rollback at a time
        self.note: str | None = None  # why the active adapter could not be applied (for error messages)

    # ---- what serves ---------------------------------------------------------------------------------------
    @property
    def current(self) -> Generation:
        """The serving generation."""
        return self._cache.current

    @property
    def embedder(self) -> Embedder:
        """The serving embedder."""
        return self._cache.model.embedder

    @property
    def fingerprint(self) -> str:
        """The serving fingerprint."""
        return self._cache.model.fingerprint

    @property
    def adapters_dir(self) -> Path:
        """`<db>.adapters/`, where adapter files and their history live."""
        p = Path(self._access.path).resolve()
        return p.parent / (p.name + ".adapters")

    @property
    def closed(self) -> bool:
        """Whether the store was closed (no method below may be called then)."""
        return self._db.closed

    # ---- one builder at a time, across processes -----------------------------------------------------------
    @contextlib.contextmanager
    def claimed(self) -> Iterator[bool]:
        """Hold the "generation" lease for the block; yields False (and holds nothing) when a live process
        holds it. Inside, keep_lease() renews it; publish() renews it between batches."""
        if not self._leases.claim(GENERATION_LEASE):
            yield False
            return
        self._heartbeat = Heartbeat(self._leases, GENERATION_LEASE)
        try:
            yield True
        finally:
            self._heartbeat = None
            with contextlib.suppress(EvermindError):
                self._leases.release(GENERATION_LEASE)

    def keep_lease(self) -> bool:
        """Renew the generation lease when due; False once it was lost (expired and taken over): stop then."""
        beat = self._heartbeat
        return beat is None or beat.beat()

    def builder(self) -> str | None:
        """The owner token of the live process building a generation now, or None."""
        held = self._leases.holder(GENERATION_LEASE)
        return None if held is None else held[0]

    def build_progress(self) -> tuple[str, bool] | None:
        """(what is being built and how far, whether a live process builds it), or None when nothing is."""
        pending = self.pending()
        if pending is None:
            return None
        fp = pending.get("fingerprint")
        with self._db.snapshot() as r:
            labelled = len(r.labels(None))
            missing = r.generation_count_missing(str(fp))
            serving = r.meta("fingerprint")
        holder = self.builder()
        text = (f"a new generation ({pending.get('kind')}, {fp}) is part way built: {labelled - missing} of {labelled} "
                f"memories re-embedded; {serving} serves until the swap")
        if holder is not None:
            return text + f" (process {holder.split(':')[1]} is building it)", True
        return text + ("; no live process is building it: it resumes when a writer with that model opens the "
                       "store, or at the next adaptation round"), False

    @staticmethod
    def require_serving(tx: FeedReads, fingerprint: str, method: str) -> None:
        """Inside a write: refuse vectors of `fingerprint` when the store now serves another model.

        Raises:
            EmbedderMismatch: another process swapped the store to a model this one has not followed.
        """
        stored = tx.meta("fingerprint")
        if stored is not None and stored != fingerprint:
            raise ModelSwapped(
                f"{method}(): the store now serves {stored} (another process swapped models); this MemoryStore "
                f"embeds with {fingerprint}. Nothing was stored. Recall once to follow the swap, or reopen the "
                "store with its embedder."
            )

    # ---- opening and following ---------------------------------------------------------------------------
    def apply_active_adapter(self) -> None:
        """At open: when the store serves base + adapter and we were given that base, serve the adapter too."""
        if self._access.memory:
            return
        gen = self._cache.model  # (the index is not loaded yet: it is loaded for the model chosen here)
        with self._db.reading() as r:
            stored_fp = r.meta("fingerprint")
            raw = r.meta(META_ADAPTER)
            base_fp = r.meta(META_BASE_FP)
        if not raw or stored_fp == gen.fingerprint or base_fp != gen.fingerprint:
            return
        try:
            entry = json.loads(raw)
            if not is_adaptable(gen.embedder):
                raise InvalidInput("the embedder given is not an LMEmbedder")
            embedder = resolve_embedder(gen.embedder, self.load_adapter(entry, gen.embedder))
        except (CheckpointError, InvalidInput, ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
            self.note = f"its active adapter could not be applied ({exc})"
            return
        if embedder.fingerprint != stored_fp:
            self.note = f"base + adapter {entry.get('id')} gives {embedder.fingerprint}, not {stored_fp}"
            return
        self._cache.serve_model(embedder, embedder.fingerprint)

    def settle(self, on_mismatch: str) -> None:
        """At open: serve the stored adapter if it sits on our embedder, then deal with vectors of another model.

        The first writer of a store records its model. A writer whose model differs from the one the store
        serves builds a generation of its own beside the serving one (publish: other processes keep answering
        with the complete old generation meanwhile) and swaps it in; when another process is already building
        this same model it waits for that swap (or takes the build over if that process dies). Vectors of
        another model under the serving fingerprint (a re-embed of an older version cut short) are re-embedded
        in place.

        Raises:
            EmbedderMismatch: the store serves another model and this process may not (a reader), was told not
                to (on_mismatch="raise"), or cannot now (another process is building a third model).
        """
        self.apply_active_adapter()
        db, access, dim = self._db, self._access, self._cache.dim
        fingerprint = self._cache.model.fingerprint
        while True:
            with db.reading() as r:
                stored_fp = r.meta("fingerprint")
                stored_dim = r.meta("dim")
                vectors = r.count() - r.count_waiting()
                foreign = r.count_foreign(fingerprint)
            if stored_fp == fingerprint or not access.writes:
                break
            if stored_fp is not None and vectors:  # the store serves another model: build ours beside it
                if on_mismatch == "raise":
                    raise EmbedderMismatch(self._mismatch(stored_fp, stored_dim, foreign, reader=False))
                if self._build_own_generation(stored_fp):
                    return
                continue  # another process swapped to our model meanwhile: look again
            with db.transaction() as tx:  # a new (or vector-less) store: ours is the model from now on
                if tx.meta("fingerprint") != stored_fp:
                    continue  # another process recorded its model first
                tx.set_meta("fingerprint", fingerprint)
                tx.set_meta("dim", str(dim))
                if stored_fp is not None:
                    self.clear_adaptation_state(tx)  # another model: its adapters and half-built generation lapse
            break
        if foreign and stored_fp != fingerprint and not access.writes:
            raise EmbedderMismatch(self._mismatch(stored_fp, stored_dim, foreign, reader=True))
        if foreign and access.writes:
            if on_mismatch == "raise":
                raise EmbedderMismatch(self._mismatch(stored_fp, stored_dim, foreign, reader=False))
            self.reembed(force=False, with_index=False, include_waiting=False)

    def _build_own_generation(self, stored_fp: str) -> bool:
        """Re-embed the store into a generation of our model beside the serving one and swap it in, or wait
        while another process builds this very model. Returns True once ours serves, False to look again.

        Raises:
            EmbedderMismatch: another process is building a different model right now.
        """
        ours = self._cache.model.fingerprint
        while True:
            with self.claimed() as mine:
                if mine:
                    pending = self.pending()
                    report = RebuildReport(kind="reembed")
                    resume = pending is not None and pending.get("fingerprint") == ours
                    self.publish(self._cache.model.embedder, None, report, resume=resume)
                    if report.status != "swapped":
                        raise EmbedderMismatch(
                            f"{self._access.path}: re-embedding it for {ours} did not finish ({report.status}: "
                            f"{report.reason}); it still serves {stored_fp}."
                        )
                    return True
            pending = self.pending() or {}
            if pending.get("fingerprint") != ours:
                if self.builder() is None:
                    continue  # the builder just finished or died: claim again
                with self._db.reading() as r:
                    if r.meta("fingerprint") == ours:
                        return False
                raise EmbedderMismatch(
                    f"{self._access.path} serves {stored_fp}, and another process is building a generation of "
                    f"{pending.get('fingerprint')} right now; this one has {ours}. Wait for that swap and open it "
                    "with that model, or try again later."
                )
            time.sleep(WAIT_POLL_S)  # another process builds our model: wait for its swap, or take over
            with self._db.reading() as r:
                if r.meta("fingerprint") == ours:
                    return False

    def _mismatch(self, stored_fp: str | None, stored_dim: str | None, stale: int, *, reader: bool) -> str:
        what = f"{self._access.path} holds {stale} vectors made by embedder {stored_fp} (dim {stored_dim})"
        now = f"the current one is {self._cache.model.fingerprint} (dim {self._cache.dim})"
        if self.note:
            now += f"; {self.note}"
        if reader:
            return (f"{what}; {now}. A read-only store cannot re-embed: open it once as a writer with this embedder, "
                    "or use the matching embedder.")
        return f"{what}; {now}. Open it with on_mismatch='reembed' to re-embed them, or with the matching embedder."

    def follow(self) -> None:
        """Serve the generation the database names, when another process swapped it (adaptation, rollback).

        Raises:
            EmbedderMismatch: the new generation's model cannot be built from the base embedder this process has.
        """
        cache = self._cache
        with self._db.reading() as r:
            stored_fp = r.meta("fingerprint")
        if stored_fp is None or stored_fp == cache.model.fingerprint:
            return
        with cache.swapping():
            # Read the name again under the lock: a swap of our own (adaptation in another thread) commits and
            # installs inside swapping(), so the name read above may predate a swap that has installed since; kept,
            # it would "follow" back to the model just replaced.
            with self._db.reading() as r:
                stored_fp = r.meta("fingerprint")
            if stored_fp is None or stored_fp == cache.model.fingerprint:
                return  # another thread of ours switched first
            base = self.base_embedder
            embedder = base if stored_fp == getattr(base, "fingerprint", None) else None
            entry = self.active_adapter()
            if embedder is None and entry is not None and is_adaptable(base):
                try:
                    embedder = resolve_embedder(base, self.load_adapter(entry, base))
                except (CheckpointError, InvalidInput) as exc:
                    self.note = f"its active adapter could not be applied ({exc})"
            if embedder is None or embedder.fingerprint != stored_fp:
                raise EmbedderMismatch(
                    f"{self._access.path} now serves {stored_fp} (the writer swapped models); this reader has "
                    f"{cache.model.fingerprint}. Reopen it with the store's base embedder."
                )
            cache.rebuild("the writer swapped to a new generation", model=(embedder, stored_fp))

    @staticmethod
    def clear_adaptation_state(tx: Writes) -> None:
        """Forget adapters and any half-built generation (the store now serves another model)."""
        tx.delete_meta(META_ADAPTER, META_BASE_FP, META_PENDING, META_ADAPT_SEQ)
        tx.generation_drop()

    def reembed(self, *, force: bool, with_index: bool, batch_size: int = REEMBED_BATCH,
                include_waiting: bool = True) -> int:
        """Re-embed, in place and in resumable batches, the facts whose vector is not the serving model's.

        Args:
            force: every fact, not only stale ones.
            with_index: mirror each batch into the vector cache (False at open, before the index is loaded).
            batch_size: facts per transaction.
            include_waiting: also the facts that have no vector yet.
        Returns:
            how many facts were re-embedded.
        """
        from tqdm.auto import tqdm

        db, cache = self._db, self._cache
        with db.write_mutex:
            gen = cache.model  # (the model only: at open the index is not loaded; with_index's apply() loads it)
            with db.reading() as r:
                total = r.count() if force else r.count_stale(gen.fingerprint, include_waiting)
            done, after = 0, 0
            with tqdm(total=total, desc="re-embedding", unit="fact", disable=not sys.stderr.isatty(),
                      leave=False) as bar:
                while True:
                    with db.reading() as r:
                        rows = r.stale(None if force else gen.fingerprint, batch_size, after_rid=after,
                                       include_waiting=include_waiting)
                    if not rows:
                        break
                    vectors = embed_texts(gen.embedder, [row.text for row in rows], cache.dim)  # (b, D)
                    with db.transaction() as tx:
                        before = tx.max_seq()
                        pairs = tx.set_vectors([(row.rid, row.id, row.label) for row in rows], vectors,
                                               gen.fingerprint, utc_now())
                        top = tx.max_seq()
                    crash_point("reembed.batch")
                    if with_index:
                        cache.apply(np.array([p[0] for p in pairs]), vectors, [p[1] for p in pairs if p[1] is not None],
                                    before, top)
                    after = rows[-1].rid
                    done += len(rows)
                    bar.update(len(rows))
            if with_index and done:
                cache.save()
        return done

    # ---- replacing the model -------------------------------------------------------------------------------
    def resume(self, report: PublishReport, *, before_swap: Callable[[PublishReport], object] | None = None,
               should_stop: Callable[[], bool] | None = None, batch: int = REEMBED_BATCH) -> None:
        """Finish the publish recorded in meta (after a crash or stop()), or drop it if it cannot be rebuilt.

        Sets report.resumed, base_fingerprint and adapter_id, then as publish(); status "abandoned" when the
        recorded model cannot be rebuilt from this store's base embedder.
        """
        pending = self.pending() or {}
        report.resumed = True
        base = self.base_embedder
        report.base_fingerprint = base.fingerprint
        entry = pending.get("adapter")
        report.adapter_id = None if not isinstance(entry, dict) else entry.get("id")
        try:
            if pending.get("base_fingerprint") != base.fingerprint or not is_adaptable(base):
                raise InvalidInput(f"it was started on base model {pending.get('base_fingerprint')}")
            embedder = base if entry is None else resolve_embedder(base, self.load_adapter(entry, base))
            if embedder.fingerprint != pending.get("fingerprint"):
                raise InvalidInput(f"its model now gives {embedder.fingerprint}, not {pending.get('fingerprint')}")
        except (CheckpointError, InvalidInput, TypeError, AttributeError) as exc:
            self._abandon(report, "abandoned", f"the interrupted publish cannot be resumed: {exc}")
            return
        self.publish(embedder, entry, report, before_swap=before_swap, should_stop=should_stop, batch=batch,
                     resume=True)

    def publish(self, embedder: Embedder, entry: dict | None, report: PublishReport, *,
                seed: tuple[np.ndarray, np.ndarray] | None = None,
                before_swap: Callable[[PublishReport], object] | None = None,
                should_stop: Callable[[], bool] | None = None, batch: int = REEMBED_BATCH,
                resume: bool = False) -> None:
        """Re-embed every memory into a new generation, index it, catch up, and swap it in (R12).

        Resumable: the target is recorded in meta first and each batch of vectors commits on its own, so a
        crash leaves the old generation serving and the next call continues where this one stopped.

        Args:
            embedder: the new model.
            entry: its adapter's history entry (id, file, sha256, digest), or None for the base model.
            report: filled in as it goes; report.status ends "swapped", "vetoed", "stopped" or "refused".
            seed: (labels (N,), vectors (N, D)) already embedded by the new model (the gate's corpus).
            before_swap: called with the report when the new generation is ready; False vetoes the swap.
            should_stop: polled between batches; True stops (the next call resumes).
            batch: memories per re-embedding transaction.
            resume: continue the publish recorded in meta instead of recording a new one.
        Raises:
            EvermindError: a memory has no vector in the new generation at the swap (nothing is swapped).
        """
        stop = should_stop or (lambda: False)
        db, cache, dim = self._db, self._cache, self._cache.dim
        fp = embedder.fingerprint
        report.fingerprint_after = fp
        meta_entry = None if entry is None else {k: entry.get(k) for k in ("id", "file", "sha256", "digest")}
        base_fp = self.base_embedder.fingerprint
        if not resume:
            pending = {"fingerprint": fp, "adapter": meta_entry, "base_fingerprint": base_fp, "kind": report.kind,
                       "since": utc_now()}
            with db.transaction() as tx:
                tx.generation_begin(fp, *(seed or (None, None)))
                tx.set_meta(META_PENDING, json.dumps(pending, sort_keys=True))
            crash_point("adapt.pending_recorded")
        # 1. re-embed in resumable batches while the old generation serves
        t0 = time.perf_counter()
        after = 0
        try:
            while True:
                if stop():
                    report.status, report.reason = "stopped", "stop() was called; the next round resumes this publish"
                    return
                if not self.keep_lease():
                    report.status, report.reason = "stopped", "another process took the generation lease over"
                    return
                with db.reading() as r:
                    rows = r.generation_missing(fp, after, batch)
                if not rows:
                    break
                vectors = embed_texts(embedder, [text for _, text in rows], dim)  # (b, D)
                with db.transaction() as tx:
                    tx.generation_store(fp, [label for label, _ in rows], vectors)
                crash_point("adapt.reembed.batch")
                after = rows[-1][0]
                report.reembedded += len(rows)
            report.reembed_seconds += time.perf_counter() - t0
            # 2. the new index from a read snapshot, then replay the writes made since
            t0 = time.perf_counter()
            with db.snapshot() as r:
                top = r.max_seq()
                stored = r.generation_rows(fp, dim)
            index = build_index(dim, cache.config, *self._complete(embedder, fp, stored))
            crash_point("adapt.index_built")
            top, replayed = self._replay(index, embedder, fp, top)
            report.replayed += replayed
            report.index_seconds += time.perf_counter() - t0
        except EmbedderOutputInvalid as exc:
            self._abandon(report, "refused", f"the candidate gave an invalid vector while re-embedding ({exc})")
            return
        if before_swap is not None and before_swap(report) is False:
            self._abandon(report, "vetoed", "before_swap() vetoed the swap; the current model keeps serving")
            return
        # 3. catch up under the write mutex (this process's writers wait), then again inside the swap's own
        #    transaction (every process's writers wait: nothing can commit between the last replay and the swap)
        t0 = time.perf_counter()
        with db.write_mutex:
            try:
                top, replayed = self._replay(index, embedder, fp, top)
                report.replayed += replayed
                with cache.swapping():
                    with db.transaction() as tx:
                        top, replayed = self._replay(index, embedder, fp, top, tx)
                        report.replayed += replayed
                        if index.live_labels() != tx.labels(None):  # never expected: rebuild rather than guess
                            index = build_index(dim, cache.config,
                                                *self._complete(embedder, fp, tx.generation_rows(fp, dim), tx))
                        missing = tx.generation_count_missing(fp)
                        if missing:
                            raise EvermindError(f"{missing} memories have no vector in the new generation; nothing was "
                                                "swapped.")
                        tx.generation_adopt(fp)
                        tx.set_meta("fingerprint", fp)
                        if meta_entry is None:
                            tx.delete_meta(META_ADAPTER)
                        else:
                            tx.set_meta(META_ADAPTER, json.dumps(meta_entry, sort_keys=True))
                        tx.set_meta(META_BASE_FP, base_fp)
                        tx.set_meta(META_ADAPT_SEQ, str(top))
                        tx.delete_meta(META_PENDING)
                        tx.generation_drop()
                        crash_point("adapt.swap.before_commit")
                    crash_point("adapt.swap.after_commit")
                    cache.install(Generation(embedder, fp, index, top), f"swapped in a new generation ({report.kind})")
            except EmbedderOutputInvalid as exc:
                self._abandon(report, "refused", f"the candidate gave an invalid vector while catching up ({exc})")
                return
            try:
                cache.save()
            except OSError:
                pass  # the index is a cache: the next open rebuilds it from SQLite
        report.swap_seconds += time.perf_counter() - t0
        report.status, report.swapped_at = "swapped", utc_now()

    def _complete(self, embedder: Embedder, fingerprint: str, rows: GenerationRows,
                  tx: Writes | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(labels (N,), vectors (N, D)) of rows, embedding (and storing, in `tx` or a transaction of its own)
        the ones the generation still lacks."""
        labels, vectors = rows.labels, rows.vectors
        if rows.missing:
            pos = [i for i, _ in rows.missing]
            new = embed_texts(embedder, [text for _, text in rows.missing], self._cache.dim)  # (m, D)
            with contextlib.nullcontext(tx) if tx is not None else self._db.transaction() as w:
                w.generation_store(fingerprint, labels[pos].tolist(), new)
            vectors[pos] = new
        return labels, vectors

    def _replay(self, index: VectorIndex, embedder: Embedder, fingerprint: str, since: int,
                tx: Writes | None = None) -> tuple[int, int]:
        """Apply changes after `since` to the new generation's index (R3), reading a snapshot (or inside `tx`,
        the swap's transaction). Returns (new watermark, changes)."""
        with contextlib.nullcontext(tx) if tx is not None else self._db.snapshot() as r:
            top = r.max_seq()
            changes = r.changes_after(since, top)
            added = [c.seq for c in changes if c.vector_added and c.seq not in index]
            removed = [c.label_removed for c in changes if c.label_removed is not None]
            rows = r.generation_rows(fingerprint, self._cache.dim, labels=added)
        index.mark_deleted(removed)
        index.add(*self._complete(embedder, fingerprint, rows, tx))
        return max(top, since), len(changes)

    def _abandon(self, report: PublishReport, status: str, reason: str) -> None:
        """Drop a publish in progress: the current generation stays; the candidate's vectors are deleted."""
        with self._db.transaction() as tx:
            tx.delete_meta(META_PENDING)
            tx.generation_drop()
        report.status, report.reason = status, reason
