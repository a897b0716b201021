"""The frozen dataclasses a MemoryStore returns: Fact, Recall, Change and CheckReport."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Fact:
    """One stored memory.

    Attributes:
        id: opaque string id.
        text: the text as given.
        tags: exact-match labels (str -> str).
        source: where the fact came from (provenance), or None.
        created_at / updated_at: UTC timestamps.
        fingerprint: the embedder fingerprint of the stored vector.
    """

    id: str
    text: str
    tags: dict[str, str]
    source: str | None
    created_at: datetime
    updated_at: datetime
    fingerprint: str | None = None


@dataclass(frozen=True)
class Recall:
    """One recall hit; higher `score` is better (its scale depends on the mode and fusion).

    Attributes:
        id, text, tags, source, created_at, updated_at: as in Fact.
        score: cosine (vector), BM25 (lexical), fused score (hybrid).
    """

    id: str
    text: str
    score: float
    tags: dict[str, str]
    source: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Change:
    """One entry of a fact's history: remember, update, forget or reembed.

    Attributes:
        seq: the store-wide monotonic change number.
        op: "remember", "update", "forget" or "reembed".
        at: UTC timestamp.
        text, tags, source: the fact as it was after the change (None for a forget).
    """

    seq: int
    op: str
    at: datetime
    text: str | None
    tags: dict[str, str] | None
    source: str | None


@dataclass(frozen=True)
class CheckReport:
    """What `MemoryStore.check()` found. `ok` is True when `problems` is empty.

    Attributes:
        ok: no problems.
        problems: human-readable findings.
        facts: live facts in SQLite.
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
