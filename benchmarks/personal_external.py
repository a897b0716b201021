"""The personal-memory dev protocol for an embedder that cannot be imported here (another venv, another Python).

Step 1 writes the protocol's texts (the dev set and the validation set: facts with their users, questions with
their user, answer and kind) to a JSON file. Step 2, anywhere, embeds them and saves an .npz with, per set S
("dev", "val"), S_facts (N, D) and S_questions (Q, D) unit rows in the file's order (an asymmetric embedder embeds
questions as queries, facts as passages). Step 3 scores those vectors by exact cosine as
benchmarks/lexicon_mix.py scores ours (right fact first, in the person's scope and store-wide; the hand-written asks
apart: lexicon_mix.right_first), beside the shipped model and, with --minilm, all-MiniLM-L6-v2 computed here.

    python benchmarks/personal_external.py --dump texts.json
    <other python> -c "...embed texts.json, np.savez('vecs.npz', dev_facts=..., dev_questions=..., ...)"
    python benchmarks/personal_external.py --score vecs.npz --label NAME [--minilm]

Used to check a teacher before carrying it to the GPU (docs/training.md): the model must beat all-MiniLM-L6-v2 on
this protocol to be worth distilling from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402

from lexicon_mix import right_first  # noqa: E402
from personal_data import PersonalSet, personal_set, validation_set  # noqa: E402

SETS = {"dev": personal_set, "val": validation_set}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", type=Path, help="write the protocol's texts here")
    parser.add_argument("--score", type=Path, help="score the vectors of this .npz")
    parser.add_argument("--label", default="external")
    parser.add_argument("--minilm", action="store_true", help="also all-MiniLM-L6-v2, embedded here")
    args = parser.parse_args()
    sets = {name: make() for name, make in SETS.items()}
    if args.dump:
        args.dump.write_text(json.dumps({name: {
            "facts": [{"text": f.text, "user": f.user} for f in ps.facts],
            "questions": [{"text": q.text, "user": q.user, "fact": q.fact, "first_person": q.first_person,
                           "part": q.part, "category": q.category} for q in ps.questions]}
            for name, ps in sets.items()}) + "\n")
        print(f"wrote {args.dump}")
    if not args.score:
        return
    from evermind_memory import default_embedder

    def counts(facts: np.ndarray, questions: np.ndarray, ps: PersonalSet) -> dict[str, int]:
        return right_first(facts, questions[[q.fact is not None for q in ps.questions]], ps)  # (answerable rows)

    rows = {}
    with np.load(args.score) as z:
        rows[args.label] = {name: counts(z[f"{name}_facts"], z[f"{name}_questions"], ps) for name, ps in sets.items()}
    embedders = {"shipped": default_embedder()}
    if args.minilm:
        from personal_recall import minilm_embedder

        embedders["all-MiniLM-L6-v2"] = minilm_embedder()
    for label, emb in embedders.items():
        rows[label] = {name: counts(emb.embed_many([f.text for f in ps.facts]),
                                    emb.embed_many([q.text for q in ps.questions]), ps) for name, ps in sets.items()}
    print("| embedder | dev: scoped / store-wide / all (of 470 / 350 / 820) | dev hand-written (of 85) | "
          "validation (of 100 / 80 / 180) |")
    print("|---|---|---|---|")
    for label, r in rows.items():
        d, v = r["dev"], r["val"]
        print(f"| {label} | {d['scoped']} / {d['store_wide']} / {d['all']} | {d['hand']} | "
              f"{v['scoped']} / {v['store_wide']} / {v['all']} |")


if __name__ == "__main__":
    main()
