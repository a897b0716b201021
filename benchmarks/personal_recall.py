"""The personal-memory dev protocol: recall of facts about people, asked in each person's scope and store-wide.

The data is benchmarks/personal_data.py (generated people with distractors and notes, and a hand-written part):
673 facts of 47 people in one store, each person's facts in their own scope (`store.scope(user=...)`), the notes in
none. Every answerable question is asked in its person's scope and across the whole store (first-person questions
only in the scope); unanswerable questions (about a kind of fact the person has none of) are asked in the scope.

Reported per embedder and mode (lexical, vector, hybrid): right fact first (count and share), MRR@10 and the right
fact in the top 5, for the generated and the hand-written parts, scoped and store-wide; for hybrid with a fitted
rule, the relevance of the top hit: the share of right top hits a threshold keeps and of unanswerable questions it
drops. Nothing is fitted here.

    python benchmarks/personal_recall.py [--model M.evlm --tokenizer T.json] [--minilm] [--json out.json]

--minilm adds all-MiniLM-L6-v2 as the store's embedder (with benchmarks/results/fusion_minilm.json, its rule
fitted by the same left-out protocol): the reference row.

`personal_sources(embedder)` gives the same questions as candidate pools in recipe/calibrate_fusion.py's format
(sources "personal" and "personal-hand"), so fusion and relevance can be fitted and judged with them left out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402

from evermind_memory import MemoryStore  # noqa: E402
from personal_data import PersonalSet, personal_set, validation_set  # noqa: E402

K = 10
MODES = ("lexical", "vector", "hybrid")
THRESHOLDS = (0.02, 0.05, 0.1, 0.2, 0.3)
MINILM_FUSION = REPO / "benchmarks" / "results" / "fusion_minilm.json"


def build(path: Path, embedder: object, ps: PersonalSet) -> tuple[MemoryStore, list[str]]:
    """A store at `path` holding every fact of `ps`, each in its user's scope. Returns (store, fact ids in order)."""
    store = MemoryStore(path, embedder)
    ids: list[str | None] = [None] * len(ps.facts)
    by_user: dict[str | None, list[int]] = {}
    for i, f in enumerate(ps.facts):
        by_user.setdefault(f.user, []).append(i)
    for user, idx in by_user.items():
        view = store if user is None else store.scope(user=user)
        for i, fid in zip(idx, view.remember_many([ps.facts[i].text for i in idx])):
            ids[i] = fid
    return store, ids  # type: ignore[return-value]


def asks(ps: PersonalSet) -> list[tuple[int, str]]:
    """(question index, "scoped" | "all") for every recall the protocol makes, in order."""
    out = []
    for qi, q in enumerate(ps.questions):
        out.append((qi, "scoped"))
        if q.fact is not None and not q.first_person:
            out.append((qi, "all"))
    return out


def run(embedder: object, ps: PersonalSet, log: Callable[[str], None] = lambda s: None) -> dict:
    """Every ask of the protocol through the public recall API, in every mode.

    Returns:
        {"fingerprint", "asks": [{"q", "scope", "part", "answerable", "category", "ranks": {mode: rank 1..K or 0},
        "top_relevance": float | None}]} (ranks of the right fact; 0: not in the top K or unanswerable).
    """
    with tempfile.TemporaryDirectory(prefix="personal_") as tmp:
        t0 = time.perf_counter()
        store, ids = build(Path(tmp) / "p.db", embedder, ps)
        log(f"stored {len(ids)} facts in {time.perf_counter() - t0:.1f}s")
        index = {fid: i for i, fid in enumerate(ids)}
        rows = []
        try:
            for qi, scope in asks(ps):
                q = ps.questions[qi]
                view = store.scope(user=q.user) if scope == "scoped" else store
                rec = {"q": qi, "scope": scope, "part": q.part, "answerable": q.fact is not None,
                       "first_person": q.first_person, "category": q.category, "ranks": {}}
                for mode in MODES:
                    hits = view.recall(q.text, k=K, mode=mode)
                    found = [index[h.id] for h in hits]
                    rec["ranks"][mode] = found.index(q.fact) + 1 if q.fact in found else 0
                    if mode == "hybrid":
                        rec["top_relevance"] = hits[0].relevance if hits else None
                        rec["top_right"] = bool(found) and found[0] == q.fact
                rows.append(rec)
        finally:
            store.close()
    return {"fingerprint": embedder.fingerprint, "asks": rows}


