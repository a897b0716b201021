"""Text -> vectors for the store, and the background vector worker.

With background embedding (the default) `remember()` commits a fact without a vector and queues it here; a daemon
thread gathers the queue for GATHER_S, embeds it in batches and stores each batch in one transaction, both outside
the write mutex (the database orders the transaction with every other writer), then mirrors it into the vector
cache under the mutex. A caller that needs the vectors (vector recall, flush, check, close) drains the queue
itself. A text the embedder fails on keeps no vector: the failure is reported once (flush or the next vector
recall) and the fact is retried at the next open. When the queue reaches PENDING_MAX, remember() embeds in the
caller (back-pressure).

Each waiting fact names its owner (the open store that remembered it, store/leases.Owner). A fact whose
owner died (kill -9, a closed store whose embedder failed on it) is adopted by any other writer: at open, at
flush(), and whenever the vector thread wakes. Storing a vector is idempotent (only a fact still waiting with
the same text gets it), so a fact is never embedded twice into the store, whoever embeds it.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from typing import TYPE_CHECKING, Sequence

from .._blas import single_blas
from .._crash import crash_point
from .._lazy import lazy_import
from ..embedder.base import query_method
from ..embedder.lazy import LazyEmbedder
from ..errors import EmbedderOutputInvalid, EvermindError
from .backend import vector_blobs
from .backend.base import Backend, WaitingRow, utc_now
from .leases import Owner, owner_alive
from .vectors import Generation, VectorCache

if TYPE_CHECKING:
    from ..embedder.base import Embedder


if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

EMBED_CHUNK = 256
PENDING_MAX = 1024  # remember() embeds in the caller once this many facts wait for a vector (back-pressure)
PENDING_BATCH = 256  # facts per background embedding transaction
PROBE_TEXT = "evermind probe"  # embedded once at open, so a broken embedder fails there (not in the vector thread)
GATHER_S = 0.05  # the thread waits this long after the first fact queued, so a stream of remembers is embedded and
# stored in batches (one transaction per batch, not per fact); vector recall and flush() drain the queue themselves
WAKE_S = 2.0  # an idle vector thread wakes this often to adopt facts a dead process left waiting


def checked(vectors: object, count: int, dim: int, *, what: str = "embed_many") -> np.ndarray:
    """The embedder's output as a checked (count, dim) float32 matrix of unit rows (embedder.checked_vectors)."""
    # (imported when first used: `import evermind_memory.store` stays light)
    from ..embedder.base import checked_vectors

    return checked_vectors(vectors, count, dim, what=what)


@single_blas
def embed_texts(embedder: Embedder, texts: Sequence[str], dim: int) -> np.ndarray:
    """(N, D) checked vectors of `texts`, in chunks of EMBED_CHUNK, rounded as a row stores them (int8 steps).

    A text given more than once is embedded once (the same note remembered again, a re-embedding of a store full of
    copies), and its copies get the same vector.

    Raises:
        EmbedderOutputInvalid: a bad vector. Any exception of the embedder itself.
    """
    at: dict[str, int] = {}  # each distinct text's row, in order of first appearance
    rows = [at.setdefault(text, len(at)) for text in texts]  # (N,)
    if len(at) == len(texts):
        return _embed_chunks(embedder, texts, dim)
    return _embed_chunks(embedder, list(at), dim)[rows]  # (N, D)


def _embed_chunks(embedder: Embedder, texts: Sequence[str], dim: int) -> np.ndarray:
    """embed_texts without the copies: every text embedded, EMBED_CHUNK at a time."""
    out = np.zeros((len(texts), dim), dtype=np.float32)  # (N, D)
    for start in range(0, len(texts), EMBED_CHUNK):
        chunk = list(texts[start : start + EMBED_CHUNK])
        out[start : start + len(chunk)] = checked(embedder.embed_many(chunk), len(chunk), dim)
    return vector_blobs.as_stored(out)  # (N, D) what a row keeps: this process's index holds what others read


