"""What storing vectors compactly (issue 34 item 3) costs in recall: exact vs stored ranking.

For every dev source (/work/data/dev, recipe/build_devsets.py), the corpus's held-out eval sets and the personal
dev set (benchmarks/personal_data.py: every fact, store-wide questions with an answer), the shipped model embeds
docs and queries once; each query's top 10 is ranked by exact cosine over the docs' float32 vectors (what a row
held up to schema 4), over float16 rows (schemas 5 and 6) and over the vectors a row holds now
(backend/vector_blobs.as_stored: int8 components and a float32 scale a row, read back at unit length), the query in
float32 every time. Reported per set: ndcg@10 of each, the stored rows' difference from float32, and how many top-10
lists differ at all. Vector ranking only: lexical recall does not read vectors, and hybrid recall fuses the same
cosine.

    python benchmarks/compact_vectors.py [--dev /work/data/dev] [--corpus /work/corpus] [--limit 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # read once, at numpy's import
    os.environ.setdefault(_var, "2")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

from dev_pools import dev_sources, load_dev_source, load_eval_source  # noqa: E402
from evermind_memory.embedder.loader import default_embedder  # noqa: E402
from evermind_memory.store.backend import vector_blobs  # noqa: E402
from personal_data import personal_set  # noqa: E402
from recall_quality import exact_rankings, rank_metrics  # noqa: E402

EVAL_SOURCES = ("debian", "pyapi", "foldoc")


def sets(dev: Path, corpus: Path, limit: int) -> list[tuple[str, list[str], list[str], np.ndarray]]:
    """(name, queries, docs, gold (Q,)) of every set that is on this machine."""
    out = []
    if dev.is_dir():
        for name in dev_sources(dev):
            s = load_dev_source(name, dev, limit)
            out.append((name, s.queries, s.docs, s.gold))
    for name in EVAL_SOURCES:
        if (corpus / "eval" / f"{name}.jsonl").is_file():
            s = load_eval_source(name, corpus)
            q = limit or len(s.queries)
            out.append((f"eval/{name}", s.queries[:q], s.docs, s.gold[:q]))
    ps = personal_set()
    asked = [q for q in ps.questions if q.fact is not None][: limit or None]
    out.append(("personal", [q.text for q in asked], [f.text for f in ps.facts],
                np.array([q.fact for q in asked], dtype=np.int64)))
    return out


def float16_rows(vectors: np.ndarray) -> np.ndarray:
    """(N, D) unit vectors as the float16 rows of schemas 5 and 6 gave them back: rounded, scaled to unit length."""
    back = np.asarray(vectors, dtype=np.float32).astype("<f2").astype(np.float32)  # (N, D)
    return back / np.linalg.norm(back, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev", type=Path, default=Path("/work/data/dev"))
    parser.add_argument("--corpus", type=Path, default=Path("/work/corpus"))
    parser.add_argument("--limit", type=int, default=0, help="at most this many queries a set (0: all)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    embedder = default_embedder()
    rows = []
    for name, queries, docs, gold in sets(args.dev, args.corpus, args.limit):
        d32 = np.asarray(embedder.embed_many(docs), dtype=np.float32)  # (N, D)
        d16 = float16_rows(d32)  # (N, D)
        d8 = vector_blobs.as_stored(d32)  # (N, D)
        q = np.asarray(embedder.embed_many(queries), dtype=np.float32)  # (Q, D)
        exact, half, stored = exact_rankings(q, d32), exact_rankings(q, d16), exact_rankings(q, d8)
        a, h, b = (rank_metrics(r, gold)["ndcg@10"] for r in (exact, half, stored))
        changed = sum(x != y for x, y in zip(exact, stored))
        rows.append({"set": name, "queries": len(queries), "docs": len(docs), "ndcg@10_float32": a,
                     "ndcg@10_float16": h, "ndcg@10_stored": b, "delta_float16": h - a, "delta": b - a,
                     "top10_lists_changed": changed, "max_abs_component_error": float(np.abs(d8 - d32).max())})
        print(json.dumps(rows[-1]), file=sys.stderr)
    keys = ("ndcg@10_float32", "ndcg@10_float16", "ndcg@10_stored", "delta_float16", "delta")
    mean = {k: float(np.mean([r[k] for r in rows])) for k in keys}
    print(f"{'set':<16} {'queries':>7} {'docs':>6} | {'ndcg@10 f32':>11} {'f16':>7} {'int8 (stored)':>13} "
          f"{'delta':>8} | stored top-10 changed")
    for r in rows + [{"set": "mean", "queries": "", "docs": "", **mean, "top10_lists_changed": None}]:
        changed = "" if r["top10_lists_changed"] is None else f"{r['top10_lists_changed']}/{r['queries']}"
        print(f"{r['set']:<16} {r['queries']:>7} {r['docs']:>6} | {r['ndcg@10_float32']:11.4f} "
              f"{r['ndcg@10_float16']:7.4f} {r['ndcg@10_stored']:13.4f} {r['delta']:+8.4f} | {changed}")
    if args.json:
        meta = {"python": platform.python_version(), "model": embedder.fingerprint, "limit": args.limit}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows, "mean": mean}, indent=2))


if __name__ == "__main__":
    main()