def summarise(res: dict) -> dict:
    """Per (part, scope) and mode: first, mrr@10, top5 (answerable asks); the same per kind of fact ("categories",
    scoped and store-wide together: which kinds of knowledge the embedder lacks); and the relevance thresholds."""
    out: dict = {"groups": {}, "categories": {}, "relevance": {}}
    asks_ = res["asks"]
    groups = {}
    for part in ("generated", "hand"):
        for scope in ("scoped", "all"):
            groups[f"{part}/{scope}"] = [a for a in asks_
                                         if a["answerable"] and a["part"] == part and a["scope"] == scope]
    for part in ("generated", "hand"):  # the questions asked both ways, scoped: to compare with "/all" one to one
        groups[f"{part}/scoped, 3rd p."] = [a for a in asks_ if a["answerable"] and a["part"] == part
                                            and a["scope"] == "scoped" and not a.get("first_person")]
    groups["all answerable"] = [a for a in asks_ if a["answerable"]]
    for name, rows in groups.items():
        g = {"n": len(rows)}
        for mode in MODES:
            r = np.array([a["ranks"][mode] for a in rows], dtype=np.float64)
            g[mode] = {"first": int((r == 1).sum()), "first_share": float((r == 1).mean()) if len(r) else 0.0,
                       "mrr@10": float(np.where(r > 0, 1.0 / np.maximum(r, 1), 0.0).mean()) if len(r) else 0.0,
                       "top5": float(((r >= 1) & (r <= 5)).mean()) if len(r) else 0.0}
        out["groups"][name] = g
    kinds = sorted({a["category"] for a in asks_ if a["answerable"] and a.get("category")})
    for kind in kinds:
        rows = [a for a in asks_ if a["answerable"] and a.get("category") == kind]
        out["categories"][kind] = {"n": len(rows), **{m: int(sum(a["ranks"][m] == 1 for a in rows)) for m in MODES}}
    right = np.array([a["top_relevance"] for a in asks_ if a["answerable"] and a.get("top_right")
                      and a.get("top_relevance") is not None])
    none = np.array([a["top_relevance"] for a in asks_ if not a["answerable"] and a.get("top_relevance") is not None])
    if len(right) and len(none):
        out["relevance"] = {f"{t:g}": {"keeps_right_top": float((right >= t).mean()), "drops_unanswerable":
                                       float((none < t).mean())} for t in THRESHOLDS}
        out["relevance"]["median"] = {"right_top": float(np.median(right)), "unanswerable_top": float(np.median(none))}
    return out


def format_table(label: str, summary: dict) -> str:
    lines = [f"{label}", f"  {'group':<24}{'n':>5}" + "".join(f"{m + ' first':>16}{'mrr':>7}" for m in MODES)]
    for name, g in summary["groups"].items():
        cells = "".join(f"{g[m]['first']:>9} ({g[m]['first_share']:.2f}){g[m]['mrr@10']:>7.3f}" for m in MODES)
        lines.append(f"  {name:<24}{g['n']:>5}{cells}")
    if summary.get("categories"):
        lines.append("  right first per kind of fact (scoped + store-wide): "
                     + ", ".join(f"{kind} {c['vector']}/{c['hybrid']} of {c['n']}"
                                 for kind, c in summary["categories"].items()) + " (vector/hybrid)")
    rel = summary.get("relevance")
    if rel:
        lines.append("  relevance of the hybrid top hit (threshold: share of right top hits kept / of unanswerable "
                     "questions dropped): "
                     + ", ".join(f"{t}: {v['keeps_right_top']:.2f} / {v['drops_unanswerable']:.2f}"
                                                         for t, v in rel.items() if t != "median")
                     + f"; medians right {rel['median']['right_top']:.3f}, unanswerable "
                       f"{rel['median']['unanswerable_top']:.3f}")
    return "\n".join(lines)


# ------------------------------------------------------------------ candidate pools for calibrate_fusion.py


SOURCE_OF_PART = {"generated": "personal", "hand": "personal-hand"}


