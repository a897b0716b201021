"""Exact search against the HNSW graph, side by side on the same vectors: where the crossover is, and what exact
duplicates do to the graph (issue: recall@10 0.75-0.9 in the slow crash test).

For each size N (default 1k, 5k, 20k, 100k) and two data sets,
  distinct:  N different texts;
  templated: half the facts in groups of 100 copies of one vector (a templated or repeated memory: half the copies
             bit for bit, half a few ULPs off, as one text embedded in two batches is), half distinct,
three searches over the same vectors, with the same queries:
  exact:        VectorIndex searching exactly (IndexConfig.exact_max above N: one matrix product + argpartition),
  hnsw:         VectorIndex searching its graph (exact_max=0): one node per distinct vector (within NEAR_TOL),
  hnsw_plain:   hnswlib with one node per fact, as the store was before (same M, ef_construction, ef, seed).
Reported per search: query latency p50/p99 in ms (single thread, k=10; the three searches interleaved query by
query, --rounds passes) and recall@10 against exact numpy,
tie-aware (a hit counts when its exact score reaches the 10th best: any member of a tie is a right answer); and
the build time of each graph.

Vectors: the shipped model's embeddings of synthetic texts (benchmarks/store_speed.py's word list). Embedding
runs at ~370 texts/s on one core, so at most --pool texts are embedded (default 20,000); beyond that, the rest
are normalised sums of two embedded vectors (points between real ones), so a 100k set takes ~1 min to make.
Queries are embeddings of other texts. Indicative only on a shared machine.

    python benchmarks/exact_vs_hnsw.py [--sizes 1000,5000,20000,100000] [--queries 200] [--pool 20000]
                                       [--json benchmarks/results/exact_vs_hnsw.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # read once, at numpy's import
    os.environ.setdefault(_var, "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hnswlib  # noqa: E402
import numpy as np  # noqa: E402

from evermind_memory import default_embedder  # noqa: E402
from evermind_memory.store.index import IndexConfig, VectorIndex, search_ef  # noqa: E402

WORDS = (
    "ada bob carol tea coffee water cat dog bird paris london tokyo project meeting deadline report budget "
    "python sqlite vector memory agent user prefers likes drinks reads writes visits morning evening monday "
    "friday green black small large quick lazy river mountain city office home garden book music film"
).split()
K = 10
GROUP = 100  # facts per group of identical vectors in the templated set


def texts(rng: np.random.Generator, n: int, tag: str) -> list[str]:
    lengths = rng.integers(6, 13, size=n)
    return [" ".join(rng.choice(WORDS, size=int(k))) + f" {tag}{i}" for i, k in enumerate(lengths)]


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_vectors(base: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, D): the first rows of `base`, then normalised sums of two random base rows."""
    if n <= len(base):
        return base[:n].copy()
    i, j = rng.integers(0, len(base), size=(2, n - len(base)))
    return np.concatenate([base, unit(base[i] + base[j])])