def load_model_aside(embedder: Embedder) -> None:
    """Start reading a lazy embedder's weights in a thread of its own, so that a process's first vector recall
    reads them while it loads the index rather than after (both are about 0.4 s at a million facts). Nothing for
    an embedder already loaded or not lazy; a failure there is raised again by the query's own embed."""
    if not isinstance(embedder, LazyEmbedder) or embedder.loaded:
        return
    threading.Thread(target=_load_quietly, args=(embedder,), name="evermind-load-model", daemon=True).start()


def _load_quietly(embedder: LazyEmbedder) -> None:
    try:
        embedder.load()
    except Exception:  # noqa: BLE001 - the query's embed loads again and raises it where it can be seen
        pass


@single_blas
def embed_query(embedder: Embedder, text: str, dim: int) -> np.ndarray:
    """(D,) the checked vector of one query: the embedder's `embed_query` where it has one (an embedder may embed a
    question differently from what it stores: the shipped model's query map), else its `embed`."""
    what, embed = query_method(embedder)
    return checked(embed(text), 1, dim, what=what)[0]  # (D,)


def embed_serving(cache: VectorCache, texts: Sequence[str], earlier: tuple[Generation, np.ndarray] | None = None
                  ) -> tuple[Generation, np.ndarray]:
    """(generation, vectors (N, D)) of `texts` by the serving model.

    Call once before taking the write mutex, then again under it with that result as `earlier`: the texts are
    embedded a second time only if a generation swap changed the model meanwhile. The generation's index is
    None when nothing loaded it yet: a caller that searches it calls cache.ensure_loaded() first.
    """
    gen = cache.model
    if earlier is not None and earlier[0].fingerprint == gen.fingerprint:
        return earlier
    return gen, embed_texts(gen.embedder, texts, cache.dim)