def personal_sources(embedder: object, ps: PersonalSet | None = None, *, minilm: object | None = None,
                     cache_dir: Path | None = None, log: Callable[[str], None] = lambda s: None,
                     names: dict[str, str] | None = None) -> dict[str, dict]:
    """Sources "personal" (generated) and "personal-hand" in recipe/calibrate_fusion.py's load_data format.

    Each source's queries are its answerable asks (scoped and store-wide; a DevSource whose docs are all facts of
    the one store); its "foreign" pools are its unanswerable questions in their scopes. Cached by fingerprint.
    `names` maps a question's part to its source's name (SOURCE_OF_PART; parts it lacks give no source).
    """
    import dev_pools as dp
    from evermind_memory.store.fusion import CandidatePool

    names = SOURCE_OF_PART if names is None else names
    ps = ps or personal_set()
    cache_dir = Path(cache_dir or dp.CACHE_DIR)
    fp = hashlib.sha1(embedder.fingerprint.encode("utf-8")).hexdigest()[:12]
    path = cache_dir / f"personal-{fp}-{dp.POOL_MAX}{dp.POOL_FORMAT}-{ps.digest()}.json.gz"
    docs = [f.text for f in ps.facts]
    all_asks = asks(ps)
    if path.is_file():
        cached = dp.load_json_gz(path)
    else:
        t0 = time.perf_counter()
        wrapped = dp.QueryCachingEmbedder(embedder)
        cached = {"pools": [], "store": {"lexical": [], "vector": []}, "fts5": []}
        with tempfile.TemporaryDirectory(prefix="personal_pools_") as tmp:
            store, ids = build(Path(tmp) / "p.db", wrapped, ps)
            index = {fid: i for i, fid in enumerate(ids)}
            try:
                wrapped.warm([q.text for q in ps.questions])
                for qi, scope in all_asks:
                    q = ps.questions[qi]
                    view = store.scope(user=q.user) if scope == "scoped" else store
                    cached["pools"].append(dp.pool_of(view, q.text, index, wrapped).to_json())
                    for mode in ("lexical", "vector"):
                        cached["store"][mode].append([index[h.id] for h in view.recall(q.text, k=K, mode=mode)])
            finally:
                store.close()
        dp.save_json_gz(path, cached)
        log(f"personal: {len(all_asks)} asks pooled in {time.perf_counter() - t0:.1f}s")
    minilm_rank = _minilm_rankings(ps, all_asks, minilm, cache_dir) if minilm is not None else None
    pools = [CandidatePool.from_json(p) for p in cached["pools"]]
    out = {}
    for part, name in names.items():
        sel = [i for i, (qi, _) in enumerate(all_asks) if ps.questions[qi].part == part]
        ans = [i for i in sel if ps.questions[all_asks[i][0]].fact is not None]
        una = [i for i in sel if ps.questions[all_asks[i][0]].fact is None]
        gold = np.array([ps.questions[all_asks[i][0]].fact for i in ans], dtype=np.int64)
        src = dp.DevSource(name, [ps.questions[all_asks[i][0]].text for i in ans],
                           [all_asks[i][1] for i in ans], docs, gold)
        out[name] = {"source": src, "pools": [pools[i] for i in ans], "gold": gold,
                     "store": {m: [cached["store"][m][i] for i in ans] for m in ("lexical", "vector")},
                     "fts5": [cached["store"]["lexical"][i] for i in ans],
                     "minilm": None if minilm_rank is None else [minilm_rank[i] for i in ans],
                     "foreign": [pools[i] for i in una], "foreign_from": f"{name} (unanswerable)"}
    return out


def validation_source(embedder: object, *, minilm: object | None = None, cache_dir: Path | None = None,
                      log: Callable[[str], None] = lambda s: None) -> dict[str, dict]:
    """Source "personal-val": personal_data.validation_set() in a store of its own (100 facts about ten people),
    asked as the hand-written part is. More hand-written questions for the fusion rule and the relevance model to
    be fitted on; judged left out like every source."""
    return personal_sources(embedder, validation_set(), minilm=minilm, cache_dir=cache_dir, log=log,
                            names={"hand": "personal-val"})


SMALL_SIZES = (2, 3, 5, 8, 13, 20, 30, 50, 100, 200, 400)
SMALL_STORES = 66     # six stores of each size
SMALL_ASKS = 16       # answerable asks per store, at most, and as many asks whose fact it lacks


