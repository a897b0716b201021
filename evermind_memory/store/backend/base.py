"""The store's database seam: the rows the rest of the store reads (by name) and the interface a backend implements
(open_backend, in backend/__init__.py, picks the engine; the engines import this module, never the factory).

Every SQL statement of the store lives under this package; memory_store, vectors, search, embedding,
generations and maintenance only call the methods below. Two implementations: SQLite (`backend/sqlite.py`, a
file or ":memory:") and PostgreSQL (`backend/postgres.py`, `MemoryStore("postgresql://...")`), with the same
rows and meanings. A backend hands out sessions: `reading()`
(each statement its own snapshot), `snapshot()` (one consistent read transaction) and `transaction()` (one
write transaction, committed when the block ends, rolled back if it raises). Sessions are used only inside
their block and only by the thread that opened it.

The change log is the change feed: every change of a fact gets the next `seq` (monotonic, never reused), and
`max_seq()` / `changes_after()` let any vector cache catch up from its watermark (docs/reliability.md R3).
`prune_history()` (compact) deletes the changes of long-forgotten facts and records how far it went in meta
`history_pruned`: a cache whose watermark is below that cannot replay, and rebuilds.

Reads of facts take a `Selection` (scope, now, where-filter) and compile it with backend/filter_sql.py, so
every query carries the scope and expiry conditions the same way.

Many processes write one store. The database orders their commits (`transaction()` is serialised with every
other process's, and the change feed's seq with it); `write_mutex` only orders, inside one process, a commit
and its mirroring into that process's vector cache. Jobs that must run in one process at a time are claimed
through leases (`lease`, `set_lease`, `drop_lease`; the claim rules are in store/leases.py, run inside one
transaction), and a fact waiting for its vector names its owner (`adopt_waiting` takes over a dead one's).
`checkpoint()` folds the log back into the database where the engine has one (a no-op elsewhere).

On PostgreSQL, `transaction()` takes one advisory lock per store, so writers of every node commit one at a time
and seqs are handed out in commit order (a cache never skips a seq committed late); a lease claim runs inside
such a transaction; `follow()` wakes each node's cache through LISTEN/NOTIFY; `checkpoint()` does nothing.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, NamedTuple, Protocol, Sequence

from ..._lazy import lazy_import
from ...errors import RowDamaged
from ..filters import Filter, MatchAll
from ..records import Change, Fact, Recall
from ..scope import scope_parts

if TYPE_CHECKING:
    import numpy as np

    from ..adapter_history import AdapterLog
    from .codec import RepairCounts  # (codec.py imports this module)
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)


def utc_now() -> str:
    """Current UTC time as ISO 8601 text with microseconds (sorts as text)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def new_id() -> str:
    """A fresh opaque fact id: 32 hex digits, the milliseconds since the epoch (12) then 80 random bits (20).

    Ids made one after another sort by time, as UUIDv7's do, so an insert lands at the end of the id indexes (the
    facts' and the change log's) instead of on a random page of them: at a million facts a random id (uuid4) made
    each insert read and dirty a page that had left SQLite's cache (benchmarks/fact_ids.py: the last 100,000 of a
    million inserts 9.2 s with uuid4 ids, 1.1 s with these)."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def _tags(text: str) -> dict[str, str | int | float | bool]:
    return {} if text == "{}" else json.loads(text)  # most facts carry no tags: skip the JSON parser


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


class Selection(NamedTuple):
    """Which facts a read may see: those in `scope` (and, with `below`, the scopes under it) that are alive at
    `now` and match `where`. Every read of facts takes one; the front builds it (store/selection.py), so the
    scope and expiry conditions are never left out."""

    where: Filter  # MATCH_ALL: no condition of the caller's
    scope: str  # the scope key ("" with below: the whole store); see store/scope.py
    now: datetime  # aware UTC: facts with expires_at <= now are gone
    below: bool = True  # False: only facts whose scope is exactly `scope` (duplicate candidates)

    @property
    def narrows(self) -> bool:
        """Whether it selects fewer facts than "every live fact" (a scope or a where-filter)."""
        return bool(self.scope) or not self.below or not isinstance(self.where, MatchAll)


class FactRow(NamedTuple):
    """One stored fact as the backend holds it."""

    rid: int  # row id: insertion order, never reused
    id: str  # the public fact id
    text: str
    tags_json: str  # canonical JSON of the tags ("{}" for none)
    source: str | None
    created_at: str  # ISO 8601 UTC
    updated_at: str
    fingerprint: str | None  # the embedder that made `vector` (None while the fact waits for one)
    label: int | None  # the index label of its current vector (the seq that gave it), None while waiting
    seq: int  # the seq of its latest change
    expires_at: str | None  # ISO 8601 UTC; None: never
    pinned: int  # 1: kept until forgotten (never expires, no recency decay)
    scope: str  # the scope key ("": the whole store's own facts)

    @property
    def tags(self) -> dict[str, str | int | float | bool]:
        """The tags, parsed."""
        return _tags(self.tags_json)

    def _common(self) -> dict:
        """The fields Fact and Recall share, checked: a damaged row raises RowDamaged (store/damage.py)."""
        try:
            out: dict[str, Any] = dict(id=self.id, text=self.text, tags=self.tags, source=self.source,
                       created_at=_when("created_at", self.created_at),
                       updated_at=_when("updated_at", self.updated_at))
            reason = row_problem(out)
            out.update(expires_at=None if self.expires_at is None else _when("expires_at", self.expires_at),
                       pinned=bool(self.pinned), scope=scope_parts(self.scope))
        except (ValueError, TypeError, AttributeError) as exc:
            reason = str(exc) if str(exc).startswith("its ") else f"{type(exc).__name__}: {exc}"
        if reason is not None:
            raise RowDamaged(f"fact {self.id!r:.80} (row {self.rid}) is damaged: {reason}. Run store.repair() (from a "
                             "shell: `evermind repair PATH`, PATH the store's file): it fixes what it can and "
                             "quarantines the rest.", part="fact row")
        return out

    def to_fact(self) -> Fact:
        """The public Fact.

        Raises:
            RowDamaged: the row is unreadable.
        """
        return Fact(**self._common(), fingerprint=self.fingerprint)

    def to_recall(self, score: float, relevance: float | None = None, explain: Any = None) -> Recall:
        """The public Recall with `score` (and, from hybrid recall, `relevance` and an Explain).

        Raises:
            RowDamaged: the row is unreadable.
        """
        return Recall(score=float(score), relevance=relevance, explain=explain, **self._common())


def _when(name: str, text: str) -> datetime:
    """A stored timestamp, parsed; a ValueError names the field."""
    try:
        return datetime.fromisoformat(text)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"its {name} {text!r:.40} is not a timestamp ({exc})") from None


def utf8_text(text: str) -> bool:
    """Whether `text` is valid Unicode (no lone surrogates: the backend decodes damaged bytes to them)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def row_problem(fields: dict) -> str | None:
    """What is wrong with a fact's decoded fields (id, text, tags, source, created_at, updated_at), or None."""
    for name in ("id", "text"):
        value = fields[name]
        if not isinstance(value, str) or not value.strip():
            return f"its {name} is {type(value).__name__} {value!r:.40}, not text"
        if not utf8_text(value):
            return f"its {name} holds bytes that are not UTF-8"
    source = fields["source"]
    if source is not None and (not isinstance(source, str) or not utf8_text(source)):
        return f"its source is {source!r:.40}, not text"
    tags = fields["tags"]
    if not isinstance(tags, dict) or not all(isinstance(k, str) and utf8_text(k)
                                             and isinstance(v, (str, int, float, bool))
                                             and (not isinstance(v, str) or utf8_text(v)) for k, v in tags.items()):
        return f"its tags are {str(tags)[:60]!r}, not a JSON object of labels"
    for name in ("created_at", "updated_at"):
        if fields[name].tzinfo is None:
            return f"its {name} {fields[name].isoformat()!r} has no time zone"
    return None


