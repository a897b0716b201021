"""MemoryStore: the public front of a store. It checks every argument at the boundary and hands the work to
the rooms of store/: backend/ (all SQL), vectors.py (the HNSW cache and its catch-up), search.py (lexical,
vector, hybrid), embedding.py (the background vector worker), generations.py (model swaps), maintenance.py
(check, backup, export/import), access.py (who may write) and closing.py (how a store's life ends). It builds them
as one StoreParts (parts.py) and passes that to the modules that need more than one of them.
Adaptation (evermind_memory.adaptation) is imported only when it is used.

Writes commit to SQLite first (`BEGIN IMMEDIATE`, acknowledged only after COMMIT), then update the index; the
index on disk is a validated, replayable cache (docs/reliability.md R1-R14). Any number of processes open a store
read-write (and any number read-only): SQLite orders their commits, each process's index follows all of them
through the change feed before it answers, and leases (leases.py) pick the one process that runs each
background job. A store is its database file, whatever path names it (identity.py).
The write paths are in writer.py, the read arguments become one Selection in selection.py, scopes are scope.py.
`store.scope(user=...)` returns a view: a MemoryStore sharing this one's connections, confined to a scope.
"""

from __future__ import annotations

import builtins  # below `def list`, a bare `list` in an annotation names the method
import copy
import os
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from ..errors import EmbedderMismatch, EvermindError, FactNotFound, InvalidInput
from . import closing, maintenance
from .access import locate
from .memory_store_adaptation import AdaptationMethods
from .backend.base import FactRow, new_id, utc_now
from .damage import readable
from .embedding import load_model_aside, probe_embedder
from .filters import MatchAll
from .generations import Generations, ModelSwapped, resolve_embedder
from .index_config import IndexConfig, check_index_memory
from .memory_store_maintenance import MaintenanceMethods
from .parts import Opening, StoreParts, connect
from .records import Change, Fact, Recall
from .scope import narrow, scope_parts
from .search import STRICT_LABELS, LabelsMoved, hybrid_weight
from .selection import select
from .timing import DurationArg, TimeArg
from .validate import (
    MAX_LIST_LIMIT, check_flag, check_id, check_int, check_open_args, check_source, check_tag_patch, check_text,
    check_typed_tags,
)
from .writer import new_fact, not_found, reachable

if TYPE_CHECKING:
    from ..embedder.base import Embedder


FEEDBACK_LIMIT = 10_000  # judgements kept (the newest); each is a training pair for adaptation
T = TypeVar("T")
RECALL_ATTEMPTS = 5  # searches of one recall while other processes' commits keep moving labels (the last drops them)