def small_store_source(embedder: object, ps: PersonalSet | None = None, *, seed: int = 0,
                       cache_dir: Path | None = None, log: Callable[[str], None] = lambda s: None) -> dict:
    """Source "personal-small" in calibrate_fusion's load_data format: the generated part's store-wide questions
    asked in stores of 2 to 400 facts (SMALL_SIZES), so the fusion rule and the relevance model also see the
    small stores a new user has. Each store holds a random sample of the facts; its answerable asks are questions
    whose fact it holds, its "foreign" asks questions whose fact it lacks (mostly about a person it holds facts
    of: near misses). Unscoped stores (a scope is a small store too, and is what the scoped asks test)."""
    import dev_pools as dp

    ps = ps or personal_set()
    cache_dir = Path(cache_dir or dp.CACHE_DIR)
    fp = hashlib.sha1(embedder.fingerprint.encode("utf-8")).hexdigest()[:12]
    path = cache_dir / f"personal-small-{fp}-{dp.POOL_MAX}{dp.POOL_FORMAT}-{ps.digest()}-{seed}.json.gz"
    qs = [i for i, q in enumerate(ps.questions) if q.fact is not None and not q.first_person and q.part == "generated"]
    if path.is_file():
        cached = dp.load_json_gz(path)
    else:
        t0 = time.perf_counter()
        rng = np.random.default_rng(seed)
        wrapped = dp.QueryCachingEmbedder(embedder)
        wrapped.warm([ps.questions[i].text for i in qs])
        people = [f for f in range(len(ps.facts)) if ps.facts[f].person]
        cached = {"asks": [], "pools": [], "foreign": [], "sizes": []}
        for n in range(SMALL_STORES):
            size = SMALL_SIZES[n % len(SMALL_SIZES)]
            held = rng.choice(people, size=min(size, len(people)), replace=False)
            inside = set(held.tolist())
            ans = [i for i in qs if ps.questions[i].fact in inside]
            users = {ps.facts[f].user for f in inside}
            miss = [i for i in qs if ps.questions[i].fact not in inside and ps.questions[i].user in users]
            ans = rng.permutation(ans)[:SMALL_ASKS].tolist()
            miss = rng.permutation(miss)[:SMALL_ASKS].tolist()
            with tempfile.TemporaryDirectory(prefix="personal_small_") as tmp:
                store = MemoryStore(Path(tmp) / "s.db", wrapped)
                try:
                    order = held.tolist()
                    ids = store.remember_many([ps.facts[f].text for f in order])
                    index = dict(zip(ids, order))
                    for kind, asks_ in (("pools", ans), ("foreign", miss)):
                        for qi in asks_:
                            cached[kind].append(dp.pool_of(store, ps.questions[qi].text, index, wrapped).to_json())
                            if kind == "pools":
                                cached["asks"].append(qi)
                                cached["sizes"].append(size)
                finally:
                    store.close()
        dp.save_json_gz(path, cached)
        log(f"personal-small: {len(cached['asks'])} asks in {SMALL_STORES} stores pooled in "
            f"{time.perf_counter() - t0:.1f}s")
    gold = np.array([ps.questions[qi].fact for qi in cached["asks"]], dtype=np.int64)
    src = dp.DevSource("personal-small", [ps.questions[qi].text for qi in cached["asks"]],
                       [f"size {n}" for n in cached["sizes"]], [f.text for f in ps.facts], gold)
    return {"personal-small": pooled_source(src, cached["pools"], cached["foreign"],
                                            "personal-small (questions whose fact the store lacks)")}


def pooled_source(src: object, pools_json: Sequence[dict], foreign_json: Sequence[dict], foreign_from: str) -> dict:
    """A source in calibrate_fusion's load_data format from cached candidate pools gathered in stores of their own:
    the store's lexical and vector top K read from each pool's ranks (no MiniLM ranking)."""
    from evermind_memory.store.fusion import CandidatePool

    pools = [CandidatePool.from_json(p) for p in pools_json]

    def top(rank: str) -> list[list[int]]:
        return [[p.ids[i] for i in np.argsort(np.where(getattr(p, rank) >= 0, getattr(p, rank), 1 << 30),
                                              kind="stable")[:K] if getattr(p, rank)[i] >= 0] for p in pools]

    lexical = top("lex_rank")
    return {"source": src, "pools": pools, "gold": src.gold, "store": {"lexical": lexical, "vector": top("vec_rank")},
            "fts5": lexical, "minilm": None, "foreign": [CandidatePool.from_json(p) for p in foreign_json],
            "foreign_from": foreign_from}