class NewFact(NamedTuple):
    """A fact about to be inserted (Writes.insert)."""

    id: str
    text: str
    tags: dict[str, str | int | float | bool]
    source: str | None
    created_at: str  # ISO 8601 UTC
    updated_at: str
    expires_at: str | None = None  # ISO 8601 UTC; None: never
    pinned: bool = False
    scope: str = ""  # the scope key
    replaces: str | None = None  # supersede: the fact this one replaces (recorded in both histories)


class ChangeRow(NamedTuple):
    """One entry of the change feed, as a vector cache replays it."""

    seq: int
    vector_added: bool  # the change gave the fact a vector labelled `seq`
    label_removed: int | None  # the label whose vector the change retired


class StaleRow(NamedTuple):
    """A fact whose vector must be (re)made."""

    rid: int
    id: str
    text: str
    label: int | None  # its current label (retired when the new vector lands)


class LeaseRow(NamedTuple):
    """Who holds a lease, and until when."""

    owner: str  # store/leases.Owner token
    expires: float  # Unix time


class WaitingRow(NamedTuple):
    """A fact with no vector yet (background embedding's queue)."""

    rid: int
    id: str
    text: str


class Integrity(NamedTuple):
    """What the database's own checks found (maintenance turns it into CheckReport problems)."""

    messages: list[str]  # the engine's integrity check; ["ok"] when clean
    foreign_key_violations: int
    bad_vectors: int  # vectors of no readable byte length (vector_blobs.blob_lengths: int8, float16 or float32)
    fts_rows: int  # rows in the full-text index (must equal the facts)
    tags_out_of_sync: int  # facts whose tag rows disagree with their tags JSON


