"""A training-free second stage on hybrid recall: the store's hybrid top 30 reranked by its own score plus w x MaxSim
over the lexicon's word vectors (issue 36), on the personal-memory protocol, the validation set and the dev manuals.

MaxSim is the store's own (store/rerank.py word_match, as `late_interaction.py --tokens lexicon` computes it): each
question word's best cosine with the memory's words (the lexicon's unit rows), weighted by the word's lexicon weight.
The hybrid score is min-max scaled over the 30 (its scale changes with the store), so a candidate's new score is
scaled score + w x MaxSim. Nothing is fitted here: every weight is shown, and w = 0 is the store's own hybrid
ranking; the last column is `recall(..., rerank=True)` itself (store/rerank.py, w = 0.5), which must equal the w = 0.5
column. The store's fusion rule was fitted on these sources (the shipped rule), so the w = 0 column is in-sample, in
hybrid's favour.

- personal: benchmarks/personal_data.py's protocol through personal_recall.build (each fact in its user's scope),
  every answerable ask in the person's scope and store-wide (third-person questions): right first and MRR@10;
- validation: personal_data.validation_set(), the same;
- manual: the first 120 questions of each dev source among their gold docs and the source's other docs up to 600
  (as late_interaction.py), one store each: ndcg@10.

    python benchmarks/rerank_lexicon.py [--dev-dir DIR] [--sources apache,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402

from evermind_memory.store.rerank import word_match  # noqa: E402

WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.8)
COLUMNS = (*WEIGHTS, "store")
POOL = 30  # the hybrid hits reranked (--pool; the store's own rerank, the last column, reads RERANK_POOL = 30)
MATCH_SECONDS: list[float] = []  # the word match's time, a question at a time


def reranked(view, question: str, lexicon) -> dict[object, list[str]]:
    """{w: fact ids in reranked order} of the hybrid top POOL, and {"store": the same by recall(rerank=True)}."""
    hits = view.recall(question, k=POOL, mode="hybrid", rerank=False)
    if not hits:
        return {w: [] for w in COLUMNS}
    s = np.array([h.score for h in hits], dtype=np.float64)  # (P,)
    span = s.max() - s.min()
    base = (s - s.min()) / span if span > 0 else np.zeros_like(s)
    t0 = time.perf_counter()
    maxsim = word_match(lexicon, question, [h.text for h in hits])  # (P,) the store's own word match
    MATCH_SECONDS.append(time.perf_counter() - t0)
    ids = [h.id for h in hits]
    out = {w: [ids[i] for i in np.argsort(-(base + w * maxsim), kind="stable")] for w in WEIGHTS}
    out["store"] = [h.id for h in view.recall(question, k=POOL, rerank=True)]  # the product's path (w 0.5)
    return out


def personal(embedder, ps, rank: Callable, columns: Sequence) -> dict[str, dict[object, tuple[int, float]]]:
    """{"scoped" | "store-wide": {column: (right first, MRR@10)}} over the answerable asks, each ranked by
    rank(view, question) -> {column: fact ids, best first} (reranked(), or rerank_gate.py's ways)."""
    from personal_recall import build

    out = {"scoped": {c: [0, 0.0] for c in columns}, "store-wide": {c: [0, 0.0] for c in columns}}
    with tempfile.TemporaryDirectory(prefix="rerank_") as tmp:
        store, ids = build(Path(tmp) / "p.db", embedder, ps)
        try:
            for q in ps.questions:
                if q.fact is None:
                    continue
                for part in ("scoped", "store-wide"):
                    if part == "store-wide" and q.first_person:
                        continue
                    view = store.scope(user=q.user) if part == "scoped" else store
                    for c, order in rank(view, q.text).items():
                        top = order[:10]
                        if ids[q.fact] in top:
                            at = top.index(ids[q.fact]) + 1
                            out[part][c][0] += at == 1
                            out[part][c][1] += 1.0 / at
        finally:
            store.close()
    return {p: {c: (int(v[0]), float(v[1])) for c, v in r.items()} for p, r in out.items()}


def manual(embedder, dev: Path, source: str, rank: Callable, columns: Sequence) -> dict[object, float]:
    """{column: ndcg@10} over the first 120 questions of a dev source among its gold docs and its other docs up
    to 600, one store, each ranked by rank(view, question) as in personal()."""
    from evermind_memory import MemoryStore

    rows = [json.loads(line) for line in open(dev / f"{source}.jsonl")][:120]
    extra = [json.loads(line)["doc"] for line in open(dev / f"{source}.docs.jsonl")]
    docs = list(dict.fromkeys([r["doc"] for r in rows] + extra))[:600]
    gains: dict[object, list[float]] = {c: [] for c in columns}
    with tempfile.TemporaryDirectory(prefix="rerank_") as tmp, MemoryStore(Path(tmp) / "m.db", embedder) as store:
        ids = store.remember_many(docs)
        for r in rows:
            gold = ids[docs.index(r["doc"])]
            for c, order in rank(store, r["query"]).items():
                top = order[:10]
                gains[c].append(1 / np.log2(top.index(gold) + 2) if gold in top else 0.0)
    return {c: float(np.mean(g)) for c, g in gains.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev-dir", type=Path, default=ROOT / "data" / "dev")
    ap.add_argument("--sources", default="apache,gimp,libreoffice,lilypond,maxima,nodejs,octave,rust,statsmodels")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--word-vectors", type=Path, default=None,
                    help="a lexicon file whose word vectors the w columns match with (recipe/train_word_rerank.py); "
                         "default: the embedder's lexicon. The last column stays the store's own rerank")
    ap.add_argument("--pool", type=int, default=POOL, help="rerank this many hybrid hits (the curve over N)")
    args = ap.parse_args(argv)
    globals()["POOL"] = args.pool
    from personal_data import personal_set, validation_set

    from evermind_memory import default_embedder

    embedder = default_embedder()
    if args.word_vectors is not None:
        from evermind_memory.lm.lexicon import Lexicon

        lexicon = Lexicon.load(args.word_vectors)
    else:
        lexicon = embedder.lexicon

    def rank(view, question: str) -> dict[object, list[str]]:
        return reranked(view, question, lexicon)
    table: dict[str, dict[object, str]] = {}
    raw: dict[str, dict] = {}
    for name, ps in (("personal", personal_set()), ("validation", validation_set())):
        res = personal(embedder, ps, rank, COLUMNS)
        raw[name] = res
        for part, by_w in res.items():
            table[f"{name} {part}: right first / MRR@10"] = {w: f"{a} / {b:.1f}" for w, (a, b) in by_w.items()}
        print(name, res, flush=True)
    means: dict[object, list[float]] = {w: [] for w in COLUMNS}
    for source in [s for s in args.sources.split(",") if s]:
        res = manual(embedder, args.dev_dir, source, rank, COLUMNS)
        raw[source] = res
        table[f"manual {source} (ndcg@10)"] = {w: f"{v:.4f}" for w, v in res.items()}
        for w, v in res.items():
            means[w].append(v)
        print(source, res, flush=True)
    if any(means.values()):
        table["manual mean"] = {w: f"{np.mean(v):.4f}" for w, v in means.items()}
    print(f"\npool {POOL}: the word match took {1000 * np.mean(MATCH_SECONDS):.2f} ms a question (p99 "
          f"{1000 * np.percentile(MATCH_SECONDS, 99):.2f}) over {len(MATCH_SECONDS)} questions")
    print(f"\n| set | {' | '.join(f'w={w}' for w in WEIGHTS)} | recall(rerank=True) |")
    print(f"|---|{'---|' * len(COLUMNS)}")
    for name, by_w in table.items():
        print(f"| {name} | " + " | ".join(by_w[w] for w in COLUMNS) + " |")
    if args.json:
        args.json.write_text(json.dumps({n: {str(w): v for w, v in r.items()} for n, r in raw.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
