"""The change feed and SQLite set against a process's vector index (vectors.py keeps the index; these read the
database for it): replaying a stretch of the feed, whether compaction pruned past a watermark, and comparing the
index's labels and vectors with the stored ones, whole (check()) or a range of labels at a time (the paced pass)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_import
from .backend.base import CatchUpReads, FeedReads, VectorReads
from .index import VectorIndex
from .index_nodes import NEAR_TOL

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)


def between(labels: np.ndarray, lo: int, hi: int | None) -> np.ndarray:
    """The part of the sorted `labels` from lo (included) up to hi (excluded; None: no upper end)."""
    a = int(np.searchsorted(labels, lo, side="left"))
    b = len(labels) if hi is None else int(np.searchsorted(labels, hi, side="left"))
    return labels[a:b]


def replay(index: VectorIndex, labels: np.ndarray, vectors: np.ndarray, removed: list[int]) -> None:
    """Apply a stretch of the change feed to `index`: retire `removed`, add the (N, D) `vectors` under `labels`
    (N,) that it does not hold yet (a change this index already mirrored is skipped)."""
    index.mark_deleted(removed)
    fresh = np.array([label not in index for label in labels.tolist()], dtype=bool)  # (N,)
    index.add(labels[fresh], vectors[fresh])


def feed_after(r: CatchUpReads, fingerprint: str, dim: int, after: int,
               top: int) -> tuple[np.ndarray, np.ndarray, list[int], int]:
    """The change feed (after, top] as reader `r` sees it: (labels (N,) and vectors (N, D) added under
    `fingerprint`, labels retired, how many changes)."""
    changes = r.changes_after(after, top)
    added = [c.seq for c in changes if c.vector_added]
    removed = [c.label_removed for c in changes if c.label_removed is not None]
    labels, vectors = r.vectors(fingerprint, dim, labels=added)
    return labels, vectors, removed, len(changes)


def pruned_past(r: FeedReads, watermark: int) -> str | None:
    """Why an index at `watermark` cannot replay the change feed: compact() pruned changes after it (meta
    `history_pruned`, the highest seq pruned), so a forget may be missing; None when it can."""
    pruned = int(r.meta("history_pruned") or 0)
    return None if pruned <= watermark else f"history was compacted past this index (seq {pruned} > {watermark})"


def disagreement(r: VectorReads, index: VectorIndex, fingerprint: str, dim: int, chunk: int) -> str | None:
    """Why an index disagrees with the vectors reader `r` sees under `fingerprint` (its live labels, or the vector
    of any label's node farther than NEAR_TOL from the stored one), or None. Reads `chunk` rows at a time, so the
    comparison holds one chunk of vectors, not the whole table, in memory."""
    # (a damaged vector's row is among SQLite's labels; r.vectors leaves it out, so an index holding it is "extra")
    wanted = sorted(set(r.labels(fingerprint)).union(index.live_labels()))
    missing = extra = 0
    for start in range(0, len(wanted), chunk):
        m, e, differ = compare_labels(r, index, fingerprint, dim, wanted[start:start + chunk])
        if differ:
            return "index vectors disagree with SQLite"
        missing, extra = missing + m, extra + e
    if missing or extra:
        return f"index disagrees with SQLite ({missing} missing, {extra} extra)"
    return None


def compare_labels(r: VectorReads, index: VectorIndex, fingerprint: str, dim: int,
                   labels: list[int]) -> tuple[int, int, bool]:
    """`labels` compared between SQLite (reader `r`, vectors under `fingerprint`) and `index`: (how many SQLite
    holds and the index does not, how many the index holds and SQLite does not, whether any both hold differ by
    more than NEAR_TOL in a component)."""
    got, vectors = r.vectors(fingerprint, dim, labels=labels)  # (n,), (n, D): the readable ones SQLite holds
    inside = index.holds(got)  # (n,)
    differ = bool(inside.any()) and float(np.abs(index.get_vectors(got[inside].tolist())
                                                 - vectors[inside]).max()) > NEAR_TOL
    stored = set(got.tolist())
    held = index.holds(labels)  # (L,)
    return int((~inside).sum()), sum(1 for label, h in zip(labels, held.tolist()) if h and label not in stored), differ
