"""Does one `adapt_now()` on a domain's documents alone raise vector recall on that domain's queries?

For each dev source of /work/data/dev (nine manuals the shipped model never trained on: see its README), a fresh
store holds ONLY that source's documents (--docs of them: the relevant documents of a seeded sample of the
source's queries, then the source's other documents as distractors). We measure vector ndcg@10 of those queries
through `store.recall(mode="vector")` before and after one `store.adapt_now(policy)`. Adaptation sees the
documents only: the queries are never shown to it (no feedback, no query log), so the gain is "left-out" in the
sense of issue 16 item 5. Each run also reports the round's gate verdict (a refused round keeps the base model:
gain 0) and, as a guard, ndcg@10 of --general pairs of /work/corpus/eval/debian.jsonl by exact search with the
models before and after (never used to choose anything).

Several policies (--config NAME:FIELD=VALUE,...; repeatable) run side by side on the same stores. With more than
one, a leave-one-source-out table follows: for each source, the config with the best mean gain on the OTHER
sources is chosen and its gain on the left-out source is reported; the mean of those left-out gains is the
honest figure of the selection.

    nice python benchmarks/adaptation_gain.py --jobs 2 --out benchmarks/results/adaptation_gain.json
    python benchmarks/adaptation_gain.py --config base: --config lr6:lr=6e-3 --config r16:rank=16,alpha=32
    python benchmarks/adaptation_gain.py --report benchmarks/results/adaptation_gain.json   # print a saved run
    python benchmarks/adaptation_gain.py --report A.json B.json   # runs of one seed side by side, one LOSO table
    python benchmarks/adaptation_gain.py --report S0.json S1.json ...  # several seeds: mean gains, LOSO over them

Target (issue 16 item 5): vector ndcg@10 +0.03 or more after adapt_now() on a domain's documents alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields
from multiprocessing import get_context
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evermind_memory import MemoryStore  # noqa: E402
from evermind_memory.adaptation import AdaptationPolicy  # noqa: E402

SOURCES = ("apache", "gimp", "libreoffice", "lilypond", "maxima", "nodejs", "octave", "rust", "statsmodels")
TARGET = 0.03


def ndcg_at_10(ranks: np.ndarray) -> np.ndarray:
    """Per-query ndcg@10 (Q,) with one relevant doc per query at 0-based `ranks` (>= 10 or -1: missed)."""
    ok = (ranks >= 0) & (ranks < 10)
    return np.where(ok, 1.0 / np.log2(np.maximum(ranks, 0) + 2), 0.0)


def paired_ci(before: np.ndarray, after: np.ndarray, seed: int = 0, draws: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of mean(after - before) over the same queries (resampled together)."""
    diff = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)  # (Q,)
    idx = np.random.default_rng(seed).integers(0, len(diff), size=(draws, len(diff)))  # (draws, Q)
    means = diff[idx].mean(axis=1)  # (draws,)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def store_ndcg(store: MemoryStore, queries: list[str], doc_ids: list[str]) -> np.ndarray:
    """Per-query ndcg@10 (Q,) of vector recall through the store (what an agent gets)."""
    ranks = np.full(len(queries), -1)  # (Q,)
    for i, (q, fid) in enumerate(zip(queries, doc_ids)):
        got = [h.id for h in store.recall(q, k=10, mode="vector")]
        ranks[i] = got.index(fid) if fid in got else -1
    return ndcg_at_10(ranks)


def exact_ndcg(embedder, queries: list[str], docs: list[str]) -> np.ndarray:
    """Per-query ndcg@10 (Q,) by exact search: query i's relevant doc is docs[i] (duplicate docs share one row)."""
    uniq = list(dict.fromkeys(docs))
    pos = {d: i for i, d in enumerate(uniq)}
    target = np.array([pos[d] for d in docs])  # (Q,)
    dv = embedder.embed_many(uniq)  # (N, D)
    qv = embedder.embed_many(queries)  # (Q, D)
    scores = qv @ dv.T  # (Q, N)
    own = scores[np.arange(len(queries)), target]  # (Q,)
    ranks = (scores > own[:, None]).sum(axis=1)  # (Q,)
    return ndcg_at_10(ranks)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def source_set(dev: Path, source: str, docs: int, query_share: float,
               seed: int) -> tuple[list[tuple[str, str]], list[str]]:
    """(query, doc) pairs and distractor docs of one source: round(docs * query_share) pairs (seeded sample,
    distinct docs), the rest of `docs` from the source's other documents."""
    rng = np.random.default_rng([seed, SOURCES.index(source) if source in SOURCES else 99])
    rows = read_jsonl(dev / f"{source}.jsonl")
    pairs, seen = [], set()
    for i in rng.permutation(len(rows)).tolist():
        q, d = rows[i]["query"], rows[i]["doc"]
        if d not in seen:
            seen.add(d)
            pairs.append((q, d))
    pairs = pairs[: int(round(docs * query_share))]
    others = [r["doc"] for r in read_jsonl(dev / f"{source}.docs.jsonl") if r["doc"] not in seen]
    others = list(dict.fromkeys(others))
    fill = [others[i] for i in rng.permutation(len(others))[: max(0, docs - len(pairs))].tolist()]
    return pairs, fill