class GenerationRows(NamedTuple):
    """Facts as seen by a generation being built: the vectors it has, and the texts it still needs."""

    labels: np.ndarray  # (N,) int64 labels, ascending
    vectors: np.ndarray  # (N, D) float32: the new generation's vector, zeros where missing
    missing: list[tuple[int, str]]  # (position in labels, text) of the facts with no new vector yet


class FeedReads(Protocol):
    """The store's settings and its change feed: what a vector cache reads to catch up (store/vectors.py), and
    every part that reads a setting."""

    def meta(self, key: str) -> str | None:
        """A store-level setting (schema_version, store_id, fingerprint, dim, adapter state), or None."""

    def max_seq(self) -> int:
        """The newest change's seq (0 for a new store): the head of the change feed."""

    def changes_after(self, seq: int, upto: int) -> list[ChangeRow]:
        """The changes with seq in (seq, upto], oldest first: what a cache at watermark `seq` must replay."""

    def remembered_since(self, seq: int) -> int:
        """How many facts were remembered after change `seq`."""


class FactReads(Protocol):
    """Facts as rows: the front's get/list/count/history, the writer's lookups, maintenance's sweeps."""

    def count(self, fingerprint: str | None = None) -> int:
        """Live facts (only those whose vector has `fingerprint` when given)."""

    def fetch(self, fact_id: str) -> FactRow | None:
        """One fact by id, or None."""

    def fetch_where(self, column: str, values: Sequence) -> dict:
        """Facts whose `column` ("rid", "id" or "label") is in `values`, keyed by that column."""

    def list_rows(self, limit: int, offset: int, sel: Selection) -> list[FactRow]:
        """Facts in insertion order that `sel` selects; limit -1: all."""

    def count_selected(self, sel: Selection, fingerprint: str | None = None) -> int:
        """Facts that `sel` selects (only those whose vector has `fingerprint` when given)."""

    def history(self, fact_id: str, scope: str) -> list[Change]:
        """Every change of one fact made in `scope` or under it, oldest first (a first vector arriving is part of
        its remember)."""

    def expired_rows(self, now: datetime, scope: str, limit: int) -> list[FactRow]:
        """Up to `limit` facts in `scope` (or under it) that expired at or before `now`, oldest expiry first."""

    def recent_selected(self, sel: Selection, seq: int) -> list[FactRow]:
        """Facts `sel` selects that changed after change `seq` or have no vector yet: what an index at watermark
        `seq` may not hold (duplicate candidates)."""


