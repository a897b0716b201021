"""Lexical top-k from a library built for it (tantivy: block-max WAND over impact-ordered blocks) beside our own
(FTS5's postings, ranked in numpy), on a store that benchmarks/scale.py built (issue 34, item 1: weigh a library
against an index of our own).

For the store's facts (read from its SQLite file) a tantivy index is built in a temporary directory (English
stemming, like FTS5's porter tokenizer; the fact's rid stored beside it), then the same questions as scale.py's
(seed 7) are asked of both, k=10, in this process:

- ours: `recall(mode="lexical")` through the public API, after ten warm-up questions (its postings are then held,
  as in a long-lived process; the first-touch cost is scale.py's lexical p99 in a fresh process): the whole recall,
  the catch-up check and the ten facts' rows included;
- tantivy: a searcher over the built index, the query our `query_words` keeps (function words dropped), OR of the
  words, top 10 by tantivy's BM25 (Lucene's idf, not FTS5's: the lists differ where the scores are close): the
  ranking and the rids only, so a lower bound of a recall through it.

Reported: the build rate and bytes on disk of tantivy's index, p50/p99 of each, how many of tantivy's top 10 are in
ours, and what a live store would pay to keep tantivy current: one remembered fact made visible (add, commit,
reload) and a batch of 1,000. Indicative only: one run, a shared machine. tantivy is not a dependency of the
package (`pip install tantivy` to run this).

    python benchmarks/lexical_library.py --db DIR/scale_100000.db [--queries 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402


def pct(ms: list[float]) -> tuple[float, float]:
    a = np.array(ms)
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def build_tantivy(rows: list[tuple[int, str]], directory: Path, threads: int = 1):
    """A tantivy index of (rid, text) rows in `directory`: (index, seconds, bytes on disk)."""
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_text_field("text", stored=False, tokenizer_name="en_stem")
    sb.add_integer_field("rid", stored=True, indexed=False, fast=True)
    index = tantivy.Index(sb.build(), path=str(directory))
    t0 = time.perf_counter()
    writer = index.writer(heap_size=256_000_000, num_threads=threads)
    for rid, text in rows:
        writer.add_document(tantivy.Document(text=text, rid=rid))
    writer.commit()
    writer.wait_merging_threads()
    seconds = time.perf_counter() - t0
    index.reload()
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    return index, seconds, size


def tantivy_query(index, words: list[str]):
    import tantivy

    if not words:
        return None
    return tantivy.Query.boolean_query([(tantivy.Occur.Should, index.parse_query(w, ["text"])) for w in words])


def live_costs(index, n: int = 50) -> dict:
    """What keeping the index current costs: n single facts each made visible (add, commit, reload), then one batch
    of 1,000 facts committed at once."""
    import tantivy

    writer = index.writer(heap_size=50_000_000, num_threads=1)
    single = []
    for i in range(n):
        t0 = time.perf_counter()
        writer.add_document(tantivy.Document(text=f"live fact {i} about the tram to the harbour", rid=-1 - i))
        writer.commit()
        index.reload()
        single.append((time.perf_counter() - t0) * 1000.0)
    t0 = time.perf_counter()
    for i in range(1000):
        writer.add_document(tantivy.Document(text=f"batch fact {i} about the ferry to the island", rid=-100 - i))
    writer.commit()
    index.reload()
    batch = (time.perf_counter() - t0) * 1000.0
    writer.wait_merging_threads()
    p50, p99 = pct(single)
    return {"single_commit_p50_ms": p50, "single_commit_p99_ms": p99, "batch_1000_ms": batch}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True, help="a store scale.py built (kept with --dir)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    import scale

    from evermind_memory import MemoryStore
    from evermind_memory.store.lexical import query_words

    conn = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True)
    rows = conn.execute("SELECT rid, text FROM facts ORDER BY rid").fetchall()
    id_of = dict(conn.execute("SELECT rid, id FROM facts").fetchall())
    conn.close()
    qs = scale.questions(args.queries, seed=7)
    out: dict = {"facts": len(rows), "queries": len(qs)}
    with tempfile.TemporaryDirectory() as tmp:
        index, seconds, size = build_tantivy(rows, Path(tmp))
        out.update(tantivy_build_per_s=len(rows) / seconds, tantivy_bytes=size, tantivy_bytes_per_fact=size / len(rows))
        searcher = index.searcher()
        for q in qs[:10]:
            query = tantivy_query(index, query_words(q))
            if query is not None:
                searcher.search(query, 10)
        t_times, t_top = [], []
        for q in qs:
            t0 = time.perf_counter()
            query = tantivy_query(index, query_words(q))  # (our query words, then tantivy's parse of each)
            hits = [] if query is None else searcher.search(query, 10).hits
            t_top.append([searcher.doc(addr)["rid"][0] for _, addr in hits])
            t_times.append((time.perf_counter() - t0) * 1000.0)
        with MemoryStore(args.db, read_only=True) as store:
            for q in qs[:10]:
                store.recall(q, k=10, mode="lexical")
            o_times, o_top = [], []
            for q in qs:
                t0 = time.perf_counter()
                o_top.append([h.id for h in store.recall(q, k=10, mode="lexical")])
                o_times.append((time.perf_counter() - t0) * 1000.0)
        shared = [len({id_of[r] for r in t if r in id_of} & set(o)) / max(1, len(o)) for t, o in zip(t_top, o_top)]
        out.update(ours_p50_ms=pct(o_times)[0], ours_p99_ms=pct(o_times)[1], tantivy_p50_ms=pct(t_times)[0],
                   tantivy_p99_ms=pct(t_times)[1], top10_shared=float(np.mean(shared)))
        out.update(live_costs(index))
    print(f"{out['facts']:,} facts, {out['queries']} questions (scale.py's), k=10, this process")
    print(f"  tantivy build {out['tantivy_build_per_s']:,.0f} facts/s, "
          f"{out['tantivy_bytes_per_fact']:.0f} bytes a fact")
    print(f"  {'':10} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"  {'ours':10} {out['ours_p50_ms']:8.2f} {out['ours_p99_ms']:8.2f}")
    print(f"  {'tantivy':10} {out['tantivy_p50_ms']:8.2f} {out['tantivy_p99_ms']:8.2f}")
    print(f"  tantivy's top 10 found in ours: {out['top10_shared']:.1%}")
    print(f"  keeping tantivy current: one fact made visible {out['single_commit_p50_ms']:.1f} / "
          f"{out['single_commit_p99_ms']:.1f} ms (p50/p99), 1,000 at once {out['batch_1000_ms']:.0f} ms")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
