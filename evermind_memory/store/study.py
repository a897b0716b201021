"""What recall sees, for offline study (recipe/, benchmarks/, tests): the hybrid candidates a store gathers for a
query, exactly the pool recall fuses. Nothing in the package uses it; it reads the store's parts through
memory_store.parts_of, as the store's own modules get them passed in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .embedding import embed_query
from .memory_store import MemoryStore, parts_of
from .selection import select

if TYPE_CHECKING:
    import numpy as np

    from .fusion import CandidatePool


def gather(store: MemoryStore, query: str, size: int, qv: np.ndarray | None = None) -> tuple[dict, CandidatePool]:
    """The hybrid candidates a MemoryStore (or a view of one) gathers for `query`, `size` per list, in its scope:
    (rid -> FactRow, CandidatePool). `qv` (D,) replaces the query's embedding (a cached one)."""
    parts, scope = parts_of(store)
    sel = select("recall", scope)
    with parts.vectors.serving() as gen:
        qv = embed_query(gen.embedder, query, parts.opening.dim) if qv is None else qv
        return parts.search.pool(gen, query, qv, size, sel)
