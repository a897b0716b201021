"""The documented min_relevance threshold on a personal test set that nothing was fitted or chosen on.

recipe/calibrate_fusion.py fits the relevance model on the manual sources and four personal sources (the
generated dev store, its hand-written part, the small stores, the validation set), and the threshold the README
recommends for personal facts was chosen from those sources' left-out figures (benchmarks/relevance_study.py).
This script judges that choice once, on benchmarks/data/personal_test.jsonl: 100 facts about ten more people,
written by hand after the threshold was chosen, each with a question that shares few words with it, and three
unanswerable questions a person (one of them a near miss: a cat asked of a person with a dog). The file is read by
nothing else: not by the fit, not by the study, not by the training corpus (its names are reserved).

Stores of every size a user has, built through the public API with the shipped model and rule:
- 5 facts: each person's store holds five of their facts (seeded); the questions of the other five are unanswerable
  there too (near misses: the person is in the store, the fact is not);
- 10 facts: each person alone;
- 100 facts: the ten people, each in their own scope;
- 1,000 facts: the same beside 900 facts of other people (benchmarks/personal_data.py's generated people).
In the last two every question is asked in its person's scope and across the store (first-person ones in the
scope only). Reported per store size and threshold: the share of right top hits a threshold keeps, and of
unanswerable questions whose top hit it drops (the issue's target: >= 80% kept, >= 50% dropped).

    python benchmarks/relevance_heldout.py [--thresholds 0.1,0.2,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
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

from personal_data import TEST_FILE, PersonalSet, Question, generated, hand_written  # noqa: E402
from personal_recall import build  # noqa: E402

THRESHOLDS = (0.1, 0.15, 0.2, 0.21, 0.25, 0.3)
WAYS = {"default": None, "no rerank": False}  # recall's default (reranks short notes) and plain hybrid
FIVE = 5
LARGE = 1000


def _asks(ps: PersonalSet, users: set[str], *, store_wide: bool) -> list[tuple[Question, bool]]:
    """(question, in its person's scope) for the questions of `users`; store-wide asks too when `store_wide`."""
    out = []
    for q in ps.questions:
        if q.user in users:
            out.append((q, True))
            if store_wide and not q.first_person:
                out.append((q, False))
    return out


def _recall(embedder: object, ps: PersonalSet, asks: list[tuple[Question, bool]], tmp: Path) -> list[dict]:
    """Each ask's hybrid top hit: whether it is the question's fact (None: unanswerable here) and its relevance."""
    store, ids = build(tmp / f"s{len(os.listdir(tmp))}.db", embedder, ps)
    try:
        out = []
        for q, scoped in asks:
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


def _only(ps: PersonalSet, keep: list[int]) -> PersonalSet:
    """The facts `keep` of ps (renumbered) and every question of their users: a question whose fact is not kept
    becomes unanswerable."""
    new = {old: i for i, old in enumerate(keep)}
    users = {ps.facts[i].user for i in keep}
    qs = [Question(q.text, q.user, new.get(q.fact) if q.fact is not None else None, q.category, q.first_person,
                   q.part) for q in ps.questions if q.user in users]
    return PersonalSet([ps.facts[i] for i in keep], qs)


def _with_others(ps: PersonalSet, n_total: int) -> PersonalSet:
    """ps beside facts of other people (personal_data's generated people, seeds 0 and 1) up to n_total facts; their
    questions are not asked."""
    others = [f for seed in (0, 1) for f in generated(seed).facts]
    return PersonalSet(list(ps.facts) + others[:n_total - len(ps.facts)], list(ps.questions))


def collect(embedder: object, ps: PersonalSet) -> dict[str, list[dict]]:
    """Every ask of every store size (see the module doc)."""
    users = sorted({f.user for f in ps.facts if f.user})
    by_user = {u: [i for i, f in enumerate(ps.facts) if f.user == u] for u in users}
    out: dict[str, list[dict]] = {"5": [], "10": [], "100": [], "1000": []}
    with tempfile.TemporaryDirectory(prefix="relevance_heldout_") as tmp_name:
        tmp = Path(tmp_name)
        for u in users:
            five = sorted(random.Random(f"heldout-{u}").sample(by_user[u], FIVE))
            small = _only(ps, five)
            out["5"] += _recall(embedder, small, _asks(small, {u}, store_wide=False), tmp)
            alone = _only(ps, by_user[u])
            out["10"] += _recall(embedder, alone, _asks(alone, {u}, store_wide=False), tmp)
        out["100"] = _recall(embedder, ps, _asks(ps, set(users), store_wide=True), tmp)
        large = _with_others(ps, LARGE)
        out["1000"] = _recall(embedder, large, _asks(large, set(users), store_wide=True), tmp)
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
    args = ap.parse_args(argv)
    thresholds = [float(t) for t in args.thresholds.split(",")]
    from recall_quality import load_embedder

    embedder = load_embedder(None, None)
    asks = collect(embedder, hand_written(TEST_FILE))
    results = {}
    for way in WAYS:
        results[way] = {size: judge([a[way] for a in rows], thresholds) for size, rows in asks.items()}
        results[way]["all"] = judge([a[way] for rows in asks.values() for a in rows], thresholds)
        print(f"\nmodel {embedder.fingerprint}; hybrid recall's top hit ({way}), {TEST_FILE.name}")
        print(table(results[way], thresholds))
    if args.json:
        Path(args.json).write_text(json.dumps({"fingerprint": embedder.fingerprint, "results": results,
                                               "asks": asks}, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
