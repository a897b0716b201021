"""Does a per-store null separate a right top hit from an unanswerable question's better than the raw cosine?

Relevance has to tell, in a store of a few facts, "the fact asked for is here" from "the closest fact is only the
least unrelated". One idea for it (a relevance feature not yet in the store): compare the query's top cosine with
what generic questions about a person (PROBES, written for this script: no dev set's wording or values) reach in
the same store, a per-store null. Judged by vector search alone (exact cosine, the shipped vector) on stores made
of random subsets of the personal dev protocol's and the validation set's facts (12 stores a size; questions about
a person the store holds, asked store-wide; a right top hit against the top hit of a question whose fact the store
lacks: the near misses relevance must drop), by AUC of each candidate feature:
- cos: the top hit's cosine; margin: its lead over the second; z_store: its z-score among the store's cosines;
- null_mean: cos minus the probes' mean top cosine in that store; null_rank: the share of probes it beats.
Not the held-out test set (benchmarks/relevance_heldout.py), which no choice reads.

With --store, also through the store as a user has it (8 stores a size, built by remember_many; recall's default
top hit): the AUC of its relevance, of its fused score and of vector recall's top cosine, and the share of right top
hits kept / unanswerable questions dropped at min_relevance 0.1, 0.2 and 0.3. These sets are among those the
relevance model was fitted on, so this shows what it does where it was fitted, not how it generalises.

    python benchmarks/relevance_null.py [--store]
"""
import argparse
import tempfile
import os
import sys
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402

from personal_data import personal_set, validation_set  # noqa: E402
from relevance_word_match import auc  # noqa: E402

from evermind_memory import MemoryStore  # noqa: E402
from evermind_memory.embedder.loader import default_embedder  # noqa: E402

emb = default_embedder()
PROBES = [  # generic questions about a person, written here (no dev set's wording or values)
 "what does she like?", "where does he live?", "what is her job?", "does he have any pets?", "when is her birthday?",
 "what does he eat?", "who is her partner?", "what does he do at weekends?", "is she allergic to anything?",
 "what car does he drive?", "which languages does she speak?", "what music does he listen to?",
 "where did she study?", "how many children does he have?", "what is his favourite drink?", "where is she travelling?",
 "what sport does he play?", "what books does she read?", "when is his next appointment?", "what does she hate?",
 "what is my job?", "where do I live?", "what do I like to drink?", "what are my hobbies?", "when was I born?",
 "who is my sister?", "what am I allergic to?", "what instrument do I play?", "what do I drive?", "what pet do I have?"]
P = emb.embed_many(PROBES)
def study(ps, label, rng):
    F = emb.embed_many([f.text for f in ps.facts])  # (N, D)
    Q = emb.embed_many([q.text for q in ps.questions])  # (Q, D)
    people = [i for i, f in enumerate(ps.facts) if f.person]
    qs = [i for i, q in enumerate(ps.questions) if q.fact is not None and not q.first_person]
    out = {}
    for size in [s for s in (5, 10, 30, 100, 300) if s < len(people)]:
        feats = {k: ([], []) for k in ("cos", "margin", "z_store", "null_mean", "null_rank")}
        for rep in range(12):
            held = rng.choice(people, size=min(size, len(people)), replace=False)  # (n,) the store's facts
            inside = set(held.tolist())
            users = {ps.facts[f].user for f in inside}
            Fs = F[held]
            pt = (P @ Fs.T).max(axis=1)  # (probes,) each probe's top cosine in this store
            for qi in qs:
                q = ps.questions[qi]
                if q.user not in users:
                    continue
                s = Fs @ Q[qi]  # (n,)
                order = np.argsort(-s)
                top = s[order[0]]
                right = held[order[0]] == q.fact
                answerable = q.fact in inside
                if answerable and not right:
                    continue  # only right top hits against unanswerable ones
                k = 0 if answerable else 1
                second = s[order[1]] if len(s) > 1 else 0.0
                feats["cos"][k].append(top)
                feats["margin"][k].append(top - second)
                feats["z_store"][k].append((top - s.mean()) / (s.std() + 1e-6))
                feats["null_mean"][k].append(top - pt.mean())
                feats["null_rank"][k].append((pt < top).mean())
        out[size] = {k: (auc(*map(np.asarray, v)), len(v[0]), len(v[1])) for k, v in feats.items()}
        print(f"| {label} | {size} | {out[size]['cos'][1]} / {out[size]['cos'][2]} | "
              + " | ".join(f"{out[size][k][0]:.3f}" for k in feats) + " |", flush=True)
def through_store(ps, label: str, rng: np.random.Generator) -> None:
    """Recall's default top hit in real stores of random subsets of `ps`'s facts: AUCs and threshold shares."""
    people = [i for i, f in enumerate(ps.facts) if f.person]
    qs = [i for i, q in enumerate(ps.questions) if q.fact is not None and not q.first_person]
    for size in [s for s in (5, 10, 30, 100) if s < len(people)]:
        feats = {k: ([], []) for k in ("relevance", "score", "vector_cos")}
        for _ in range(8):
            held = rng.choice(people, size=size, replace=False)  # (n,) the store's facts
            inside, users = set(held.tolist()), {ps.facts[f].user for f in held}
            with tempfile.TemporaryDirectory() as tmp, MemoryStore(Path(tmp) / "s.db", emb) as store:
                fact_of = dict(zip(store.remember_many([ps.facts[f].text for f in held]), held.tolist()))
                for qi in qs:
                    q = ps.questions[qi]
                    hits = store.recall(q.text, k=1) if q.user in users else []
                    if not hits or (q.fact in inside and fact_of[hits[0].id] != q.fact):
                        continue  # only right top hits against unanswerable questions' top hits
                    k = 0 if q.fact in inside else 1
                    feats["relevance"][k].append(hits[0].relevance)
                    feats["score"][k].append(hits[0].score)
                    feats["vector_cos"][k].append(store.recall(q.text, k=1, mode="vector")[0].score)
        right, unans = (np.asarray(v) for v in feats["relevance"])
        shares = " | ".join(f"{(right >= t).mean():.0%} / {(unans < t).mean():.0%}" for t in (0.1, 0.2, 0.3))
        print(f"| {label} | {size} | {len(right)} / {len(unans)} | "
              + " | ".join(f"{auc(*map(np.asarray, v)):.3f}" for v in feats.values()) + f" | {shares} |", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", action="store_true", help="also recall's relevance through real stores")
    args = parser.parse_args()
    print(f"shipped vector {emb.fingerprint}; AUC of a right top hit against an unanswerable question's top hit")
    print("| set | store (facts) | right / unanswerable | cos | margin | z_store | null_mean | null_rank |")
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    study(personal_set(), "dev protocol", rng)
    study(validation_set(), "validation", rng)
    if args.store:
        print("\nThrough the store (recall's default top hit; sets the relevance model was fitted on)")
        print("| set | store (facts) | right / unanswerable | AUC relevance | AUC fused score | AUC vector cosine | "
              "min_relevance 0.1: kept / dropped | 0.2 | 0.3 |")
        print("|---|---|---|---|---|---|---|---|---|")
        rng = np.random.default_rng(1)
        through_store(personal_set(), "dev protocol", rng)
        through_store(validation_set(), "validation", rng)
