"""A vector index that stores compact vectors, weighed against hnswlib on a store's own vectors (issue 34 item 3).

The store keeps each vector as float16 in its row and float32 in hnswlib's graph, whose snapshot is most of a
store's bytes (2 KB a distinct vector at 512 dimensions). usearch (Unum, Apache-2.0, one C++ header with Python
wheels) builds the same kind of HNSW graph over float16 or int8 vectors and can serve a saved index from a memory
map (`Index.restore(path, view=True)`) that processes share. This script takes the distinct vectors of a store,
holds out some as queries, and reports for hnswlib (float32, the store's M, ef_construction and ef) and usearch
(float32, float16, int8; the same graph parameters): build seconds, saved bytes a vector, open seconds, query p50 /
p99 ms for k = 10 (one thread), and recall@10 against exact search over the float32 vectors. The store has since
taken the first row, usearch's cosine over the rows' own int8 steps (store/index.py); hnswlib's row is what it
used before. The selections are searched by the fixed-step int8 graph with its candidates rescored from the rows
(the same graph the store's up to the int8 rounding of the vectors).

    python benchmarks/index_library.py --db STORE.db [--queries 1000] [--ef 96] [--json out.json]
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "2")

import argparse  # noqa: E402
import json  # noqa: E402
import sqlite3  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evermind_memory.store.backend import vector_blobs  # noqa: E402
from evermind_memory.store.index import IndexConfig  # noqa: E402

K = 10


def store_vectors(db: Path, dim: int) -> np.ndarray:
    """(N, D) float32: the distinct vectors of an SQLite store, as a read of the store gives them back (the rows of
    an older store may be float16)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        blobs = [r[0] for r in conn.execute("SELECT DISTINCT vector FROM facts WHERE vector IS NOT NULL")]
    finally:
        conn.close()
    ok, matrix = vector_blobs.read(blobs, dim)
    return matrix[ok]


def _timed(fn, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(labels (Q, K), ms (Q,)) of one query at a time."""
    out, ms = [], []
    for q in queries:
        t = time.perf_counter()
        out.append(fn(q))
        ms.append((time.perf_counter() - t) * 1000.0)
    return np.array(out), np.array(ms)


def recall_at_k(labels: np.ndarray, truth: np.ndarray) -> float:
    """Mean share of each query's true top K (truth (Q, K)) among its found K (labels (Q, K))."""
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / K for a, b in zip(labels, truth)]))


def rank_exactly(keys: np.ndarray, q: np.ndarray, steps: np.ndarray, inv_norm: np.ndarray) -> np.ndarray:
    """The best K of candidate `keys` by their rows' own cosines with q (int8 steps (N, D), 1 / their norms (N,))."""
    exact = (steps[keys].astype(np.float32) @ q) * inv_norm[keys]  # (len(keys),)
    return keys[np.argsort(-exact, kind="stable")[:K]]


def run_hnswlib(base: np.ndarray, queries: np.ndarray, cfg: IndexConfig, ef: int, tmp: Path) -> dict:
    import hnswlib

    t = time.perf_counter()
    index = hnswlib.Index(space="ip", dim=base.shape[1])
    index.init_index(max_elements=len(base), M=cfg.M, ef_construction=cfg.ef_construction, random_seed=cfg.seed)
    index.set_num_threads(2)
    index.add_items(base, np.arange(len(base)))
    build = time.perf_counter() - t
    path = tmp / "h.bin"
    index.save_index(str(path))
    t = time.perf_counter()
    loaded = hnswlib.Index(space="ip", dim=base.shape[1])
    loaded.load_index(str(path), max_elements=len(base))
    opened = time.perf_counter() - t
    loaded.set_ef(ef)
    loaded.set_num_threads(1)
    labels, ms = _timed(lambda q: loaded.knn_query(q, k=K)[0][0], queries)
    return {"build_s": build, "bytes_per_vector": path.stat().st_size / len(base), "open_s": opened,
            "labels": labels, "ms": ms, "index": loaded}


