"""The write paths of a store, behind MemoryStore's checked arguments: insert (queued for the background vector
worker, or embedded first), upsert by a caller's id, update, forget, supersede, remember-unless-duplicate,
feedback and sweep. Each commits one transaction under the backend's write mutex and mirrors it into the vector
cache.

A fact is reachable through a handle when its scope is the handle's or lies under it (store/scope.py) and it has
not expired: `reachable()` is the one test, so update, forget, supersede and feedback answer FactNotFound alike
for a fact that is gone, expired, or in another scope.

Many processes write one store: each commit records the head of the change feed before it (`before`), so the
vector cache mirrors it directly only when no other process committed in between (else it replays the feed);
vectors are refused when another process swapped the serving model (`Generations.require_serving`); a fact
queued without a vector names this store as its owner; after a commit the store may checkpoint the WAL.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeGuard

from .._crash import crash_point
from .._lazy import lazy_import
from ..errors import FactNotFound, InvalidInput
from .backend.base import Backend, FactRow, NewFact, new_id, utc_now
from .embedding import PENDING_MAX, VectorWorker, embed_serving, embed_texts
from .generations import Generations
from .checkpoints import Checkpoints
from .scope import visible
from .search import Search
from .selection import same_kind
from .timing import expiry, parse_time, time_text
from .validate import check_flag, check_source, check_text, check_typed_tags, merge_tags
from .vectors import VectorCache

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

if TYPE_CHECKING:  # (dedup.py is imported by the first remember(dedup=True))
    from .dedup import Decision

SWEEP_BATCH = 1000  # expired facts deleted per transaction


AT_SKEW = timedelta(minutes=1)  # how far in the future remember(at=...) may lie (clocks of other machines)


def new_fact(method: str, scope: str, text: object, tags: object, source: object, ttl: object, expires_at: object,
             pinned: object, at: object = None) -> NewFact:
    """remember()'s arguments checked into a NewFact in `scope`, remembered now (created at `at` when given: when
    it was said, for a conversation or a note written down later; a ttl then counts from now).

    Raises:
        InvalidInput: a bad text, tags, source, ttl, expires_at, pinned or at; an expiry with pinned=True.
    """
    text = check_text(text)
    tags = check_typed_tags(tags)
    source = check_source(source)
    now = datetime.now(timezone.utc)
    expires = expiry(ttl=ttl, expires_at=expires_at, now=now)
    pin = check_flag(pinned, "pinned", method)
    if pin and expires is not None:
        raise InvalidInput(f"{method}() got pinned=True with an expiry; a pinned fact never expires: drop one.")
    stamp = time_text(now if at is None else said_at(at, now, method))
    return NewFact(new_id(), text, tags, source, stamp, stamp, None if expires is None else time_text(expires),
                   pin, scope)


def said_at(at: object, now: datetime, method: str) -> datetime:
    """remember(at=...) checked: an aware time not later than now (plus AT_SKEW).

    Raises:
        InvalidInput: not a time with a timezone, or in the future.
    """
    when = parse_time(at, f"{method}(at=...)")
    if when > now + AT_SKEW:
        raise InvalidInput(f"{method}(at=...) is when the fact was said, at most now ({time_text(now)}); got "
                           f"{time_text(when)}. For a fact about the future, say so in its text or a tag.")
    return when


def reachable(row: FactRow | None, scope: str, now: str) -> TypeGuard[FactRow]:
    """Whether a handle scoped to `scope` may see or change `row` at `now` (ISO UTC)."""
    return row is not None and visible(row.scope, scope) and (row.expires_at is None or row.expires_at > now)


def _same_tags(a: dict, b: dict) -> bool:
    """Equal tags, types included (1, 1.0 and True are equal in Python, not as tags)."""
    return a.keys() == b.keys() and all(type(a[k]) is type(b[k]) and a[k] == b[k] for k in a)


def not_found(method: str, fact_id: str) -> FactNotFound:
    """The error of a fact this handle cannot reach."""
    return FactNotFound(f"{method}() found no fact with id {fact_id!r} here; it may have been forgotten, have "
                        "expired, or belong to another scope.")


class Writer:
    """Commits facts for one store (shared by the store and its scope views).

    Args:
        db: the backend.
        cache: the vector cache (its serving generation embeds inline writes).
        worker: the background vector worker (queued inserts).
        search: recall's searches (duplicate candidates).
        checkpoints: the store's WAL checkpoints (run after commits).
        owner: the token of the store that owns the facts it queues (leases.Owner.token).
    """

    def __init__(self, db: Backend, cache: VectorCache, worker: VectorWorker, search: Search, checkpoints: Checkpoints,
                 owner: str) -> None:
        self._db = db
        self._cache = cache
        self._worker = worker
        self._search = search
        self._checkpoints = checkpoints
        self._owner = owner

    def _retire(self, removed: list[int], before: int, top: int) -> None:
        self._cache.apply(np.zeros(0, dtype=np.int64), np.zeros((0, self._cache.dim), np.float32), removed, before, top)

    def _add(self, labels: list[int], vectors: np.ndarray, removed: list[int], before: int, top: int) -> None:
        self._cache.apply(np.array(labels, dtype=np.int64), vectors, removed, before, top)

    # ---- inserts -------------------------------------------------------------------------------------------
    def insert_queued(self, item: NewFact) -> str:
        """Commit one fact without a vector and queue it for the background worker (remember's default path)."""
        db = self._db
        with db.write_mutex:
            with db.transaction() as tx:
                (seq,), rid = tx.insert([item], None, None, self._owner)
                crash_point("remember.before_commit")
            crash_point("remember.after_commit")
            self._cache.advance(seq - 1, seq)  # nothing to index yet
            waiting = self._worker.add(rid, item.id, item.text)
        self._checkpoints.after_commit(seq)
        if waiting >= PENDING_MAX:
            self._worker.drain()  # back-pressure: the caller embeds when the thread falls behind
        else:
            self._worker.start()
        return item.id

    def insert_embedded(self, items: Sequence[NewFact], prepare: Callable[[Any, list[NewFact]], list[NewFact]]
                        | None = None) -> list[str]:
        """Embed the facts, then commit them with their vectors in one transaction (all or none). `prepare(tx,
        items)`, run inside that transaction before the insert, may change what the texts do not depend on (a
        conversation numbers its turns there, against the turns committed before it)."""
        texts = [item.text for item in items]
        made = embed_serving(self._cache, texts)  # before the mutex: an adaptation swap may change the model
        with self._db.write_mutex:
            gen, vectors = embed_serving(self._cache, texts, made)  # (N, D) by the model that serves now
            with self._db.transaction() as tx:
                Generations.require_serving(tx, gen.fingerprint, "remember")
                if prepare is not None:
                    items = prepare(tx, list(items))
                    if [item.text for item in items] != texts:
                        raise AssertionError("insert_embedded: prepare changed a text its vector was made from")
                labels, _ = tx.insert(list(items), vectors, gen.fingerprint)
                crash_point("remember.before_commit")
            crash_point("remember.after_commit")
            self._add(labels, vectors, [], labels[0] - 1, labels[-1])
        self._checkpoints.after_commit(labels[-1])
        return [item.id for item in items]

    def upsert(self, item: NewFact, scope: str) -> str:
        """remember(id=...): insert `item`, or replace the text, tags, source, expiry and pin of the fact with its id
        (history kept: an "update"). The fact keeps its scope and created_at.

        Raises:
            InvalidInput: the id belongs to a fact outside `scope`.
        """
        made = embed_serving(self._cache, [item.text])
        with self._db.write_mutex:
            gen, vectors = embed_serving(self._cache, [item.text], made)
            with self._db.transaction() as tx:
                Generations.require_serving(tx, gen.fingerprint, "remember")
                row = tx.fetch(item.id)
                if row is None:
                    labels, _ = tx.insert([item], vectors, gen.fingerprint)
                    seq, vector, removed = labels[0], vectors[0], None
                else:
                    if not visible(row.scope, scope):
                        raise InvalidInput(f"remember() got id={item.id!r}, which a fact outside this scope uses; "
                                           "choose another id.")
                    vector = None if item.text == row.text and row.fingerprint == gen.fingerprint else vectors[0]
                    seq, removed = tx.update(row, text=item.text, tags=item.tags, source=item.source, vector=vector,
                                             fingerprint=gen.fingerprint, now=item.updated_at,
                                             expires_at=item.expires_at, pinned=item.pinned)
                crash_point("remember.before_commit")
            self._mirror(seq, vector, removed)
        self._checkpoints.after_commit(seq)
        return item.id

    def _mirror(self, seq: int, vector: np.ndarray | None, removed: int | None) -> None:
        """Mirror a one-change commit (seq) that may have given a fact a vector and retired a label."""
        if vector is not None:
            self._add([seq], vector[None, :], [] if removed is None else [removed], seq - 1, seq)
        else:
            self._cache.advance(seq - 1, seq)

    def insert_unique(self, item: NewFact) -> tuple[str, Decision | None]:
        """remember(dedup=True): the id of a stored fact that `item` duplicates (store/dedup.py), else insert it.

        The candidates are the NEIGHBOURS nearest facts of the same scope, tags and source in this process's
        index, plus every such fact the index may not hold: changed after its watermark (by another process,
        say) or still waiting for a vector. They are read inside the write transaction, which holds the
        database's writer lock, so two threads or processes remembering the same fact store it once. Returns
        (id, the Decision when it was a duplicate, else None).
        """
        from .dedup import find_duplicate

        self._worker.wait()  # facts queued before this call get their vectors (outside the mutex: the worker takes it)
        self._cache.ensure_loaded()  # the candidates come from the index (loaded outside the mutex's readers)
        made = embed_serving(self._cache, [item.text])
        with self._db.write_mutex:
            gen, vectors = embed_serving(self._cache, [item.text], made)
            vec = vectors[0]  # (D,)
            with self._db.transaction() as tx:  # no other writer commits until this one ends
                found = find_duplicate(item.text, vec, self._candidates(tx, gen, vec, item))
                if found is None:
                    Generations.require_serving(tx, gen.fingerprint, "remember")
                    labels, _ = tx.insert([item], vectors, gen.fingerprint)
                    crash_point("remember.before_commit")
            if found is not None:
                return found[0], found[1]
            self._add(labels, vectors, [], labels[0] - 1, labels[-1])
        self._checkpoints.after_commit(labels[-1])
        return item.id, None

    def _candidates(self, tx, gen, vec: np.ndarray, item: NewFact) -> list[tuple[str, str, np.ndarray]]:
        """(id, text, vector) of the stored facts `item` could duplicate (inside the write transaction `tx`)."""
        from .dedup import NEIGHBOURS

        sel = same_kind(item.scope, item.tags, item.source, datetime.now(timezone.utc))
        near = [row for row, _ in self._search.rows_for(self._search.vector(gen, vec, NEIGHBOURS, sel))]
        seen = {row.id for row in near}
        recent = [row for row in tx.recent_selected(sel, gen.watermark) if row.id not in seen]
        rows = [row for row in near + recent if row.tags == item.tags]  # every tag equal, not only a superset
        labels, vecs = tx.vectors(gen.fingerprint, self._cache.dim,
                                  labels=[row.label for row in rows if row.label is not None])
        by_label = dict(zip(labels.tolist(), vecs))
        out = [(row.id, row.text, by_label[row.label]) for row in rows if row.label in by_label]
        missing = [row for row in rows if row.label not in by_label]  # waiting, or a vector of another model
        if missing:
            more = embed_texts(gen.embedder, [row.text for row in missing], self._cache.dim)  # (W, D)
            out += [(row.id, row.text, v) for row, v in zip(missing, more)]
        return out

    # ---- changes -------------------------------------------------------------------------------------------
    def update(self, fact_id: str, scope: str, text: str | None, tags: dict | None, source: str | None,
               merge: bool = False):
        """Change a reachable fact's text, tags or source (None keeps it); returns the new FactRow. With merge,
        `tags` is merged into the fact's tags in the same transaction (a None value removes its key)."""
        made = None if text is None else embed_serving(self._cache, [text])
        with self._db.write_mutex:
            gen, vector = self._cache.model, None
            if made is not None and text is not None:
                gen, vectors = embed_serving(self._cache, [text], made)  # again if the model changed meanwhile
                vector = vectors[0]  # (D,)
            with self._db.transaction() as tx:
                if vector is not None:
                    Generations.require_serving(tx, gen.fingerprint, "update")
                row = tx.fetch(fact_id)
                if not reachable(row, scope, utc_now()):
                    raise not_found("update", fact_id)
                if text is not None and text == row.text and row.fingerprint == gen.fingerprint:
                    vector = None  # same text, same embedder: keep the vector and its label
                if tags is not None and merge:
                    tags = merge_tags(row.tags, tags)
                if vector is None and text in (None, row.text) and source in (None, row.source) and (
                        tags is None or _same_tags(tags, row.tags)):
                    return row  # nothing changes: no history row, updated_at (which recency reads) stays
                seq, removed = tx.update(
                    row, text=row.text if text is None else text, tags=row.tags if tags is None else tags,
                    source=row.source if source is None else source, vector=vector, fingerprint=gen.fingerprint,
                    now=utc_now(), expires_at=row.expires_at, pinned=bool(row.pinned),
                )
                fact = tx.fetch(fact_id)
            self._mirror(seq, vector, removed)
        self._checkpoints.after_commit(seq)
        return fact

    def forget(self, fact_id: str, scope: str) -> None:
        """Forget one reachable fact (a tombstone stays in its history)."""
        with self._db.write_mutex:
            with self._db.transaction() as tx:
                row = tx.fetch(fact_id)
                if not reachable(row, scope, utc_now()):
                    raise not_found("forget", fact_id)
                before = tx.max_seq()
                removed = tx.delete([row], utc_now())
                top = tx.max_seq()
            self._retire(removed, before, top)
        self._checkpoints.after_commit(top)

    def forget_selected(self, sel) -> int:
        """Forget every fact `sel` selects, in one transaction; returns how many."""
        with self._db.write_mutex:
            with self._db.transaction() as tx:
                rows = tx.list_rows(-1, 0, sel)
                before = tx.max_seq()
                removed = tx.delete(rows, utc_now())
                top = tx.max_seq()
            self._retire(removed, before, top)
        self._checkpoints.after_commit(top)
        return len(rows)

    def supersede(self, old_id: str, scope: str, text: str, tags: dict | None, source: str | None,
                  new_id: str) -> str:
        """Replace a reachable fact by a new one (same scope; tags, source, expiry and pin kept unless given), in
        one transaction; the old fact's forget names the new id and the new fact's remember names the old."""
        made = embed_serving(self._cache, [text])
        with self._db.write_mutex:
            gen, vectors = embed_serving(self._cache, [text], made)
            now = utc_now()
            with self._db.transaction() as tx:
                Generations.require_serving(tx, gen.fingerprint, "supersede")
                old = tx.fetch(old_id)
                if not reachable(old, scope, now):
                    raise not_found("supersede", old_id)
                before = tx.max_seq()
                item = NewFact(new_id, text, old.tags if tags is None else tags,
                               old.source if source is None else source, now, now, old.expires_at, bool(old.pinned),
                               old.scope, replaces=old_id)
                labels, _ = tx.insert([item], vectors, gen.fingerprint)
                removed = tx.delete([old], now, replaced_by=new_id)
                top = tx.max_seq()
            self._add(labels, vectors, removed, before, top)
        self._checkpoints.after_commit(top)
        return new_id

    def feedback(self, query: str, fact_id: str, useful: bool, scope: str, keep: int) -> None:
        """Record a judgement of a reachable fact for `query`, keeping the newest `keep` judgements."""
        with self._db.write_mutex:
            with self._db.transaction() as tx:
                if not reachable(tx.fetch(fact_id), scope, utc_now()):
                    raise not_found("feedback", fact_id)
                tx.add_feedback(utc_now(), query, fact_id, useful, keep)

    def sweep(self, scope: str, now: datetime) -> int:
        """Forget (with history) every fact in `scope` that expired at or before `now`, SWEEP_BATCH per
        transaction; returns how many."""
        total = 0
        stamp = time_text(now)
        while True:
            with self._db.write_mutex:
                with self._db.transaction() as tx:
                    rows = tx.expired_rows(now, scope, SWEEP_BATCH)
                    before = tx.max_seq()
                    removed = tx.delete(rows, stamp) if rows else []
                    top = tx.max_seq()
                if rows:
                    self._retire(removed, before, top)
            if rows:
                self._checkpoints.after_commit(top)
            total += len(rows)
            if len(rows) < SWEEP_BATCH:
                return total
