"""The lexicon part of the vector (evermind_memory.lm.lexicon): how much it adds, by weight, on both dev families.

For each lexicon file and each lexicon_weight w, the embedder's vector is the shipped model's unit vector followed
by w x the text's unit lexicon vector (exactly what LMEmbedder(lexicon=..., lexicon_weight=w) computes: checked on
a sample of texts before the table is printed). Reported, by exact cosine:
- personal: the personal-memory dev protocol's answerable questions (benchmarks/personal_data.py), right fact first,
  asked in the person's scope and store-wide (third-person questions), the counts of personal_recall.py's vector
  rows;
- manuals: ndcg@10 on each of the nine dev manual sources (benchmarks/embedder_dev.py, DEV_DIR) and their mean;
- validation: the same counts on personal_data.validation_set() (100 scoped / 80 store-wide questions), the set a
  stage chooses its own variants on;
- left out: for each manual source, the weight the other eight sources' mean picks, and its ndcg@10 on the left-out
  source; for personal memory, the weight the nine manual sources pick.

With --unknown-weights, each lexicon is also tried with a vector for every word the table lacks (a name, an
identifier): a fixed pseudo-random unit vector of the word (seeded by its blake2b digest) times u times the median
norm of the table's 10,000 rarest weighted rows, so that two texts sharing a rare unknown word share a direction.
Not in the product (the figures in benchmarks/results/lexicon_mix.txt say why).

    python benchmarks/lexicon_mix.py --lexicon A.evlx [--lexicon B.evlx] [--weights 0.5,0.6,0.7,0.8]
        [--unknown-weights 0.25,0.5,1] [--model M.evlm] [--json out]

--model puts another checkpoint (with the shipped tokenizer) in the shipped model's place, e.g. one trained beside
a lexicon (recipe/train_embedder.py --lexicon). The model's vectors (without its lexicon) are cached on disk as
embedder_dev.py caches them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402

import embedder_dev as ed  # noqa: E402
from personal_data import personal_set, validation_set  # noqa: E402


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def mixed(model_vecs: np.ndarray, lex_vecs: np.ndarray, weight: float) -> np.ndarray:
    """What LMEmbedder returns with a lexicon: [model unit row, weight x lexicon unit row], normalised."""
    return unit(np.concatenate([model_vecs, np.float32(weight) * lex_vecs], axis=1))


def with_unknown(lex, u: float):  # -> callable texts -> (N, D) unit lexicon vectors
    """The lexicon's text vectors with a hashed vector for each unknown word (see the module docstring); with
    u = 0, the lexicon's own."""
    from evermind_memory.lm.lexicon import WORD_PATTERN
    import re

    if not u:
        return lex.embed_many
    word_re = re.compile(WORD_PATTERN)
    norms = np.linalg.norm(lex.table.astype(np.float32), axis=1) * lex.scale * lex.weight  # (V,)
    size = float(u * np.median(norms[-10000:]))
    memo: dict[str, np.ndarray] = {}

    def hashed(word: str) -> np.ndarray:
        if word not in memo:
            seed = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")
            v = np.random.default_rng(seed).standard_normal(lex.dims).astype(np.float32)
            memo[word] = v / np.linalg.norm(v)
        return memo[word]

    def embed(texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), lex.dims), np.float32)  # (N, D)
        for i, text in enumerate(texts):
            ids = lex.word_ids(text)
            if ids:
                out[i] = (lex.table[ids].astype(np.float32) * (lex.scale * lex.weight)[ids, None]).sum(axis=0)
            for word in word_re.findall(text.lower()):
                if word not in lex._index:
                    out[i] += size * hashed(word)
        return unit(out)

    return embed


def personal_first(vec: callable, ps) -> tuple[int, int]:
    """(scoped, store-wide) right-first counts of the answerable questions by exact cosine."""
    counts = personal_counts(vec, ps, None)
    return counts["scoped"], counts["store_wide"]


def personal_counts(vec: callable, ps, W: np.ndarray | None) -> dict[str, int]:
    """Right-first counts by exact cosine, the queries mapped by W: scoped, store-wide, and the hand-written asks."""
    qv = vec([q.text for q in ps.questions if q.fact is not None])  # (Q, D)
    return right_first(vec([f.text for f in ps.facts]), qv if W is None else unit(qv @ W), ps)