def parse_config(text: str) -> tuple[str, dict]:
    """"NAME:field=value,field=value" -> (NAME, policy overrides); tuples (targets) separated by '+'."""
    name, _, rest = text.partition(":")
    defaults = {f.name: f.default for f in fields(AdaptationPolicy)}
    out: dict = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, _, raw = item.partition("=")
        if key not in defaults:
            raise SystemExit(f"--config {text}: no AdaptationPolicy field {key!r}")
        kind = type(defaults[key])
        out[key] = (tuple(t for t in raw.split("+") if t) if key == "targets"
                    else raw if kind is str else (raw.lower() in ("1", "true", "yes")) if kind is bool
                    else kind(float(raw)) if kind is int else float(raw))
    AdaptationPolicy(**out)  # fail early on a bad value
    return name or "default", out


def run_one(job: dict) -> dict:
    """One (source, config): a fresh store of the source's docs, ndcg before, adapt_now, ndcg after."""
    from evermind_memory import default_embedder

    embedder = default_embedder()
    pairs, fill = source_set(Path(job["dev"]), job["source"], job["docs"], job["query_share"], job["seed"])
    general = read_jsonl(Path(job["general"]))[: job["general_limit"]] if job["general_limit"] else []
    policy = AdaptationPolicy(**{"seed": job["seed"], **job["overrides"]})
    with tempfile.TemporaryDirectory() as tmp:
        with MemoryStore(Path(tmp) / "bench.db", embedder, background_embedding=False) as store:
            ids = store.remember_many([d for _, d in pairs], source=job["source"])
            if fill:
                store.remember_many(fill, source=job["source"])
            queries = [q for q, _ in pairs]

            def measure() -> dict[str, np.ndarray]:
                out = {"domain": store_ndcg(store, queries, ids)}
                if general:
                    out["general"] = exact_ndcg(store.embedder, [g["query"] for g in general],
                                                [g["doc"] for g in general])
                return out

            before = measure()
            cpu0, t0 = time.process_time(), time.perf_counter()
            report = store.adapt_now(policy)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
            after = measure()
    r = report.to_dict()
    delta = float(after["domain"].mean() - before["domain"].mean())
    g = r["gate"] or {}
    strict = AdaptationPolicy(**{k: v for k, v in job["overrides"].items()
                                 if k not in ("require_gain", "gate_tolerance")})
    would_pass = r["status"] == "swapped" and g.get("mrr_gain") is not None and (
        g["queries"] >= strict.min_probe_queries and g["mrr_gain"] > 0
        and g["mrr_gain"] > strict.gate_margin * g["mrr_gain_se"]
        and g["recall_candidate"] >= g["recall_current"] - strict.gate_tolerance)
    return {
        "gated_delta": delta if would_pass else 0.0,  # what the default (strict) gate would have made of it
        "source": job["source"], "config": job["name"], "overrides": job["overrides"], "docs": len(pairs) + len(fill),
        "queries": len(pairs), "status": r["status"], "reason": r["reason"], "steps": r["steps"],
        "gate": r["gate"], "round_seconds": wall, "round_process_cpu_seconds": cpu,
        "train_cpu_seconds": r["train_cpu_seconds"],
        "before": {k: float(v.mean()) for k, v in before.items()},
        "after": {k: float(v.mean()) for k, v in after.items()},
        "delta": {k: float(after[k].mean() - before[k].mean()) for k in before},
        "delta_ci95": {k: paired_ci(before[k], after[k]) for k in before},
    }


def loso(runs: list[dict], configs: list[str], sources: list[str], key: str = "delta") -> list[dict]:
    """For each source: the config with the best mean domain gain (key "delta": as run; "gated_delta": what
    the strict gate would have let through) on the other sources, and its gain here."""
    gain = {(r["source"], r["config"]): r[key] if key == "gated_delta" else r[key]["domain"] for r in runs}
    rows = []
    for s in sources:
        others = [o for o in sources if o != s]
        mean_other = {c: float(np.mean([gain[(o, c)] for o in others])) for c in configs}
        best = max(configs, key=lambda c: (mean_other[c], -configs.index(c)))
        rows.append({"source": s, "chosen": best, "chosen_on_others": mean_other[best],
                     "left_out_gain": gain[(s, best)]})
    return rows


