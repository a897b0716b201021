"""MemoryStore: the public front of a store. It checks every argument at the boundary and hands the work to
the rooms of store/: backend/ (all SQL), vectors.py (the HNSW cache and its catch-up), search.py (lexical,
vector, hybrid), embedding.py (the background vector worker), generations.py (model swaps), maintenance.py
(check, backup, export/import) and access.py (who may write). Adaptation (evermind_memory.adaptation) is
imported only when it is used.

Writes commit to SQLite first (`BEGIN IMMEDIATE`, acknowledged only after COMMIT), then update the index; the
index on disk is a validated, replayable cache (RELIABILITY R1-R14). Any number of processes open a store
read-write (and any number read-only): SQLite orders their commits, each process's index follows all of them
through the change feed before it answers, and leases (leases.py) pick the one process that runs each
background job. A store is its database file, whatever path names it (identity.py).
"""

from __future__ import annotations

import atexit
import os
import sys
import warnings
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .._crash import crash_point
from ..errors import (
    EmbedderMismatch, EvermindError, FactNotFound, InvalidInput, StorageError, StoreCorrupt, StoreLocked, StoreWarning,
)
from . import maintenance
from .access import Access
from .adapting import AdaptationMethods
from .backend import FactRow, NewFact, new_id, open_backend, utc_now
from .damage import readable
from .embedding import PENDING_MAX, VectorWorker, embed_query, embed_serving, probe_embedder
from .generations import REEMBED_BATCH, Generations, resolve_embedder
from .index import IndexConfig, check_index_memory
from .leases import Leases, Owner
from .lock import filesystem_type, is_remote_filesystem
from .maintenance import Checkpoints
from .records import Change, CheckReport, Fact, Recall
from .repair import RepairReport
from .search import Search, hybrid_weight
from .vectors import VectorCache
from .validate import (
    FUSIONS, MAX_LIST_LIMIT, MODES, check_choice, check_id, check_int, check_k, check_min_score, check_source,
    check_tags, check_text,
)

FEEDBACK_LIMIT = 10_000  # judgements kept (the newest); each is a training pair for adaptation


