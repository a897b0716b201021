"""recall's default second stage: reranked only where the hits are short notes. What the gate does on every dev set.

store/rerank.py reorders hybrid recall's best 30 by a word match over the lexicon; `recall(rerank=None)`, the
default, does so only when the hits' median length is under NOTES_CHARS. This script runs each question three ways
through the public API, `rerank=False`, the default and `rerank=True`, and reports the sets' figures and the median
length of each question's hybrid top 30 (the gate's input), so that the gate is seen to separate the personal sets
(reranked) from the manual sources (left as hybrid ranks them):

- personal: benchmarks/personal_data.py's dev protocol (personal_recall.build: each fact in its user's scope), every
  answerable ask in the person's scope and store-wide (third-person questions): right first and MRR@10;
- validation: personal_data.validation_set(), the same;
- manual: the first 120 questions of each dev source among their gold docs and the source's other docs up to 600,
  one store each: ndcg@10.

The stores and the scoring are rerank_lexicon.py's (`personal`, `manual`); only the ranking differs.

    python benchmarks/rerank_gate.py [--dev-dir DIR] [--sources apache,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402

from rerank_lexicon import manual, personal  # noqa: E402

WAYS = {"off": False, "default": None, "always": True}
SOURCES = "apache,gimp,libreoffice,lilypond,maxima,nodejs,octave,rust,statsmodels"


def ranker(medians: list[float]):
    """rank(view, question) -> {way: the top 10 ids} for rerank_lexicon.py's personal() and manual(), which appends
    the median length of each question's hybrid top 30 (the gate's input) to `medians`."""
    def rank(view, question: str) -> dict[str, list[str]]:
        pool = view.recall(question, k=30, rerank=False)
        medians.append(float(np.median([len(h.text) for h in pool])) if pool else 0.0)
        return {way: [h.id for h in view.recall(question, k=10, rerank=flag)] for way, flag in WAYS.items()}

    return rank


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev-dir", type=Path, default=Path(os.environ.get("EVERMIND_DEV_DIR", "/work/data/dev")))
    ap.add_argument("--sources", default=SOURCES)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from personal_data import personal_set, validation_set

    from evermind_memory import default_embedder
    from evermind_memory.store.rerank import NOTES_CHARS

    embedder = default_embedder()
    lines, raw = [], {}
    for name, ps in (("personal", personal_set()), ("validation", validation_set())):
        m: list[float] = []
        res = {**personal(embedder, ps, ranker(m), WAYS), "medians": m}
        raw[name] = res
        for part in ("scoped", "store-wide"):
            cells = [f"{res[part][w][0]} / {res[part][w][1]:.1f}" for w in WAYS]
            lines.append(f"| {name} {part}: right first / MRR@10 summed | " + " | ".join(cells)
                         + f" | {min(m):.0f} to {max(m):.0f} |")
        print(name, {p: res[p] for p in ("scoped", "store-wide")}, flush=True)
    means: dict[str, list[float]] = {w: [] for w in WAYS}
    for source in [s for s in args.sources.split(",") if s]:
        m = []
        res = {**manual(embedder, args.dev_dir, source, ranker(m), WAYS), "medians": m}
        raw[source] = res
        for w in WAYS:
            means[w].append(res[w])
        lines.append(f"| manual {source}: ndcg@10 | " + " | ".join(f"{res[w]:.4f}" for w in WAYS)
                     + f" | {min(m):.0f} to {max(m):.0f} |")
        print(source, {w: res[w] for w in WAYS}, flush=True)
    if means["off"]:
        lines.append("| manual mean | " + " | ".join(f"{np.mean(means[w]):.4f}" for w in WAYS) + " | |")
    print(f"\nmodel {embedder.fingerprint}; the default reranks where the top 30's median length < {NOTES_CHARS}")
    print("| set | rerank=False | default | rerank=True | median length of the hybrid top 30 (chars) |")
    print("|---|---|---|---|---|")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"fingerprint": embedder.fingerprint, "notes_chars": NOTES_CHARS,
                                         "results": raw}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
