"""The HNSW index's parameters (IndexConfig, checked when made) and what follows from them: the search beam for a
graph's size and the memory a configuration may reserve. store/index.py holds the graph they configure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._lazy import is_numpy
from ..errors import InvalidInput

EXACT_MAX = 2048  # IndexConfig.exact_max's default: benchmarks/exact_vs_hnsw.py, shipped model (256-d), 2 cores:
# exact p50 0.07 / 0.14 / 0.50 / 7.0 ms at 1k / 2k / 5k / 20k vectors, the graph 0.08 / 0.13 / 0.27 / 0.63 ms


@dataclass(frozen=True)
class IndexConfig:
    """HNSW parameters (fixed for the life of an index file).

    Args:
        M: graph degree (2..256).
        ef_construction: build-time beam width (M..10,000; usearch's expansion_add).
        ef_search: query-time beam width up to ef_base_size vectors in the graph; above that it grows by
            ef_growth per 10x vectors (see VectorIndex.search_ef). Changed only under the exclusive lock.
        ef_base_size: graph size up to which ef_search is used as it is.
        ef_growth: beam width factor per 10x graph size beyond ef_base_size. Measured on store_speed's vectors
            (M=16, ef_construction=100): a fixed ef 64 gives recall@10 0.984 at 10k vectors but 0.941 at 100k;
            ef 96 gives 0.972 at 100k (128: 0.983), so 1.5 keeps recall@10 >= 0.97 as the store grows.
        initial_capacity: kept so configurations stay valid, and still bounded (1..2**20, check_index_memory);
            the graph grows as nodes are added (usearch's Python API takes no reservation).
        exact_max: up to this many graph nodes (distinct vectors, deleted ones included) a search is exact, over
            the vectors kept in memory (0: always the graph; at most 2**20). Default EXACT_MAX (2048): up to 2k
            256-d vectors exact search is as fast as the graph's, at 5k twice as slow (benchmarks/exact_vs_hnsw.py).
        rebuild_deleted_ratio: rebuild once deleted/total exceeds this (R8).
        threads: graph threads for bulk adds of 256 vectors or more (1..256; one thread adds deterministically).
        seed: kept so configurations stay valid (0..2**63 - 1); usearch draws node levels from its own generator.
    Raises:
        InvalidInput: a value of the wrong type or out of its range (every value here reopens: see _INT_BOUNDS).
    """

    M: int = 16
    ef_construction: int = 100
    ef_search: int = 64
    ef_base_size: int = 10_000
    ef_growth: float = 1.5
    initial_capacity: int = 1024
    exact_max: int = EXACT_MAX
    rebuild_deleted_ratio: float = 0.2
    threads: int = 2
    seed: int = 100

    def __post_init__(self) -> None:
        for name, (low, high) in _INT_BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int) or is_numpy(value, "integer")) \
                    or not low <= value <= high:
                raise InvalidInput(f"IndexConfig.{name} expected an int from {low} to {high:,}, got {value!r:.40}"
                                   f"{_INT_WHY.get(name, '')}.")
            object.__setattr__(self, name, int(value))
        for name, (lo, hi) in _REAL_BOUNDS.items():
            value = getattr(self, name)
            number = isinstance(value, (int, float)) or is_numpy(value, "integer", "floating")
            if isinstance(value, bool) or not number \
                    or not math.isfinite(value) or not lo <= value <= hi or (name == "rebuild_deleted_ratio"
                                                                             and value <= 0):
                raise InvalidInput(f"IndexConfig.{name} expected a number from {lo} to {hi}"
                                   f"{' (above 0)' if name == 'rebuild_deleted_ratio' else ''}, got {value!r:.40}.")
            object.__setattr__(self, name, float(value))
        if self.ef_construction < self.M:
            raise InvalidInput(f"IndexConfig expected ef_construction >= M (a beam narrower than the graph degree "
                               f"cannot fill a node's links), got ef_construction="
                               f"{self.ef_construction}, M={self.M}.")


# The bounds keep every configuration openable again (a saved index must pass parse_usearch_file: M is in its
# header) and no allocation absurd.
_INT_BOUNDS = {"M": (2, 256), "ef_construction": (2, 10_000), "ef_search": (1, 100_000), "ef_base_size": (1, 10**9),
               "initial_capacity": (1, 1 << 20), "exact_max": (0, 1 << 20), "threads": (1, 256), "seed": (0, 2**63 - 1)}
_INT_WHY = {"M": " (the graph degree; 2 to 100 is the usual range)",
            "initial_capacity": " (a bound kept for configurations; the graph grows on demand)"}
_REAL_BOUNDS = {"ef_growth": (1.0, 10.0), "rebuild_deleted_ratio": (0.0, 1.0)}


MAX_INITIAL_BYTES = 1 << 30  # what an index may reserve before its first add


def check_index_memory(config: IndexConfig, dim: int) -> None:
    """Refuse a configuration whose first allocation is absurd for vectors of `dim` (docs/reliability.md, tests B).

    Raises:
        InvalidInput: initial_capacity x bytes per element exceeds MAX_INITIAL_BYTES.
    """
    per = 10 + (2 * config.M * 4 + 4) + dim + config.M * 4 + 16  # node head, level-0 links, int8 vector, upper
    if config.initial_capacity * per > MAX_INITIAL_BYTES:  # links (about one level in M) and bookkeeping, roughly
        raise InvalidInput(
            f"IndexConfig(initial_capacity={config.initial_capacity}, M={config.M}) would allocate "
            f"{config.initial_capacity * per / 2**30:.1f} GiB for {dim}-dimensional vectors before the first fact; "
            f"expected at most {MAX_INITIAL_BYTES / 2**30:.0f} GiB. Lower initial_capacity (the index grows on "
            "demand).")


def search_ef(config: IndexConfig, elements: int) -> int:
    """The beam width for a graph of `elements` vectors (removed ones too: search walks through them).

    ef_search up to config.ef_base_size, then times ef_growth per 10x; the graph itself widens the beam to k
    for a query asking for more than ef neighbours.
    """
    if elements <= config.ef_base_size:
        return config.ef_search
    return int(math.ceil(config.ef_search * config.ef_growth ** math.log10(elements / config.ef_base_size)))