def _usearch_saved(vectors: np.ndarray, metric: str, dtype: str, cfg: IndexConfig, ef: int, path: Path,
                   view: bool) -> tuple[object, dict]:
    """A usearch graph of `vectors` (keys 0..N-1) built on two threads, saved to `path` and opened again (viewed from
    the file or loaded): (the opened index at beam width ef, {build_s, bytes_per_vector, open_s})."""
    from usearch.index import Index

    t = time.perf_counter()
    index = Index(ndim=vectors.shape[1], metric=metric, dtype=dtype, connectivity=cfg.M,
                  expansion_add=cfg.ef_construction, expansion_search=ef)
    index.add(np.arange(len(vectors)), vectors, threads=2)
    build = time.perf_counter() - t
    index.save(str(path))
    t = time.perf_counter()
    loaded = Index.restore(str(path), view=view)
    opened = time.perf_counter() - t
    loaded.expansion_search = ef
    return loaded, {"build_s": build, "bytes_per_vector": path.stat().st_size / len(vectors), "open_s": opened}


def run_usearch(base: np.ndarray, queries: np.ndarray, cfg: IndexConfig, ef: int, dtype: str, tmp: Path,
                view: bool, rescore: tuple[int, ...] = ()) -> dict[str, dict]:
    """{row name: figures} for usearch at `dtype`, and for each factor R in `rescore` the same graph asked for R x k
    candidates that are then ranked exactly against the rows' int8 vectors (what a store would hold beside the graph:
    the candidates' rows gathered, scaled back to float32 and scored)."""
    loaded, common = _usearch_saved(base, "ip", dtype, cfg, ef, tmp / f"u_{dtype}.usearch", view)
    labels, ms = _timed(lambda q: loaded.search(q, K, threads=1).keys, queries)
    rows = {f"usearch {dtype}{', view' if view else ''}": {**common, "labels": labels, "ms": ms}}
    _, steps = vector_blobs._quantize(base)  # (N, D) int8: the rows as the store keeps them (their scale only
    inv_norm = 1.0 / np.linalg.norm(steps.astype(np.float32), axis=1)  # sets a length, which a read divides out)

    def rescored(q: np.ndarray, r: int) -> np.ndarray:
        return rank_exactly(loaded.search(q, r * K, threads=1).keys.astype(np.int64), q, steps, inv_norm)

    for r in rescore:
        loaded.expansion_search = max(ef, r * K)
        labels, ms = _timed(lambda q, r=r: rescored(q, r), queries)
        rows[f"usearch {dtype}, view, {r * K} rescored from int8 rows"] = {**common, "labels": labels, "ms": ms}
    rows[f"usearch {dtype}, view"]["search"] = (loaded, steps, inv_norm)
    return rows


def run_store_graph(base: np.ndarray, queries: np.ndarray, cfg: IndexConfig, ef: int, tmp: Path) -> dict:
    """The graph the store now keeps (store/index.py): usearch's cosine over the rows' own int8 steps (the per-row
    scale is ignored by the cosine, so no fixed 1/127 step is imposed), the query's steps searched, the k found
    scored again exactly against the float32 query; built with the store's two threads, viewed from its file."""
    from evermind_memory.store.backend.vector_blobs import steps_of, unit_steps

    loaded, common = _usearch_saved(steps_of(base), "cos", "i8", cfg, ef, tmp / "store_graph.usearch", True)

    def search(q: np.ndarray) -> np.ndarray:
        keys = loaded.search(steps_of(q[None, :])[0], K, threads=1).keys
        exact = unit_steps(np.stack(loaded.get(keys, dtype=np.int8))) @ q  # (K,)
        return keys[np.argsort(-exact, kind="stable")].astype(np.int64)

    labels, ms = _timed(search, queries)
    return {**common, "labels": labels, "ms": ms}