def print_loso(rows: list[dict], title: str) -> None:
    """One leave-one-source-out table (rows from loso()) and its mean against the target."""
    print(f"\n{title}")
    print(f"{'left out':<12} {'chosen':<16} {'gain on others':>14} {'left-out gain':>13}")
    for row in rows:
        print(f"{row['source']:<12} {row['chosen']:<16} {row['chosen_on_others']:+14.4f} {row['left_out_gain']:+13.4f}")
    print(f"{'mean':<12} {'':<16} {'':>14} {float(np.mean([r['left_out_gain'] for r in rows])):+13.4f}"
          f"   (target >= +{TARGET})")


def print_tables(result: dict) -> None:
    runs, configs, sources = result["runs"], result["configs"], result["sources"]
    print(f"model: {result['model']}; {result['docs']} docs per source ({result['query_share']:.0%} of them the "
          f"relevant docs of that many queries); adaptation sees the documents only")
    for c in configs:
        print(f"\nconfig {c}: {json.dumps(result['overrides'][c])}")
        print(f"{'source':<12} {'before':>7} {'after':>7} {'gain':>8} {'95% CI':>17} {'general':>8} {'status':>9} "
              f"{'steps':>5} {'round s':>7}  gate")
        mine = [r for r in runs if r["config"] == c]
        for r in sorted(mine, key=lambda r: sources.index(r["source"])):
            lo, hi = r["delta_ci95"]["domain"]
            g = r["gate"] or {}
            gate = (f"MRR gain {g['mrr_gain']:+.4f} (SE {g['mrr_gain_se']:.4f}, {g['queries']} q)"
                    if g.get("mrr_gain") is not None else r["reason"][:60])
            print(f"{r['source']:<12} {r['before']['domain']:7.4f} {r['after']['domain']:7.4f} "
                  f"{r['delta']['domain']:+8.4f} [{lo:+.4f},{hi:+.4f}] {r['delta'].get('general', float('nan')):+8.4f} "
                  f"{r['status']:>9} {r['steps']:5d} {r['round_seconds']:7.1f}  {gate}")
        mean = lambda key, sub: float(np.mean([r[key][sub] for r in mine]))  # noqa: E731
        print(f"{'mean':<12} {mean('before', 'domain'):7.4f} {mean('after', 'domain'):7.4f} "
              f"{mean('delta', 'domain'):+8.4f} {'':17} "
              f"{mean('delta', 'general') if all('general' in r['delta'] for r in mine) else float('nan'):+8.4f} "
              f"{sum(r['status'] == 'swapped' for r in mine)}/{len(mine)} swapped")
        if not all(r["overrides"].get("require_gain", True) for r in mine):
            print("  (gate off for study) gain the strict gate would have let through: "
                  + " ".join(f"{r['source']} {r['gated_delta']:+.4f}" for r in mine)
                  + f"; mean {float(np.mean([r['gated_delta'] for r in mine])):+.4f}")
    for key, what in (("loso", "gain as run"), ("loso_gated", "gain the strict gate lets through")):
        if key in result:
            print_loso(result[key], f"leave-one-source-out ({what}): the config chosen on the other sources' mean, "
                                    "scored on the one left out")


def merge_results(results: list[dict]) -> dict:
    """Several saved runs of the same model, documents and seed as one result (their configs side by side, with
    the leave-one-source-out tables over all of them); a config name seen again gets a suffix (#2, ...). Runs
    made under other policy defaults have their configs' overrides restated against the first run's defaults."""
    first = results[0]
    base = first["policy_defaults"]
    same = ("model", "docs", "query_share", "seed", "sources")
    for r in results[1:]:
        differ = [k for k in same if r.get(k) != first.get(k)]
        if differ:
            raise SystemExit(f"--report: these runs differ in {differ}; only runs of one setting merge")
    merged = {**first, "configs": [], "overrides": {}, "runs": [], "seconds": sum(r["seconds"] for r in results)}
    for r in results:
        names = {}
        for c in r["configs"]:
            name, n = c, 1
            while name in merged["overrides"]:
                n += 1
                name = f"{c}#{n}"
            names[c] = name
            merged["configs"].append(name)
            effective = {**r["policy_defaults"], **r["overrides"][c]}
            merged["overrides"][name] = {k: v for k, v in effective.items() if base.get(k) != v}
        merged["runs"] += [{**run, "config": names[run["config"]]} for run in r["runs"]]
    if len(merged["configs"]) > 1:
        merged["loso"] = loso(merged["runs"], merged["configs"], merged["sources"])
        merged["loso_gated"] = loso(merged["runs"], merged["configs"], merged["sources"], "gated_delta")
    return merged