def right_first(facts: np.ndarray, qv: np.ndarray, ps) -> dict[str, int]:
    """Right-first counts of `ps`'s answerable questions (their vectors qv (Q, D), in order) among its facts
    (N, D) by exact cosine: in the person's scope, store-wide (third-person questions), the hand-written asks, all."""
    users = np.array([f.user or "" for f in ps.facts])
    qs = [q for q in ps.questions if q.fact is not None]
    sims = qv @ facts.T  # (Q, N)
    out = {"scoped": 0, "store_wide": 0, "hand": 0}
    for row, q in zip(sims, qs):
        scoped = int(np.argmax(np.where(users == q.user, row, -np.inf)) == q.fact)
        wide = int(np.argmax(row) == q.fact) if not q.first_person else 0
        out["scoped"] += scoped
        out["store_wide"] += wide
        if q.part == "hand":
            out["hand"] += scoped + wide
    out["all"] = out["scoped"] + out["store_wide"]
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lexicon", action="append", required=True, type=Path)
    ap.add_argument("--weights", default="0.4,0.5,0.6,0.7,0.8,1.0")
    ap.add_argument("--unknown-weights", default="", help="also try hashed vectors of unknown words at these u")
    ap.add_argument("--dev-dir", type=Path, default=ed.DEV_DIR)
    ap.add_argument("--model", type=Path, default=None, help="a checkpoint in the shipped model's place")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    weights = [float(w) for w in args.weights.split(",")]

    from evermind_memory import default_embedder
    from evermind_memory.embedder import LMEmbedder
    from evermind_memory.lm.lexicon import Lexicon

    shipped = default_embedder().load()
    model = shipped.model
    if args.model is not None:
        from evermind_memory.lm.model import EvermindLM

        model = EvermindLM.load(args.model)
    base = LMEmbedder(model, shipped.tokenizer, max_tokens=shipped.max_tokens)  # the model's part alone
    fp = hashlib.sha1(base.fingerprint.encode("utf-8")).hexdigest()[:12]
    cache = ed.VectorCache(ed.CACHE_DIR / f"ours-{fp}-{base.max_tokens}.npz")

    def model_vecs(texts: list[str]) -> np.ndarray:
        return unit(cache.get(texts, lambda t: base.embed_many(list(t)), batch=1024))

    ps, val = personal_set(), validation_set()
    sources = {name: ed.load_source(name, args.dev_dir) for name in ed.dev_sources(args.dev_dir)}
    lm_only = {name: float(ed.ndcg_at_10(model_vecs(s.queries) @ model_vecs(s.docs).T, s.gold).mean())
               for name, s in sources.items()}
    print(f"model {args.model or 'shipped'} ({base.fingerprint})", file=sys.stderr, flush=True)
    rows: dict[str, dict] = {"model alone": {"personal": personal_first(model_vecs, ps), "manuals": lm_only,
                                             "validation": personal_first(model_vecs, val)}}
    unknown = [float(u) for u in args.unknown_weights.split(",") if u]
    for path in args.lexicon:
        lex = Lexicon.load(path)
        check = LMEmbedder(base.model, base.tokenizer, max_tokens=base.max_tokens, lexicon=lex, lexicon_weight=0.7)
        sample = [f.text for f in ps.facts[:50]] + sources[next(iter(sources))].docs[:50]
        assert np.allclose(check.embed_many(sample), mixed(model_vecs(sample), lex.embed_many(sample), 0.7),
                           atol=2e-5), "the benchmark's mix is not the embedder's"
        for u in [0.0] + unknown:
            lex_vecs = with_unknown(lex, u)
            for w in weights:
                label = f"{path.name} w={w:g}" + (f" unknown u={u:g}" if u else "")

                def vec(t, w=w, lex_vecs=lex_vecs):
                    return mixed(model_vecs(t), lex_vecs(t), w)

                rows[label] = {
                    "personal": personal_first(vec, ps), "validation": personal_first(vec, val),
                    "manuals": {name: float(ed.ndcg_at_10(vec(s.queries) @ vec(s.docs).T, s.gold).mean())
                                for name, s in sources.items()},
                    "lexicon": str(path), "weight": w, "unknown": u}
                r = rows[label]
                print(f"{label}: personal {r['personal']}, validation {r['validation']}, manuals "
                      f"{np.mean(list(r['manuals'].values())):.4f}", file=sys.stderr, flush=True)
    names = list(sources)
    print("| vectors | personal scoped / store-wide / sum (of 470 / 350) | validation (of 100 / 80) | manual mean "
          "| worst source vs model alone | " + " | ".join(names) + " |")
    print("|---" * (5 + len(names)) + "|")
    for label, r in rows.items():
        m = r["manuals"]
        worst = min(names, key=lambda n: m[n] - lm_only[n])
        print(f"| {label} | {r['personal'][0]} / {r['personal'][1]} / {sum(r['personal'])} | "
              f"{r['validation'][0]} / {r['validation'][1]} | {np.mean([m[n] for n in names]):.4f} | "
              f"{worst} {m[worst] - lm_only[worst]:+.4f} | "
              + " | ".join(f"{m[n]:.4f}" for n in names) + " |")
    # left out: each manual source judged with the (lexicon, weight) the other sources pick
    mixes = [k for k in rows if k != "model alone"]
    loso = {}
    for name in names:
        pick = max(mixes, key=lambda k: np.mean([rows[k]["manuals"][n] for n in names if n != name]))
        loso[name] = {"picked": pick, "ndcg": rows[pick]["manuals"][name], "model alone": lm_only[name]}
    pick_p = max(mixes, key=lambda k: np.mean(list(rows[k]["manuals"].values())))
    print("\nLeft out: each source with the lexicon and weight the other eight manual sources pick")
    print("| source | picked | ndcg@10 | model alone | change |")
    print("|---|---|---|---|---|")
    for name, r in loso.items():
        print(f"| {name} | {r['picked']} | {r['ndcg']:.4f} | {r['model alone']:.4f} | "
              f"{r['ndcg'] - r['model alone']:+.4f} |")
    mean_l = np.mean([r["ndcg"] for r in loso.values()])
    print(f"| **mean** | | {mean_l:.4f} | {np.mean(list(lm_only.values())):.4f} | "
          f"{mean_l - np.mean(list(lm_only.values())):+.4f} |")
    print(f"| personal (picked by the nine manual sources) | {pick_p} | {rows[pick_p]['personal']} | "
          f"{rows['model alone']['personal']} | |")
    out = {"rows": rows, "loso": loso, "personal_pick": pick_p}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
