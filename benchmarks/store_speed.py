"""Speed of MemoryStore against plain hnswlib and exact numpy search on the same vectors.

For each store size: remember one at a time (items/s, default durability), in the default mode (background
embedding: the loop plus flush(), i.e. until every vector is stored and indexed; beside it the loop alone) and
with background_embedding=False (each call embeds before its commit), remember_many
(items/s), recall latency p50/p99 per mode with the query embedding included, the query embedding alone, opening a saved
store, rebuild_index(); then plain hnswlib (build, knn_query) and exact numpy (matrix @ q + argpartition) over the very
vectors the store holds, with and without the embedding step. The model is an untrained EvermindLM of the chosen config
(speed does not depend on training) with a BPE tokenizer trained on synthetic text. Indicative only on a shared machine.

    python benchmarks/store_speed.py [--sizes 10000,100000] [--config small|tiny] [--queries 200]
                                     [--threads 1] [--json results.json]

With --writers 1,2,4,8: many writer processes on one store (issue 17). For each count W, W processes each
remember --per-writer facts one at a time (default background embedding, timed until each one's flush()
returns; and again with vectors computed before the clock starts, which measures SQLite + FTS5 + HNSW alone)
into a store already holding --seed-facts facts, while this process recalls (vector, including the query
embedding and the catch-up with the other processes' commits) as fast as it can; reported: total facts/s over
all writers, and recall p50/p99 during the writes beside the same recalls with no writer running.
--sizes "" skips the single-process section.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path


def _threads_from_argv() -> str:
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "1"


for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # read once, at numpy's import
    os.environ.setdefault(_var, _threads_from_argv())
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hnswlib  # noqa: E402
import numpy as np  # noqa: E402

from evermind_memory import MemoryStore  # noqa: E402
from evermind_memory.embedder import LMEmbedder  # noqa: E402
from evermind_memory.lm.model import EvermindLM, LMConfig  # noqa: E402
from evermind_memory.lm.tokenizer import BPETokenizer  # noqa: E402
from evermind_memory.store.index import IndexConfig, search_ef  # noqa: E402
from evermind_memory.store.search import fts_match  # noqa: E402

CONFIGS = {
    # the foundation issue's small config (the tokenizer is trained smaller; ids stay < vocab_size)
    "small": LMConfig(vocab_size=8192, d_model=128, n_layers=4, conv_kernel=4, hidden_dim=256, n_experts=4, top_k=2),
    "tiny": LMConfig(vocab_size=1024, d_model=32, n_layers=2, conv_kernel=3, hidden_dim=64, n_experts=4, top_k=2),
}
WORDS = (
    "ada bob carol tea coffee water cat dog bird paris london tokyo project meeting deadline report budget "
    "python sqlite vector memory agent user prefers likes drinks reads writes visits morning evening monday "
    "friday green black small large quick lazy river mountain city office home garden book music film"
).split()


def texts(rng: np.random.Generator, n: int, lo: int = 6, hi: int = 12) -> list[str]:
    lengths = rng.integers(lo, hi + 1, size=n)
    return [" ".join(rng.choice(WORDS, size=int(k))) + f" #{i}" for i, k in enumerate(lengths)]


def pct(samples: list[float]) -> tuple[float, float]:
    arr = np.array(samples) * 1000.0
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def timed(fn, items: list) -> list[float]:
    out = []
    for item in items:
        t0 = time.perf_counter()
        fn(item)
        out.append(time.perf_counter() - t0)
    return out


class PrecomputedEmbedder:
    """Serves vectors computed ahead of time, so a run measures the store alone (SQLite + FTS5 + HNSW)."""

    def __init__(self, inner: LMEmbedder, corpus: list[str]) -> None:
        self.inner = inner
        self.dimensions = inner.dimensions
        self.fingerprint = inner.fingerprint + "+precomputed"
        self.table = dict(zip(corpus, inner.embed_many(corpus)))

    def embed(self, text: str) -> np.ndarray:
        vec = self.table.get(text)
        return self.inner.embed(text) if vec is None else vec  # (the store's probe text at open)

    def embed_many(self, texts_: list[str]) -> np.ndarray:
        return np.stack([self.embed(t) for t in texts_])


def bench_size(n: int, embedder: LMEmbedder, args: argparse.Namespace, workdir: Path) -> dict:
    rng = np.random.default_rng(n)
    corpus = texts(rng, n)
    queries = [" ".join(rng.choice(WORDS, size=3)) for _ in range(args.queries)]
    db = workdir / f"bench_{n}.db"
    res: dict = {"n": n}

    single = min(args.single, n)
    with MemoryStore(workdir / f"sync_{n}.db", embedder, background_embedding=False) as store:
        t0 = time.perf_counter()
        for text in corpus[:single]:
            store.remember(text)
        res["remember_sync_items_per_s"] = single / (time.perf_counter() - t0)
    with MemoryStore(db, embedder) as store:  # the default: background embedding
        t0 = time.perf_counter()
        for text in corpus[:single]:
            store.remember(text)
        res["remember_loop_items_per_s"] = single / (time.perf_counter() - t0)
        store.flush()  # until every vector is embedded, stored and indexed
        res["remember_items_per_s"] = single / (time.perf_counter() - t0)
        assert store.info()["waiting_vectors"] == 0 and store.info()["indexed"] == single
        t0 = time.perf_counter()
        for start in range(single, n, 1000):
            store.remember_many(corpus[start : start + 1000])
        res["remember_many_items_per_s"] = (n - single) / max(1e-9, time.perf_counter() - t0)
        t0 = time.perf_counter()
        vecs = embedder.embed_many(corpus[single : single + 2000])
        res["embed_many_items_per_s"] = len(vecs) / (time.perf_counter() - t0)
    single_only = corpus[:single]
    pre = PrecomputedEmbedder(embedder, single_only)
    with MemoryStore(workdir / f"pre_{n}.db", pre) as store:
        t0 = time.perf_counter()
        for text in single_only:
            store.remember(text)
        store.flush()
        res["remember_store_only_items_per_s"] = single / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    store = MemoryStore(db, embedder)
    res["open_s"] = time.perf_counter() - t0
    res["open_status"] = store.info()["index_status"]
    try:
        for q in queries[:10]:  # warm-up
            store.recall(q, k=10, mode="hybrid")
        res["embed_query_ms"] = pct(timed(embedder.embed, queries))
        for mode in ("vector", "lexical", "hybrid"):
            res[f"recall_{mode}_ms"] = pct(timed(lambda q, m=mode: store.recall(q, k=10, mode=m), queries))
        res["recall_vector_tag_filter_ms"] = pct(
            timed(lambda q: store.recall(q, k=10, mode="vector", tags={"none": "x"}), queries[:50]))
        store_vector_ids = [[h.id for h in store.recall(q, k=10, mode="vector")] for q in queries]
        with sqlite3.connect(db) as conn:  # FTS5's OR over every query word: the ranking before any pruning
            full_or = [[r[0] for r in conn.execute(
                "SELECT f.id FROM (SELECT rowid, rank FROM facts_fts WHERE facts_fts MATCH ? ORDER BY rank LIMIT 10) r "
                "JOIN facts f ON f.rid = r.rowid ORDER BY r.rank, f.rid", [fts_match(q)])] for q in queries]
        lexical_ids = [[h.id for h in store.recall(q, k=10, mode="lexical")] for q in queries]
        res["lexical_top10_vs_full_or"] = sum(len(set(a) & set(b)) for a, b in zip(lexical_ids, full_or)) / max(
            1, sum(len(b) for b in full_or))
        t0 = time.perf_counter()
        store.rebuild_index()
        res["rebuild_s"] = time.perf_counter() - t0
    finally:
        store.close()

    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT label, vector, id FROM facts ORDER BY label").fetchall()
    labels = np.array([r[0] for r in rows], dtype=np.int64)
    matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), embedder.dimensions)
    id_of = {r[0]: r[2] for r in rows}
    qvecs = embedder.embed_many(queries)
    cfg = IndexConfig()
    t0 = time.perf_counter()
    plain = hnswlib.Index(space="ip", dim=embedder.dimensions)
    plain.init_index(max_elements=len(labels), ef_construction=cfg.ef_construction, M=cfg.M, random_seed=cfg.seed)
    plain.add_items(matrix, labels, num_threads=cfg.threads)
    res["hnswlib_ef"] = search_ef(cfg, len(labels))  # the beam the store's index uses at this size
    plain.set_ef(res["hnswlib_ef"])
    res["hnswlib_build_s"] = time.perf_counter() - t0
    res["hnswlib_knn_ms"] = pct(timed(lambda q: plain.knn_query(q[None, :], k=10, num_threads=1), list(qvecs)))
    res["hnswlib_with_embed_ms"] = pct(
        timed(lambda q: plain.knn_query(embedder.embed(q)[None, :], k=10, num_threads=1), queries))

    def exact(q: np.ndarray) -> np.ndarray:
        scores = matrix @ q
        return labels[np.argpartition(-scores, 9)[:10]]

    res["numpy_exact_ms"] = pct(timed(exact, list(qvecs)))
    res["numpy_exact_with_embed_ms"] = pct(timed(lambda q: exact(embedder.embed(q)), queries))
    hits = sum(len(set(plain.knn_query(q[None, :], k=10)[0][0].tolist()) & set(exact(q).tolist())) for q in qvecs)
    res["hnswlib_recall_at_10"] = hits / (10 * len(qvecs))
    exact_ids = [{id_of[label] for label in exact(q).tolist()} for q in qvecs]
    res["store_vector_recall_at_10"] = sum(len(set(got) & want) for got, want in zip(store_vector_ids, exact_ids)) / (
        10 * len(qvecs))
    sweep = {}
    for ef in args.ef_sweep:
        plain.set_ef(ef)
        found = sum(len(set(plain.knn_query(q[None, :], k=10)[0][0].tolist()) & set(exact(q).tolist())) for q in qvecs)
        knn = pct(timed(lambda q: plain.knn_query(q[None, :], k=10, num_threads=1), list(qvecs)))
        sweep[str(ef)] = {"recall_at_10": found / (10 * len(qvecs)), "knn_ms": knn}
    res["ef_sweep"] = sweep
    return res


def writer_process(db: str, model_path: str, tok_path: str, corpus: list[str], precomputed: bool, barrier,
                   out) -> None:
    """One writer of the many-writers run: open, wait for the others, remember one at a time, flush."""
    model = EvermindLM.load(model_path)
    embedder = LMEmbedder(model, BPETokenizer.load(tok_path))
    if precomputed:
        embedder = PrecomputedEmbedder(embedder, corpus)
    with MemoryStore(db, embedder) as store:
        barrier.wait()
        t0 = time.time()
        for text in corpus:
            store.remember(text)
        store.flush()
        out.put((t0, time.time()))


def bench_writers(embedder: LMEmbedder, args: argparse.Namespace, workdir: Path, new_db=None) -> list[dict]:
    """Throughput of W writer processes on one store and recall latency in this process while they write.

    `new_db(name)` gives a new, empty store's place (default: a file in `workdir`; benchmarks/pg_speed.py passes
    PostgreSQL URLs); `args` needs writers, per_writer, seed_facts, queries and precomputed (True, False or
    None for both)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    model_path, tok_path = workdir / "model.evl", workdir / "tokenizer.json"
    embedder.model.save(model_path)
    embedder.tokenizer.save(tok_path)
    rng = np.random.default_rng(7)
    queries = [" ".join(rng.choice(WORDS, size=3)) for _ in range(args.queries)]
    out = []
    modes = (False, True) if getattr(args, "precomputed", None) is None else (args.precomputed,)
    for precomputed in modes:
        for w in args.writers:
            name = f"writers_{w}_{int(precomputed)}"
            db = workdir / f"{name}.db" if new_db is None else new_db(name)
            seed_texts = texts(rng, args.seed_facts)
            # every process must embed with one model (fingerprint): the precomputed one is a model of its own
            mine = PrecomputedEmbedder(embedder, seed_texts) if precomputed else embedder
            with MemoryStore(db, mine) as seed:
                seed.remember_many(seed_texts)
            corpora = [[f"{t} w{n}" for t in texts(rng, args.per_writer)] for n in range(w)]
            with MemoryStore(db, mine) as store:
                for q in queries[:10]:
                    store.recall(q, k=10, mode="vector")
                idle = pct(timed(lambda q: store.recall(q, k=10, mode="vector"), queries))
                barrier, done = ctx.Barrier(w + 1), ctx.Queue()
                procs = [ctx.Process(target=writer_process, args=(str(db), str(model_path), str(tok_path), corpora[n],
                                                                  precomputed, barrier, done)) for n in range(w)]
                for p in procs:
                    p.start()
                barrier.wait()
                busy: list[float] = []
                spans = []
                while len(spans) < w:
                    q = queries[len(busy) % len(queries)]
                    t0 = time.perf_counter()
                    store.recall(q, k=10, mode="vector")
                    busy.append(time.perf_counter() - t0)
                    while not done.empty():
                        spans.append(done.get())
                for p in procs:
                    p.join()
                    assert p.exitcode == 0, f"a writer process failed (exit {p.exitcode})"
                store.flush()
                assert len(store) == args.seed_facts + w * args.per_writer and store.check().ok
            start, end = min(a for a, _ in spans), max(b for _, b in spans)
            out.append({"writers": w, "precomputed": precomputed, "facts": w * args.per_writer,
                        "items_per_s": w * args.per_writer / (end - start), "recall_idle_ms": idle,
                        "recall_during_writes_ms": pct(busy), "recalls_during_writes": len(busy)})
    return out


