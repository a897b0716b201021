"""MemoryStore: remember and recall, joining SQLite (the truth), the HNSW cache and an embedder.

Writes commit to SQLite first (`BEGIN IMMEDIATE`, acknowledged only after COMMIT), then update the index; the
index on disk is a validated, replayable cache (RELIABILITY R1-R14). One writer process per store holds
`<db>.lock`; any number of `read_only=True` readers follow the writer's commits through the change log.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import threading
import time
import warnings
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import sqlite3

from ..embedder import check_embedder, checked_vectors, default_embedder
from ..errors import (
    CheckpointError, EmbedderMismatch, EmbedderOutputInvalid, EvermindError, FactNotFound, InvalidInput, StoreWarning,
)
from .facts import (
    SCHEMA_VERSION, FactsDB, new_id, row_to_fact, row_to_recall, sqlite_has_wal_reset_fix, utc_now, vectors_from_blobs,
)
from .fusion import (  # noqa: F401 (LEXICAL_EVIDENCE, RRF_K, fuse_rrf, fuse_scores re-exported)
    LEXICAL_EVIDENCE, RRF_K, CandidatePool, fuse_pool, fuse_rrf, fuse_scores, params_for,
)
from .index import IndexConfig, IndexRejected, SearchFailed, VectorIndex, exact_search, read_manifest
from .lexical import MAX_TERMS, document_frequencies, phrase_query, plan, query_words
from .lock import RWLock, WriterLock, crash_point, filesystem_type, is_remote_filesystem
from .records import Change, CheckReport, Explain, Fact, Recall
from .validate import (
    FUSIONS, K_MAX, MAX_LIST_LIMIT, MODES, check_choice, check_id, check_int, check_k, check_min_score,
    check_source, check_tags, check_text,
)

DEFAULT_HYBRID_WEIGHT = 2.0
EXACT_FILTER_MAX = 4096  # a tag filter matching at most this many facts is searched exactly (R9)
EMBED_CHUNK = 256
REEMBED_BATCH = 256
PENDING_MAX = 1024  # remember() embeds in the caller once this many facts wait for a vector (back-pressure)
PENDING_BATCH = 256  # facts per background embedding transaction
PROBE_TEXT = "evermind probe"  # embedded once at open, so a broken embedder fails there (not in the vector thread)
SAVE_AFTER_REPLAY = 1000
FEEDBACK_LIMIT = 10_000  # judgements kept (the newest); each is a training pair for adaptation
MAX_IMPORT_LINE = 1 << 20
_ISO_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(\+00:00|Z)?")
# Adaptation state in SQLite (the truth): the active adapter, the base model it sits on, a publish in progress,
# and the vectors of the generation being built (keyed by the fact's label, which names one text version).
META_ADAPTER = "adapter"
META_BASE_FP = "base_fingerprint"
META_PENDING = "adapt_pending"
META_ADAPT_SEQ = "adapt_seq"  # the change seq up to which the serving adapter has seen memories
GEN_TABLE = "adapt_vectors"
_ADAPTER_NAME_RE = re.compile(r"^\d{4,9}\.lora$")
_IN_CHUNK = 500


def fts_match(query: str, max_terms: int = MAX_TERMS) -> str | None:
    """Turn free text into a safe FTS5 query: each word quoted, OR-joined (None when no words). Recall itself
    matches fewer words on large stores: see store/lexical.py."""
    return phrase_query(query_words(query, max_terms))


def _is_lm_embedder(embedder: Any) -> bool:
    """Whether `embedder` is an LMEmbedder-like object adaptation can work with (model + tokenizer)."""
    model = getattr(embedder, "model", None)
    return (model is not None and all(hasattr(embedder, a) for a in ("tokenizer", "max_tokens", "fingerprint"))
            and all(hasattr(model, a) for a in ("params", "config", "pooled_forward", "pooled_backward")))


def adapted_embedder(base: Any, weights: Any) -> Any:
    """An LMEmbedder running base + LoRA adapter (merged), its fingerprint covering the adapter (R11).

    Args:
        base: the base LMEmbedder.
        weights: lm.adapter.LoRAWeights fitted on base.model.
    Returns:
        a new LMEmbedder (base is not changed).
    Raises:
        InvalidInput: the adapter does not fit the model or the merged weights are not finite.
    """
    from ..embedder import LMEmbedder
    from ..lm.adapter import adapter_digest, merge_adapter

    return LMEmbedder(
        merge_adapter(base.model, weights), base.tokenizer, max_tokens=base.max_tokens,
        adapter_digest=adapter_digest(weights), hybrid_weight=getattr(base, "hybrid_weight", DEFAULT_HYBRID_WEIGHT),
        batch_size=getattr(base, "batch_size", 64),
    )


class MemoryStore:
    """A local memory with semantic recall.

    Thread-safety: every method may be called from any thread of the process that opened the store; writes
    are serialised, recalls run concurrently. Do not use a store in a forked child: open a new one there.

    Args:
        path: SQLite file (created if missing; its directory must exist), or ":memory:".
        embedder: any object with embed, embed_many, dimensions and fingerprint; None for the shipped model.
        read_only: open as a reader that follows another process's writes (no lock, no writes).
        durability: "normal" (WAL, synchronous=NORMAL: survives application crashes; the last commits may be
            lost on power loss or an OS crash) or "full" (synchronous=FULL: survives power loss, slower).
        on_mismatch: when stored vectors come from another embedder: "reembed" them before serving (with a
            progress bar on a terminal) or "raise" EmbedderMismatch.
        lock_timeout: seconds to wait for another writer's lock before StoreLocked.
        index_config: HNSW parameters.
        busy_timeout: seconds SQLite waits on a locked database.
        background_embedding: True (the default): `remember()` commits the fact and returns; a background
            thread embeds it, in batches with the facts remembered meanwhile, and indexes it. Vector and hybrid
            recalls (and flush, check, rebuild_index, close) first wait for every waiting vector, so a recall
            always sees what was remembered before it; lexical recall finds the fact at once. A fact the
            embedder fails on (an exception, or a NaN, zero or wrong-shaped vector) stays lexical-only: the
            next `flush()` or vector/hybrid recall raises for it, `check()` and `info()["vector_error"]`
            report it. After a crash, facts still waiting are embedded when the store next opens.
            False: `remember()` embeds before it commits and raises EmbedderOutputInvalid for a bad vector
            (nothing stored). `remember_many()`, `update()` and `import_()` always embed before committing.
    Raises:
        InvalidInput: a bad argument or embedder, a missing directory, read_only on a missing file.
        EmbedderOutputInvalid: the embedder's output for a probe text at open is not a usable vector.
        StoreLocked: another writer holds the store.
        EmbedderMismatch: on_mismatch="raise" (or a reader) and stored vectors are from another embedder.
        EvermindError: not an evermind store, no default model is available, or the embedder raised on the
            probe text at open (its exception is the __cause__).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        embedder: Any = None,
        *,
        read_only: bool = False,
        durability: str = "normal",
        on_mismatch: str = "reembed",
        lock_timeout: float = 10.0,
        index_config: IndexConfig | None = None,
        busy_timeout: float = 5.0,
        background_embedding: bool = True,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidInput(f"MemoryStore() expected path to be a str or os.PathLike, got {type(path).__name__}.")
        path = os.fspath(path)
        if not isinstance(path, str) or not path or "\x00" in path:
            raise InvalidInput(f"MemoryStore() expected a non-empty text path, got {path!r:.80}.")
        check_choice(durability, "durability", ("normal", "full"), "MemoryStore")
        check_choice(on_mismatch, "on_mismatch", ("reembed", "raise"), "MemoryStore")
        for name, value in (("lock_timeout", lock_timeout), ("busy_timeout", busy_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 86_400:
                raise InvalidInput(f"MemoryStore() expected 0 <= {name} <= 86400 seconds, got {value!r}.")
        for name, flag in (("read_only", read_only), ("background_embedding", background_embedding)):
            if not isinstance(flag, bool):
                raise InvalidInput(f"MemoryStore() expected {name} to be a bool, got {flag!r}.")
        self._memory = path == ":memory:"
        if self._memory and read_only:
            raise InvalidInput("MemoryStore(':memory:', read_only=True) has nothing to read; drop read_only.")
        if not self._memory:
            parent = Path(path).resolve().parent
            if not parent.is_dir():
                raise InvalidInput(f"MemoryStore() expected the directory {parent} to exist; create it first.")
            if Path(path).is_dir():
                raise InvalidInput(f"MemoryStore() expected a file path, got the directory {path}.")
            self._fs_type = filesystem_type(parent)
            if is_remote_filesystem(self._fs_type):
                warnings.warn(
                    f"{path} is on a {self._fs_type} mount: SQLite's WAL and the writer lock are unreliable on "
                    "network and FUSE filesystems, so the store can be corrupted. Keep it on a local disk.",
                    StoreWarning, stacklevel=2)
        else:
            self._fs_type = None
        self._embedder = default_embedder() if embedder is None else embedder
        self._dim, self._fingerprint = check_embedder(self._embedder)
        self._probe_embedder(self._embedder, self._dim)
        weight = getattr(self._embedder, "hybrid_weight", DEFAULT_HYBRID_WEIGHT)
        self._hybrid_weight = float(weight) if isinstance(weight, (int, float)) and np.isfinite(weight) else DEFAULT_HYBRID_WEIGHT
        self._path = path
        self._read_only = read_only
        self._durability = durability
        self._on_mismatch = on_mismatch
        self._index_config = index_config or IndexConfig()
        self._pid = os.getpid()
        self._closed = False
        self._applied = 0
        self._saved_watermark = -1
        self._index: VectorIndex = VectorIndex(self._dim, self._index_config)
        self._index_status = "new"
        self._base_embedder = self._embedder  # the model adapters sit on (see _apply_active_adapter)
        self._gen_lock = RWLock()  # recalls share it; a generation swap takes it exclusively
        self._adapt_mutex = threading.Lock()  # one adaptation round, resume or rollback at a time
        self._adaptation: Any = None
        self._adapt_rounds = 0
        self._adapter_note: str | None = None
        # Background embedding: rid -> (id, text) of facts remembered without a vector yet, oldest first.
        self._background = background_embedding and not read_only
        self._waiting: dict[int, tuple[str, str]] = {}
        self._waiting_cv = threading.Condition()
        self._drain_lock = threading.Lock()  # one drainer at a time: the worker or a caller that waits
        self._worker: threading.Thread | None = None
        self._worker_stop = False
        self._vector_error: str | None = None  # the last background failure, for info() (kept until close)
        self._failures: list[tuple[str, BaseException]] = []  # (fact id, why) not yet raised by flush()/recall()
        self._lock: WriterLock | None = None
        self._db: FactsDB | None = None
        try:
            if not self._memory and not read_only:
                self._lock = WriterLock(Path(path + ".lock"), float(lock_timeout))
            self._db = FactsDB(path, read_only=read_only, durability=durability, busy_timeout=float(busy_timeout))
            self._open()
        except BaseException:
            self._release()
            raise

    # ---- opening -------------------------------------------------------------------------------------------
    def _open(self) -> None:
        db = self._db
        self._apply_active_adapter()
        with db.reading() as conn:
            self._store_id = db.meta(conn, "store_id")
            stored_fp = db.meta(conn, "fingerprint")
            stored_dim = db.meta(conn, "dim")
            foreign = db.count_foreign(conn, self._fingerprint)
            waiting = db.waiting(conn) if not self._read_only else []
        if foreign:  # vectors from another model (facts merely waiting for a vector are embedded below)
            if self._read_only and stored_fp != self._fingerprint:
                raise EmbedderMismatch(self._mismatch_message(stored_fp, stored_dim, foreign, reader=True))
            if not self._read_only and self._on_mismatch == "raise":
                raise EmbedderMismatch(self._mismatch_message(stored_fp, stored_dim, foreign, reader=False))
        if not self._read_only and (stored_fp != self._fingerprint or stored_dim != str(self._dim)):
            with db.transaction() as conn:
                db.set_meta(conn, "fingerprint", self._fingerprint)
                db.set_meta(conn, "dim", str(self._dim))
                if stored_fp != self._fingerprint:
                    self._clear_adaptation_state(conn)  # another model: its adapters and half-built generation lapse
        if foreign and not self._read_only:
            self._reembed_rows(force=False, with_index=False, include_waiting=False)
        self._load_index()
        if waiting:  # remembered without a vector before a crash (or the embedder failed on them): retry now
            with self._waiting_cv:
                self._waiting.update((rid, (fid, text)) for rid, fid, text in waiting)
            if self._background:
                self._start_worker()
            else:
                self._drain_waiting()

    def _mismatch_message(self, stored_fp: str | None, stored_dim: str | None, stale: int, *, reader: bool) -> str:
        what = f"{self._path} holds {stale} vectors made by embedder {stored_fp} (dim {stored_dim})"
        now = f"the current one is {self._fingerprint} (dim {self._dim})"
        if self._adapter_note:
            now += f"; {self._adapter_note}"
        if reader:
            return f"{what}; {now}. A read-only store cannot re-embed: open it once as a writer with this embedder, or use the matching embedder."
        return f"{what}; {now}. Open it with on_mismatch='reembed' to re-embed them, or with the matching embedder."

    def _expect(self) -> dict:
        return {"store_id": self._store_id, "fingerprint": self._fingerprint, "dim": self._dim}

    def _load_index(self) -> None:
        """Load the saved index if it validates, replay newer changes, verify it against SQLite, else rebuild."""
        if self._memory:
            self._rebuild("new in-memory store")
            return
        directory, stem = Path(self._path).resolve().parent, Path(self._path).name
        with self._db.reading() as conn:
            top = self._db.max_seq(conn)
        try:
            index, manifest = VectorIndex.load(directory, stem, expect=self._expect(), config=self._index_config, max_seq=top)
        except IndexRejected as exc:
            self._rebuild(str(exc))
            return
        except (OSError, RuntimeError, MemoryError) as exc:  # hnswlib refusing a file we validated, or I/O
            self._rebuild(f"index could not be loaded ({exc})")
            return
        self._index = index
        self._applied = manifest["watermark"]
        self._saved_watermark = manifest["watermark"]
        replayed = self._catch_up(verify=True)
        if replayed is None:
            return
        self._index_status = f"loaded (replayed {replayed} changes)"
        if replayed >= SAVE_AFTER_REPLAY and not self._read_only:
            self._save_index()

    def _rebuild(self, reason: str) -> int:
        """Build a fresh index from the vectors in SQLite and swap it in; save it when we are the writer."""
        with self._db.write_mutex:
            with self._db.reading() as conn:
                conn.execute("BEGIN")
                try:
                    top = self._db.max_seq(conn)
                    labels, vectors = self._db.vectors(conn, self._fingerprint, self._dim)
                finally:
                    conn.execute("COMMIT")
            cap = max(self._index_config.initial_capacity, len(labels) + len(labels) // 4)
            cfg = IndexConfig(**{**self._index_config.__dict__, "initial_capacity": cap})
            index = VectorIndex(self._dim, cfg)
            index.add(labels, vectors)
            crash_point("rebuild.before_swap")
            self._index = index
            self._applied = top
            self._index_status = f"rebuilt ({reason})"
            if not self._read_only and not self._memory:
                self._save_index()
            return len(labels)

    def _catch_up(self, *, verify: bool = False) -> int | None:
        """Replay changes after the index watermark (R3). Returns how many, or None when verify rebuilt."""
        if not verify:
            with self._db.reading() as conn:
                if self._db.max_seq(conn) <= self._applied:
                    return 0
        with self._db.write_mutex:  # one catch-up or rebuild at a time, so the watermark only moves forward
            with self._db.reading() as conn:
                conn.execute("BEGIN")
                try:
                    top = self._db.max_seq(conn)
                    changes = self._db.changes_after(conn, self._applied, top)
                    added = [seq for seq, vec_added, _ in changes if vec_added]
                    removed = [label for _, _, label in changes if label is not None]
                    labels, vectors = self._db.vectors(conn, self._fingerprint, self._dim, labels=added)
                    if verify:
                        truth_labels, truth_vecs = self._db.vectors(conn, self._fingerprint, self._dim)
                finally:
                    conn.execute("COMMIT")
            index = self._index
            reason = None
            try:
                index.mark_deleted(removed)
                fresh = np.array([label not in index for label in labels.tolist()], dtype=bool)  # (N,)
                index.add(labels[fresh], vectors[fresh])
                self._applied = top
            except (InvalidInput, RuntimeError, MemoryError) as exc:
                reason = f"replay failed ({exc})"
            if verify and reason is None:
                reason = self._disagreement(index, truth_labels, truth_vecs)
            if reason is not None:
                self._rebuild(reason)
                return None
        return len(changes)

    @staticmethod
    def _disagreement(index: VectorIndex, labels: np.ndarray, vectors: np.ndarray) -> str | None:
        """Why a freshly loaded and replayed index disagrees with SQLite (labels or any stored vector), or None."""
        info, index.file_info = index.file_info, None
        live = index.live_labels()
        truth = set(labels.tolist())
        if live != truth:
            return f"index disagrees with SQLite ({len(truth - live)} missing, {len(live - truth)} extra)"
        if info is not None and info.count:
            order = np.argsort(info.labels)  # (N,)
            file_labels = info.labels[order].astype(np.int64)  # (N,)
            pos = np.searchsorted(file_labels, labels)  # (M,)
            pos = np.minimum(pos, len(file_labels) - 1)  # (M,)
            in_file = file_labels[pos] == labels  # (M,) labels the file holds (the rest came from replay)
            file_vecs = info.vectors[order][pos[in_file]]  # (m, D)
            if not np.array_equal(file_vecs, vectors[in_file]):
                return "index vectors disagree with SQLite"
        return None

    # ---- guards --------------------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._closed:
            raise EvermindError("this MemoryStore is closed; open a new one.")
        if os.getpid() != self._pid:
            raise EvermindError(
                f"this MemoryStore was opened in process {self._pid} and cannot be used after fork (now {os.getpid()}); "
                "open a new MemoryStore in the child."
            )

    def _check_writable(self, method: str) -> None:
        self._check_usable()
        if self._read_only:
            raise EvermindError(f"{method}() needs a writer; {self._path} was opened with read_only=True.")

    # ---- embedding -----------------------------------------------------------------------------------------
    def _embed_many(self, texts: Sequence[str], embedder: Any = None) -> np.ndarray:
        embedder = self._embedder if embedder is None else embedder
        out = np.zeros((len(texts), self._dim), dtype=np.float32)  # (N, D)
        for start in range(0, len(texts), EMBED_CHUNK):
            chunk = list(texts[start : start + EMBED_CHUNK])
            out[start : start + len(chunk)] = checked_vectors(embedder.embed_many(chunk), len(chunk), self._dim)
        return out

    @staticmethod
    def _probe_embedder(embedder: Any, dim: int) -> None:
        """Embed PROBE_TEXT through embed and embed_many once, so a broken embedder fails at open."""
        for what, call in (("embed", lambda: embedder.embed(PROBE_TEXT)),
                           ("embed_many", lambda: embedder.embed_many([PROBE_TEXT]))):
            try:
                checked_vectors(call(), 1, dim, what=what)
            except EmbedderOutputInvalid as exc:
                raise EmbedderOutputInvalid(f"MemoryStore() probed the embedder at open: {exc}") from None
            except Exception as exc:  # noqa: BLE001 (any embedder's own error, named and chained)
                raise EvermindError(
                    f"MemoryStore() probed the embedder at open and embedder.{what}({PROBE_TEXT!r}) raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc

    def _embed_query(self, text: str) -> np.ndarray:
        return checked_vectors(self._embedder.embed(text), 1, self._dim, what="embed")[0]  # (D,)

    # ---- writes --------------------------------------------------------------------------------------------
    def remember(self, text: str, *, tags: dict[str, str] | None = None, source: str | None = None) -> str:
        """Store a fact; returns only after it is committed (durable as `durability` says).

        By default (background_embedding=True) the vector follows from a background thread: lexical recall
        finds the fact at once, vector and hybrid recall wait for its vector, and `flush()` waits for it and
        raises if the embedder failed on it. With background_embedding=False it is embedded before the
        commit. Thread-safe.

        Args:
            text: the fact (1..100,000 characters, no NUL or lone surrogates).
            tags: exact-match labels, str -> str.
            source: provenance label (who or what said it).
        Returns:
            the new fact's id.
        Raises:
            InvalidInput: bad text, tags or source. EmbedderOutputInvalid: the embedder returned a bad vector
            (background_embedding=False only: nothing is stored; in the background such a fact keeps no
            vector and `flush()` or the next vector/hybrid recall raises for it).
        """
        if not self._background:
            return self.remember_many([text], tags=tags, source=source)[0]
        self._check_writable("remember")
        text = check_text(text)
        tags = check_tags(tags)
        source = check_source(source)
        now = utc_now()
        fid = new_id()
        with self._db.write_mutex:
            with self._db.transaction() as conn:
                (seq,), rid = self._db.insert(conn, [(fid, text, tags, source, now, now)], None, None)
                crash_point("remember.before_commit")
            crash_point("remember.after_commit")
            self._applied = seq  # nothing to index yet; every earlier change was applied under this mutex
            with self._waiting_cv:
                self._waiting[rid] = (fid, text)
                waiting = len(self._waiting)
                self._waiting_cv.notify_all()
        if waiting >= PENDING_MAX:
            self._drain_waiting()  # back-pressure: the caller embeds when the thread falls behind
        else:
            self._start_worker()
        return fid

    # ---- background embedding ------------------------------------------------------------------------------
    def _start_worker(self) -> None:
        worker = self._worker
        if worker is None or not worker.is_alive():
            with self._waiting_cv:
                if self._worker is None or not self._worker.is_alive():
                    self._worker_stop = False
                    self._worker = threading.Thread(target=MemoryStore._vector_worker, args=(weakref.ref(self),),
                                                    name="evermind-vectors", daemon=True)
                    self._worker.start()

    @staticmethod
    def _vector_worker(ref: "weakref.ref[MemoryStore]") -> None:
        # Holds the store only while draining, so a store dropped without close() is still collected (its
        # finaliser stops this thread; what was waiting is embedded at the next open).
        store = ref()
        if store is None:
            return
        cv = store._waiting_cv
        del store
        while True:
            with cv:
                while True:
                    store = ref()
                    if store is None or store._worker_stop:
                        return
                    if store._waiting:
                        break
                    del store
                    cv.wait(timeout=5.0)
            try:
                store._drain_waiting()
            except Exception as exc:  # noqa: BLE001 (e.g. SQLite refused the write: retry later, keep the facts)
                store._vector_error = f"{type(exc).__name__}: {exc}"
                with cv:
                    cv.wait(timeout=1.0)
            finally:
                del store

    def _signal_worker_stop(self) -> None:
        with self._waiting_cv:
            self._worker_stop = True
            self._waiting_cv.notify_all()

    def _stop_worker(self) -> None:
        self._signal_worker_stop()
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join()
        self._worker = None

    def _wait_for_vectors(self) -> None:
        """Embed and index every fact still waiting for its vector (read-your-writes for vector recall)."""
        if self._waiting:
            self._drain_waiting()

    def _drain_waiting(self) -> None:
        """Embed waiting facts in batches outside the write mutex, then store and index each batch."""
        with self._drain_lock:
            while True:
                with self._waiting_cv:
                    batch = list(itertools.islice(self._waiting.items(), PENDING_BATCH))
                if not batch:
                    return
                fingerprint, embedder = self._fingerprint, self._embedder  # in this order (see _adapt_publish)
                rids = [rid for rid, _ in batch]
                texts = [text for _, (_, text) in batch]
                vectors, failed = self._embed_waiting(texts, embedder)  # (b, D)
                with self._db.write_mutex:
                    if fingerprint != self._fingerprint:
                        continue  # the model was swapped meanwhile: embed this batch again with the new one
                    with self._db.transaction() as conn:
                        still = self._db.still_waiting(conn, rids)  # not forgotten or updated since
                        current = [i for i, rid in enumerate(rids) if still.get(rid) == texts[i]]
                        keep = [i for i in current if i not in failed]
                        pairs = self._db.set_vectors(conn, [(rids[i], batch[i][1][0], None) for i in keep],
                                                     vectors[keep], fingerprint, utc_now())
                        top = self._db.max_seq(conn)
                    crash_point("remember.vectors_committed")
                    self._apply(np.array([p[0] for p in pairs], dtype=np.int64), vectors[keep], [], top)
                with self._waiting_cv:
                    for i in current:
                        if i in failed:  # reported once by flush() or a vector/hybrid recall
                            self._failures.append((batch[i][1][0], failed[i]))
                            self._vector_error = (f"the embedder failed on fact {batch[i][1][0]}: "
                                                  f"{type(failed[i]).__name__}: {failed[i]}")
                    for rid in rids:
                        self._waiting.pop(rid, None)
                    self._waiting_cv.notify_all()

    def _embed_waiting(self, texts: list[str], embedder: Any) -> tuple[np.ndarray, dict[int, BaseException]]:
        """Vectors (b, D) of texts, and {position: error} for the texts the embedder fails on (their rows
        are zero; those facts keep no vector). A failing batch is retried one text at a time."""
        try:
            return self._embed_many(texts, embedder), {}
        except Exception as exc:  # noqa: BLE001 (any embedder's error: find the texts it fails on)
            if len(texts) == 1:
                return np.zeros((1, self._dim), dtype=np.float32), {0: exc}
        vectors = np.zeros((len(texts), self._dim), dtype=np.float32)  # (b, D)
        failed: dict[int, BaseException] = {}
        for i, text in enumerate(texts):  # (only after a batch failed: bisecting would save calls, not clarity)
            one, bad = self._embed_waiting([text], embedder)
            vectors[i] = one[0]
            if bad:
                failed[i] = bad[0]
        return vectors, failed

    def _raise_vector_failures(self, method: str) -> None:
        """Raise (once) for the facts the background embedding failed on since the last report."""
        with self._waiting_cv:
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

    def flush(self) -> None:
        """Wait until every remembered fact's vector is embedded and indexed (default background embedding).

        Then raise if the embedder failed on any fact since the last flush() or vector/hybrid recall (each
        failure is raised once; `check()` keeps reporting facts without a vector). For a reader: catch up
        with the writer's commits. Thread-safe.

        Raises:
            EmbedderOutputInvalid: the embedder gave a bad vector (NaN, Inf, zero, wrong shape) for a fact.
            EvermindError: the embedder raised on a fact (its exception is the __cause__), or SQLite refused
                the vectors (the facts keep waiting and are retried).
        """
        self._check_usable()
        if self._read_only:
            self._follow_generation()
            self._catch_up()
            return
        self._wait_for_vectors()
        self._raise_vector_failures("flush")

    def remember_many(self, texts: Sequence[str], *, tags: dict[str, str] | None = None,
                      source: str | None = None) -> list[str]:
        """Store many facts in one transaction (all or none).

        Thread-safe.

        Args:
            texts: the facts.
            tags: tags applied to every fact.
            source: provenance applied to every fact.
        Returns:
            the new ids, in order.
        Raises:
            InvalidInput: a bad text (its position is named), tags or source.
            EmbedderOutputInvalid: the embedder returned a bad vector; nothing is stored.
        """
        self._check_writable("remember_many")
        if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
            raise InvalidInput(f"remember_many() expected a list of str, got {type(texts).__name__}.")
        checked = [check_text(t, f"texts[{i}]" if len(texts) > 1 else "text") for i, t in enumerate(texts)]
        tags = check_tags(tags)
        source = check_source(source)
        if not checked:
            return []
        fingerprint = self._fingerprint  # read before embedding: an adaptation swap may change the model meanwhile
        vectors = self._embed_many(checked)  # (N, D)
        now = utc_now()
        ids = [new_id() for _ in checked]
        items = [(fid, text, tags, source, now, now) for fid, text in zip(ids, checked)]
        with self._db.write_mutex:
            if fingerprint != self._fingerprint:
                vectors = self._embed_many(checked)  # (N, D) with the model that now serves
            with self._db.transaction() as conn:
                labels, _ = self._db.insert(conn, items, vectors, self._fingerprint)
                crash_point("remember.before_commit")
            crash_point("remember.after_commit")
            self._apply(np.array(labels, dtype=np.int64), vectors, [], labels[-1])
        return ids

    def _apply(self, added: np.ndarray, vectors: np.ndarray, removed: list[int], top: int) -> None:
        """Mirror a committed change in the index (writer only, under the write mutex)."""
        try:
            if removed:  # (the index calls take a lock and validate even when there is nothing to do)
                self._index.mark_deleted(removed)
            if len(added):
                self._index.add(added, vectors)
            self._applied = top
        except (InvalidInput, RuntimeError, MemoryError) as exc:
            self._rebuild(f"index update failed ({exc})")
            return
        if self._index.element_count >= 64 and self._index.deleted_ratio() > self._index_config.rebuild_deleted_ratio:
            self._rebuild("too many deleted elements")

    def update(self, fact_id: str, text: str | None = None, *, tags: dict[str, str] | None = None,
               source: str | None = None) -> Fact:
        """Change a fact's text, tags or source (None leaves that part as it is).

        A new text gets a new vector; the old one is never returned again. Thread-safe.

        Args:
            fact_id: the fact.
            text: new text.
            tags: new tags (replace the old ones; {} clears them).
            source: new source.
        Returns:
            the updated Fact.
        Raises:
            FactNotFound: no such fact. InvalidInput: bad arguments or nothing to change.
        """
        self._check_writable("update")
        fact_id = check_id(fact_id)
        if text is None and tags is None and source is None:
            raise InvalidInput("update() expected at least one of text, tags or source.")
        new_text = None if text is None else check_text(text)
        new_tags = None if tags is None else check_tags(tags)
        new_source = check_source(source)
        fingerprint = self._fingerprint
        vector = None if new_text is None else self._embed_many([new_text])[0]  # (D,)
        with self._db.write_mutex:
            if vector is not None and fingerprint != self._fingerprint:
                vector = self._embed_many([new_text])[0]  # (D,) the model changed while we embedded
            with self._db.transaction() as conn:
                row = self._db.fetch(conn, fact_id)
                if row is None:
                    raise FactNotFound(f"update() found no fact with id {fact_id!r}; it may have been forgotten.")
                if new_text is not None and new_text == row[2] and row[7] == self._fingerprint:
                    vector = None  # same text, same embedder: keep the vector and its label
                seq, removed = self._db.update(
                    conn, row, text=row[2] if new_text is None else new_text,
                    tags=json.loads(row[3]) if new_tags is None else new_tags,
                    source=row[4] if new_source is None else new_source,
                    vector=vector, fingerprint=self._fingerprint, now=utc_now(),
                )
                fact = row_to_fact(self._db.fetch(conn, fact_id))
            if vector is not None:
                self._apply(np.array([seq]), vector[None, :], [] if removed is None else [removed], seq)
            else:
                self._applied = seq
        return fact

    def forget(self, fact_id: str) -> None:
        """Remove a fact; it is never returned again (a tombstone stays in its history).

        Thread-safe.

        Args:
            fact_id: the fact.
        Raises:
            FactNotFound: no such fact.
        """
        self._check_writable("forget")
        fact_id = check_id(fact_id)
        with self._db.write_mutex:
            with self._db.transaction() as conn:
                row = self._db.fetch(conn, fact_id)
                if row is None:
                    raise FactNotFound(f"forget() found no fact with id {fact_id!r}; it may have been forgotten already.")
                removed = self._db.delete(conn, [row], utc_now())
                top = self._db.max_seq(conn)
            self._apply(np.zeros(0, dtype=np.int64), np.zeros((0, self._dim), np.float32), removed, top)

    def forget_where(self, *, tags: dict[str, str] | None = None, source: str | None = None) -> int:
        """Remove every fact carrying all `tags` and/or coming from `source`, in one transaction.

        Thread-safe.

        Args:
            tags: exact tags to match.
            source: exact source to match.
        Returns:
            how many facts were forgotten.
        Raises:
            InvalidInput: neither tags nor source given (that would forget everything).
        """
        self._check_writable("forget_where")
        tags = check_tags(tags)
        source = check_source(source)
        if not tags and source is None:
            raise InvalidInput("forget_where() expected tags or source; to forget everything, delete the store file.")
        with self._db.write_mutex:
            with self._db.transaction() as conn:
                rows = self._db.list_rows(conn, -1, 0, tags, source)
                removed = self._db.delete(conn, rows, utc_now())
                top = self._db.max_seq(conn)
            self._apply(np.zeros(0, dtype=np.int64), np.zeros((0, self._dim), np.float32), removed, top)
        return len(rows)

    def feedback(self, query: str, fact_id: str, *, useful: bool = True) -> None:
        """Tell the store whether a recalled fact answered a query; adaptation learns from it.

        Each "useful" judgement becomes a training pair (query -> that fact) of the next adaptation round, so
        queries in the user's own words learn to reach the facts they meant; a later useful=False for the same
        query and fact withdraws it. The newest FEEDBACK_LIMIT judgements are kept; forgetting a fact drops
        its judgements. Thread-safe.

        Args:
            query: the query as it was recalled.
            fact_id: the fact judged.
            useful: whether it answered the query.
        Raises:
            InvalidInput: bad query, id or useful. FactNotFound: no such fact.
        """
        self._check_writable("feedback")
        query = check_text(query, "query")
        fact_id = check_id(fact_id)
        if not isinstance(useful, bool):
            raise InvalidInput(f"feedback() expected useful to be a bool, got {useful!r}.")
        with self._db.write_mutex:
            with self._db.transaction() as conn:
                if self._db.fetch(conn, fact_id) is None:
                    raise FactNotFound(f"feedback() found no fact with id {fact_id!r}; it may have been forgotten.")
                self._db.add_feedback(conn, utc_now(), query, fact_id, useful, FEEDBACK_LIMIT)

    # ---- reads ---------------------------------------------------------------------------------------------
    def get(self, fact_id: str) -> Fact:
        """Fetch one fact. Thread-safe.

        Raises:
            FactNotFound: no such fact. InvalidInput: not a valid id.
        """
        self._check_usable()
        fact_id = check_id(fact_id)
        with self._db.reading() as conn:
            row = self._db.fetch(conn, fact_id)
        if row is None:
            raise FactNotFound(f"get() found no fact with id {fact_id!r}; it may have been forgotten.")
        return row_to_fact(row)

    def list(self, *, limit: int = 100, offset: int = 0, tags: dict[str, str] | None = None,
             source: str | None = None) -> list[Fact]:
        """Facts in the order they were remembered, optionally filtered. Thread-safe.

        Args:
            limit: at most this many (1..100,000).
            offset: skip this many first.
            tags: exact tags every fact must carry.
            source: exact source.
        Returns:
            list of Fact.
        """
        self._check_usable()
        limit = check_int(limit, "limit", 1, MAX_LIST_LIMIT, "list")
        offset = check_int(offset, "offset", 0, 2**62, "list")
        tags = check_tags(tags)
        source = check_source(source)
        with self._db.reading() as conn:
            rows = self._db.list_rows(conn, limit, offset, tags, source)
        return [row_to_fact(r) for r in rows]

    def history(self, fact_id: str) -> list[Change]:
        """Every change of a fact (remember, update, reembed, forget), oldest first. Thread-safe.

        A background-embedded fact's first vector is part of its "remember", not a change of its own.

        Raises:
            FactNotFound: the id was never used in this store.
        """
        self._check_usable()
        fact_id = check_id(fact_id)
        with self._db.reading() as conn:
            changes = self._db.history(conn, fact_id)
        if not changes:
            raise FactNotFound(f"history() found no fact with id {fact_id!r} in this store.")
        return changes

    def __len__(self) -> int:
        self._check_usable()
        with self._db.reading() as conn:
            return self._db.count(conn)

    def recall(self, query: str, k: int = 5, *, tags: dict[str, str] | None = None, mode: str = "hybrid",
               min_score: float | None = None, fusion: str = "score", min_relevance: float | None = None,
               explain: bool = False) -> list[Recall]:
        """The facts that best match `query`, best first. Thread-safe.

        Args:
            query: what to look for.
            k: at most this many (1..1000); fewer when fewer facts match.
            tags: exact tags every hit must carry.
            mode: "hybrid" (BM25 and vector fused), "vector" (cosine) or "lexical" (FTS5 BM25).
            min_score: drop hits scoring below this (the scale depends on mode and fusion; see min_relevance).
            fusion: for hybrid: "score" (the embedder's fitted rule, store/fusion.py; BM25 / best BM25 +
                w * cosine for embedders without one) or "rrf" (reciprocal ranks).
            min_relevance: (hybrid) drop hits whose calibrated relevance is below this, in [0, 1]. Needs an
                embedder with a fitted rule (the shipped model has one). 0.5 keeps hits more likely right than
                wrong; README "Recall quality" gives the measured trade-off.
            explain: (hybrid) fill each hit's `explain` with its lexical and vector parts and ranks.
        Returns:
            list of Recall (`relevance` is set in hybrid mode when the embedder has a fitted rule).
        Raises:
            InvalidInput: bad query, k, tags, mode, fusion, min_score, min_relevance or explain; min_relevance
                outside hybrid mode or with an embedder that has no fitted rule.
            EmbedderOutputInvalid, EvermindError: (vector and hybrid mode) the background embedding failed on
                a remembered fact since the last flush() or recall; raised once, as flush() would (the next
                recall serves results, without that fact's vector).
        """
        self._check_usable()
        query = check_text(query, "query")
        k = check_k(k)
        tags = check_tags(tags)
        mode = check_choice(mode, "mode", MODES, "recall")
        fusion = check_choice(fusion, "fusion", FUSIONS, "recall")
        min_score = check_min_score(min_score)
        if min_relevance is not None and (isinstance(min_relevance, bool) or not isinstance(min_relevance, (int, float))
                                          or not 0.0 <= min_relevance <= 1.0):
            raise InvalidInput(f"recall() expected min_relevance to be a number in [0, 1] or None, got {min_relevance!r}.")
        if not isinstance(explain, bool):
            raise InvalidInput(f"recall() expected explain to be a bool, got {explain!r}.")
        if min_relevance is not None and mode != "hybrid":
            raise InvalidInput(f"recall(min_relevance=...) needs mode='hybrid', got mode={mode!r}; relevance is "
                               "calibrated on the hybrid candidates. Use min_score in other modes.")
        if self._read_only:
            self._follow_generation()
            self._catch_up()
        elif mode != "lexical":
            self._wait_for_vectors()
            self._raise_vector_failures("recall")
        with self._gen_lock.read():  # one generation (model, fingerprint, index) for the whole recall
            if mode == "lexical":
                scored = self._lexical(query, k, tags)
            else:
                qv = self._embed_query(query)  # (D,)
                if mode == "vector":
                    scored = self._rows_for(self._vector(qv, k, tags))
                else:
                    fused = self._hybrid(query, qv, k, tags, fusion, explain)
                    if min_relevance is not None and fused and fused[0][2] is None:
                        raise InvalidInput(
                            "recall(min_relevance=...) needs an embedder with a fitted fusion rule (the shipped "
                            f"model has one; {self._fingerprint} has none). Fit one with recipe/calibrate_fusion.py "
                            "and set it as the embedder's fusion_params, or use min_score.")
                    hits = [replace(row_to_recall(row, score), relevance=rel, explain=why)
                            for row, score, rel, why in fused
                            if (min_score is None or score >= min_score)
                            and (min_relevance is None or rel >= min_relevance)]
                    return hits[:k]
        hits = [row_to_recall(row, score) for row, score in scored if min_score is None or score >= min_score]
        return hits[:k]

    def _vector(self, qv: np.ndarray, k: int, tags: dict[str, str]) -> list[tuple[int, float]]:
        """(label, cosine) best first, from the index or exactly (small filters, failed searches)."""
        index = self._index
        if tags:
            with self._db.reading() as conn:
                matching = self._db.count_tagged(conn, tags, self._fingerprint)
                if matching == 0:
                    return []
                if matching <= EXACT_FILTER_MAX or matching * 10 <= index.live_count:
                    labels, vecs = self._db.vectors(conn, self._fingerprint, self._dim, tags=tags)
                    return list(zip(*[a.tolist() for a in exact_search(vecs, labels, qv, k)]))
                allowed, _ = self._db.vectors(conn, self._fingerprint, self._dim, tags=tags)
            allowed_set = set(allowed.tolist())
            want = min(k, len(allowed_set))
            wide = min(index.live_count, K_MAX * 4, k * max(2, 2 * index.live_count // max(1, len(allowed_set))))
            try:
                labels, scores = index.query(qv, wide)
                hits = [(lab, s) for lab, s in zip(labels.tolist(), scores.tolist()) if lab in allowed_set]
            except SearchFailed:
                hits = []
            if len(hits) >= want:
                return hits[:k]
            with self._db.reading() as conn:
                labels, vecs = self._db.vectors(conn, self._fingerprint, self._dim, tags=tags)
            return list(zip(*[a.tolist() for a in exact_search(vecs, labels, qv, k)]))
        want = min(k, index.live_count)
        try:
            labels, scores = index.query(qv, k)
            if len(labels) >= want:
                return list(zip(labels.tolist(), scores.tolist()))
        except SearchFailed:
            pass
        with self._db.reading() as conn:
            labels, vecs = self._db.vectors(conn, self._fingerprint, self._dim)
        return list(zip(*[a.tolist() for a in exact_search(vecs, labels, qv, k)]))

    def _rows_for(self, hits: list[tuple[int, float]]) -> list[tuple[tuple, float]]:
        if not hits:
            return []
        with self._db.reading() as conn:
            rows = self._db.fetch_where(conn, "label", [label for label, _ in hits])
        return [(rows[label], score) for label, score in hits if label in rows]

    def _lexical(self, query: str, k: int, tags: dict[str, str]) -> list[tuple[tuple, float]]:
        words = query_words(query)
        if not words:
            return []
        with self._db.reading() as conn:
            chosen = plan(conn, words, self._db.count(conn))
            if chosen.all_words is not None:  # many postings: the rows holding every word, when there are enough
                hits = self._db.lexical(conn, chosen.all_words, k, tags)
                if len(hits) >= k:
                    return hits
            return [] if chosen.any_word is None else self._db.lexical(conn, chosen.any_word, k, tags)

    def _hybrid_pool(self, query: str, qv: np.ndarray, pool: int, tags: dict[str, str]) -> tuple[dict, CandidatePool]:
        """The hybrid candidates: top `pool` of each list, with every score fusion may read. (rid -> row, pool)."""
        vec = self._rows_for(self._vector(qv, pool, tags))
        lex = self._lexical(query, pool, tags)
        rows = {row[0]: row for row, _ in vec}
        rows.update({row[0]: row for row, _ in lex})
        in_vec = {row[0] for row, _ in vec}
        missing = [row[8] for row, _ in lex if row[0] not in in_vec and row[8] is not None]
        words = query_words(query)
        with self._db.reading() as conn:
            cosine: dict[int, float] = {}
            if missing:
                labels, vecs = self._db.vectors(conn, self._fingerprint, self._dim, labels=missing)
                by_label = dict(zip(labels.tolist(), (vecs @ qv).tolist()))
                cosine = {row[0]: by_label[row[8]] for row, _ in lex if row[0] not in in_vec and row[8] in by_label}
            df = document_frequencies(conn, words) if words else []
            n_facts = self._db.count(conn)
        return rows, CandidatePool.build([(row[0], s) for row, s in lex], [(row[0], s) for row, s in vec], cosine,
                                         {rid: len(row[2]) for rid, row in rows.items()}, df, n_facts)

    def _hybrid(self, query: str, qv: np.ndarray, k: int, tags: dict[str, str], fusion: str,
                explain: bool = False) -> list[tuple[tuple, float, float | None, Explain | None]]:
        """(row, fused score, relevance or None, Explain or None) best first; the rule is store/fusion.py's."""
        if not hasattr(self, "_fusion_params"):  # the base model's fitted rule (adapters keep it), looked up once
            self._fusion_params = params_for(self._base_embedder)
        params = self._fusion_params
        size = min(K_MAX, max(50, 4 * k)) if params is None else min(K_MAX, max(params.pool, 2 * k))
        rows, pool = self._hybrid_pool(query, qv, size, tags)
        rule, fused = fuse_pool(pool, fusion, params, self._hybrid_weight)
        order = sorted(range(len(pool.ids)), key=lambda i: (-fused.score[i], pool.ids[i]))[:k]
        out = []
        for i in order:
            why = None
            if explain:
                lex_rank, vec_rank = int(pool.lex_rank[i]), int(pool.vec_rank[i])
                why = Explain(rule, float(fused.lexical[i]), float(fused.vector[i]), float(fused.score[i]),
                              float(pool.bm25[i]) if lex_rank >= 0 else None,
                              None if np.isnan(pool.cos[i]) else float(pool.cos[i]),
                              lex_rank + 1 if lex_rank >= 0 else None, vec_rank + 1 if vec_rank >= 0 else None)
            rel = None if fused.relevance is None else float(fused.relevance[i])
            out.append((rows[pool.ids[i]], float(fused.score[i]), rel, why))
        return out

    # ---- maintenance ---------------------------------------------------------------------------------------
    def rebuild_index(self) -> int:
        """Rebuild the HNSW index from the vectors in SQLite and (for a writer) save it.

        Thread-safe; recalls keep using the old index until the swap.

        Returns:
            how many vectors the new index holds.
        """
        self._check_usable()
        self._wait_for_vectors()
        return self._rebuild("rebuild_index() was called")

    def reembed(self, *, force: bool = False, batch_size: int = REEMBED_BATCH) -> int:
        """Re-embed facts whose vector came from another embedder (every fact with force=True).

        Resumable: each batch is one transaction, so an interrupted run continues where it stopped.
        Thread-safe (writes are serialised; recalls continue).

        Args:
            force: re-embed every fact, not only stale ones.
            batch_size: facts per transaction.
        Returns:
            how many facts were re-embedded.
        """
        self._check_writable("reembed")
        if not isinstance(force, bool):
            raise InvalidInput(f"reembed() expected force to be a bool, got {force!r}.")
        batch_size = check_int(batch_size, "batch_size", 1, 100_000, "reembed")
        return self._reembed_rows(force=force, with_index=True, batch_size=batch_size)

    def _reembed_rows(self, *, force: bool, with_index: bool, batch_size: int = REEMBED_BATCH,
                      include_waiting: bool = True) -> int:
        from tqdm.auto import tqdm

        db = self._db
        with db.write_mutex:
            with db.reading() as conn:
                total = db.count(conn) if force else db.count_stale(conn, self._fingerprint, include_waiting)
            done, after = 0, 0
            with tqdm(total=total, desc="re-embedding", unit="fact", disable=not sys.stderr.isatty(), leave=False) as bar:
                while True:
                    with db.reading() as conn:
                        rows = db.stale(conn, None if force else self._fingerprint, batch_size, after_rid=after,
                                        include_waiting=include_waiting)
                    if not rows:
                        break
                    vectors = self._embed_many([r[2] for r in rows])  # (b, D)
                    with db.transaction() as conn:
                        pairs = db.set_vectors(conn, [(r[0], r[1], r[3]) for r in rows], vectors, self._fingerprint, utc_now())
                        top = db.max_seq(conn)
                    crash_point("reembed.batch")
                    if with_index:
                        self._apply(np.array([p[0] for p in pairs]), vectors, [p[1] for p in pairs if p[1] is not None], top)
                    after = rows[-1][0]
                    done += len(rows)
                    bar.update(len(rows))
            if with_index and not self._memory and done:
                self._save_index()
        return done

    def check(self) -> CheckReport:
        """Check SQLite integrity, FTS, vectors and the index against SQLite; report, never raise.

        Thread-safe.

        Returns:
            CheckReport (ok is True when nothing is wrong).
        """
        self._check_usable()
        problems: list[str] = []
        if self._read_only:
            self._catch_up()
        else:
            self._wait_for_vectors()
        with self._db.write_mutex:  # a consistent view: no write of ours in between
            with self._db.reading() as conn:
                conn.execute("BEGIN")
                try:
                    result = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
                    if result != ["ok"]:
                        problems.append("sqlite integrity_check: " + "; ".join(result[:5]))
                    fk = conn.execute("PRAGMA foreign_key_check").fetchall()
                    if fk:
                        problems.append(f"{len(fk)} foreign key violations")
                    facts = self._db.count(conn)
                    stale = self._db.count_foreign(conn, self._fingerprint)
                    waiting = self._db.count_waiting(conn)
                    top = self._db.max_seq(conn)
                    truth = self._db.labels(conn, self._fingerprint)
                    bad = conn.execute(
                        "SELECT COUNT(*) FROM facts WHERE vector IS NOT NULL AND length(vector) != ?", (4 * self._dim,)
                    ).fetchone()[0]
                    if bad and not stale:
                        problems.append(f"{bad} vectors have the wrong length")
                    fts_rows = conn.execute("SELECT COUNT(*) FROM facts_fts_docsize").fetchone()[0]
                    if fts_rows != facts:
                        problems.append(f"FTS index has {fts_rows} rows for {facts} facts")
                    tag_mismatch = conn.execute(
                        "SELECT COUNT(*) FROM facts f WHERE (SELECT COUNT(*) FROM fact_tags t WHERE t.fact_id = f.id) "
                        "!= (SELECT COUNT(*) FROM json_each(f.tags))"
                    ).fetchone()[0]
                    if tag_mismatch:
                        problems.append(f"{tag_mismatch} facts have tags out of sync")
                finally:
                    conn.execute("COMMIT")
            if not self._read_only:
                try:
                    self._db.writer.execute("INSERT INTO facts_fts (facts_fts, rank) VALUES ('integrity-check', 1)")
                except sqlite3.DatabaseError as exc:
                    problems.append(f"FTS integrity-check: {exc}")
            if stale and not self._read_only:
                problems.append(f"{stale} facts carry vectors from another embedder; call reembed()")
            if waiting and not self._read_only:  # (a reader sees the writer's facts before their vectors)
                why = f" ({self._vector_error})" if self._vector_error else ""
                count = f"{waiting} facts have" if waiting != 1 else "1 fact has"
                problems.append(f"{count} no vector, the embedder failed{why}: lexical recall only until a "
                                "reembed() succeeds")
            live = self._index.live_labels()
            if self._applied >= top and live != truth:
                problems.append(f"index disagrees with SQLite ({len(truth - live)} missing, {len(live - truth)} extra)")
        return CheckReport(
            ok=not problems, problems=tuple(problems), facts=facts, indexed=len(live), stale_vectors=stale,
            waiting_vectors=waiting, max_seq=top, fingerprint=self._fingerprint,
        )

    def backup(self, dest: str | os.PathLike) -> Path:
        """Write a consistent copy of the database to `dest` while the store stays live (`VACUUM INTO`).

        The index is not copied (it is rebuilt on first open). Thread-safe.

        Args:
            dest: a new file path (must not exist; its directory must).
        Returns:
            the destination path.
        Raises:
            InvalidInput: dest exists or its directory is missing.
        """
        self._check_usable()
        dest_path = Path(os.fspath(dest)).resolve()
        if dest_path.exists():
            raise InvalidInput(f"backup() expected a new file, but {dest_path} exists; choose another name.")
        if not dest_path.parent.is_dir():
            raise InvalidInput(f"backup() expected the directory {dest_path.parent} to exist.")
        with self._db.reading() as conn:
            conn.execute("VACUUM INTO ?", (str(dest_path),))
        return dest_path

    def export(self, path: str | os.PathLike) -> int:
        """Write every fact as JSON lines (id, text, tags, source, created_at, updated_at; no vectors).

        Thread-safe; written to a temp file and renamed, so a crash leaves no half file.

        Args:
            path: the JSONL file to write (replaced if it exists).
        Returns:
            how many facts were written.
        """
        self._check_usable()
        out = Path(os.fspath(path))
        if not out.resolve().parent.is_dir():
            raise InvalidInput(f"export() expected the directory {out.resolve().parent} to exist.")
        tmp = out.with_name(out.name + ".tmp")
        count = 0
        with self._db.reading() as conn, open(tmp, "w", encoding="utf-8") as fh:
            conn.execute("BEGIN")
            try:
                for row in conn.execute("SELECT id, text, tags, source, created_at, updated_at FROM facts ORDER BY rid"):
                    record = {"id": row[0], "text": row[1], "tags": json.loads(row[2]), "source": row[3],
                              "created_at": row[4], "updated_at": row[5]}
                    fh.write(json.dumps(record, ensure_ascii=False) + "\n")
                    count += 1
            finally:
                conn.execute("COMMIT")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
        return count

    def import_(self, path: str | os.PathLike) -> int:
        """Add the facts of a JSONL export (ids and timestamps kept; ids already present are skipped).

        One transaction: on any bad line nothing is imported. Thread-safe.

        Args:
            path: a file written by export().
        Returns:
            how many facts were added.
        Raises:
            InvalidInput: a line is not a valid fact (the line number is named).
        """
        self._check_writable("import_")
        records = []
        with open(os.fspath(path), "r", encoding="utf-8", errors="strict") as fh:
            for number, line in enumerate(fh, start=1):
                if len(line) > MAX_IMPORT_LINE:
                    raise InvalidInput(f"import_() line {number} is longer than {MAX_IMPORT_LINE} characters.")
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError as exc:
                    raise InvalidInput(f"import_() line {number} is not JSON ({exc}).") from None
                if not isinstance(rec, dict):
                    raise InvalidInput(f"import_() line {number} expected a JSON object.")
                try:
                    fid = check_id(rec.get("id")) if rec.get("id") is not None else new_id()
                    text = check_text(rec.get("text"))
                    tags = check_tags(rec.get("tags"))
                    source = check_source(rec.get("source"))
                    created = self._check_time(rec.get("created_at"))
                    updated = self._check_time(rec.get("updated_at"), default=created)
                except InvalidInput as exc:
                    raise InvalidInput(f"import_() line {number}: {exc}") from None
                records.append((fid, text, tags, source, created, updated))
        seen: set[str] = set()
        records = [r for r in records if not (r[0] in seen or seen.add(r[0]))]
        with self._db.reading() as conn:
            present = set(self._db.fetch_where(conn, "id", [r[0] for r in records]))
        records = [r for r in records if r[0] not in present]
        if not records:
            return 0
        fingerprint = self._fingerprint
        vectors = self._embed_many([r[1] for r in records])  # (N, D)
        with self._db.write_mutex:
            if fingerprint != self._fingerprint:
                vectors = self._embed_many([r[1] for r in records])  # (N, D) the model changed meanwhile
            with self._db.transaction() as conn:
                present = set(self._db.fetch_where(conn, "id", [r[0] for r in records]))
                keep = [i for i, r in enumerate(records) if r[0] not in present]
                labels, _ = self._db.insert(conn, [records[i] for i in keep], vectors[keep], self._fingerprint)
                top = self._db.max_seq(conn)
            self._apply(np.array(labels, dtype=np.int64), vectors[keep], [], top)
        return len(keep)

    @staticmethod
    def _check_time(value: Any, default: str | None = None) -> str:
        if value is None:
            return default or utc_now()
        if not isinstance(value, str) or not _ISO_RE.fullmatch(value):
            raise InvalidInput(f"expected an ISO 8601 UTC timestamp, got {value!r:.40}.")
        from datetime import datetime, timezone

        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return dt.astimezone(timezone.utc).isoformat(timespec="microseconds")

    # ---- adaptation ----------------------------------------------------------------------------------------
    def start_adaptation(self, policy: Any = None, hooks: Any = None) -> Any:
        """Start a background thread that adapts the embedder to this store's memories (LoRA rounds).

        A round runs when the policy says so (enough new memories, long enough since the last round): it fits
        an adapter, gates it on held-out memories, writes it to `<db>.adapters/`, re-embeds every memory into
        a new generation while the current one keeps serving, catches up with writes made meanwhile and swaps
        under the lock. A publish interrupted by a crash or stop() is resumed by the next round.

        Args:
            policy: an AdaptationPolicy (None: the defaults).
            hooks: an AdaptationHooks or a dict of hook name -> callable (they run in the adaptation thread
                and must not start another round themselves).
        Returns:
            the Adaptation (stop(), join(), status()).
        Raises:
            InvalidInput: an in-memory or read-only store, an embedder that is not an LMEmbedder, bad policy
                or hooks, or an adaptation already running.
        """
        from ..training.adaptation import Adaptation, check_hooks

        self._check_adaptable("start_adaptation")
        policy = self._check_policy(policy, "start_adaptation")
        hooks = check_hooks(hooks)
        self._adapt_base()  # fail now, not in the thread, when the store cannot be adapted
        if self._adaptation is not None and self._adaptation.running:
            raise InvalidInput("start_adaptation(): an adaptation is already running; stop() and join() it first.")
        self._adaptation = Adaptation(self, policy, hooks).start()
        return self._adaptation

    @property
    def adaptation(self) -> Any:
        """The Adaptation started by start_adaptation() (None if never started)."""
        return self._adaptation

    def adapt_now(self, policy: Any = None, hooks: Any = None, *, adapter: Any = None) -> Any:
        """Run one adaptation round in this thread (for scripts and `evermind adapt`).

        If an earlier publish was interrupted (crash, stop()), this call finishes it instead and returns that
        report (kind "resume"); call again for a new round. Recalls and writes from other threads continue.

        Args:
            policy: an AdaptationPolicy (None: the defaults; min_new_facts and min_interval_s do not apply).
            hooks: as for start_adaptation.
            adapter: a LoRAWeights to gate and publish instead of training one.
        Returns:
            the AdaptationReport (status "swapped", "refused", "vetoed", "skipped", "stopped" or "abandoned").
        Raises:
            InvalidInput: as for start_adaptation.
        """
        from ..training.adaptation import check_hooks, run_round

        self._check_adaptable("adapt_now")
        policy = self._check_policy(policy, "adapt_now")
        hooks = check_hooks(hooks)
        self._adapt_rounds += 1
        return run_round(self, policy, hooks, round_no=self._adapt_rounds, adapter=adapter)

    def rollback_adapter(self, to: str | None = "base") -> Any:
        """Serve an earlier adapter (by id, see adapter_history()) or the base model again.

        Re-embeds into a new generation and swaps like an adaptation round (no gate, no hooks).

        Args:
            to: an adapter id such as "0002", or "base" / None for the base model.
        Returns:
            the AdaptationReport (kind "rollback"; status "swapped" or "unchanged").
        Raises:
            InvalidInput: an unknown id, an adapter made for another base model, or a store that cannot adapt.
            CheckpointError: the adapter file is missing, corrupt or not the one recorded.
        """
        from ..training.adaptation import AdaptationReport, AdapterHistory

        self._check_adaptable("rollback_adapter")
        to = "base" if to is None else to
        if not isinstance(to, str) or not to:
            raise InvalidInput(f"rollback_adapter() expected an adapter id or 'base', got {to!r:.60}.")
        with self._adapt_mutex:
            base, _, _ = self._adapt_base()
            report = AdaptationReport(round=0, kind="rollback", fingerprint_before=self._fingerprint,
                                      base_fingerprint=base.fingerprint)
            entry = None
            embedder = base
            if to != "base":
                history = AdapterHistory(self._adapters_dir())
                entry = history.get(to)
                weights = history.load(entry, base.model)
                if weights.base_fingerprint not in (None, base.fingerprint):
                    raise InvalidInput(
                        f"adapter {to} was fitted on {weights.base_fingerprint}, this store's base is {base.fingerprint}."
                    )
                embedder = adapted_embedder(base, weights)
                report.adapter_id = entry["id"]
            report.fingerprint_after = embedder.fingerprint
            if embedder.fingerprint == self._fingerprint and self._adapt_pending() is None:
                report.status, report.reason = "unchanged", "that model already serves"
                return report
            t0 = time.perf_counter()
            self._adapt_publish(embedder, entry, report)
            report.total_seconds = time.perf_counter() - t0
            return report

    def adapter_history(self) -> list[dict]:
        """Every adapter written for this store, oldest first, each with "active" (the one serving now)."""
        from ..training.adaptation import AdapterHistory

        self._check_usable()
        active = self._active_adapter_id()
        return [{**e, "active": e["id"] == active} for e in AdapterHistory(self._adapters_dir()).entries()]

    def _check_adaptable(self, method: str) -> None:
        self._check_writable(method)
        if self._memory:
            raise InvalidInput(f"{method}() needs a store file (adapters are kept beside it); this store is ':memory:'.")

    @staticmethod
    def _check_policy(policy: Any, method: str) -> Any:
        from ..training.adaptation import AdaptationPolicy

        if policy is None:
            return AdaptationPolicy()
        if not isinstance(policy, AdaptationPolicy):
            raise InvalidInput(f"{method}() expected policy to be an AdaptationPolicy, got {type(policy).__name__}.")
        return policy

    def _adapters_dir(self) -> Path:
        p = Path(self._path).resolve()
        return p.parent / (p.name + ".adapters")

    def _meta_json(self, key: str) -> dict | None:
        with self._db.reading() as conn:
            raw = self._db.meta(conn, key)
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def _active_adapter_id(self) -> str | None:
        entry = self._meta_json(META_ADAPTER)
        return None if entry is None else entry.get("id")

    def _adapt_pending(self) -> dict | None:
        """The publish in progress (fingerprint, adapter, base_fingerprint), or None."""
        return self._meta_json(META_PENDING)

    def _adapt_new_facts(self, since: int) -> int:
        with self._db.reading() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM changes WHERE seq > ? AND op = 'remember'", (since,)).fetchone()[0])

    def _adapt_last_seq(self) -> int:
        with self._db.reading() as conn:
            raw = self._db.meta(conn, META_ADAPT_SEQ)
        return int(raw) if raw and raw.isdigit() else 0

    def _adapt_max_seq(self) -> int:
        with self._db.reading() as conn:
            return self._db.max_seq(conn)

    def _load_adapter_entry(self, entry: dict, base: Any) -> Any:
        from ..lm.adapter import load_adapter

        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _ADAPTER_NAME_RE.match(name):
            raise CheckpointError(f"the recorded adapter entry {entry!r:.80} names no valid adapter file.")
        sha = entry.get("sha256")
        return load_adapter(self._adapters_dir() / name, model=base.model, sha256=sha if isinstance(sha, str) else None)

    def _apply_active_adapter(self) -> None:
        """On open: when the store serves base + adapter and we were given that base, load the adapter too."""
        if self._memory:
            return
        with self._db.reading() as conn:
            stored_fp = self._db.meta(conn, "fingerprint")
            raw = self._db.meta(conn, META_ADAPTER)
            base_fp = self._db.meta(conn, META_BASE_FP)
        if not raw or stored_fp == self._fingerprint or base_fp != self._fingerprint:
            return
        try:
            entry = json.loads(raw)
            if not _is_lm_embedder(self._embedder):
                raise InvalidInput("the embedder given is not an LMEmbedder")
            embedder = adapted_embedder(self._embedder, self._load_adapter_entry(entry, self._embedder))
        except (CheckpointError, InvalidInput, ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
            self._adapter_note = f"its active adapter could not be applied ({exc})"
            return
        if embedder.fingerprint != stored_fp:
            self._adapter_note = f"base + adapter {entry.get('id')} gives {embedder.fingerprint}, not {stored_fp}"
            return
        self._embedder = embedder
        self._fingerprint = embedder.fingerprint

    def _follow_generation(self) -> None:
        """Reader: when the writer swapped generations (adaptation, rollback), switch to the new one too.

        Raises:
            EmbedderMismatch: the new generation's model cannot be built from the embedder this reader has.
        """
        with self._db.reading() as conn:
            stored_fp = self._db.meta(conn, "fingerprint")
        if stored_fp is None or stored_fp == self._fingerprint:
            return
        with self._gen_lock.write():
            if stored_fp == self._fingerprint:
                return  # another thread of ours switched first
            base = self._base_embedder
            embedder = base if stored_fp == getattr(base, "fingerprint", None) else None
            entry = self._meta_json(META_ADAPTER)
            if embedder is None and entry is not None and _is_lm_embedder(base):
                try:
                    embedder = adapted_embedder(base, self._load_adapter_entry(entry, base))
                except (CheckpointError, InvalidInput) as exc:
                    self._adapter_note = f"its active adapter could not be applied ({exc})"
            if embedder is None or embedder.fingerprint != stored_fp:
                raise EmbedderMismatch(
                    f"{self._path} now serves {stored_fp} (the writer swapped models); this reader has "
                    f"{self._fingerprint}. Reopen it with the store's base embedder."
                )
            self._embedder = embedder
            self._fingerprint = stored_fp
            self._rebuild("the writer swapped to a new generation")

    def _clear_adaptation_state(self, conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM meta WHERE key IN (?, ?, ?, ?)", (META_ADAPTER, META_BASE_FP, META_PENDING, META_ADAPT_SEQ))
        conn.execute(f"DROP TABLE IF EXISTS {GEN_TABLE}")

    def _adapt_base(self) -> tuple[Any, Any, dict | None]:
        """(base LMEmbedder, the active adapter's weights or None, its meta entry or None)."""
        base = self._base_embedder
        if not _is_lm_embedder(base):
            raise InvalidInput(
                f"adaptation needs an LMEmbedder (an EvermindLM with a tokenizer); this store was opened with "
                f"{type(base).__name__}. Open it with embedder=LMEmbedder(model, tokenizer)."
            )
        entry = self._meta_json(META_ADAPTER)
        with self._db.reading() as conn:
            base_fp = self._db.meta(conn, META_BASE_FP)
        if entry is None:
            if self._fingerprint != base.fingerprint:
                raise InvalidInput(f"this store serves {self._fingerprint}, not the embedder it was opened with.")
            return base, None, None
        if base_fp != base.fingerprint or self._embedder is base:
            raise InvalidInput(
                f"this store serves adapter {entry.get('id')} on base model {base_fp}; open it with that base "
                f"LMEmbedder to adapt or roll back (it was opened with {base.fingerprint})."
            )
        try:
            init = self._load_adapter_entry(entry, base)
        except CheckpointError:
            init = None
        return base, init, entry

    def _adapt_embedder(self, base: Any, weights: Any) -> Any:
        return adapted_embedder(base, weights)

    def _adapt_memories(self, policy: Any) -> tuple[np.ndarray, list[str], np.ndarray]:
        """(labels (N,), texts, current vectors (N, D)) of the memories a round learns from (a seeded sample)."""
        with self._db.reading() as conn:
            rows = conn.execute(
                "SELECT label, text, vector FROM facts WHERE fingerprint = ? AND label IS NOT NULL ORDER BY label",
                (self._fingerprint,),
            ).fetchall()
        rows = [r for r in rows if r[2] is not None and len(r[2]) == 4 * self._dim]
        if len(rows) > policy.max_memories:
            keep = np.sort(np.random.default_rng([policy.seed, 3]).choice(len(rows), policy.max_memories, replace=False))
            rows = [rows[i] for i in keep.tolist()]
        labels = np.array([r[0] for r in rows], dtype=np.int64)  # (N,)
        return labels, [r[1] for r in rows], vectors_from_blobs([r[2] for r in rows], self._dim)

    def _adapt_feedback(self, labels: np.ndarray) -> list[tuple[str, int, float]]:
        """(query, row in `labels`, weight 1.0) for every standing "useful" judgement of those memories."""
        row = {int(label): i for i, label in enumerate(labels.tolist())}
        with self._db.reading() as conn:
            pairs = self._db.feedback_pairs(conn, self._fingerprint)
        return [(query, row[label], 1.0) for query, label in pairs if label in row]

    def _adapt_save(self, weights: Any, report: Any) -> dict:
        """Write a gated candidate to the adapter history; returns its entry."""
        from ..training.adaptation import AdapterHistory

        entry = AdapterHistory(self._adapters_dir()).add(
            weights, fingerprint=report.fingerprint_after, base_fingerprint=report.base_fingerprint,
            round=report.round, gate=None if report.gate is None else report.gate.to_dict(),
            steps=report.steps, final_loss=None if not report.losses else list(report.losses[-1]),
        )
        report.adapter_id = entry["id"]
        crash_point("adapt.adapter_written")
        return entry

    def _adapt_resume(self, report: Any, *, before_swap: Any = None, should_stop: Any = None,
                      batch: int = REEMBED_BATCH) -> None:
        """Finish the publish recorded in meta (after a crash or stop()), or drop it if it cannot be rebuilt."""
        pending = self._adapt_pending()
        report.resumed = True
        base = self._base_embedder
        report.base_fingerprint = getattr(base, "fingerprint", "")
        entry = pending.get("adapter")
        report.adapter_id = None if not isinstance(entry, dict) else entry.get("id")
        try:
            if pending.get("base_fingerprint") != getattr(base, "fingerprint", None) or not _is_lm_embedder(base):
                raise InvalidInput(f"it was started on base model {pending.get('base_fingerprint')}")
            embedder = base if entry is None else adapted_embedder(base, self._load_adapter_entry(entry, base))
            if embedder.fingerprint != pending.get("fingerprint"):
                raise InvalidInput(f"its model now gives {embedder.fingerprint}, not {pending.get('fingerprint')}")
        except (CheckpointError, InvalidInput, TypeError, AttributeError) as exc:
            self._gen_abandon(report, "abandoned", f"the interrupted publish cannot be resumed: {exc}")
            return
        self._adapt_publish(embedder, entry, report, before_swap=before_swap, should_stop=should_stop,
                            batch=batch, resume=True)

    def _adapt_publish(self, embedder: Any, entry: dict | None, report: Any, *, before_swap: Any = None,
                       should_stop: Any = None, batch: int = REEMBED_BATCH, resume: bool = False) -> None:
        """Re-embed every memory into a new generation, index it, catch up, and swap it in (R12).

        Resumable: the target is recorded in meta first and each batch of vectors commits on its own, so a
        crash leaves the old generation serving and the next call continues where this one stopped. Sets
        report.status to "swapped", "vetoed", "stopped" or "refused".
        """
        stop = should_stop or (lambda: False)
        db = self._db
        fp = embedder.fingerprint
        report.fingerprint_after = fp
        meta_entry = None if entry is None else {k: entry.get(k) for k in ("id", "file", "sha256", "digest")}
        base_fp = self._base_embedder.fingerprint
        if not resume:
            pending = {"fingerprint": fp, "adapter": meta_entry, "base_fingerprint": base_fp, "kind": report.kind,
                       "since": utc_now()}
            with db.transaction() as conn:
                conn.execute(f"CREATE TABLE IF NOT EXISTS {GEN_TABLE} (label INTEGER PRIMARY KEY, "
                             "fingerprint TEXT NOT NULL, vector BLOB NOT NULL)")
                conn.execute(f"DELETE FROM {GEN_TABLE} WHERE fingerprint != ?", (fp,))
                db.set_meta(conn, META_PENDING, json.dumps(pending, sort_keys=True))
                gate = getattr(report, "gate", None)
                if gate is not None and gate.candidate_vectors is not None:  # the gate already embedded these
                    conn.executemany(
                        f"INSERT OR REPLACE INTO {GEN_TABLE} (label, fingerprint, vector) VALUES (?, ?, ?)",
                        [(int(lab), fp, v.astype("<f4").tobytes())
                         for lab, v in zip(gate.candidate_labels.tolist(), gate.candidate_vectors)],
                    )
            crash_point("adapt.pending_recorded")
        # 1. re-embed in resumable batches while the old generation serves
        t0 = time.perf_counter()
        after = 0
        try:
            while True:
                if stop():
                    report.status, report.reason = "stopped", "stop() was called; the next round resumes this publish"
                    return
                with db.reading() as conn:
                    rows = conn.execute(
                        f"SELECT f.label, f.text FROM facts f WHERE f.label > ? AND NOT EXISTS (SELECT 1 FROM "
                        f"{GEN_TABLE} g WHERE g.label = f.label AND g.fingerprint = ?) ORDER BY f.label LIMIT ?",
                        (after, fp, batch),
                    ).fetchall()
                if not rows:
                    break
                vectors = self._embed_many([r[1] for r in rows], embedder)  # (b, D)
                self._gen_store(fp, [r[0] for r in rows], vectors)
                crash_point("adapt.reembed.batch")
                after = rows[-1][0]
                report.reembedded += len(rows)
            report.reembed_seconds += time.perf_counter() - t0
            # 2. the new index from a read snapshot, then replay the writes made since
            t0 = time.perf_counter()
            with db.reading() as conn:
                conn.execute("BEGIN")
                try:
                    top = db.max_seq(conn)
                    rows = conn.execute(
                        f"SELECT f.label, CASE WHEN g.vector IS NULL THEN f.text END, g.vector FROM facts f LEFT JOIN "
                        f"{GEN_TABLE} g ON g.label = f.label AND g.fingerprint = ? WHERE f.label IS NOT NULL "
                        "ORDER BY f.label", (fp,),
                    ).fetchall()
                finally:
                    conn.execute("COMMIT")
            labels, vectors = self._gen_collect(embedder, fp, rows)
            index = self._gen_index(labels, vectors)
            crash_point("adapt.index_built")
            top, replayed = self._gen_replay(index, embedder, fp, top)
            report.replayed += replayed
            report.index_seconds += time.perf_counter() - t0
        except EmbedderOutputInvalid as exc:
            self._gen_abandon(report, "refused", f"the candidate gave an invalid vector while re-embedding ({exc})")
            return
        if before_swap is not None and before_swap(report) is False:
            self._gen_abandon(report, "vetoed", "before_swap() vetoed the swap; the current model keeps serving")
            return
        # 3. catch up under the write mutex (writers wait), swap under the exclusive generation lock
        t0 = time.perf_counter()
        with db.write_mutex:
            try:
                top, replayed = self._gen_replay(index, embedder, fp, top)
            except EmbedderOutputInvalid as exc:
                self._gen_abandon(report, "refused", f"the candidate gave an invalid vector while catching up ({exc})")
                return
            report.replayed += replayed
            with db.reading() as conn:
                truth = {r[0] for r in conn.execute("SELECT label FROM facts WHERE label IS NOT NULL")}
            if index.live_labels() != truth:  # never expected; rebuild from the generation table rather than guess
                with db.reading() as conn:
                    rows = conn.execute(
                        f"SELECT f.label, CASE WHEN g.vector IS NULL THEN f.text END, g.vector FROM facts f LEFT JOIN "
                        f"{GEN_TABLE} g ON g.label = f.label AND g.fingerprint = ? WHERE f.label IS NOT NULL "
                        "ORDER BY f.label", (fp,),
                    ).fetchall()
                index = self._gen_index(*self._gen_collect(embedder, fp, rows))
            with self._gen_lock.write():
                with db.transaction() as conn:
                    missing = conn.execute(
                        f"SELECT COUNT(*) FROM facts f WHERE f.label IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "
                        f"{GEN_TABLE} g WHERE g.label = f.label AND g.fingerprint = ?)", (fp,),
                    ).fetchone()[0]
                    if missing:
                        raise EvermindError(f"{missing} memories have no vector in the new generation; nothing was swapped.")
                    conn.execute(
                        f"UPDATE facts SET vector = (SELECT g.vector FROM {GEN_TABLE} g WHERE g.label = facts.label "
                        "AND g.fingerprint = ?1), fingerprint = ?1", (fp,),
                    )
                    db.set_meta(conn, "fingerprint", fp)
                    if meta_entry is None:
                        conn.execute("DELETE FROM meta WHERE key = ?", (META_ADAPTER,))
                    else:
                        db.set_meta(conn, META_ADAPTER, json.dumps(meta_entry, sort_keys=True))
                    db.set_meta(conn, META_BASE_FP, base_fp)
                    db.set_meta(conn, META_ADAPT_SEQ, str(top))
                    conn.execute("DELETE FROM meta WHERE key = ?", (META_PENDING,))
                    conn.execute(f"DROP TABLE {GEN_TABLE}")
                    crash_point("adapt.swap.before_commit")
                crash_point("adapt.swap.after_commit")
                self._embedder = embedder  # before the fingerprint: a writer that sees the new one embeds with it
                self._fingerprint = fp
                self._index = index
                self._applied = top
                self._index_status = f"swapped in by adaptation ({report.kind})"
            try:
                self._save_index()
            except OSError:
                pass  # the index is a cache: the next open rebuilds it from SQLite
        report.swap_seconds += time.perf_counter() - t0
        report.status, report.swapped_at = "swapped", utc_now()
        if meta_entry is not None:
            from ..training.adaptation import AdapterHistory

            AdapterHistory(self._adapters_dir()).update(meta_entry["id"], status="published", published_at=report.swapped_at)

    def _gen_store(self, fingerprint: str, labels: Sequence[int], vectors: np.ndarray) -> None:
        with self._db.transaction() as conn:
            conn.executemany(
                f"INSERT OR REPLACE INTO {GEN_TABLE} (label, fingerprint, vector) VALUES (?, ?, ?)",
                [(int(lab), fingerprint, v.astype("<f4").tobytes()) for lab, v in zip(labels, vectors)],
            )

    def _gen_collect(self, embedder: Any, fingerprint: str, rows: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
        """(labels (N,), vectors (N, D)) for rows (label, text or None, vector blob or None); embeds the missing."""
        labels = np.array([r[0] for r in rows], dtype=np.int64)  # (N,)
        vectors = np.zeros((len(rows), self._dim), dtype=np.float32)  # (N, D)
        have = [i for i, r in enumerate(rows) if r[2] is not None and len(r[2]) == 4 * self._dim]
        if have:
            vectors[have] = vectors_from_blobs([rows[i][2] for i in have], self._dim)
        have_set = set(have)
        missing = [i for i in range(len(rows)) if i not in have_set]
        if missing:
            new = self._embed_many([rows[i][1] for i in missing], embedder)  # (m, D)
            self._gen_store(fingerprint, labels[missing].tolist(), new)
            vectors[missing] = new
        return labels, vectors

    def _gen_index(self, labels: np.ndarray, vectors: np.ndarray) -> VectorIndex:
        cap = max(self._index_config.initial_capacity, len(labels) + len(labels) // 4)
        index = VectorIndex(self._dim, IndexConfig(**{**self._index_config.__dict__, "initial_capacity": cap}))
        index.add(labels, vectors)
        return index

    def _gen_replay(self, index: VectorIndex, embedder: Any, fingerprint: str, since: int) -> tuple[int, int]:
        """Apply changes after `since` to the new generation's index (R3). Returns (new watermark, changes)."""
        db = self._db
        rows: list[tuple] = []
        with db.reading() as conn:
            conn.execute("BEGIN")
            try:
                top = db.max_seq(conn)
                changes = db.changes_after(conn, since, top)
                added = [seq for seq, vec_added, _ in changes if vec_added]
                removed = [label for _, _, label in changes if label is not None]
                for start in range(0, len(added), _IN_CHUNK):
                    chunk = added[start : start + _IN_CHUNK]
                    rows += conn.execute(
                        f"SELECT f.label, CASE WHEN g.vector IS NULL THEN f.text END, g.vector FROM facts f LEFT JOIN "
                        f"{GEN_TABLE} g ON g.label = f.label AND g.fingerprint = ? WHERE f.label IN "
                        f"({','.join('?' * len(chunk))})", [fingerprint, *chunk],
                    ).fetchall()
            finally:
                conn.execute("COMMIT")
        index.mark_deleted(removed)
        rows = [r for r in rows if r[0] not in index]
        labels, vectors = self._gen_collect(embedder, fingerprint, rows)
        index.add(labels, vectors)
        return max(top, since), len(changes)

    def _gen_abandon(self, report: Any, status: str, reason: str) -> None:
        """Drop a publish in progress: the current generation stays; the candidate's vectors are deleted."""
        with self._db.transaction() as conn:
            conn.execute("DELETE FROM meta WHERE key = ?", (META_PENDING,))
            conn.execute(f"DROP TABLE IF EXISTS {GEN_TABLE}")
        report.status, report.reason = status, reason
        if report.adapter_id:
            from ..training.adaptation import AdapterHistory

            AdapterHistory(self._adapters_dir()).update(report.adapter_id, status=status)

    # ---- identity and info ---------------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        """The fingerprint of the embedder whose vectors this store serves."""
        return self._fingerprint

    @property
    def embedder(self) -> Any:
        """The embedder in use."""
        return self._embedder

    @property
    def path(self) -> str:
        """The database path (or ":memory:")."""
        return self._path

    @property
    def read_only(self) -> bool:
        """Whether this is a read-only reader."""
        return self._read_only

    def info(self) -> dict:
        """A summary for humans and the CLI: sizes, identity, durability, SQLite version, index state."""
        self._check_usable()
        with self._db.reading() as conn:
            facts = self._db.count(conn)
            top = self._db.max_seq(conn)
            schema = self._db.meta(conn, "schema_version")
            waiting = self._db.count_waiting(conn)
            judged = conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0]
        return {
            "path": self._path, "read_only": self._read_only, "durability": self._durability, "facts": facts,
            "indexed": self._index.live_count, "index_elements": self._index.element_count,
            "index_status": self._index_status, "index_watermark": self._applied, "max_seq": top,
            "fingerprint": self._fingerprint, "dimensions": self._dim, "store_id": self._store_id,
            "schema_version": int(schema or SCHEMA_VERSION), "sqlite_version": sqlite3.sqlite_version,
            "sqlite_wal_reset_fixed": sqlite_has_wal_reset_fix(), "filesystem": self._fs_type,
            "hybrid_weight": self._hybrid_weight,
            "adapter": self._active_adapter_id(), "adaptation_pending": self._adapt_pending() is not None,
            "background_embedding": self._background, "waiting_vectors": waiting, "vector_error": self._vector_error,
            "feedback": judged,
        }

    # ---- persistence and closing ---------------------------------------------------------------------------
    def _save_index(self) -> None:
        """Persist the index (writer only) unless the file on disk is already newer (CAS, R13)."""
        if self._read_only or self._memory:
            return
        directory, stem = Path(self._path).resolve().parent, Path(self._path).name
        with self._db.write_mutex:
            try:
                on_disk = read_manifest(directory / f"{stem}.json")
                with self._db.reading() as conn:
                    top = self._db.max_seq(conn)
                newer = on_disk.get("watermark")
                if (on_disk.get("store_id") == self._store_id and on_disk.get("fingerprint") == self._fingerprint
                        and isinstance(newer, int) and self._applied < newer <= top):
                    return  # a newer writer saved after us: never regress the index (R13)
            except IndexRejected:
                pass
            meta = {**self._expect(), "watermark": self._applied}
            self._index.save(directory, stem, meta)
            self._saved_watermark = self._applied

    def close(self) -> None:
        """Embed and index the waiting vectors, save the index if it changed, close SQLite, release the lock.

        Idempotent. It does not raise for facts the embedder failed on (they stay lexical-only, check()
        reports them and the next open retries them): call flush() first to hear about them.
        """
        if self._closed:
            return
        adaptation = self._adaptation
        if adaptation is not None and os.getpid() == self._pid:
            adaptation.stop()
            adaptation._thread.join()  # its error, if any, stays for adaptation.join() to raise
        try:
            if self._worker is not None and os.getpid() == self._pid:
                try:
                    self._wait_for_vectors()
                except EvermindError:
                    pass  # SQLite refused the writes (disk full): the facts wait in SQLite for the next open
                finally:
                    self._stop_worker()
            if self._db is not None and os.getpid() == self._pid and not self._read_only and not self._memory:
                if self._applied != self._saved_watermark:
                    try:
                        self._save_index()
                    except OSError:
                        pass  # the index is a cache: SQLite has everything, next open replays or rebuilds
        finally:
            self._closed = True
            self._release()

    def _release(self) -> None:
        if self._db is not None:
            self._db.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __del__(self) -> None:
        # A store dropped without close(): free the connections and the writer lock (no index save here;
        # the next open replays from SQLite). Never raise from a finaliser.
        try:
            if not getattr(self, "_closed", True) and os.getpid() == self._pid:
                self._closed = True
                self._signal_worker_stop()
                self._release()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> "MemoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self._read_only else "writer")
        return f"MemoryStore({self._path!r}, {state}, fingerprint={self._fingerprint!r})"
