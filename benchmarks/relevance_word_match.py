"""Does the rerank's word match tell right top hits from unanswerable questions better than relevance alone?

On the personal-memory dev protocol and the validation set (benchmarks/personal_data.py; not the test set), every
scoped ask goes through the public API (`recall(k=3, explain=True)`, recall's defaults: hybrid, reranked short
notes). Its top hit gives: relevance; the word match of store/rerank.py (the question words' best cosines with the
hit's words over the lexicon, by the words' weights); the weakest match among the question's heavier half of words;
the weighted share of question words matched below 0.5; and the word match's lead over the second hit. Right top
hits of answerable asks are the positives, top hits of unanswerable asks the negatives. Reported: each feature's
AUC, and the AUC of logistic regressions over relevance's logit plus the word features, five-fold by person (each
person's asks in one fold), so a combination is judged on people it was not fitted on.

    python benchmarks/relevance_word_match.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import personal_recall as pr  # noqa: E402
from evermind_memory import default_embedder  # noqa: E402
from evermind_memory.store.rerank import unit_rows  # noqa: E402
from personal_data import personal_set, validation_set  # noqa: E402

FEATURES = ("relevance", "word_match", "weakest", "unmatched", "lead")
COMBOS = {"relevance": [0], "+ word_match": [0, 1], "+ weakest": [0, 2], "+ word_match, weakest": [0, 1, 2],
          "+ all four": [0, 1, 2, 3, 4]}


def word_features(lexicon: object, query: str, text: str) -> tuple[float, float, float]:
    """(word match, the weakest best cosine among the heavier half of the query's words, the weighted share of
    query words whose best cosine is under 0.5); zeros when either side has no word the lexicon knows."""
    q_ids, t_ids = lexicon.word_ids(query), lexicon.word_ids(text)
    if not q_ids or not t_ids:
        return 0.0, 0.0, 0.0
    weight = lexicon.weight[np.asarray(q_ids, dtype=np.intp)].astype(np.float64)  # (Q,)
    best = (unit_rows(lexicon, q_ids) @ unit_rows(lexicon, t_ids).T).max(axis=1)  # (Q,)
    share = weight / max(weight.sum(), 1e-12)  # (Q,)
    return float(share @ best), float(best[weight >= np.median(weight)].min()), float(share @ (best < 0.5))


def collect(embedder: object) -> list[dict]:
    """One row per scoped ask of the dev protocol and the validation set with a top hit."""
    rows = []
    for name, ps in (("dev", personal_set()), ("validation", validation_set())):
        with tempfile.TemporaryDirectory(prefix="relevance_wm_") as tmp:
            store, ids = pr.build(Path(tmp) / "p.db", embedder, ps)
            index = {fid: i for i, fid in enumerate(ids)}
            try:
                for qi, scope in pr.asks(ps):
                    q = ps.questions[qi]
                    if scope != "scoped":
                        continue
                    hits = store.scope(user=q.user).recall(q.text, k=3, explain=True)
                    if not hits:
                        continue
                    wm, weakest, unmatched = word_features(embedder.lexicon, q.text, hits[0].text)
                    second = word_features(embedder.lexicon, q.text, hits[1].text)[0] if len(hits) > 1 else 0.0
                    rows.append({"set": name, "user": q.user, "answerable": q.fact is not None,
                                 "right": q.fact is not None and index[hits[0].id] == q.fact,
                                 "relevance": hits[0].relevance, "word_match": wm, "weakest": weakest,
                                 "unmatched": -unmatched, "lead": wm - second})
            finally:
                store.close()
    return rows


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counting half."""
    return float((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean())


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1e-2, steps: int = 3000) -> np.ndarray:
    """Weights (F + 1,) of an L2-regularised logistic regression, by gradient descent (features are O(1))."""
    Xb = np.c_[X, np.ones(len(X))]  # (N, F + 1)
    w = np.zeros(Xb.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-Xb @ w))  # (N,)
        w -= 0.5 * (Xb.T @ (p - y) / len(y) + l2 * np.r_[w[:-1], 0.0])
    return w


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    rows = [r for r in collect(default_embedder()) if r["right"] or not r["answerable"]]
    y = np.array([r["right"] for r in rows], dtype=float)  # (N,)
    p = np.clip([r["relevance"] for r in rows], 1e-4, 1 - 1e-4)
    X = np.c_[np.log(p / (1 - p)), [[r[f] for f in FEATURES[1:]] for r in rows]]  # (N, 5)
    out: dict = {"right_top_hits": int(y.sum()), "unanswerable": int((1 - y).sum()), "single": {}, "combined": {}}
    print(f"scoped asks, dev protocol + validation set: {int(y.sum())} right top hits, {int((1 - y).sum())} "
          "unanswerable asks")
    for j, name in enumerate(FEATURES):
        out["single"][name] = auc(X[y == 1, j], X[y == 0, j])
        print(f"  AUC of {name:<11} {out['single'][name]:.3f}")
    users = sorted({r["user"] for r in rows})
    fold_of = {u: i % 5 for i, u in enumerate(np.random.default_rng(0).permutation(users))}
    fold = np.array([fold_of[r["user"]] for r in rows])  # (N,)
    for name, cols in COMBOS.items():
        score = np.zeros(len(y))  # (N,) left-out logits
        for f in range(5):
            w = fit_logistic(X[fold != f][:, cols], y[fold != f])
            score[fold == f] = np.c_[X[fold == f][:, cols], np.ones(int((fold == f).sum()))] @ w
        out["combined"][name] = auc(score[y == 1], score[y == 0])
        print(f"  logistic, five-fold by person: {name:<24} AUC {out['combined'][name]:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