class MemoryStore(MaintenanceMethods, AdaptationMethods):
    """A local memory with semantic recall.

    Thread-safety: every method may be called from any thread of the process that opened the store; writes
    are serialised, recalls run concurrently. Do not use a store in a forked child: open a new one there.

    Args:
        path: SQLite file (created if missing; its directory must exist), ":memory:", or a PostgreSQL URL
            "postgresql://user@host/db" (needs the `postgres` extra; password and TLS from the URL or libpq's
            environment: PGPASSWORD, PGSSLMODE, ~/.pgpass). Many nodes on many machines may open one database;
            see backend/postgres.py.
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
            (nothing stored). `remember_many()`, `update()`, `import_()` and remember with id= or dedup=True
            always embed before committing.
        namespace: confine this handle to one namespace (a scope level; see `scope()`): it sees and writes only
            that namespace's facts. None: the whole store.
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
        embedder: Embedder | None = None,
        *,
        read_only: bool = False,
        durability: str = "normal",
        on_mismatch: str = "reembed",
        lock_timeout: float = 10.0,
        index_config: IndexConfig | None = None,
        busy_timeout: float = 5.0,
        background_embedding: bool = True,
        namespace: str | None = None,
    ) -> None:
        path = check_open_args(path, durability, on_mismatch, lock_timeout, busy_timeout, read_only,
                               background_embedding)
        if index_config is not None and not isinstance(index_config, IndexConfig):
            raise InvalidInput("MemoryStore() expected index_config to be an IndexConfig, got "
                               f"{type(index_config).__name__}.")
        scope = "" if namespace is None else narrow("", "MemoryStore", namespace=namespace)
        access, fs_type = locate(path, read_only, background_embedding)
        from ..embedder.base import check_embedder  # (here, not at import: `import evermind_memory.store` stays light)

        embedder = resolve_embedder(embedder)
        dim, fingerprint = check_embedder(embedder)
        check_index_memory(index_config or IndexConfig(), dim)
        probe_embedder(embedder, dim)
        shown = path
        if access.remote:  # a URL is shown without its password (postgres.py is imported for a server only)
            from .backend.postgres import redact

            shown = redact(path)
        opening = Opening(path, shown, access, embedder, fingerprint, dim, durability, on_mismatch,
                          index_config or IndexConfig(), float(busy_timeout), fs_type, hybrid_weight(embedder))
        # a view (scope()) shares the parts and keeps this store (whose finaliser closes them) alive
        self._scope, self._root, self._owner, self._closed = scope, self, True, False
        self._parts: StoreParts = connect(opening, owner=self)

    # ---- guards --------------------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._closed or self._parts.closed:
            raise EvermindError("this MemoryStore is closed; open a new one.")
        if os.getpid() != self._parts.pid:
            raise EvermindError(
                f"this MemoryStore was opened in process {self._parts.pid} and cannot be used after fork (now "
                f"{os.getpid()}); "
                "open a new MemoryStore in the child."
            )

    def _check_writable(self, method: str) -> None:
        self._check_usable()
        self._parts.access.require_writer(method)

    def _following(self, write: Callable[[], T]) -> T:
        """write(), and when it met a model another process swapped in since this one last followed, follow the
        swap (as a recall would) and write once more: a process that only writes sees no error after an
        adaptation elsewhere."""
        try:
            return write()
        except ModelSwapped:
            self._parts.sync(index=self._parts.vectors.loaded)
            return write()

    def _check_owner(self, method: str) -> None:
        if not self._owner:
            raise InvalidInput(f"{method}() looks after the whole store; call it on the MemoryStore that opened the "
                               "store, not on a scope view.")

    # ---- writes --------------------------------------------------------------------------------------------
    def remember(self, text: str, *, tags: dict | None = None, source: str | None = None, id: str | None = None,
                 ttl: DurationArg | None = None, expires_at: TimeArg | None = None, pinned: bool = False,
                 dedup: bool = False, at: TimeArg | None = None) -> str:
        """Store a fact; returns only after it is committed (durable as `durability` says).

        By default (background_embedding=True) the vector follows from a background thread: lexical recall
        finds the fact at once, vector and hybrid recall wait for its vector, and `flush()` waits for it and
        raises if the embedder failed on it. With background_embedding=False, id= or dedup=True it is embedded
        before the commit. Thread-safe.

            fid = store.scope(user="ada").remember("Ada's flight is on Tuesday", tags={"n": 2}, ttl=86_400)

        Args:
            text: the fact (1..100,000 characters, no NUL or lone surrogates).
            tags: labels, str -> str, int, float or bool (filter them with tags= or where=).
            source: provenance label (who or what said it).
            id: your own id (1..128 characters): upsert. A fact with this id in this scope is replaced (text,
                tags, source, expiry, pin; its history keeps the old version, created_at stays); otherwise a new
                fact gets it.
            ttl: seconds (or a timedelta) until the fact expires; expired facts are never returned and `sweep()`
                (or the background sweeper) deletes them, history kept.
            expires_at: an aware datetime (or ISO 8601 text with an offset) instead of ttl.
            pinned: keep until forgotten: never expires (no ttl/expires_at) and recall's recency weight leaves it
                alone.
            dedup: return the id of a stored fact this one repeats (same scope, tags and source; close in
                meaning, most words shared, no differing number, name, date or negation: store/dedup.py) and
                store nothing; else store it. Expiry and pin are not compared: the stored fact keeps its own
                (remember(text, id=that_id, ttl=...) changes them).
            at: when the fact was said or observed (an aware datetime or ISO 8601 text with an offset, not in the
                future): its created_at, which since=/until= and recency read. Default now. Not with id=.
        Returns:
            the fact's id (the existing one for an upsert or a duplicate).
        Raises:
            InvalidInput: bad text, tags, source, id, ttl or expires_at; id with dedup; an expiry with pinned; an
            id used by a fact of another scope. EmbedderOutputInvalid: the embedder returned a bad vector
            (embedded before the commit: nothing is stored; in the background such a fact keeps no vector and
            `flush()` or the next vector/hybrid recall raises for it).
        """
        self._check_writable("remember")
        if at is not None and id is not None:
            raise InvalidInput("remember() takes at= for a new fact only; an upsert by id= keeps the fact's "
                               "created_at.")
        item = new_fact("remember", self._scope, text, tags, source, ttl, expires_at, pinned, at)
        if check_flag(dedup, "dedup", "remember"):
            if id is not None:
                raise InvalidInput("remember() takes id= (replace that fact) or dedup=True (find a duplicate), not "
                                   "both.")
            fid = self._following(lambda: self._parts.writer.insert_unique(item)[0])
        elif id is not None:
            fid = self._following(lambda: self._parts.writer.upsert(item._replace(id=check_id(id)), self._scope))
        elif self._parts.access.embeds_in_background:
            fid = self._parts.writer.insert_queued(item)
        else:
            fid = self._following(lambda: self._parts.writer.insert_embedded([item])[0])
        if item.expires_at is not None:
            self._parts.start_sweeper(item.expires_at)
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
        if self._parts.access.writes:
            self._parts.worker.adopt_orphans()  # facts a dead process left waiting: embedded here too
            self._parts.worker.wait()
            self._parts.worker.raise_failures("flush")
        self._parts.sync()

    def remember_many(self, texts: Sequence[str], *, tags: dict | None = None, source: str | None = None,
                      ttl: DurationArg | None = None, expires_at: TimeArg | None = None, pinned: bool = False,
                      at: TimeArg | None = None) -> list[str]:
        """Store many facts in one transaction (all or none), embedded before the commit.

        Thread-safe.

        Args:
            texts: the facts.
            tags, source, ttl, expires_at, pinned, at: as in remember(), applied to every fact.
        Returns:
            the new ids, in order.
        Raises:
            InvalidInput: a bad text (its position is named), tags, source or expiry.
            EmbedderOutputInvalid: the embedder returned a bad vector; nothing is stored.
        """
        self._check_writable("remember_many")
        if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
            raise InvalidInput(f"remember_many() expected a list of str, got {type(texts).__name__}.")
        checked = [check_text(t, f"texts[{i}]" if len(texts) > 1 else "text") for i, t in enumerate(texts)]
        if not checked:
            new_fact("remember_many", self._scope, "-", tags, source, ttl, expires_at, pinned, at)  # the others
            return []
        first = new_fact("remember_many", self._scope, checked[0], tags, source, ttl, expires_at, pinned, at)
        items = [first] + [first._replace(id=new_id(), text=t) for t in checked[1:]]
        ids = self._following(lambda: self._parts.writer.insert_embedded(items))
        if first.expires_at is not None:
            self._parts.start_sweeper(first.expires_at)
        return ids

    def remember_conversation(self, turns: Sequence[object], *, session: str, tags: dict | None = None,
                              source: str | None = None) -> list[str]:
        """Store a conversation's turns in one transaction (all or none), one fact each (store/conversation.py).

            store.scope(user="ada").remember_conversation(
                [{"speaker": "Ada", "text": "I fly to Lisbon on Tuesday", "at": "2026-12-01T09:30:00+00:00"},
                 ("Assistant", "Have a good trip!")], session="chat-41")

        Each turn is stored as "Speaker: text" with the tags session, turn (its number in the session, after the
        turns the session already holds here) and speaker, which filters can use (`where={"speaker": "Ada"}`),
        and its `at` (default now) as created_at; recall(..., context=N) returns a hit's neighbouring turns.

        Args:
            turns: {"speaker", "text"[, "at"]} mappings or (speaker, text) pairs, in order.
            session: the conversation's id (1..128 characters).
            tags, source: as in remember(), on every turn (tags may not set session, turn or speaker).
        Returns:
            the new ids, in order.
        Raises:
            InvalidInput: bad turns, session, tags, source or at. EmbedderOutputInvalid: as remember_many().
        """
        from .conversation import SESSION_TAG, check_session, check_turns, number_turns, turn_tags

        self._check_writable("remember_conversation")
        session, checked = check_session(session), check_turns(turns)
        items = [new_fact("remember_conversation", self._scope, f"{speaker}: {text}",
                          turn_tags(tags, session, i, speaker), source, None, None, False, at)
                 for i, (speaker, text, at) in enumerate(checked)]
        held = select("remember_conversation", self._scope, where={SESSION_TAG: session})
        # numbered in the write transaction, after the session's last turn in this very scope: two writers (or a
        # forgotten turn) cannot give two turns one number
        return self._following(lambda: self._parts.writer.insert_embedded(
            items, lambda tx, new: number_turns(new, [row for row in tx.list_rows(-1, 0, held)
                                                      if row.scope == self._scope])))

    def update(self, fact_id: str, text: str | None = None, *, tags: dict | None = None,
               source: str | None = None, replace_tags: bool = False) -> Fact:
        """Change a fact's text, tags or source (None leaves that part as it is).

        Tags are merged by default: `tags={"mood": "happy"}` sets that tag and keeps the others, and a None value
        removes its tag (`tags={"mood": None}`); with replace_tags=True the given tags replace all of them
        (`tags={}, replace_tags=True` removes every tag). The CLI (`update --tag`, `--replace-tags`) and the MCP
        tool (`update_memory(tags, replace_tags)`) do the same. A new text gets a new vector; the old one is never
        returned again. The scope, expiry and pin stay (remember(text, id=...) replaces those too). An update
        that changes nothing records nothing: no history entry, and updated_at (which recency reads) stays.
        Thread-safe.

            store.update(fid, tags={"mood": "happy", "draft": None})   # set one tag, remove another

        Args:
            fact_id: the fact.
            text: new text.
            tags: tags to merge in (None values remove), or with replace_tags=True the new tags.
            source: new source.
            replace_tags: replace every tag by `tags` instead of merging.
        Returns:
            the updated Fact.
        Raises:
            FactNotFound: no such fact in this scope (or it expired). InvalidInput: bad arguments, nothing to
                change, `tags={}` without replace_tags (it would merge nothing), or more than 32 tags after the merge.
        """
        self._check_writable("update")
        fact_id = check_id(fact_id)
        replace_tags = check_flag(replace_tags, "replace_tags", "update")
        if replace_tags and tags is None:
            raise InvalidInput("update(replace_tags=True) expected tags= as well (tags={} removes every tag).")
        if text is None and tags is None and source is None:
            raise InvalidInput("update() expected at least one of text, tags or source.")
        if tags is not None and not replace_tags and isinstance(tags, dict) and not tags:
            raise InvalidInput("update(tags={}) would merge nothing: tags are merged by default. To remove every tag, "
                               "call update(fact_id, tags={}, replace_tags=True); to remove one, tags={'key': None}.")
        new_text = None if text is None else check_text(text)
        new_tags = None if tags is None else (check_typed_tags(tags) if replace_tags else check_tag_patch(tags))
        source = check_source(source)
        return self._following(lambda: self._parts.writer.update(fact_id, self._scope, new_text, new_tags, source,
                                                                 merge=not replace_tags)).to_fact()

    def supersede(self, old_id: str, text: str, *, tags: dict | None = None, source: str | None = None) -> str:
        """Replace a fact by a new one: "moved to Zurich" supersedes "lives in Bern". One transaction.

        The new fact gets a new id, the old one's scope, and its tags, source, expiry and pin unless given; the
        old fact is forgotten. Both histories record the link: history(old_id) ends with a forget whose
        `replaced_by` is the new id, history(new_id) starts with a remember whose `replaces` is the old id.
        Thread-safe.

        Returns:
            the new fact's id.
        Raises:
            FactNotFound: no fact old_id in this scope. InvalidInput: bad text, tags or source.
        """
        self._check_writable("supersede")
        old_id = check_id(old_id)
        text = check_text(text)
        new_tags = None if tags is None else check_typed_tags(tags)
        source, fid = check_source(source), new_id()
        return self._following(lambda: self._parts.writer.supersede(old_id, self._scope, text, new_tags, source, fid))

    def forget(self, fact_id: str) -> None:
        """Remove a fact; it is never returned again (a tombstone stays in its history).

        Thread-safe.

        Args:
            fact_id: the fact.
        Raises:
            FactNotFound: no such fact in this scope.
        """
        self._check_writable("forget")
        self._parts.writer.forget(check_id(fact_id), self._scope)

    def forget_where(self, *, tags: dict | None = None, where: dict | None = None, source: str | None = None,
                     since: TimeArg | None = None, until: TimeArg | None = None) -> int:
        """Remove every fact of this scope that matches, in one transaction (tombstones stay in the history).

        Thread-safe.

        Args:
            tags, where, source, since, until: as in list(); at least one.
        Returns:
            how many facts were forgotten.
        Raises:
            InvalidInput: a bad filter, or none given (clear(confirm=True) forgets everything).
        """
        self._check_writable("forget_where")
        sel = select("forget_where", self._scope, tags=tags, where=where, source=source, since=since, until=until)
        if isinstance(sel.where, MatchAll):
            raise InvalidInput("forget_where() expected tags, where, source, since or until; to forget every fact of "
                               "this scope, call clear(confirm=True).")
        return self._parts.writer.forget_selected(sel)

    def clear(self, *, confirm: bool = False) -> int:
        """Forget every fact of this scope (the whole store when unscoped), in one transaction; history kept.

        Thread-safe.

        Args:
            confirm: must be True: a guard against clearing by accident.
        Returns:
            how many facts were forgotten.
        Raises:
            InvalidInput: confirm is not True.
        """
        self._check_writable("clear")
        if confirm is not True:
            raise InvalidInput("clear() forgets every fact of this scope; call clear(confirm=True) if you mean it.")
        return self._parts.writer.forget_selected(select("clear", self._scope))

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
            InvalidInput: bad query, id or useful. FactNotFound: no such fact in this scope.
        """
        self._check_writable("feedback")
        query = check_text(query, "query")
        fact_id = check_id(fact_id)
        useful = check_flag(useful, "useful", "feedback")
        self._parts.writer.feedback(query, fact_id, useful, self._scope, FEEDBACK_LIMIT)

    # ---- reads ---------------------------------------------------------------------------------------------
    def get(self, fact_id: str) -> Fact:
        """Fetch one fact. Thread-safe.

        Raises:
            FactNotFound: no such fact in this scope (or it expired). InvalidInput: not a valid id.
        """
        self._check_usable()
        fact_id = check_id(fact_id)
        with self._parts.db.reading() as r:
            row = r.fetch(fact_id)
        if not reachable(row, self._scope, utc_now()):
            raise not_found("get", fact_id)
        return row.to_fact()

    def list(self, *, limit: int = 100, offset: int = 0, tags: dict | None = None, where: dict | None = None,
             source: str | None = None, since: TimeArg | None = None, until: TimeArg | None = None) -> list[Fact]:
        """Facts of this scope in the order they were remembered, optionally filtered. Thread-safe.

        Args:
            limit: at most this many (1..100,000).
            offset: skip this many first.
            tags: tags every fact must carry, exactly (typed: {"n": 3} is not {"n": "3"}).
            where: a Chroma-style filter over tags, source, created_at and updated_at:
                {"topic": "travel", "n": {"$gte": 2}}, {"$or": [...]}; $eq $ne $gt $gte $lt $lte $in $nin $exists
                $and $or (store/filters.py has the whole language).
            source: exact source.
            since, until: inclusive bounds on created_at (aware datetimes or ISO 8601 text with an offset).
        Returns:
            list of Fact (never an expired one).
        Raises:
            InvalidInput: a bad limit, offset or filter (the message says which part, and where inside).
        """
        self._check_usable()
        limit = check_int(limit, "limit", 1, MAX_LIST_LIMIT, "list")
        offset = check_int(offset, "offset", 0, 2**62, "list")
        sel = select("list", self._scope, tags=tags, where=where, source=source, since=since, until=until)
        with self._parts.db.reading() as r:
            rows = r.list_rows(limit, offset, sel)
        return readable(rows, FactRow.to_fact, "list")

    def count(self, *, tags: dict | None = None, where: dict | None = None, source: str | None = None,
              since: TimeArg | None = None, until: TimeArg | None = None) -> int:
        """How many live facts of this scope match (all of them with no filter; `len(store)` is count()).

        Thread-safe. Args as in list(). Raises: InvalidInput: a bad filter.
        """
        self._check_usable()
        sel = select("count", self._scope, tags=tags, where=where, source=source, since=since, until=until)
        with self._parts.db.reading() as r:
            return r.count_selected(sel)

    def __len__(self) -> int:
        """The live (not expired) facts of this scope: count() with no filter."""
        return self.count()

    def history(self, fact_id: str) -> builtins.list[Change]:
        """Every change of a fact (remember, update, reembed, forget), oldest first. Thread-safe.

        A background-embedded fact's first vector is part of its "remember", not a change of its own. The
        history outlives the fact until compact() prunes it; a scope sees only its own facts' history.

        Raises:
            FactNotFound: the id was never used in this scope (or its history was compacted away).
        """
        self._check_usable()
        fact_id = check_id(fact_id)
        with self._parts.db.reading() as r:
            changes = r.history(fact_id, self._scope)
        if not changes:
            raise FactNotFound(f"history() found no fact with id {fact_id!r} here; it may belong to another scope, "
                               "or its history was compacted away.")
        return changes

    def recall(self, query: str, k: int = 5, *, tags: dict | None = None, where: dict | None = None,
               source: str | None = None, since: TimeArg | None = None, until: TimeArg | None = None,
               recency: DurationArg | None = None, mode: str = "hybrid", min_score: float | None = None,
               fusion: str = "score", min_relevance: float | None = None, explain: bool = False, context: int = 0,
               time_words: bool = False, now: TimeArg | None = None,
               rerank: bool | None = None) -> builtins.list[Recall]:
        """The facts of this scope that best match `query`, best first. Thread-safe.

            store.scope(user="ada").recall("Ada's travel plans", k=3, where={"year": {"$gte": 2025}})

        Args:
            query: what to look for.
            k: at most this many (1..1000); fewer when fewer facts match.
            tags, where, source, since, until: only facts that match, as in list(). Vector recall stays exact
                under any filter: small selections are searched exhaustively, large ones by filtered HNSW.
            recency: opt-in half-life (seconds or a timedelta): each score is weighted by 0.5 ** (age / half-life),
                age since the fact's last change (pinned facts are not weighted); drawn from a pool of
                max(50, 4k) candidates. None (the default): no weighting.
            mode: "hybrid" (BM25 and vector fused), "vector" (cosine) or "lexical" (FTS5 BM25).
            min_score: drop hits scoring below this (after the recency weight; the scale depends on mode and fusion).
            fusion: for hybrid: "score" (the embedder's fitted rule, store/fusion.py, else BM25 / best BM25 + w *
                cosine) or "rrf". min_relevance: (hybrid, fitted rule) drop hits whose relevance is below this.
            explain: (hybrid) fill each hit's `explain` with its lexical and vector parts and ranks.
            context: for a hit that is a conversation turn (remember_conversation), fill its `context` with the
                turns of its session from `context` before to `context` after it, itself included, in order
                (0 to 20; default 0: none).
            time_words: read the query's time words ("yesterday", "last week", "in May", "3 days ago":
                store/timewords.py) against `now` (default: the clock) and put the facts created in that span
                first: the best of them, then, if fewer than k, the best of the rest. Off by default.
            now: the time time_words count from (an aware datetime or ISO 8601 text); only with time_words.
            rerank: (hybrid, an embedder with a lexicon: the shipped one) reorder the best 30 hits by reading the
                query's words against each fact's words (store/rerank.py); each hit's score becomes the reranked
                score (min_score, min_relevance and explain still judge and show the hybrid score, and a floor only
                drops hits: the rest keep the scores and order they have without it). None (the default): only
                when the hits are short notes (median under 150 characters), where it helps; True: always (it
                costs some manual sources up to 0.014 ndcg@10); False: never.
        Returns:
            list of Recall (never an expired fact); `relevance` (0..1) is set in hybrid mode with a fitted rule.
        Raises:
            InvalidInput: bad query, k, filter, recency, mode, fusion, min_score, min_relevance (also outside hybrid
                mode, or with no fitted rule) or explain.
            EmbedderOutputInvalid, EvermindError: (vector and hybrid mode) the background embedding failed on
                a remembered fact since the last flush() or recall; raised once, as flush() would (the next
                recall serves results, without that fact's vector).
        """
        self._check_usable()
        q = self._parts.search.query(self._scope, query, k, tags=tags, where=where, source=source, since=since,
                                     until=until,
                               recency=recency, mode=mode, min_score=min_score, fusion=fusion,
                               min_relevance=min_relevance, explain=explain, rerank=rerank)
        if check_flag(time_words, "time_words", "recall") or now is not None or context:
            from .conversation import recall_around  # a plain recall (or several) with turns and time spans added

            return recall_around(self, query, k, dict(tags=tags, where=where, source=source, since=since, until=until,
                                                      recency=recency, mode=mode, min_score=min_score, fusion=fusion,
                                                      min_relevance=min_relevance, explain=explain, rerank=rerank),
                                 context=context, time_words=time_words, now=now)
        if q.mode != "lexical" and not self._parts.vectors.loaded:
            load_model_aside(self._parts.vectors.model.embedder)
        try:
            self._parts.sync(index=q.mode != "lexical")
        except EmbedderMismatch:
            if q.mode != "lexical":  # text needs no model: a lexical recall still answers
                raise
        if q.mode != "lexical" and self._parts.access.writes:
            self._parts.worker.wait()
            self._parts.worker.raise_failures("recall")
        for attempt in range(RECALL_ATTEMPTS):
            strict = STRICT_LABELS.set(q.mode != "lexical" and attempt < RECALL_ATTEMPTS - 1)
            try:
                with self._parts.vectors.serving(load=q.mode != "lexical") as gen:  # one generation (model, index)
                    hits = self._parts.search.recall(gen, q, self._parts.opening.hybrid_weight)
                break
            except LabelsMoved:  # another process's commit moved labels after the catch-up: catch up, ask again
                self._parts.sync(index=True)
            finally:
                STRICT_LABELS.reset(strict)
        return readable(hits, lambda hit: hit[0].to_recall(hit[1], *hit[2]), "recall")[:q.k]

    # ---- scopes --------------------------------------------------------------------------------------------
    def scope(self, *, namespace: str | None = None, user: str | None = None, agent: str | None = None,
              run: str | None = None) -> "MemoryStore":
        """A view of this store confined to a scope: it reads, changes and writes only that scope's facts.

            ada = store.scope(user="ada")
            ada.remember("prefers green tea"); ada.recall("tea")   # never another user's facts

        Levels nest in the order namespace, user, agent, run, and a view sees its own scope and those under it:
        scope(user="ada") sees scope(user="ada", agent="x")'s facts, never scope(user="bob")'s nor
        scope(agent="x")'s. A view of a view may only add levels below its last one. Views share this store's
        connections (cheap to make, thread-safe); closing one closes nothing else, closing the store ends them.
        Whole-store maintenance (check, rebuild_index, reembed, compact, backup, adaptation) refuses on a view.

        Args:
            namespace, user, agent, run: 1..128 characters, no "/" or control characters; at least one.
        Returns:
            a MemoryStore view.
        Raises:
            InvalidInput: no level, a bad value, or a level that would leave this handle's scope.
        """
        self._check_usable()
        key = narrow(self._scope, "scope", namespace=namespace, user=user, agent=agent, run=run)
        view = copy.copy(self)
        view._scope, view._closed, view._owner = key, False, False
        return view

    @property
    def scoped_to(self) -> dict[str, str]:
        """This handle's scope, e.g. {"user": "ada"} ({} for the whole store)."""
        return scope_parts(self._scope)

    # ---- identity and info ---------------------------------------------------------------------------------
    @property
    def generations(self) -> Generations:
        """The model generation API (what serves; how a new model replaces it): see store/generations.py.

        Adaptation works through it; most programs never need it.
        """
        return self._parts.gens

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the embedder whose vectors this store serves."""
        return self._parts.vectors.model.fingerprint

    @property
    def embedder(self) -> Embedder:
        """The embedder in use."""
        return self._parts.vectors.model.embedder

    @property
    def path(self) -> str:
        """The database path (or ":memory:")."""
        return self._parts.opening.shown

    @property
    def read_only(self) -> bool:
        """Whether this is a read-only reader."""
        return self._parts.access.read_only

    def info(self) -> dict:
        """A summary for humans and the CLI: sizes, identity, durability, SQLite version, index state."""
        self._check_usable()
        return maintenance.summary(self._parts, self.count(), self.scoped_to)

    # ---- closing -------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Embed and index the waiting vectors, save the index if it changed, checkpoint, close SQLite.

        Idempotent. It does not raise for facts the embedder failed on (they stay lexical-only, check()
        reports them and any writer that opens the store next retries them): call flush() first to hear about
        them. A store still open when the interpreter exits is closed by an atexit hook, so a script that never
        calls close() exits normally and loses nothing.
        """
        if self._owner:
            closing.close(self._parts)
        else:
            self._closed = True  # a view: the store it shares stays open

    def __del__(self) -> None:
        if self.__dict__.get("_owner") and "_parts" in self.__dict__:  # (not when __init__ raised)
            closing.drop(self._parts)  # a store dropped without close(): freed without waiting, never raising

    def __enter__(self) -> "MemoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed or self._parts.closed else (
            "read-only" if self._parts.access.read_only else "writer")
        scope = f", scope={self._scope!r}" if self._scope else ""
        return f"MemoryStore({self.path!r}, {state}{scope}, fingerprint={self.fingerprint!r})"



def parts_of(store: MemoryStore) -> tuple[StoreParts, str]:
    """An open store's (or view's) parts and scope key, for offline study (study.py); the store's own modules get
    the parts passed in."""
    return store._parts, store._scope