def _minilm_rankings(ps: PersonalSet, all_asks: list[tuple[int, str]], minilm: object, cache_dir: Path
                     ) -> list[list[int]]:
    """MiniLM's exact-cosine top 50 for every ask, among the facts the ask's scope holds."""
    import dev_pools as dp
    from recall_quality import _minilm_embed

    vc = dp.VectorCache(dp.MINILM_CACHE, "all-MiniLM-L6-v2")
    d = vc.get([f.text for f in ps.facts], lambda t: _minilm_embed(minilm, t))  # (N, 384)
    q = vc.get([ps.questions[qi].text for qi, _ in all_asks], lambda t: _minilm_embed(minilm, t))  # (A, 384)
    users = np.array([f.user or "" for f in ps.facts])
    out = []
    for row, (qi, scope) in zip(q, all_asks):
        sim = d @ row
        if scope == "scoped":
            sim = np.where(users == ps.questions[qi].user, sim, -np.inf)
        order = np.argsort(-sim, kind="stable")[: dp.REF_K]
        out.append([int(i) for i in order if np.isfinite(sim[i])])
    return out


def minilm_embedder() -> object:
    """The reference row's embedder: all-MiniLM-L6-v2 in our store, with its rule fitted by the same left-out
    protocol (MINILM_FUSION) when that file is there."""
    from recall_quality import load_embedder

    minilm = load_embedder("minilm", None)
    if MINILM_FUSION.is_file():
        minilm.fusion_params = str(MINILM_FUSION)
    return minilm


class QueryMapped:
    """An embedder whose one-text `embed` (what the store embeds a recall's query with) is mapped by W and
    normalised, while `embed_many` (what it embeds facts with) is the base's; every other attribute is the base's,
    its fingerprint too, so the store applies the base model's fusion rule and relevance model unchanged."""

    def __init__(self, base: object, path: str) -> None:
        from evermind_memory.lm.query_map import QueryMap

        self._base = base
        self._map = QueryMap.load(path)
        if self._map.dims != base.dimensions:
            raise SystemExit(f"{path}: a map of {self._map.dims} dimensions; the embedder's are {base.dimensions}")

    def embed(self, text: str):
        return self._map.apply(self._base.embed(text)[None, :])[0]

    embed_query = embed

    def __getattr__(self, name: str):
        return getattr(self._base, name)


def main(argv: Sequence[str] | None = None) -> dict:
    """Command line: see the module docstring."""
    from recall_quality import load_embedder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="an .evlm checkpoint (default: the shipped model)")
    ap.add_argument("--tokenizer", default=None, help="its tokenizer.json")
    ap.add_argument("--fusion", default=None, help="fitted fusion parameters for --model (calibrate_fusion.py)")
    ap.add_argument("--minilm", action="store_true", help="add all-MiniLM-L6-v2 in our store as the reference row")
    ap.add_argument("--st-model", default=None, metavar="DIR",
                    help="add this sentence-transformers model directory in our store as a reference row (vector "
                         "mode is its fair figure: hybrid uses the unfitted weight rule)")
    ap.add_argument("--query-map", default=None, metavar="MAP.evqm",
                    help="add a row whose queries go through this map (benchmarks/query_map.py --write-map), the "
                         "stored facts as they are; the fusion rule and relevance of the shipped model, not refitted")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(f"[personal_recall] {msg}", file=sys.stderr, flush=True)

    ps = personal_set()
    n_ans = sum(q.fact is not None for q in ps.questions)
    print(f"personal-memory dev protocol: {len(ps.facts)} facts, {len(ps.users())} users, {n_ans} answerable and "
          f"{len(ps.questions) - n_ans} unanswerable questions, {len(asks(ps))} recalls per mode")
    embedders = [("ours", load_embedder(args.model, args.tokenizer))]
    if args.fusion:
        embedders[0][1].fusion_params = args.fusion
    if args.query_map:
        embedders.append(("ours, queries mapped", QueryMapped(embedders[0][1], args.query_map)))
    if args.minilm:
        embedders.append(("MiniLM in our store", minilm_embedder()))
    if args.st_model:
        from recall_quality import MiniLMEmbedder, load_minilm

        name = Path(args.st_model).name
        embedders.append((f"{name} in our store", MiniLMEmbedder(load_minilm(args.st_model, 2), name)))
    out = {}
    for label, emb in embedders:
        t0 = time.perf_counter()
        res = run(emb, ps, log)
        summary = summarise(res)
        out[label] = {"fingerprint": res["fingerprint"], "summary": summary, "asks": res["asks"],
                      "seconds": round(time.perf_counter() - t0, 1)}
        print(format_table(f"{label} ({res['fingerprint']})", summary))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