class VectorReads(Protocol):
    """Stored vectors and their labels: the cache's loads, exact and filtered vector search."""

    def vectors(self, fingerprint: str, dim: int, *, labels: Sequence[int] | None = None,
                sel: Selection | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(labels (N,), vectors (N, D)) of facts with `fingerprint`, optionally only `labels` or those `sel`
        selects. Vectors of the wrong length are left out."""

    def labels(self, fingerprint: str | None) -> set[int]:
        """Labels of facts whose vector has `fingerprint` (None: every labelled fact)."""

    def selected_labels(self, sel: Selection, fingerprint: str) -> np.ndarray:
        """(N,) labels of the facts with `fingerprint` that `sel` selects (a filtered HNSW search's allow-list)."""

    def expired_labels(self, fingerprint: str, now: datetime) -> set[int]:
        """Labels of facts with `fingerprint` whose expiry is at or before `now` (not swept yet)."""


class CatchUpReads(FeedReads, VectorReads, Protocol):
    """What a vector cache reads to catch up (store/vectors.py): the change feed, then the vectors it added."""


class LexicalReads(Protocol):
    """Full-text search and its statistics (store/search.py)."""

    def lexical(self, words: list[str], limit: int, sel: Selection) -> list[tuple[FactRow, float]]:
        """Full-text search for `words` (store/lexical.query_words) among the facts `sel` selects: (row, score)
        best first, higher is better."""

    def document_frequencies(self, words: list[str], sel: Selection | None = None) -> list[int]:
        """For each of `words` (store/lexical.query_words), how many facts hold it (of those `sel` selects, when
        given and narrowing): the idf hybrid fusion reads."""

    def selection_size(self, sel: Selection) -> tuple[int, int]:
        """(facts, tokens) that `sel` selects: the statistics lexical recall scores a narrowing selection with."""


class QueueReads(Protocol):
    """Facts whose vector is missing or from another model: the background worker's queue and reembed's."""

    def stale(self, fingerprint: str | None, limit: int, *, after_rid: int = 0,
              include_waiting: bool = True) -> list[StaleRow]:
        """Facts after `after_rid` (by rid) whose vector is not from `fingerprint` (and, with include_waiting,
        those with none); every fact for fingerprint None."""

    def count_stale(self, fingerprint: str, include_waiting: bool = True) -> int:
        """How many facts `stale(fingerprint, ...)` would return in all."""

    def count_foreign(self, fingerprint: str) -> int:
        """Facts with a vector made by another embedder (a model mismatch, unlike facts waiting for one)."""

    def waiting(self) -> list[WaitingRow]:
        """Facts with no vector yet, oldest first."""

    def waiting_owners(self) -> dict[str | None, int]:
        """How many facts with no vector yet each owner has (None: facts from before owners were recorded, or
        left to anyone)."""

    def still_waiting(self, rids: Sequence[int]) -> dict[int, str]:
        """rid -> text of those of `rids` that still have no vector (not forgotten, not updated since)."""

    def count_waiting(self) -> int:
        """Facts with no vector yet."""


class LeaseReads(Protocol):
    """Who holds a lease (store/leases.py)."""

    def lease(self, name: str) -> LeaseRow | None:
        """The current claim on lease `name` (possibly expired), or None."""


class LearningReads(Protocol):
    """What an adaptation round learns from (store/adapter_state.py)."""

    def memory_texts(self, fingerprint: str, dim: int) -> tuple[np.ndarray, list[str]]:
        """(labels (N,), texts) of every fact with a valid vector of `fingerprint`, by label (what adaptation
        learns from; their vectors come from `vectors(..., labels=...)`)."""

    def feedback_pairs(self, fingerprint: str) -> list[tuple[str, int]]:
        """(query, label) of every query whose latest judgement of a fact with a current vector is "useful"."""

    def count_feedback(self) -> int:
        """Judgements kept."""


class GenerationReads(Protocol):
    """The generation being built (store/generations.py)."""

    def generation_missing(self, fingerprint: str, after: int, limit: int) -> list[tuple[int, str]]:
        """(label, text) of facts after label `after` with no vector yet in the generation `fingerprint`."""

    def generation_rows(self, fingerprint: str, dim: int, labels: Sequence[int] | None = None) -> GenerationRows:
        """Every labelled fact (or only `labels`) with its vector in the generation `fingerprint`, if it has one."""

    def generation_count_missing(self, fingerprint: str) -> int:
        """Labelled facts with no vector in the generation `fingerprint` (all of them while none is being built)."""


class CheckReads(Protocol):
    """What check(), stats() and export read (store/maintenance.py)."""

    def sizes(self) -> dict:
        """Counts and bytes for stats(): facts, expired, pinned, changes, forgotten, page bytes, free bytes."""

    def export_rows(self) -> Iterator[FactRow]:
        """Every fact in insertion order (use inside `snapshot()` for a consistent copy)."""

    def integrity(self, dim: int) -> Integrity:
        """Run the database's structural checks (use inside `snapshot()`)."""


class Reads(FeedReads, FactReads, VectorReads, LexicalReads, QueueReads, LeaseReads, LearningReads, GenerationReads,
            CheckReads, Protocol):
    """Queries every session answers: the union of the roles above. A part that reads only some of them names
    those roles in its signatures; `Backend.reading()` and `snapshot()` hand out the whole."""


class Writes(Reads, Protocol):
    """Changes; only inside `Backend.transaction()`, so each call commits with the others or not at all."""

    def set_meta(self, key: str, value: str) -> None:
        """Set a store-level setting."""

    def delete_meta(self, *keys: str) -> None:
        """Remove store-level settings (absent keys are ignored)."""

    def insert(self, items: Sequence[NewFact], vectors: np.ndarray | None, fingerprint: str | None,
               owner: str | None = None) -> tuple[list[int], int]:
        """Add facts. Each gets the next seq, which is also its label when `vectors` (N, D) are given; with
        None they wait for one, owned by `owner` (the store that will embed them). Returns (seqs, first new rid)."""

    def adopt_waiting(self, old_owner: str | None, new_owner: str | None) -> list[WaitingRow]:
        """Make `new_owner` the owner of every fact waiting for a vector under `old_owner`; returns them. None as
        either owner: no owner (facts any writer's worker embeds)."""

    def set_lease(self, name: str, owner: str, expires: float) -> None:
        """Record `owner`'s claim on lease `name` until `expires` (Unix time)."""

    def drop_lease(self, name: str, owner: str) -> None:
        """Remove `owner`'s claim on lease `name` (nothing when another owner holds it)."""

    def update(self, row: FactRow, *, text: str, tags: dict, source: str | None, vector: np.ndarray | None,
               fingerprint: str | None, now: str, expires_at: str | None, pinned: bool) -> tuple[int, int | None]:
        """Change one fact; a new vector gets a new label (R8). Returns (seq, label retired or None)."""

    def delete(self, rows: Sequence[FactRow], now: str, replaced_by: str | None = None) -> list[int]:
        """Forget facts (tombstones stay in the change feed; their feedback goes). Returns the labels retired.
        `replaced_by`: the fact that supersedes them (recorded in their history)."""

    def prune_history(self, before: str, upto: int) -> int:
        """Delete the change rows of facts forgotten before `before` (ISO UTC) whose seq is below `upto`, and
        record the highest seq pruned in meta `history_pruned`. Returns how many rows went."""

    def set_vectors(self, rows: Sequence[tuple[int, str, int | None]], vectors: np.ndarray, fingerprint: str,
                    now: str) -> list[tuple[int, int | None]]:
        """Give each (rid, id, old label) a new vector and label. Returns [(new label, old label)]."""

    def add_feedback(self, at: str, query: str, fact_id: str, useful: bool, limit: int) -> None:
        """Record a judgement and keep only the newest `limit`."""

    def generation_begin(self, fingerprint: str, labels: np.ndarray | None, vectors: np.ndarray | None) -> None:
        """Start (or continue) building the generation `fingerprint`: drop other generations' vectors, keep
        its own, and store the (labels, vectors) given."""

    def generation_store(self, fingerprint: str, labels: Sequence[int], vectors: np.ndarray) -> None:
        """Store vectors of the generation `fingerprint` (replacing any for the same labels)."""


    def generation_adopt(self, fingerprint: str) -> None:
        """Make the generation's vectors the facts' vectors (every fact with a vector then carries `fingerprint`;
        one still waiting for its first vector is left as it is)."""

    def generation_drop(self) -> None:
        """Forget the generation being built (its vectors)."""


class Backend(Protocol):
    """One store's database: sessions, the in-process write mutex, backup and close."""

    path: str
    memory: bool  # ":memory:": nothing on disk, nothing shared with other processes
    read_only: bool
    write_mutex: Any  # an RLock: held across a commit and its mirroring into this process's vector cache

    @property
    def closed(self) -> bool:
        """Whether close() was called."""

    def reading(self) -> ContextManager[Reads]:
        """A session for reads; each statement sees the latest commit."""

    def snapshot(self) -> ContextManager[Reads]:
        """A session whose reads all see one consistent state."""

    def transaction(self) -> ContextManager[Writes]:
        """A write transaction (serialised with every other writer, in every process), committed when the block
        ends. Raises StoreMoved (store/identity.py) when the file was replaced since it was opened."""

    def checkpoint(self) -> tuple[int, int]:
        """Fold the write-ahead log back into the database while no one commits; (log frames, frames copied).
        Callers hold the "checkpoint" lease. A backend without such a log returns (0, 0)."""

    def describe(self) -> dict:
        """Engine facts for info(): schema_version, and the engine's name, version and known-bug status."""

    def fts_integrity(self) -> str | None:
        """The full-text index's own deep check (a writer only): None when it passes, else the error."""

    def count_damaged(self, dim: int) -> tuple[int, int, str | None]:
        """(fact rows a read would skip, damaged vectors, the first reason), changing nothing."""

    def repair_rows(self, dim: int) -> tuple[RepairCounts, list[str]]:
        """Repair in place in one transaction (fix or quarantine damaged rows, rebuild derived tables); returns
        (counts, the engine's integrity findings afterwards: ["ok"] when sound)."""

    def backup(self, dest: str) -> None:
        """Write a consistent copy of the database to the new file `dest` while the store stays live."""

    def vacuum(self) -> None:
        """Rewrite the database without its free pages (VACUUM; a writer only). Where the engine has a log, the
        file shrinks at the next checkpoint()."""

    def file_bytes(self) -> dict:
        """{"db": bytes, "wal": bytes} of the database files (0 for ":memory:")."""

    def save_postings(self, *, claim: Callable[[], bool] = lambda: True, force: bool = False) -> bool:
        """Rewrite the lexical postings saved beside the database when due (store/postings_file.py), or with
        `force` whenever the store is large enough for one, asking `claim()` (a lease) first; True when written.
        A backend that ranks lexical recall another way returns False. Raises OSError and the engine's errors."""

    def follow(self, callback: Callable[[int], None]) -> None:
        """Call `callback(head)` from a thread of the backend's whenever another process may have committed (a
        server's notifications, with a poll as fallback; head -1: unknown). A backend whose processes share one
        machine and file does nothing: each answer reads the head itself."""

    def adapters(self) -> AdapterLog | None:
        """Where the store's adapters live: None for files beside the database (`<db>.adapters/`), else the
        history (store/adapter_history.AdapterLog: entries, get, add, update, load) keeping them in the database."""

    def close(self) -> None:
        """Close every connection (idempotent)."""


def is_server_url(path: str) -> bool:
    """Whether a store path names a database server (postgresql:// or postgres://) rather than a file."""
    return isinstance(path, str) and path.startswith(("postgresql://", "postgres://"))


__all__ = [
    "Backend", "CatchUpReads", "ChangeRow", "CheckReads", "FactReads", "FactRow", "FeedReads", "GenerationReads",
    "GenerationRows", "Integrity", "LearningReads", "LeaseReads", "LeaseRow", "LexicalReads", "NewFact", "QueueReads",
    "Reads", "Selection", "StaleRow", "VectorReads", "WaitingRow", "Writes", "is_server_url", "new_id", "row_problem",
    "utc_now",
]