def print_writers(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"many writer processes: each remembers {args.per_writer} facts one at a time into a store of "
          f"{args.seed_facts:,} (total items/s until every writer's flush); vector recall in another process, "
          "ms p50/p99, with no writer / during the writes")
    print(f"{'writers':>8} {'vectors':>12} {'remember items/s':>18} {'recall idle':>18} {'recall during':>18} "
          f"{'recalls':>8}")
    for r in rows:
        idle, busy = r["recall_idle_ms"], r["recall_during_writes_ms"]
        print(f"{r['writers']:>8} {'precomputed' if r['precomputed'] else 'model':>12} {r['items_per_s']:>18,.0f} "
              f"{idle[0]:>8.3f} / {idle[1]:<7.3f} {busy[0]:>8.3f} / {busy[1]:<7.3f} {r['recalls_during_writes']:>8}")


def print_table(results: list[dict]) -> None:
    rows = [
        ("remember 1 by 1, default", "remember_items_per_s", "items/s"),
        ("  calls alone (vectors follow)", "remember_loop_items_per_s", "items/s"),
        ("remember 1 by 1, synchronous", "remember_sync_items_per_s", "items/s"),
        ("remember, vectors precomputed", "remember_store_only_items_per_s", "items/s"),
        ("remember_many", "remember_many_items_per_s", "items/s"),
        ("embed_many (model alone)", "embed_many_items_per_s", "items/s"),
        ("open saved store", "open_s", "s"),
        ("rebuild_index()", "rebuild_s", "s"),
        ("plain hnswlib build", "hnswlib_build_s", "s"),
        ("embed one query", "embed_query_ms", "ms p50/p99"),
        ("recall vector (incl. embed)", "recall_vector_ms", "ms p50/p99"),
        ("recall lexical", "recall_lexical_ms", "ms p50/p99"),
        ("recall hybrid (incl. embed)", "recall_hybrid_ms", "ms p50/p99"),
        ("recall vector, tag filter", "recall_vector_tag_filter_ms", "ms p50/p99"),
        ("plain hnswlib knn", "hnswlib_knn_ms", "ms p50/p99"),
        ("plain hnswlib + embed", "hnswlib_with_embed_ms", "ms p50/p99"),
        ("exact numpy", "numpy_exact_ms", "ms p50/p99"),
        ("exact numpy + embed", "numpy_exact_with_embed_ms", "ms p50/p99"),
        ("hnswlib ef (store's, by size)", "hnswlib_ef", ""),
        ("hnswlib recall@10 vs exact", "hnswlib_recall_at_10", ""),
        ("store vector recall@10 vs exact", "store_vector_recall_at_10", ""),
        ("store lexical top-10 = full OR", "lexical_top10_vs_full_or", "share"),
    ]
    head = f"{'':32}" + "".join(f"{r['n']:>20,}" for r in results)
    print(head)
    for label, key, unit in rows:
        cells = []
        for r in results:
            v = r[key]
            cells.append(f"{v[0]:>9.3f} / {v[1]:<8.3f}" if isinstance(v, tuple) else f"{v:>20.3f}"
                         if isinstance(v, float) else f"{v!s:>20}")
        print(f"{label:<32}" + "".join(f"{c:>20}" for c in cells) + f"  {unit}")