def seeds_table(results: list[dict]) -> dict:
    """Saved runs of several seeds (samples of documents and queries): each seed's runs merged, then per config and
    source the mean gain over the seeds that ran it, and the leave-one-source-out choice over those means."""
    by_seed: dict[int, list[dict]] = {}
    for r in results:
        by_seed.setdefault(r["seed"], []).append(r)
    merged = [merge_results(group) for _, group in sorted(by_seed.items())]
    configs = [c for c in merged[0]["configs"] if all(c in m["configs"] for m in merged)]
    sources = merged[0]["sources"]
    runs = []
    for c in configs:
        for s in sources:
            mine = [r for m in merged for r in m["runs"] if r["config"] == c and r["source"] == s]
            runs.append({"config": c, "source": s,
                         "delta": {"domain": float(np.mean([r["delta"]["domain"] for r in mine]))},
                         "gated_delta": float(np.mean([r["gated_delta"] for r in mine])),
                         "swapped": sum(r["status"] == "swapped" for r in mine)})
    return {"seeds": sorted(by_seed), "configs": configs, "sources": sources, "runs": runs,
            "loso": loso(runs, configs, sources) if len(configs) > 1 else []}


def print_seeds_table(table: dict) -> None:
    configs, sources, runs = table["configs"], table["sources"], table["runs"]
    gain = {(r["source"], r["config"]): r for r in runs}
    print(f"mean vector ndcg@10 gain over seeds {table['seeds']} (configs run on every seed; swapped rounds in "
          "brackets)")
    print(f"{'source':<12} " + " ".join(f"{c:>14}" for c in configs))
    for s in sources:
        print(f"{s:<12} "
              + " ".join("{:>14}".format(f"{gain[(s, c)]['delta']['domain']:+.4f} ({gain[(s, c)]['swapped']})")
                         for c in configs))
    print(f"{'mean':<12} "
          + " ".join(f"{np.mean([gain[(s, c)]['delta']['domain'] for s in sources]):+14.4f}" for c in configs))
    if table["loso"]:
        print_loso(table["loso"], "leave-one-source-out over the seed means: the config with the best mean on the "
                                  "other sources")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dev", type=Path, default=Path("/work/data/dev"), help="the dev sets (recipe/build_devsets.py)")
    ap.add_argument("--sources", default=",".join(SOURCES))
    ap.add_argument("--docs", type=int, default=400, help="documents per source store")
    ap.add_argument("--query-share", type=float, default=0.75, help="share of the docs that are some query's answer")
    ap.add_argument("--config", action="append", default=[], metavar="NAME:FIELD=VALUE,...",
                    help="a policy to run (repeatable; 'default:' is the shipped policy; targets joined by '+')")
    ap.add_argument("--general", type=Path, default=Path("/work/corpus/eval/debian.jsonl"))
    ap.add_argument("--general-limit", type=int, default=200, help="0: no general guard")
    ap.add_argument("--jobs", type=int, default=1, help="parallel processes (one BLAS thread each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--report", type=Path, nargs="+", default=None,
                    help="print the tables of saved --out files (several: merged, one LOSO table over all) and exit")
    args = ap.parse_args(argv)
    if args.report:
        saved = [json.loads(p.read_text(encoding="utf-8")) for p in args.report]
        if len({r["seed"] for r in saved}) > 1:
            print_seeds_table(seeds_table(saved))
        else:
            print_tables(merge_results(saved))
        return 0
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    missing = [s for s in sources if not (args.dev / f"{s}.jsonl").is_file()]
    if missing:
        ap.error(f"no dev set for {missing} in {args.dev}")
    configs = dict(parse_config(c) for c in (args.config or ["default:"]))
    general_limit = args.general_limit if args.general.is_file() else 0
    jobs = [{"dev": str(args.dev), "source": s, "docs": args.docs, "query_share": args.query_share, "seed": args.seed,
             "general": str(args.general), "general_limit": general_limit, "name": name, "overrides": over}
            for name, over in configs.items() for s in sources]
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
            runs = list(pool.map(run_one, jobs))
    else:
        runs = [run_one(j) for j in jobs]
    from evermind_memory import default_embedder

    result = {"model": default_embedder().fingerprint, "docs": args.docs, "query_share": args.query_share,
              "seed": args.seed, "sources": sources, "configs": list(configs), "overrides": configs,
              "general": str(args.general) if general_limit else None, "general_pairs": general_limit,
              "cores": os.cpu_count(), "jobs": args.jobs, "seconds": time.perf_counter() - t0, "runs": runs,
              "policy_defaults": {f.name: f.default for f in fields(AdaptationPolicy)}}
    if len(configs) > 1:
        result["loso"] = loso(runs, list(configs), sources)
        result["loso_gated"] = loso(runs, list(configs), sources, "gated_delta")
    print_tables(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
