"""The frozen dataclasses a MemoryStore returns: Fact, Recall (with Explain), Change and CheckReport."""

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
    """

    rule: str
    lexical: float
    vector: float
    fused: float
    bm25: float | None
    cosine: float | None
    lexical_rank: int | None
    vector_rank: int | None


@dataclass(frozen=True)
class Recall:
    """One recall hit; higher `score` is better (its scale depends on the mode and fusion).

    Attributes:
        id, text, tags, source, created_at, updated_at: as in Fact.
        score: cosine (vector), BM25 (lexical), fused score (hybrid).
        relevance: (hybrid mode, embedders with a fitted rule, such as the shipped model) the calibrated
            probability, in [0, 1], that this fact is what the query asks for; None otherwise. Unlike `score` it
            means the same across queries and stores, so it is what a threshold (`min_relevance`) should use.
        explain: with `recall(..., explain=True)` in hybrid mode, how the score was made (Explain); else None.
    """

    id: str
    text: str
    score: float
    tags: dict[str, str]
    source: str | None
    created_at: datetime
    updated_at: datetime
    relevance: float | None = None
    explain: Explain | None = None


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
    """

    ok: bool
    problems: tuple[str, ...] = field(default_factory=tuple)
    facts: int = 0
    indexed: int = 0
    stale_vectors: int = 0
    waiting_vectors: int = 0
    max_seq: int = 0
    fingerprint: str | None = None