def selections(hnsw, usearch: tuple, base: np.ndarray, queries: np.ndarray, fractions: tuple[float, ...], ef: int,
               rng: np.random.Generator) -> dict[str, dict]:
    """Vector search among a random share `f` of the vectors, as a scope or a filter selects them (the store searches
    a selection exactly below a tenth of the index, so f >= 0.1 is what reaches the graph): hnswlib's filtered search
    (the store's way: the walk skips what the predicate refuses), and the int8 graph, which takes no predicate, asked
    for 2k / f candidates, those outside the selection dropped and the rest ranked exactly from the rows (exact
    search over the selection when fewer than k are left). Recall@10 against exact search within the selection."""
    u_index, steps, inv_norm = usearch
    out = {}
    for f in fractions:
        mask = rng.random(len(base)) < f
        allowed = np.flatnonzero(mask)
        allow_set = set(allowed.tolist())
        truth = allowed[np.argsort(-(queries @ base[allowed].T), axis=1)[:, :K]]  # (Q, K)
        hnsw.set_ef(ef)
        h_labels, h_ms = _timed(lambda q: hnsw.knn_query(q, k=K, filter=allow_set.__contains__)[0][0], queries)
        count = int(np.ceil(2 * K / f))
        u_index.expansion_search = max(ef, count)
        fallbacks = []

        def filtered(q: np.ndarray) -> np.ndarray:
            keys = u_index.search(q, count, threads=1).keys.astype(np.int64)
            keys = keys[mask[keys]]
            if len(keys) < K:  # the store would search the selection exactly
                fallbacks.append(1)
                keys = allowed
            return rank_exactly(keys, q, steps, inv_norm)

        u_labels, u_ms = _timed(filtered, queries)
        for name, labels, ms in (("hnswlib f32, predicate", h_labels, h_ms),
                                 (f"usearch i8, {count} candidates filtered, rescored", u_labels, u_ms)):
            out[f"selection {f:.0%}: {name}"] = {
                "recall_at_10": recall_at_k(labels, truth),
                "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
                "exact_fallbacks": len(fallbacks) if name.startswith("usearch") else 0}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True, help="an SQLite store (benchmarks/scale.py --dir keeps them)")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--ef", type=int, default=96, help="query beam width for both (the store's at ~100k vectors)")
    ap.add_argument("--rescore", default="2,4", type=lambda v: tuple(int(x) for x in v.split(",") if x),
                    help="int8 graph asked for R x k candidates ranked exactly from the rows, for each R")
    ap.add_argument("--selections", default="0.1,0.5", type=lambda v: tuple(float(x) for x in v.split(",") if x),
                    help="also search among a random share of the vectors (a scope, a filter), for each share")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    vectors = vector_blobs.as_stored(store_vectors(args.db, args.dim))  # as int8 rows give them back
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(vectors))
    queries, base = vectors[order[:args.queries]], vectors[order[args.queries:]]
    truth = np.argsort(-(queries @ base.T), axis=1)[:, :K]  # (Q, K) exact float32
    cfg = IndexConfig()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="index_library_") as tmp_name:
        tmp = Path(tmp_name)
        rows["hnswlib f32 (the store's before)"] = run_hnswlib(base, queries, cfg, args.ef, tmp)
        rows["usearch i8 over the rows' steps, cos (the store's now)"] = run_store_graph(base, queries, cfg, args.ef,
                                                                                       tmp)
        for dtype in ("f32", "f16", "i8"):
            rows.update(run_usearch(base, queries, cfg, args.ef, dtype, tmp, view=True,
                                    rescore=args.rescore if dtype == "i8" else ()))
        chosen = selections(rows["hnswlib f32 (the store's before)"].pop("index"),
                            rows["usearch i8, view"].pop("search"), base, queries, args.selections, args.ef,
                            rng) if args.selections else {}
        for r in rows.values():
            r.pop("search", None)
    out = {"vectors": len(base), "queries": len(queries), "dim": int(base.shape[1]), "ef": args.ef, "M": cfg.M,
           "ef_construction": cfg.ef_construction, "rows": {}}
    print(f"{len(base):,} distinct vectors of {args.db.name} ({base.shape[1]} dims), {len(queries)} held-out "
          f"queries, M {cfg.M}, ef_construction {cfg.ef_construction}, ef {args.ef}, k {K}")
    print("| index | build s (2 threads) | bytes a vector | open s | query p50 / p99 ms | recall@10 |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        recall = recall_at_k(r["labels"], truth)
        p50, p99 = float(np.percentile(r["ms"], 50)), float(np.percentile(r["ms"], 99))
        out["rows"][name] = {"build_s": r["build_s"], "bytes_per_vector": r["bytes_per_vector"], "open_s": r["open_s"],
                             "p50_ms": p50, "p99_ms": p99, "recall_at_10": recall}
        print(f"| {name} | {r['build_s']:.1f} | {r['bytes_per_vector']:,.0f} | {r['open_s']:.3f} | {p50:.2f} / "
              f"{p99:.2f} | {recall:.3f} |")
    if chosen:
        print("\n| among a share of the vectors | recall@10 in it | query p50 / p99 ms | exact fallbacks |")
        print("|---|---|---|---|")
        for name, r in chosen.items():
            print(f"| {name} | {r['recall_at_10']:.3f} | {r['p50_ms']:.2f} / {r['p99_ms']:.2f} | "
                  f"{r['exact_fallbacks']} |")
        out["selections"] = chosen
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