def print_ef_sweep(results: list[dict]) -> None:
    """recall@10 vs exact and knn p50 of plain hnswlib (M, ef_construction as the store) at each swept ef."""
    for r in results:
        cells = [f"ef {ef}: {v['recall_at_10']:.3f} / {v['knn_ms'][0]:.3f} ms" for ef, v in r["ef_sweep"].items()]
        print(f"ef sweep at {r['n']:,} (recall@10 / knn p50): " + "; ".join(cells))


def print_targets(results: list[dict]) -> None:
    """The foundation issue's targets (small config, default durability): met or not, per size."""
    print("remember 1 by 1, default: background embedding, timed until flush() returns (every vector indexed); "
          "synchronous: background_embedding=False")
    for r in results:
        remember = r["remember_items_per_s"]
        recall = r["recall_vector_ms"][0]
        print(f"targets at {r['n']:,}: remember one at a time {remember:,.0f} items/s (>= 1,000: "
              f"{'met' if remember >= 1000 else 'NOT met'}; synchronous {r['remember_sync_items_per_s']:,.0f}); "
              f"vector recall p50 {recall:.3f} ms incl. embedding (<= 1 ms: {'met' if recall <= 1.0 else 'NOT met'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000", help="comma-separated store sizes (e.g. 10000,100000)")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--single", type=int, default=2000, help="facts remembered one at a time per size")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (set before numpy loads)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--ef-sweep", default="64,96,128,160", help="hnswlib ef values to measure recall@10 at")
    parser.add_argument("--writers", default="", help="writer process counts for the many-writers run (e.g. 1,2,4,8)")
    parser.add_argument("--per-writer", type=int, default=500, help="facts each writer process remembers")
    parser.add_argument("--seed-facts", type=int, default=5000, help="facts in the store before the writers start")
    args = parser.parse_args()
    args.ef_sweep = [int(x) for x in args.ef_sweep.split(",") if x]
    args.writers = [int(x) for x in args.writers.split(",") if x]
    rng = np.random.default_rng(0)
    tok = BPETokenizer.train(texts(rng, 3000), 1024)
    config = CONFIGS[args.config]
    model = EvermindLM(config, seed=0)
    embedder = LMEmbedder(model, tok)
    results = []
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="evermind-bench-") as tmp:
        for n in (int(s) for s in args.sizes.split(",") if s):
            results.append(bench_size(n, embedder, args, Path(tmp)))
        writers = bench_writers(embedder, args, Path(tmp)) if args.writers else []
    meta = {
        "config": config.to_dict(), "tokenizer_vocab": len(tok), "fingerprint": embedder.fingerprint,
        "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
            "hnswlib": getattr(hnswlib, "__version__", "?"),
        "numpy": np.__version__, "cpu_count": os.cpu_count(), "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "durability": "normal", "machine": platform.machine(), "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
    }
    print(f"MemoryStore speed ({args.config} config: {config.to_dict()}; {args.queries} queries, k=10; "
          f"load avg {load_start[0]:.2f} -> {meta['load_avg_end'][0]:.2f} on {os.cpu_count()} CPUs)")
    if results:
        print_table(results)
        print_ef_sweep(results)
        print_targets(results)
    if writers:
        print_writers(writers, args)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results, "writers": writers}, indent=2))


if __name__ == "__main__":
    main()
