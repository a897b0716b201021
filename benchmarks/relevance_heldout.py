"""The documented min_relevance threshold on personal test sets that nothing was fitted or chosen on.

recipe/calibrate_fusion.py fits the relevance model on the manual sources and six personal sources (the generated
dev store, its hand-written part, the small stores, the validation set, and since the second test set was written
thirty more hand-written people in stores of 5 to 2,000 facts, benchmarks/personal_sizes.py), and the threshold the
README recommends for personal facts (0.2) was chosen from those sources' left-out figures
(benchmarks/relevance_study.py). This script judges them on a test set of hand-written facts about people, each
with a question that shares few words with it, and three unanswerable questions a person (the first a near miss: a
cat asked of a person with a dog), written after the choice and read by nothing else (not the fit, not the study,
not the training corpus: its names are reserved):
- `--test 1`, benchmarks/data/personal_test.jsonl (ten people): judged the relevance fitted before the thirty people
  joined (benchmarks/results/relevance_heldout.json), read since for a query map not adopted
  (relevance_heldout_query_map.txt) and a third time for the refit (benchmarks/results/relevance_heldout2.txt);
- `--test 2`, benchmarks/data/personal_test2.jsonl (twelve people, two in the first person): written with the
  thirty, read first for the refit (benchmarks/results/relevance_heldout2.txt).

Stores of every size a user has (benchmarks/personal_sizes.py `layout`), built through the public API with the
shipped model and rule: five of a person's facts (the other five questions unanswerable there: near misses), a
person alone (10 facts), all the test's people each in their own scope (100 or 120 facts), and the same beside
other people's facts up to 1,000 (benchmarks/personal_data.py's generated people). In the last two every question
is asked in its person's scope and across the store (first-person ones in the scope only). Reported per store
size and threshold: the share of right top hits a threshold keeps, and of unanswerable questions whose top hit it
drops (the target: >= 80% kept, >= 50% dropped).

    python benchmarks/relevance_heldout.py [--test 1|2] [--fusion F.json | --minilm] [--thresholds 0.1,0.2,...]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from personal_data import TEST2_FILE, TEST3_FILE, TEST_FILE, PersonalSet, hand_written  # noqa: E402
from personal_recall import build, minilm_embedder  # noqa: E402
from personal_sizes import FIVE, Store, layout  # noqa: E402

THRESHOLDS = (0.1, 0.15, 0.2, 0.21, 0.25, 0.3)
WAYS = {"default": None, "no rerank": False}  # recall's default (reranks short notes) and plain hybrid
LARGE = 1000


def _recall(embedder: object, st: Store, tmp: Path) -> list[dict]:
    """Each ask's hybrid top hit: whether it is the question's fact (None: unanswerable here) and its relevance."""
    store, ids = build(tmp / f"s{len(os.listdir(tmp))}.db", embedder, st.ps)
    try:
        out = []
        for qi, scoped in st.asks:
            q = st.ps.questions[qi]
            view = store.scope(user=q.user) if scoped else store
            row = {"q": q.text, "user": q.user, "scoped": scoped}
            for way, rerank in WAYS.items():
                hits = view.recall(q.text, k=1, rerank=rerank)
                row[way] = {"right": None if q.fact is None else bool(hits) and hits[0].id == ids[q.fact],
                            "relevance": hits[0].relevance if hits else 0.0}
            out.append(row)
        return out
    finally:
        store.close()


def collect(embedder: object, ps: PersonalSet, few: Sequence[int] = (FIVE,),
            groups: bool = True) -> dict[str, list[dict]]:
    """Every ask of every store of the layout (see the module doc), by store size: a person's `few` facts, the
    person alone, and (with `groups`) the group alone and beside other people."""
    out: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="relevance_heldout_") as tmp_name:
        for st in layout(ps, large=(LARGE,), few=few, groups=groups):
            out.setdefault(st.label, []).extend(_recall(embedder, st, Path(tmp_name)))
    return out


def judge(asks: list[dict], thresholds: Sequence[float]) -> dict:
    """Right first, and per threshold the share of right top hits kept and of unanswerable top hits dropped, for
    asks {"right": True / False / None (unanswerable), "relevance"}."""
    right = [a["relevance"] for a in asks if a["right"]]
    none = [a["relevance"] for a in asks if a["right"] is None]
    answerable = sum(a["right"] is not None for a in asks)
    return {"answerable": answerable, "right_first": len(right), "unanswerable": len(none),
            "at": {f"{t:g}": {"kept": sum(r >= t for r in right) / max(len(right), 1),
                              "dropped": sum(r < t for r in none) / max(len(none), 1)} for t in thresholds}}


def table(results: dict, thresholds: Sequence[float]) -> str:
    head = "| store (facts) | right first | unanswerable asks | " + " | ".join(
        f"{t:g}: kept / dropped" for t in thresholds) + " |"
    lines = [head, "|" + "---|" * (3 + len(thresholds))]
    for size, r in results.items():
        cells = [f"{r['at'][f'{t:g}']['kept']:.0%} / {r['at'][f'{t:g}']['dropped']:.0%}" for t in thresholds]
        lines.append(f"| {size} | {r['right_first']} of {r['answerable']} | {r['unanswerable']} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thresholds", default=",".join(f"{t:g}" for t in THRESHOLDS))
    ap.add_argument("--json", default=None, help="write the results (and every ask) here")
    ap.add_argument("--test", choices=("1", "2", "3"), default="1",
                    help="which test set: 1, personal_test.jsonl (judged the relevance fitted without "
                         "personal_fit.jsonl; read twice), 2, personal_test2.jsonl (judged the one fitted with it), "
                         "3, personal_test3.jsonl (judges the one fitted with every store size weighed alike)")
    ap.add_argument("--fusion", default=None,
                    help="a fusion JSON to judge instead of the shipped one (recipe/calibrate_fusion.py --out)")
    ap.add_argument("--minilm", action="store_true",
                    help="the reference row instead: all-MiniLM-L6-v2 in our store with its own fitted rule and "
                         "relevance (benchmarks/results/fusion_minilm.json)")
    ap.add_argument("--few", default=str(FIVE),
                    help="sizes of the stores drawn from one person's facts, comma-separated (default 5)")
    ap.add_argument("--no-groups", action="store_true",
                    help="only the stores of one person (the --few sizes and the person alone): minutes less")
    args = ap.parse_args(argv)
    thresholds = [float(t) for t in args.thresholds.split(",")]
    from recall_quality import load_embedder

    if args.minilm and args.fusion:
        ap.error("--minilm judges MiniLM's own fitted relevance; --fusion is for the shipped model")
    embedder = minilm_embedder() if args.minilm else load_embedder(None, None)
    if args.fusion:
        embedder.fusion_params = args.fusion  # the store reads an embedder's own rule first (fusion.params_for)
    test_file = {"1": TEST_FILE, "2": TEST2_FILE, "3": TEST3_FILE}[args.test]
    asks = collect(embedder, hand_written(test_file), few=[int(n) for n in args.few.split(",")],
                   groups=not args.no_groups)
    results = {}
    for way in WAYS:
        results[way] = {size: judge([a[way] for a in rows], thresholds) for size, rows in asks.items()}
        results[way]["all"] = judge([a[way] for rows in asks.values() for a in rows], thresholds)
        print(f"\nmodel {embedder.fingerprint}; hybrid recall's top hit ({way}), {test_file.name}"
              + (f", relevance of {args.fusion}" if args.fusion else ""))
        print(table(results[way], thresholds))
    if args.json:
        Path(args.json).write_text(json.dumps({"fingerprint": embedder.fingerprint, "results": results,
                                               "asks": asks}, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