def probe_embedder(embedder: Embedder, dim: int) -> None:
    """Embed PROBE_TEXT through embed and embed_many once, so a broken embedder fails at open.

    An embedder whose weights are not read yet (the shipped default, a LazyEmbedder) is not probed: opening a
    store must not load the model, and its first embed checks the loaded weights against the card instead.

    Raises:
        EmbedderOutputInvalid: a bad vector. EvermindError: the embedder raised (chained).
    """
    if isinstance(embedder, LazyEmbedder) and not embedder.loaded:
        return
    for what, call in (("embed", lambda: embedder.embed(PROBE_TEXT)),
                       ("embed_many", lambda: embedder.embed_many([PROBE_TEXT]))):
        try:
            checked(call(), 1, dim, what=what)
        except EmbedderOutputInvalid as exc:
            raise EmbedderOutputInvalid(f"MemoryStore() probed the embedder at open: {exc}") from None
        except Exception as exc:  # noqa: BLE001 (any embedder's own error, named and chained)
            raise EvermindError(
                f"MemoryStore() probed the embedder at open and embedder.{what}({PROBE_TEXT!r}) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc


class VectorWorker:
    """The queue of facts waiting for a vector, the thread that embeds it, and the failures to report.

    Thread-safe. The thread holds its owner (the MemoryStore) only while draining, so a store dropped without
    close() is still collected; its finaliser calls signal_stop() and what was waiting is embedded at the next
    open.

    Args:
        db: the backend.
        cache: the vector cache the vectors are mirrored into (its current generation embeds them).
        owner: the object whose lifetime bounds the thread.
        holder: the store's lease owner, named by the facts it must embed.
    """

    def __init__(self, db: Backend, cache: VectorCache, owner: object, holder: Owner) -> None:
        self._db = db
        self._cache = cache
        self._owner = weakref.ref(owner)
        self.holder = holder
        self._waiting: dict[int, tuple[str, str]] = {}  # rid -> (id, text), oldest first
        self._cv = threading.Condition()
        self._drain_lock = threading.Lock()  # one drainer at a time: the worker or a caller that waits
        self._thread: threading.Thread | None = None
        self._stop = False
        self.vector_error: str | None = None  # the last background failure, for info() (kept until close)
        self._failures: list[tuple[str, BaseException]] = []  # (fact id, why) not yet raised

    # ---- the queue -----------------------------------------------------------------------------------------
    def add(self, rid: int, fact_id: str, text: str) -> int:
        """Queue one committed fact; returns how many now wait."""
        with self._cv:
            self._waiting[rid] = (fact_id, text)
            self._cv.notify_all()
            return len(self._waiting)

    def extend(self, rows: Sequence[WaitingRow]) -> None:
        """Queue facts found waiting at open (a crash, or an embedder that failed on them)."""
        with self._cv:
            self._waiting.update((r.rid, (r.id, r.text)) for r in rows)

    def wait(self) -> None:
        """Embed and index every fact still waiting for its vector (read-your-writes for vector recall)."""
        if self._waiting:
            self.drain()

    def adopt_orphans(self) -> int:
        """Take over the facts waiting for a vector whose owner is gone (killed, or closed with them waiting);
        returns how many were queued here."""
        with self._db.reading() as r:
            owners = r.waiting_owners()
            serving = r.meta("fingerprint")
        if serving not in (None, self._cache.model.fingerprint):
            return 0  # this process has not followed a model swap yet: leave them to one that has
        dead = [o for o in owners if o != self.holder.token and owner_alive(o) is False]
        adopted: list[WaitingRow] = []
        for old in dead:
            with self._db.transaction() as tx:  # one process wins each owner's facts: the update names the old owner
                adopted += tx.adopt_waiting(old, self.holder.token)
        if adopted:
            self.extend(adopted)
        return len(adopted)

    # ---- the thread ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread unless it runs."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            with self._cv:
                if self._thread is None or not self._thread.is_alive():
                    self._stop = False
                    self._thread = threading.Thread(target=VectorWorker._run, args=(self._owner, weakref.ref(self)),
                                                    name="evermind-vectors", daemon=True)
                    self._thread.start()

    @property
    def started(self) -> bool:
        """Whether a thread was started (and not stopped since)."""
        return self._thread is not None

    @staticmethod
    def _run(owner_ref: "weakref.ref[object]", worker_ref: "weakref.ref[VectorWorker]") -> None:
        worker = worker_ref()
        if worker is None:
            return
        cv = worker._cv
        del worker
        while True:
            sweep = False
            deadline = None
            with cv:
                while True:
                    owner, worker = owner_ref(), worker_ref()
                    if owner is None or worker is None or worker._stop:
                        return
                    if sweep:
                        break
                    if worker._waiting:  # gather a batch first: one embedding call and one transaction for many
                        now = time.monotonic()
                        deadline = now + GATHER_S if deadline is None else deadline
                        if now >= deadline or len(worker._waiting) >= PENDING_BATCH:
                            break
                        del owner, worker
                        cv.wait(timeout=deadline - now)
                        continue
                    del owner, worker
                    sweep = not cv.wait(timeout=WAKE_S)  # woke by itself: look for facts a dead process left
            try:
                if sweep:
                    worker.adopt_orphans()
                worker.drain()
            except Exception as exc:  # noqa: BLE001 (e.g. SQLite refused the write: retry later, keep the facts)
                worker.vector_error = f"{type(exc).__name__}: {exc}"
                with cv:
                    cv.wait(timeout=1.0)
            finally:
                del owner, worker

    def signal_stop(self) -> None:
        """Ask the thread to end (without waiting)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()

    def stop(self) -> None:
        """End the thread and wait for it."""
        self.signal_stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._thread = None

    # ---- embedding -----------------------------------------------------------------------------------------
    def drain(self) -> None:
        """Embed waiting facts in batches outside the write mutex, then store and index each batch."""
        db, cache = self._db, self._cache
        with self._drain_lock:
            while True:
                with self._cv:
                    batch = list(itertools.islice(self._waiting.items(), PENDING_BATCH))
                if not batch:
                    return
                gen = cache.model  # (the model only: apply() below loads the index if nothing did yet)
                rids = [rid for rid, _ in batch]
                ids = [fid for _, (fid, _) in batch]
                texts = [text for _, (_, text) in batch]
                vectors, failed = self._embed(texts, gen.embedder)  # (b, D)
                if gen.fingerprint != cache.model.fingerprint:
                    continue  # the model was swapped meanwhile: embed this batch again with the new one
                # The transaction does not hold the write mutex: the database orders it with every other writer
                # (on PostgreSQL over the network: a remember of this process must not wait for its round
                # trips); the mutex is taken only to mirror the commit into the cache.
                with db.transaction() as tx:
                    if tx.meta("fingerprint") not in (None, gen.fingerprint):
                        # another process swapped models and this one has not followed yet: leave the
                        # facts waiting, for any writer that serves the new model
                        tx.adopt_waiting(self.holder.token, None)  # (None: no owner)
                        current, keep, pairs = [], [], []
                    else:
                        still = tx.still_waiting(rids)  # not forgotten or updated since
                        current = [i for i, rid in enumerate(rids) if still.get(rid) == texts[i]]
                        keep = [i for i in current if i not in failed]
                        pairs = tx.set_vectors([(rids[i], ids[i], None) for i in keep], vectors[keep],
                                               gen.fingerprint, utc_now())
                crash_point("remember.vectors_committed")
                if pairs:  # (set_vectors hands out consecutive seqs: ours are pairs[0][0]..pairs[-1][0])
                    with db.write_mutex:
                        if gen.fingerprint == cache.model.fingerprint:
                            cache.apply(np.array([p[0] for p in pairs], dtype=np.int64), vectors[keep], [],
                                        pairs[0][0] - 1, pairs[-1][0])
                        else:  # swapped since our commit: the new generation takes what it serves from the feed
                            cache.catch_up()
                with self._cv:
                    for i in current:
                        if i in failed:  # reported once by flush() or a vector/hybrid recall
                            self._failures.append((ids[i], failed[i]))
                            self.vector_error = (f"the embedder failed on fact {ids[i]}: "
                                                 f"{type(failed[i]).__name__}: {failed[i]}")
                    for rid in rids:
                        self._waiting.pop(rid, None)
                    self._cv.notify_all()

    def _embed(self, texts: list[str], embedder: Embedder) -> tuple[np.ndarray, dict[int, BaseException]]:
        """Vectors (b, D) of texts, and {position: error} for the texts the embedder fails on (their rows
        are zero; those facts keep no vector). A failing batch is retried one text at a time."""
        dim = self._cache.dim
        try:
            return embed_texts(embedder, texts, dim), {}
        except Exception as exc:  # noqa: BLE001 (any embedder's error: find the texts it fails on)
            if len(texts) == 1:
                return np.zeros((1, dim), dtype=np.float32), {0: exc}
        vectors = np.zeros((len(texts), dim), dtype=np.float32)  # (b, D)
        failed: dict[int, BaseException] = {}
        for i, text in enumerate(texts):  # (only after a batch failed: bisecting would save calls, not clarity)
            one, bad = self._embed([text], embedder)
            vectors[i] = one[0]
            if bad:
                failed[i] = bad[0]
        return vectors, failed

    def raise_failures(self, method: str) -> None:
        """Raise (once) for the facts the background embedding failed on since the last report.

        Raises:
            EmbedderOutputInvalid: the embedder gave a bad vector. EvermindError: it raised (chained).
        """
        with self._cv:
            failures, self._failures = self._failures, []
        if not failures:
            return
        fid, first = failures[0]
        many = f"{len(failures)} remembered facts" if len(failures) > 1 else "a remembered fact"
        message = (
            f"{method}(): the embedder failed on {many}, first {fid} ({type(first).__name__}: {first}). "
            "They are stored and found by lexical recall, but have no vector; check() lists them. Fix the "
            "embedder and call reembed(), or update()/forget() them."
        )
        if isinstance(first, EmbedderOutputInvalid):
            raise EmbedderOutputInvalid(message) from first
        raise EvermindError(message) from first
