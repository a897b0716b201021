"""The frozen dataclasses a MemoryStore returns: Fact, Recall (with Explain), Change, CheckReport, DuplicatePair and
StoreStats."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Fact:
    """One stored memory.

    Attributes:
        id: opaque string id (chosen by the store, or by the caller with remember(id=...)).
        text: the text as given.
        tags: labels, str -> str, int, float or bool (filter them with tags= or where=).
        source: where the fact came from (provenance), or None.
        created_at / updated_at: UTC timestamps.
        fingerprint: the embedder fingerprint of the stored vector.
        expires_at: UTC time after which the fact is gone (ttl / expires_at), or None: never.
        pinned: kept until forgotten (never expires, not decayed by recency).
        scope: the scope it was remembered in, e.g. {"user": "ada"} ({} for the whole store's own facts).
    """

    id: str
    text: str
    tags: dict[str, str | int | float | bool]
    source: str | None
    created_at: datetime
    updated_at: datetime
    fingerprint: str | None = None
    expires_at: datetime | None = None
    pinned: bool = False
    scope: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Explain:
    """How a hybrid hit was scored (`recall(..., explain=True)`).

    Attributes:
        rule: "learned" (the embedder's fitted rule), "weight" (BM25 over the best BM25 + weight x cosine, for
            embedders without one) or "rrf" (reciprocal ranks).
        lexical: the lexical part of the fused score.
        vector: the vector part of the fused score.
        fused: lexical + vector: the hit's `score`.
        bm25: the fact's BM25 for the query (FTS5's rank negated), None when it was not in the lexical list.
        cosine: the cosine of the fact's vector to the query's, None when it has no vector.
        lexical_rank, vector_rank: 1-based rank in each list, None when not in it.
        word_match: when the hit was reranked (store/rerank.py), its word match; its `score` is then `fused` min-max
            scaled over the reranked hits plus 0.5 x this. None when it was not reranked (a hit past the reranked
            ones keeps its place, its score scaled the same way).
    """

    rule: str
    lexical: float
    vector: float
    fused: float
    bm25: float | None
    cosine: float | None
    lexical_rank: int | None
    vector_rank: int | None
    word_match: float | None = None


@dataclass(frozen=True)
class Recall:
    """One recall hit; higher `score` is better (its scale depends on the mode and fusion).

    Attributes:
        id, text, tags, source, created_at, updated_at, expires_at, pinned, scope: as in Fact.
        score: cosine (vector), BM25 (lexical), fused score (hybrid); times the recency weight when asked for.
        relevance: (hybrid mode, embedders with a fitted rule, such as the shipped model) the calibrated
            probability, in [0, 1], that this fact is what the query asks for; None otherwise. Unlike `score` it
            means the same across queries and stores, so it is what a threshold (`min_relevance`) should use.
        explain: with `recall(..., explain=True)` in hybrid mode, how the score was made (Explain); else None.
        context: with `recall(..., context=N)`, for a conversation turn (store.remember_conversation), the turns
            of its session from N before to N after it (Facts, itself included, in turn order); else ().
    """

    id: str
    text: str
    score: float
    tags: dict[str, str | int | float | bool]
    source: str | None
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None
    pinned: bool = False
    scope: dict[str, str] = field(default_factory=dict)
    relevance: float | None = None
    explain: Explain | None = None
    context: tuple = ()  # recall(..., context=N): the Facts of a conversation turn's neighbourhood, in order


@dataclass(frozen=True)
class Change:
    """One entry of a fact's history: remember, update, forget or reembed.

    Attributes:
        seq: the store-wide monotonic change number.
        op: "remember", "update", "forget" or "reembed".
        at: UTC timestamp.
        text, tags, source: the fact as it was after the change (None for a forget).
        replaces: (a remember by supersede) the id of the fact this one replaced.
        replaced_by: (a forget by supersede) the id of the fact that replaced this one.
    """

    seq: int
    op: str
    at: datetime
    text: str | None
    tags: dict[str, str | int | float | bool] | None
    source: str | None
    replaces: str | None = None
    replaced_by: str | None = None


@dataclass(frozen=True)
class CheckReport:
    """What `MemoryStore.check()` found. `ok` is True when `problems` is empty.

    Attributes:
        ok: no problems.
        problems: human-readable findings.
        facts: fact rows in SQLite (expired ones the sweeper has not deleted yet included; count() leaves them out).
        indexed: live vectors in the HNSW index.
        stale_vectors: facts whose vector was made by another embedder.
        waiting_vectors: facts with no vector yet (a writer's check waits for its background embedding first,
            so there these are facts the embedder failed on).
        max_seq: the highest change sequence.
        fingerprint: the store's current embedder fingerprint.
        building: a new generation part way built (a re-embed into another model, an adaptation publish, a
            rollback), how far, and by whom; None when there is none. Not a problem: the complete current
            generation serves until the swap, and a build whose process died resumes when a writer with that
            model opens the store (or at the next adaptation round).
        damaged_rows: fact rows reads skip because a field cannot be decoded (repair() fixes or quarantines them).
    """

    ok: bool
    problems: tuple[str, ...] = field(default_factory=tuple)
    facts: int = 0
    indexed: int = 0
    stale_vectors: int = 0
    waiting_vectors: int = 0
    max_seq: int = 0
    fingerprint: str | None = None
    building: str | None = None
    damaged_rows: int = 0


@dataclass(frozen=True)
class RepairReport:
    """What a repair did.

    Attributes:
        path: the store's database file.
        mode: "in place", "salvaged" (rows copied into a new file) or "nothing to repair".
        facts: facts in the store afterwards.
        fixed: fact rows kept with a field repaired (from the change log, or U+FFFD for undecodable bytes).
        quarantined: fact rows that could not be kept: moved to the `quarantine` table with the reason.
        restored: facts whose row was lost, restored from the change log (salvage).
        vectors_cleared: damaged vectors cleared and embedded again.
        unreadable_reads: reads of the damaged file that failed and were stepped over (salvage).
        indexed: vectors in the rebuilt index.
        kept_aside: the folder holding the damaged original files (salvage), else None.
        problems_before, problems_after: what check() (or opening) reported before and after.
        notes: the first repairs, row by row.
    """

    path: str
    mode: str
    facts: int = 0
    fixed: int = 0
    quarantined: int = 0
    restored: int = 0
    vectors_cleared: int = 0
    unreadable_reads: int = 0
    indexed: int = 0
    kept_aside: str | None = None
    problems_before: tuple[str, ...] = ()
    problems_after: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """Whether the store passes check() now."""
        return not self.problems_after


@dataclass(frozen=True)
class DuplicatePair:
    """Two stored facts of one scope, tags and source of which the newer repeats the older (`duplicates()`).

    Attributes:
        keep: the older fact's id (what remember(dedup=True) would have returned).
        drop: the newer fact's id (forget it, or supersede the older one with it).
        keep_text, drop_text: their texts.
        cosine: cosine of their vectors.
        overlap: Jaccard overlap of their content words.
        reason: why the rule calls them duplicates.
    """

    keep: str
    drop: str
    keep_text: str
    drop_text: str
    cosine: float
    overlap: float
    reason: str


@dataclass(frozen=True)
class StoreStats:
    """What a store holds and what it costs on disk (`stats()`); `compact()` brings the history and free pages down.

    Attributes:
        facts: live facts (not expired) in the handle's scope.
        expired: facts past their expiry that sweep() has not removed yet (the whole store).
        pinned: pinned facts (the whole store).
        changes: rows of history (the whole store); each remember/update keeps its text.
        forgotten: ids whose history remains after they were forgotten (compact(keep_history=...) prunes them).
        db_bytes, wal_bytes, index_bytes: the database file, its write-ahead log, and the files beside it that can
            be rebuilt from it (the HNSW snapshot with its groups and manifest, the saved lexical postings).
        free_bytes: pages inside the database file that are free (reused by new writes; VACUUM returns them).
    """

    facts: int
    expired: int
    pinned: int
    changes: int
    forgotten: int
    db_bytes: int
    wal_bytes: int
    index_bytes: int
    free_bytes: int