class MemoryStore(AdaptationMethods):
    """A local memory with semantic recall.

    Thread-safety: every method may be called from any thread of the process that opened the store; writes
    are serialised, recalls run concurrently. Do not use a store in a forked child: open a new one there.

    Args:
        path: SQLite file (created if missing; its directory must exist), or ":memory:".
        embedder: any object with embed, embed_many, dimensions and fingerprint; None for the shipped model.
        read_only: open as a reader that follows the writers' commits (no writes, no background jobs).
        durability: "normal" (WAL, synchronous=NORMAL: survives application crashes; the last commits may be
            lost on power loss or an OS crash) or "full" (synchronous=FULL: survives power loss, slower).
        on_mismatch: when stored vectors come from another embedder: "reembed" them before serving (with a
            progress bar on a terminal) or "raise" EmbedderMismatch.
        lock_timeout: kept for compatibility; unused (any number of processes may write a store).
        index_config: HNSW parameters.
        busy_timeout: seconds a write waits for another process's transaction before StoreLocked.
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
        StoreLocked: another process held the write lock past busy_timeout (while creating or migrating).
        StoreMoved: the file has several names (hard links) or was renamed while open under its old name, so
            opening it through this path could fork its WAL (see store/identity.py).
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
        if index_config is not None and not isinstance(index_config, IndexConfig):
            raise InvalidInput(f"MemoryStore() expected index_config to be an IndexConfig, got {type(index_config).__name__}.")
        self._reopen_args = (path, embedder, dict(read_only=read_only, durability=durability, on_mismatch=on_mismatch,
                                                  lock_timeout=lock_timeout, index_config=index_config,
                                                  busy_timeout=busy_timeout, background_embedding=background_embedding))
        access = Access(path, read_only, background_embedding)
        if access.memory and read_only:
            raise InvalidInput("MemoryStore(':memory:', read_only=True) has nothing to read; drop read_only.")
        self._fs_type = None
        if not access.memory:
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
        from ..embedder.base import check_embedder  # (here, not at import: `import evermind_memory.store` stays light)

        embedder = resolve_embedder(embedder)
        self._dim, fingerprint = check_embedder(embedder)
        check_index_memory(index_config or IndexConfig(), self._dim)
        probe_embedder(embedder, self._dim)
        self._hybrid_weight = hybrid_weight(embedder)
        self._path = path
        self._access = access
        self._durability = durability
        self._on_mismatch = on_mismatch
        self._index_config = index_config or IndexConfig()
        self._pid = os.getpid()
        self._closed = False
        self._adaptation: Any = None
        self._adapt_rounds = 0
        self._db = None
        self._worker: VectorWorker | None = None
        self._holder = Owner.new()
        try:
            self._db = open_backend(path, read_only=read_only, durability=durability, busy_timeout=float(busy_timeout))
            self._access = access = Access(self._db.path, read_only, background_embedding)  # the canonical path
            self._leases = Leases(self._db, self._holder)
            self._checkpoints = Checkpoints(self._db, self._leases, access)
            self._vectors = VectorCache(self._db, access, dim=self._dim, config=self._index_config, embedder=embedder,
                                        fingerprint=fingerprint, leases=self._leases)
            self._gens = Generations(self._db, self._vectors, access, embedder, self._leases)
            self._worker = VectorWorker(self._db, self._vectors, owner=self, holder=self._holder)
            self._search = Search(self._db, self._dim)
            self._open()
        except BaseException as exc:
            self._release()
            if isinstance(exc, OSError) and not isinstance(exc, EvermindError):
                err = StorageError(f"{path}: the operating system refused opening the store ({exc}). Check the "
                                   "permissions and free space of its directory, then retry.")
                err.errno = exc.errno
                raise err from exc
            raise
        _open_stores.add(self)

    # ---- opening -------------------------------------------------------------------------------------------
    def _open(self) -> None:
        with self._db.reading() as r:
            self._vectors.store_id = r.meta("store_id")
        self._gens.settle(self._on_mismatch)  # which model serves; build the generation of ours if it differs
        self._vectors.load()
        if self._access.embeds_waiting and self._worker.adopt_orphans():
            # remembered without a vector by a process that died (or whose embedder failed on them): retry now
            if self._access.embeds_in_background:
                self._worker.start()
            else:
                self._worker.drain()

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
        self._access.require_writer(method)

    def _sync(self) -> None:
        """Serve the generation the database names and replay the changes after our watermark (every process,
        before it answers; for the only writer of a store both are one cheap read)."""
        self._gens.follow()
        self._vectors.catch_up()

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
        if not self._access.embeds_in_background:
            return self.remember_many([text], tags=tags, source=source)[0]
        self._check_writable("remember")
        text = check_text(text)
        tags = check_tags(tags)
        source = check_source(source)
        now = utc_now()
        fid = new_id()
        with self._db.write_mutex:
            with self._db.transaction() as tx:
                (seq,), rid = tx.insert([NewFact(fid, text, tags, source, now, now)], None, None, self._holder.token)
                crash_point("remember.before_commit")
            crash_point("remember.after_commit")
            self._vectors.advance(seq - 1, seq)  # nothing to index yet
            waiting = self._worker.add(rid, fid, text)
        self._checkpoints.after_commit(seq)
        if waiting >= PENDING_MAX:
            self._worker.drain()  # back-pressure: the caller embeds when the thread falls behind
        else:
            self._worker.start()
        return fid

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
        if self._access.writes:
            self._worker.adopt_orphans()  # facts a dead process left waiting: embedded here too
            self._worker.wait()
            self._worker.raise_failures("flush")
        self._sync()

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
        made = embed_serving(self._vectors, checked)  # before the mutex: an adaptation swap may change the model
        now = utc_now()
        ids = [new_id() for _ in checked]
        items = [NewFact(fid, text, tags, source, now, now) for fid, text in zip(ids, checked)]
        with self._db.write_mutex:
            gen, vectors = embed_serving(self._vectors, checked, made)  # (N, D) by the model that serves now
            with self._db.transaction() as tx:
                self._gens.require_serving(tx, gen.fingerprint, "remember_many")
                labels, _ = tx.insert(items, vectors, gen.fingerprint)
                crash_point("remember.before_commit")
            crash_point("remember.after_commit")
            self._vectors.apply(np.array(labels, dtype=np.int64), vectors, [], labels[0] - 1, labels[-1])
        self._checkpoints.after_commit(labels[-1])
        return ids

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
        made = None if new_text is None else embed_serving(self._vectors, [new_text])
        with self._db.write_mutex:
            gen, vector = self._vectors.current, None
            if made is not None:
                gen, vectors = embed_serving(self._vectors, [new_text], made)  # again if the model changed meanwhile
                vector = vectors[0]  # (D,)
            with self._db.transaction() as tx:
                if vector is not None:
                    self._gens.require_serving(tx, gen.fingerprint, "update")
                row = tx.fetch(fact_id)
                if row is None:
                    raise FactNotFound(f"update() found no fact with id {fact_id!r}; it may have been forgotten.")
                if new_text is not None and new_text == row.text and row.fingerprint == gen.fingerprint:
                    vector = None  # same text, same embedder: keep the vector and its label
                seq, removed = tx.update(
                    row, text=row.text if new_text is None else new_text,
                    tags=row.tags if new_tags is None else new_tags,
                    source=row.source if new_source is None else new_source,
                    vector=vector, fingerprint=gen.fingerprint, now=utc_now(),
                )
                fact = tx.fetch(fact_id).to_fact()
            if vector is not None:
                self._vectors.apply(np.array([seq]), vector[None, :], [] if removed is None else [removed], seq - 1, seq)
            else:
                self._vectors.advance(seq - 1, seq)
        self._checkpoints.after_commit(seq)
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
            with self._db.transaction() as tx:
                row = tx.fetch(fact_id)
                if row is None:
                    raise FactNotFound(f"forget() found no fact with id {fact_id!r}; it may have been forgotten already.")
                before = tx.max_seq()
                removed = tx.delete([row], utc_now())
                top = tx.max_seq()
            self._vectors.apply(np.zeros(0, dtype=np.int64), np.zeros((0, self._dim), np.float32), removed, before, top)
        self._checkpoints.after_commit(top)

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
            with self._db.transaction() as tx:
                rows = tx.list_rows(-1, 0, tags, source)
                before = tx.max_seq()
                removed = tx.delete(rows, utc_now())
                top = tx.max_seq()
            self._vectors.apply(np.zeros(0, dtype=np.int64), np.zeros((0, self._dim), np.float32), removed, before, top)
        self._checkpoints.after_commit(top)
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
            with self._db.transaction() as tx:
                if tx.fetch(fact_id) is None:
                    raise FactNotFound(f"feedback() found no fact with id {fact_id!r}; it may have been forgotten.")
                tx.add_feedback(utc_now(), query, fact_id, useful, FEEDBACK_LIMIT)

    # ---- reads ---------------------------------------------------------------------------------------------
    def get(self, fact_id: str) -> Fact:
        """Fetch one fact. Thread-safe.

        Raises:
            FactNotFound: no such fact. InvalidInput: not a valid id.
        """
        self._check_usable()
        fact_id = check_id(fact_id)
        with self._db.reading() as r:
            row = r.fetch(fact_id)
        if row is None:
            raise FactNotFound(f"get() found no fact with id {fact_id!r}; it may have been forgotten.")
        return row.to_fact()

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
        with self._db.reading() as r:
            rows = r.list_rows(limit, offset, tags, source)
        return readable(rows, FactRow.to_fact, "list")

    def history(self, fact_id: str) -> list[Change]:
        """Every change of a fact (remember, update, reembed, forget), oldest first. Thread-safe.

        A background-embedded fact's first vector is part of its "remember", not a change of its own.

        Raises:
            FactNotFound: the id was never used in this store.
        """
        self._check_usable()
        fact_id = check_id(fact_id)
        with self._db.reading() as r:
            changes = r.history(fact_id)
        if not changes:
            raise FactNotFound(f"history() found no fact with id {fact_id!r} in this store.")
        return changes

    def __len__(self) -> int:
        self._check_usable()
        with self._db.reading() as r:
            return r.count()

    def recall(self, query: str, k: int = 5, *, tags: dict[str, str] | None = None, mode: str = "hybrid",
               min_score: float | None = None, fusion: str = "score") -> list[Recall]:
        """The facts that best match `query`, best first. Thread-safe.

        Args:
            query: what to look for.
            k: at most this many (1..1000); fewer when fewer facts match.
            tags: exact tags every hit must carry.
            mode: "hybrid" (BM25 and vector fused), "vector" (cosine) or "lexical" (FTS5 BM25).
            min_score: drop hits scoring below this.
            fusion: for hybrid: "score" (BM25 / best BM25 + w * cosine, w from the embedder) or "rrf".
        Returns:
            list of Recall.
        Raises:
            InvalidInput: bad query, k, tags, mode, fusion or min_score.
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
        try:
            self._sync()
        except EmbedderMismatch:
            if mode != "lexical":  # text needs no model: a lexical recall still answers
                raise
        if mode != "lexical" and self._access.writes:
            self._worker.wait()
            self._worker.raise_failures("recall")
        with self._vectors.serving() as gen:  # one generation (model, fingerprint, index) for the whole recall
            qv = None if mode == "lexical" else embed_query(gen.embedder, query, self._dim)  # (D,)
            scored = self._search.run(gen, query, qv, k, tags, mode, fusion, self._hybrid_weight)
        kept = [(row, score) for row, score in scored if min_score is None or score >= min_score]
        return readable(kept, lambda hit: hit[0].to_recall(hit[1]), "recall")[:k]

    # ---- maintenance ---------------------------------------------------------------------------------------
    def rebuild_index(self) -> int:
        """Rebuild the HNSW index from the vectors in SQLite and (for a writer) save it.

        Thread-safe; recalls keep using the old index until the swap.

        Returns:
            how many vectors the new index holds.
        """
        self._check_usable()
        self._worker.wait()
        return self._vectors.rebuild("rebuild_index() was called")

    def reembed(self, *, force: bool = False, batch_size: int = REEMBED_BATCH) -> int:
        """Re-embed facts whose vector came from another embedder (every fact with force=True).

        Resumable: each batch is one transaction, so an interrupted run continues where it stopped. Vectors of
        the serving model replace others in place (every process follows batch by batch); to change the model,
        open the store with the new embedder instead (a generation built beside the serving one).
        Thread-safe (writes are serialised; recalls continue).

        Args:
            force: re-embed every fact, not only stale ones.
            batch_size: facts per transaction.
        Returns:
            how many facts were re-embedded.
        Raises:
            StoreLocked: another process is re-embedding or building a generation right now.
        """
        self._check_writable("reembed")
        if not isinstance(force, bool):
            raise InvalidInput(f"reembed() expected force to be a bool, got {force!r}.")
        batch_size = check_int(batch_size, "batch_size", 1, 100_000, "reembed")
        with self._gens.claimed() as mine:
            if not mine:
                raise StoreLocked("reembed(): another process is re-embedding this store or building a new "
                                  "generation; try again when it has finished.")
            return self._gens.reembed(force=force, with_index=True, batch_size=batch_size)

    def check(self) -> CheckReport:
        """Check SQLite integrity, FTS, fact rows, vectors and the index against SQLite; report, never raise.

        A part that cannot be checked (a damaged page, a closed store) is itself reported as a problem.
        Thread-safe.

        Returns:
            CheckReport (ok is True when nothing is wrong).
        """
        try:
            self._check_usable()
        except EvermindError as exc:
            return CheckReport(ok=False, problems=(str(exc),))
        early = []
        for step in ((self._worker.wait,) if self._access.writes else ()) + (self._vectors.catch_up,):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 (reported, never raised)
                early.append(f"{type(exc).__name__}: {exc}")
        try:
            building = self._gens.build_progress()
        except Exception:  # noqa: BLE001
            building = None
        report = maintenance.check(self._db, self._vectors, self._worker, self._access, building)
        if early:
            report = replace(report, ok=False, problems=tuple(early) + report.problems)
        return report

    def repair(self) -> RepairReport:
        """Repair this store: keep every readable fact, fix or quarantine damaged rows, rebuild what is derived.

        In place when SQLite's own structure is sound (one transaction; other processes may stay open): damaged
        fact rows get their fields back from the change log (or U+FFFD for undecodable bytes) or go to the
        `quarantine` table with the reason; damaged vectors are cleared and embedded again; tag rows, the
        full-text index and the HNSW index are rebuilt. When the file itself is damaged, the store is closed, its
        files copied into `<db>.damaged-<time>/`, the readable rows salvaged into a new file (facts whose rows
        are lost come back from the change log) and the store reopened: that needs every other process closed.
        See store/repair.py.

        Returns:
            RepairReport (its ok is True when check() passes afterwards).
        Raises:
            StoreLocked: salvage is needed and another process has the store open (this store stays open).
            StoreCorrupt: salvage could not build a sound file (the original is left as it was).
        """
        from .repair import report_of, salvage_store

        self._check_writable("repair")
        before = self.check().problems
        if not before:
            return RepairReport(path=self._access.path, mode="nothing to repair", facts=len(self),
                                indexed=self._vectors.current.index.live_count)
        if self._access.memory:
            raise EvermindError("repair() needs a store file; an in-memory store has nothing to salvage.")
        try:
            counts, found = self._db.repair_rows(self._dim)
        except StoreCorrupt as exc:
            counts, found = None, [str(exc)]
        if counts is not None and found == ["ok"]:
            self._vectors.rebuild("repair()")
            try:
                self.flush()  # adopts the facts whose vectors were cleared, embeds them
            except EvermindError:
                pass  # the embedder failed on some: the report's check says which
            return report_of(self._access.path, "in place", counts, self, before)
        path, embedder, options = self._reopen_args
        self.close()
        try:
            return salvage_store(self._access.path, embedder, before, **{k: v for k, v in options.items()
                                                                          if k != "read_only"})
        finally:
            self.__init__(path, embedder, **options)

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
        return maintenance.backup(self._db, dest)

    def export(self, path: str | os.PathLike) -> int:
        """Write every fact as JSON lines (id, text, tags, source, created_at, updated_at; no vectors).

        Thread-safe; written to a temp file and renamed, so a crash leaves no half file.

        Args:
            path: the JSONL file to write (replaced if it exists).
        Returns:
            how many facts were written.
        """
        self._check_usable()
        return maintenance.export(self._db, path)

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
        return maintenance.import_records(self._db, self._vectors, maintenance.read_export(path))

    # ---- identity and info ---------------------------------------------------------------------------------
    @property
    def generations(self) -> Generations:
        """The model generation API (what serves; how a new model replaces it): see store/generations.py.

        Adaptation works through it; most programs never need it.
        """
        return self._gens

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the embedder whose vectors this store serves."""
        return self._vectors.current.fingerprint

    @property
    def embedder(self) -> Any:
        """The embedder in use."""
        return self._vectors.current.embedder

    @property
    def path(self) -> str:
        """The database path (or ":memory:")."""
        return self._path

    @property
    def read_only(self) -> bool:
        """Whether this is a read-only reader."""
        return self._access.read_only

    def info(self) -> dict:
        """A summary for humans and the CLI: sizes, identity, durability, SQLite version, index state."""
        self._check_usable()
        with self._db.reading() as r:
            facts = r.count()
            top = r.max_seq()
            waiting = r.count_waiting()
            judged = r.count_feedback()
        engine = self._db.describe()
        building = self._gens.build_progress()
        gen = self._vectors.current
        return {
            "path": self._access.path, "read_only": self._access.read_only, "durability": self._durability, "facts": facts,
            "indexed": gen.index.live_count, "index_elements": gen.index.element_count,
            "index_status": self._vectors.status, "index_watermark": gen.watermark, "max_seq": top,
            "fingerprint": gen.fingerprint, "dimensions": self._dim, "store_id": self._vectors.store_id,
            "schema_version": engine["schema_version"], "sqlite_version": engine["sqlite_version"],
            "sqlite_wal_reset_fixed": engine["sqlite_wal_reset_fixed"], "filesystem": self._fs_type,
            "hybrid_weight": self._hybrid_weight,
            "adapter": self._gens.active_adapter_id(), "adaptation_pending": self._gens.pending() is not None,
            "background_embedding": self._access.embeds_in_background, "waiting_vectors": waiting,
            "vector_error": self._worker.vector_error, "feedback": judged, "checkpoints": self._checkpoints.done,
            "building": None if building is None else building[0],
        }

    # ---- closing -------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Embed and index the waiting vectors, save the index if it changed, checkpoint, close SQLite.

        Idempotent. It does not raise for facts the embedder failed on (they stay lexical-only, check()
        reports them and any writer that opens the store next retries them): call flush() first to hear about
        them. A store still open when the interpreter exits is closed by an atexit hook, so a script that never
        calls close() exits normally and loses nothing.
        """
        if self._closed:
            return
        _open_stores.discard(self)
        ours = os.getpid() == self._pid
        adaptation = self._adaptation
        if adaptation is not None and ours:
            adaptation.stop(wait=True)  # its error, if any, stays for adaptation.join() to raise
        try:
            # Each step is best effort and never raises: what was acknowledged is committed already (a full disk,
            # a read-only directory or a damaged page met here loses nothing; the next open recovers).
            if self._worker.started and ours:
                try:
                    self._worker.wait()
                except Exception:  # noqa: BLE001
                    pass  # SQLite refused the writes (disk full): the facts wait in SQLite for any writer
                finally:
                    self._worker.stop()
            if ours and self._access.saves_index and self._vectors.unsaved:
                try:
                    self._vectors.save()
                except Exception:  # noqa: BLE001
                    pass  # the index is a cache: SQLite has everything, next open replays or rebuilds
            if ours:
                try:
                    self._checkpoints.at_close()
                except Exception:  # noqa: BLE001
                    pass  # another process checkpoints later (or the last one to close)
        finally:
            self._closed = True
            self._release()

    def _release(self) -> None:
        if self._db is not None:
            self._db.close()
        self._holder.retire()  # what it still owns (facts waiting, leases) may now be taken over at once

    def __del__(self) -> None:
        # A store dropped without close() (a notebook cell run again, a script's last line): free it without
        # waiting on anything. At interpreter exit the atexit hook has already closed it; if it runs during
        # finalisation anyway, touch no lock: a daemon thread frozen by the finalising interpreter may hold one
        # (waiting on it is what hung scripts that never called close()). Never raise from a finaliser.
        try:
            if getattr(self, "_closed", True) or os.getpid() != self._pid:
                return
            self._closed = True
            if sys.is_finalizing():
                return  # committed data is in the WAL; the OS closes the files
            if self._worker is not None:
                self._worker.signal_stop()
            self._release()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> "MemoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self._access.read_only else "writer")
        return f"MemoryStore({self._path!r}, {state}, fingerprint={self.fingerprint!r})"


_open_stores: "weakref.WeakSet[MemoryStore]" = weakref.WeakSet()  # closed by _close_all at interpreter exit


@atexit.register
def _close_all() -> None:
    """At exit (before daemon threads are frozen): close every store still open, so its waiting vectors are
    embedded, its index saved and its WAL checkpointed (nothing acknowledged is lost either way)."""
    for store in list(_open_stores):
        try:
            store.close()
        except Exception:  # noqa: BLE001 (exit must go on)
            pass