def templated(vectors: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Half the rows replaced by copies of a few rows, in groups of GROUP, shuffled in: half the copies bit for bit,
    half off by up to 2 ULPs per component (what the model gives one text embedded in two batches: ~3e-8)."""
    n = len(vectors)
    out = vectors.copy()
    dup = rng.permutation(n)[: n // 2]  # (n/2,) rows that become copies
    groups = max(1, len(dup) // GROUP)
    sources = rng.permutation(np.setdiff1d(np.arange(n), dup))[:groups]  # (G,) distinct rows they copy
    copies = out[sources[np.arange(len(dup)) % groups]]  # (n/2, D)
    ulps = rng.integers(-2, 3, size=copies.shape) * (np.arange(len(dup)) % 2)[:, None]  # (n/2, D) odd copies only
    out[dup] = copies + ulps * np.spacing(np.abs(copies))
    return out


def timed_rounds(searches: dict, queries: np.ndarray, rounds: int) -> tuple[dict, dict]:
    """Run every search on every query, interleaved (query by query, the order rotating), `rounds` times over:
    (method -> labels per query, method -> latencies)."""
    got = {m: [] for m in searches}
    lat = {m: [] for m in searches}
    names = list(searches)
    for r in range(rounds):
        for i, q in enumerate(queries):
            for j in range(len(names)):
                m = names[(i + j + r) % len(names)]
                t0 = time.perf_counter()
                labels = searches[m](q)
                lat[m].append(time.perf_counter() - t0)
                if r == 0:
                    got[m].append(labels)
    return got, lat


def recall_at_k(vectors: np.ndarray, queries: np.ndarray, got: list[np.ndarray]) -> float:
    """Tie-aware recall@K of label lists `got` (labels are row numbers) against exact search."""
    hits = total = 0
    for q, labels in zip(queries, got):
        scores = vectors @ q  # (N,)
        kth = np.partition(-scores, K - 1)[K - 1] * -1.0
        labels = np.asarray(labels, dtype=np.int64)
        hits += min(K, int((scores[labels] >= kth - 1e-5).sum()))
        total += K
    return hits / total


def p50_p99(lat: list[float]) -> tuple[float, float]:
    ms = np.array(lat) * 1000.0
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def bench(name: str, vectors: np.ndarray, queries: np.ndarray, rounds: int) -> list[dict]:
    n = len(vectors)
    labels = np.arange(n)
    base = IndexConfig()
    searches, builds = {}, {}
    for method in ("exact", "hnsw", "hnsw_plain"):
        t0 = time.perf_counter()
        if method == "hnsw_plain":
            plain = hnswlib.Index(space="ip", dim=vectors.shape[1])
            plain.init_index(max_elements=n, ef_construction=base.ef_construction, M=base.M, random_seed=base.seed)
            plain.add_items(vectors, labels, num_threads=base.threads)
            plain.set_ef(search_ef(base, n))
            plain.set_num_threads(1)

            def search(q, plain=plain):
                return plain.knn_query(q.reshape(1, -1), k=K, num_threads=1)[0][0]
        else:
            config = IndexConfig(exact_max=(1 << 20) if method == "exact" else 0, initial_capacity=min(n, 1 << 20))
            index = VectorIndex(vectors.shape[1], config)
            index.add(labels, vectors)
            assert index.exact == (method == "exact")
            nodes = index.element_count  # graph nodes: distinct vectors (within NEAR_TOL)

            def search(q, index=index):
                return index.query(q, K)[0]
        builds[method] = time.perf_counter() - t0
        search(queries[0])  # warm up
        searches[method] = search
    got, lat = timed_rounds(searches, queries, rounds)
    rows = []
    for method in searches:
        p50, p99 = p50_p99(lat[method])
        rows.append({"data": name, "n": n, "nodes": nodes, "method": method,
                     "build_s": round(builds[method], 3), "p50_ms": round(p50, 4), "p99_ms": round(p99, 4),
                     "recall_at_10": round(recall_at_k(vectors, queries, got[method]), 4)})
        print(f"  {name:9s} {n:>7,} {method:10s} build {builds[method]:7.2f} s  p50 {p50:7.3f} ms  p99 {p99:7.3f} ms  "
              f"recall@10 {rows[-1]['recall_at_10']:.4f}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,5000,20000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5, help="timed passes over the queries (interleaved)")
    ap.add_argument("--pool", type=int, default=20_000, help="texts embedded at most; the rest are mixtures")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rng = np.random.default_rng(7)
    embedder = default_embedder()
    t0 = time.perf_counter()
    pool = min(args.pool, max(sizes))
    base = unit(np.asarray(embedder.embed_many(texts(rng, pool, "#")), dtype=np.float32))
    queries = unit(np.asarray(embedder.embed_many([" ".join(rng.choice(WORDS, size=3)) for _ in range(args.queries)]),
                              dtype=np.float32))
    print(f"embedded {pool:,} texts and {args.queries} queries in {time.perf_counter() - t0:.1f} s", flush=True)
    results = []
    for n in sizes:
        vectors = make_vectors(base, n, np.random.default_rng(n))
        results += bench("distinct", vectors, queries, args.rounds)
        results += bench("templated", templated(vectors, np.random.default_rng(n + 1)), queries, args.rounds)
    print()
    print(f"{'data':9s} {'N':>7s} {'nodes':>8s} | {'exact p50':>9s} {'p99':>7s} {'R@10':>6s} | "
          f"{'hnsw p50':>8s} {'p99':>7s} {'R@10':>6s} | {'plain p50':>9s} {'p99':>7s} {'R@10':>6s} | "
          f"{'build hnsw':>10s} {'plain':>6s}")
    for i in range(0, len(results), 3):
        ex, hn, pl = results[i:i + 3]
        print(f"{ex['data']:9s} {ex['n']:>7,} {ex['nodes']:>8,} | {ex['p50_ms']:9.3f} {ex['p99_ms']:7.3f} "
              f"{ex['recall_at_10']:6.3f} | {hn['p50_ms']:8.3f} {hn['p99_ms']:7.3f} {hn['recall_at_10']:6.3f} | "
              f"{pl['p50_ms']:9.3f} {pl['p99_ms']:7.3f} {pl['recall_at_10']:6.3f} | {hn['build_s']:9.2f}s "
              f"{pl['build_s']:5.2f}s")
    if args.json:
        meta = {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                "hnswlib": getattr(hnswlib, "__version__", "?"), "k": K, "queries": args.queries, "rounds": args.rounds,
                "pool": pool, "group": GROUP, "config": IndexConfig().__dict__}
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
