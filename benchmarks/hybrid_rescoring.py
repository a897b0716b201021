"""Two ways to rescore hybrid recall's candidates that need no new model, left out by source.

    python benchmarks/hybrid_rescoring.py [--json out.json]

Both rescore exactly the candidates the store fuses (benchmarks/dev_pools.py: the top 50 of each list for the
shipped rule) and keep the rule "BM25 over the best + w x cosine"; only the cosine changes:

- `prf`: pseudo-relevance feedback on the vector side (Rocchio). The query vector moves toward the mean vector of
  the first m hits of the fused ranking, q' = q + beta * mean(top m), and every candidate's cosine is taken to q'.
- `windows`: a fact longer than the 128 tokens the model reads is also read as further 128-token windows (up to
  four), each its own vector, and a candidate's cosine becomes c1 + a * max(0, max window cosine - c1), where c1
  is the first window's (a = 1: the best window).

Each variant's parameters (and w scaled by 0.8, 1, 1.25) are chosen on eleven sources and scored on the twelfth
against the shipped rule. Vectors of documents and queries come from the shipped model through the vector cache
of benchmarks/embedder_dev.py (the first run embeds the three held-out eval sets and every extra window: about
5 minutes on one core).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "recipe")]

import calibrate_fusion as cf  # noqa: E402
import embedder_dev  # noqa: E402
from evermind_memory.embedder.loader import default_embedder  # noqa: E402
from evermind_memory.store.fusion import fuse_pool, shipped_params  # noqa: E402

WINDOWS = 4
W_SCALES = (0.8, 1.0, 1.25)
GRIDS = {
    "prf": [(m, beta) for m in (1, 2, 3, 5) for beta in (0.25, 0.5, 1.0)],
    "windows": [(a,) for a in (0.25, 0.5, 1.0)],
}


def _window_vectors(inner, docs: list[str], path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(V (W, C), owner (W,)): the vectors of every doc's 2nd..WINDOWS-th window, cached in `path`."""
    if path.is_file():
        with np.load(path, allow_pickle=False) as z:
            return z["vecs"], z["owner"]
    extra, owner = [], []
    for i, doc in enumerate(docs):
        ids = list(inner.tokenizer.encode(doc))[: inner.max_tokens * WINDOWS]
        for window in inner._windows(ids)[1:]:
            extra.append(window)
            owner.append(i)
    vecs = inner._embed_lists(extra) if extra else np.zeros((0, inner.dimensions), np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, vecs=vecs, owner=np.array(owner, dtype=np.int64))
    return vecs, np.array(owner, dtype=np.int64)


def ndcg_rescored(d: dict, params, cosine: Callable[[int, np.ndarray, np.ndarray], np.ndarray],
                  w_scale: float) -> float:
    """Mean ndcg@10 of the pools of one source when each candidate's cosine is cosine(query i, ids, fused score)."""
    rankings = []
    for i, pool in enumerate(d["pools"]):
        pool = pool.truncate(params.pool)
        fused = fuse_pool(pool, "score", params, 0.0)[1]
        ids = np.array(pool.ids)
        score = fused.lexical + w_scale * params.weights[1] * cosine(i, ids, fused.score)
        rankings.append(ids[np.argsort(-score, kind="stable")[: cf.TOP]].tolist())
    return cf.ndcg(cf.ranks_of(rankings, d["gold"]))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dev", default="/work/data/dev")
    ap.add_argument("--corpus", default="/work/corpus")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    dev, corpus = Path(args.dev), Path(args.corpus)
    emb = default_embedder()
    params = shipped_params()
    if params is None or params.features != ("lex", "cos"):
        raise SystemExit("expected the shipped rule 'BM25 over the best + w x cosine' in models/fusion.json")
    inner = emb.load()
    fp = hashlib.sha1(emb.fingerprint.encode("utf-8")).hexdigest()[:12]
    cache = embedder_dev.VectorCache(embedder_dev.CACHE_DIR / f"ours-{fp}-{inner.max_tokens}.npz")
    data = cf.load_data(emb, dev, corpus, None, minilm=None, log=lambda s: print(s, file=sys.stderr))
    scores: dict[str, dict[str, float]] = {}
    for name, d in data.items():
        src = d["source"]
        D = cache.get(src.docs, inner.embed_many)  # (N, C)
        Q = cache.get(src.queries, inner.embed_many)  # (Q, C)
        V, owner = _window_vectors(inner, src.docs, embedder_dev.CACHE_DIR / f"windows-{name}-{fp}-{src.digest()}.npz")
        best_window = np.full((len(Q), len(D)), -1.0, dtype=np.float32)  # (Q, N)
        if len(V):
            np.maximum.at(best_window.T, owner, (Q @ V.T).T)
        row: dict[str, float] = {"shipped rule": ndcg_rescored(d, params, lambda i, ids, s: D[ids] @ Q[i], 1.0)}

        def prf(m: int, beta: float) -> Callable:
            def cos(i: int, ids: np.ndarray, fused: np.ndarray) -> np.ndarray:
                q = Q[i] + beta * D[ids[np.argsort(-fused, kind="stable")[:m]]].mean(axis=0)
                return D[ids] @ (q / np.linalg.norm(q))
            return cos

        def windows(a: float) -> Callable:
            def cos(i: int, ids: np.ndarray, fused: np.ndarray) -> np.ndarray:
                first = D[ids] @ Q[i]
                return first + a * np.maximum(best_window[i, ids] - first, 0.0)
            return cos

        makers = {"prf": prf, "windows": windows}
        for variant, grid in GRIDS.items():
            for cell in grid:
                for w in W_SCALES:
                    row[f"{variant} {cell} w*{w}"] = ndcg_rescored(d, params, makers[variant](*cell), w)
        scores[name] = row
        print(f"{name}: done", file=sys.stderr, flush=True)
    cache.save()
    names = list(scores)
    out: dict = {"sources": {}, "mean": {}}
    for variant in GRIDS:
        keys = [k for k in scores[names[0]] if k.startswith(variant + " ")]
        for name in names:
            others = [n for n in names if n != name]
            pick = max(keys, key=lambda k: np.mean([scores[n][k] for n in others]))
            out["sources"].setdefault(name, {"shipped rule": scores[name]["shipped rule"]})
            out["sources"][name][variant] = scores[name][pick]
            out["sources"][name][variant + " pick"] = pick
    for col in ("shipped rule", *GRIDS):
        out["mean"][col] = float(np.mean([out["sources"][n][col] for n in names]))
    print("hybrid ndcg@10 with each source left out of the choice of parameters")
    print(f"  {'source':12s} {'shipped':>8s} {'prf':>8s} {'windows':>8s}   picks (prf | windows)")
    for name in names:
        r = out["sources"][name]
        print(f"  {name:12s} {r['shipped rule']:8.4f} {r['prf']:8.4f} {r['windows']:8.4f}   "
              f"{r['prf pick']} | {r['windows pick']}")
    m = out["mean"]
    print(f"  {'mean':12s} {m['shipped rule']:8.4f} {m['prf']:8.4f} {m['windows']:8.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"scores": scores, **out}, indent=1))
    return out


if __name__ == "__main__":
    main()
