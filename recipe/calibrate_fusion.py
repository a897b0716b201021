"""Choose the hybrid-recall weight w (score = BM25 / max BM25 + w * cosine) for a model on a dev set, not the eval sets.

The dev set is a seeded slice of corpus/pairs.jsonl (Debian short <-> long description, Python API name <->
description, FOLDOC term <-> definition: the three kinds of query the benchmark has), disjoint from corpus/eval/*; the sweep runs the store's own hybrid recall for every w on a log
grid and keeps the w with the best mean ndcg@10 among those where hybrid >= max(lexical, vector).

    python recipe/calibrate_fusion.py --model runs/c256/model.evlm --tokenizer runs/c256/tokenizer.json \
        --corpus corpus --out runs/c256/fusion.json [--per-source 1000] [--weights 0.05,...] [--write-dev dev.jsonl]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402

from evermind_memory import MemoryStore  # noqa: E402
from evermind_memory.errors import InvalidInput  # noqa: E402
from recall_quality import (  # noqa: E402
    EvalSet, QueryCachingEmbedder, build_store, eval_set_from_rows, load_embedder, rank_metrics, store_rankings,
)

DEV_SOURCES = ("debian", "python-api", "foldoc")  # the three kinds of query recall_quality.py measures
DOC_MIN_CHARS = 50  # as the eval sets (recipe/build_corpus.py EVAL_DOC_MIN_CHARS): a doc must say enough to be found
DEFAULT_WEIGHTS = tuple(float(f"{w:.3g}") for w in np.geomspace(0.05, 8.0, 17)) + (2.0,)

__all__ = ["calibrate", "choose_weight", "dev_sets", "main", "sweep"]


def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode("utf-8")).hexdigest()


def _group(source: str, query: str) -> str | None:
    """Rows that share a group enter the dev set together: a Python module's APIs (as the eval set holds whole
    library pages, so siblings are the distractors), a Debian pair on its own. None: not eligible (Python API
    names without a module, i.e. the C API and glossary, which the library-page eval set does not hold)."""
    if source == "python-api":
        return query.split(".", 1)[0] if "." in query else None
    return query


def dev_sets(pairs: Sequence[dict], *, exclude: set[str], passages: set[str], per_source: int = 1000,
             seed: int = 0, sources: Sequence[str] = DEV_SOURCES) -> dict[str, list[dict]]:
    """Pick the dev rows: per source, whole groups (see _group) in seeded-hash order, cut at `per_source` rows.

    Eligible rows come from `sources`, have a doc of at least 50 characters that occurs in exactly one pair and
    in no passage (the docs the contrastive and distillation losses saw least), a query that occurs in exactly
    one pair, and neither text in `exclude` (the eval sets). They are not unseen: train_embedder.py trains on all
    of pairs.jsonl, so the model's cosine is likely better on them than on held-out text, which biases the
    chosen w upward; to remove that, train with the rows of --write-dev left out.

    Args:
        pairs: the rows of pairs.jsonl.
        exclude: texts that must not appear (every query and doc of the eval sets).
        passages: the passage texts (distilled on in training).
        per_source: rows per source (the last group is cut).
        seed: the hash seed.
        sources: which pair sources.
    Returns:
        source -> dev rows.
    Raises:
        InvalidInput: a source has no eligible rows.
    """
    doc_count = Counter(p["doc"] for p in pairs)
    query_count = Counter(p["query"] for p in pairs)
    out = {}
    for source in sources:
        rows = [p for p in pairs if p["source"] == source and doc_count[p["doc"]] == 1 and query_count[p["query"]] == 1
                and len(p["doc"]) >= DOC_MIN_CHARS and p["doc"] not in passages
                and p["doc"] not in exclude and p["query"] not in exclude]
        if not rows:
            raise InvalidInput(f"no eligible dev pairs of source {source!r}; check the corpus and --dev-sources.")
        groups: dict[str, list[dict]] = {}
        for row in rows:
            key = _group(source, row["query"])
            if key is not None:
                groups.setdefault(key, []).append(row)
        if not groups:
            raise InvalidInput(f"no eligible dev pairs of source {source!r}; check the corpus and --dev-sources.")
        chosen: list[dict] = []
        for key in sorted(groups, key=lambda g: _rank(seed, f"{source}:{g}")):
            if len(chosen) >= per_source:
                break
            chosen += groups[key]
        out[source] = chosen[:per_source]
    return out


def sweep(es: EvalSet, embedder: object, weights: Sequence[float], workdir: Path,
          log: Callable[[str], None] = lambda s: None) -> dict:
    """Metrics of lexical, vector, hybrid rrf and hybrid at every weight, through the store's own recall.

    The store reads the weight from its embedder when it opens, so the docs are stored once and the store is
    reopened read-only with a wrapper carrying each weight (same fingerprint: no re-embedding).

    Args:
        es: the dev task.
        embedder: the model.
        weights: the grid.
        workdir: where the store lives.
        log: progress lines.
    Returns:
        {"queries", "docs", "lexical", "vector", "rrf": metrics, "hybrid": {w: metrics}}.
    """
    cache: dict = {}
    t0 = time.perf_counter()
    writer, id_to_doc = build_store(workdir / f"{es.name}.db", QueryCachingEmbedder(embedder, cache=cache), es.docs)
    try:
        QueryCachingEmbedder(embedder, cache=cache).warm(es.queries)
        out = {"queries": len(es.queries), "docs": len(es.docs)}
        for name, mode, fusion in (("lexical", "lexical", "score"), ("vector", "vector", "score"), ("rrf", "hybrid", "rrf")):
            out[name] = rank_metrics(store_rankings(writer, id_to_doc, es.queries, mode=mode, fusion=fusion), es.gold)
    finally:
        writer.close()
    log(f"{es.name}: {len(es.docs)} docs stored and embedded in {time.perf_counter() - t0:.1f}s")
    out["hybrid"] = {}
    for w in weights:
        with MemoryStore(workdir / f"{es.name}.db", QueryCachingEmbedder(embedder, w, cache), read_only=True) as store:
            if store.info()["hybrid_weight"] != float(w):
                raise InvalidInput(f"the store did not take hybrid_weight={w} from its embedder.")
            out["hybrid"][float(w)] = rank_metrics(store_rankings(store, id_to_doc, es.queries, mode="hybrid"), es.gold)
    return out


def choose_weight(results: dict[str, dict], metric: str = "ndcg@10") -> dict:
    """The weight with the best mean `metric` among those where hybrid >= max(lexical, vector).

    The constraint holds per source if any weight allows it, else on the mean over sources; when no weight
    meets even that, the best mean wins and `constraint` says "none".

    Args:
        results: source -> sweep() result (same weights in each).
        metric: what to maximise.
    Returns:
        {"hybrid_weight", "constraint": "per-source" | "mean" | "none", "mean": {w: metric}, "floor": float}.
    """
    names = list(results)
    weights = list(results[names[0]]["hybrid"])
    floor_src = {s: max(results[s]["lexical"][metric], results[s]["vector"][metric]) for s in names}
    floor_mean = max(float(np.mean([results[s][kind][metric] for s in names])) for kind in ("lexical", "vector"))
    mean = {w: float(np.mean([results[s]["hybrid"][w][metric] for s in names])) for w in weights}
    per_source_ok = [w for w in weights if all(results[s]["hybrid"][w][metric] >= floor_src[s] for s in names)]
    mean_ok = [w for w in weights if mean[w] >= floor_mean]
    if per_source_ok:
        pool, constraint = per_source_ok, "per-source"
    elif mean_ok:
        pool, constraint = mean_ok, "mean"
    else:
        pool, constraint = weights, "none"
    best = max(pool, key=lambda w: (mean[w], -w))  # ties: the smaller weight
    return {"hybrid_weight": best, "constraint": constraint, "mean": mean, "floor": floor_mean}


def format_sweep(results: dict[str, dict], choice: dict, metric: str = "ndcg@10") -> str:
    """The sweep as a table: one row per weight (per source and mean), then the reference rows."""
    names = list(results)
    head = f"  {'w':>8}" + "".join(f"{n:>12}" for n in names) + f"{'mean':>10}"
    lines = [f"{metric} on the dev set", head]
    for w, m in choice["mean"].items():
        mark = "  <- chosen" if w == choice["hybrid_weight"] else ""
        lines.append(f"  {w:>8g}" + "".join(f"{results[n]['hybrid'][w][metric]:>12.4f}" for n in names) + f"{m:>10.4f}{mark}")
    for ref in ("lexical", "vector", "rrf"):
        vals = [results[n][ref][metric] for n in names]
        lines.append(f"  {ref:>8}" + "".join(f"{v:>12.4f}" for v in vals) + f"{np.mean(vals):>10.4f}")
    return "\n".join(lines)


def calibrate(embedder: object, dev: dict[str, list[dict]], weights: Sequence[float],
              log: Callable[[str], None] = lambda s: None) -> dict:
    """Sweep every dev source and choose the weight.

    Args:
        embedder: the model.
        dev: source -> rows ({"query", "doc"}).
        weights: the grid.
        log: progress lines.
    Returns:
        {"hybrid_weight", "constraint", "results": source -> sweep(), "mean": {w: ndcg@10}}.
    """
    results = {}
    with tempfile.TemporaryDirectory(prefix="calibrate_fusion_") as tmp:
        for source, rows in dev.items():
            results[source] = sweep(eval_set_from_rows(source, rows), embedder, weights, Path(tmp), log)
    choice = choose_weight(results)
    return {**choice, "results": results}


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise InvalidInput(f"expected {path}; build the corpus with `python recipe/build_corpus.py`.")
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def main(argv: Sequence[str] | None = None) -> dict:
    """Command line: see the module docstring. Returns what it writes to --out."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(REPO / "corpus"), help="holds pairs.jsonl, passages.jsonl, eval/")
    ap.add_argument("--model", default=None, help="the .evlm checkpoint (default: the shipped model)")
    ap.add_argument("--tokenizer", default=None, help="its tokenizer.json")
    ap.add_argument("--out", required=True, help="the JSON file to write (hybrid_weight and the sweep)")
    ap.add_argument("--per-source", type=int, default=1000, help="dev rows per source")
    ap.add_argument("--dev-sources", default=",".join(DEV_SOURCES), help="pair sources of the dev set")
    ap.add_argument("--seed", type=int, default=0, help="seed of the dev slice")
    ap.add_argument("--weights", default=",".join(f"{w:g}" for w in sorted(set(DEFAULT_WEIGHTS))),
                    help="comma-separated grid")
    ap.add_argument("--write-dev", default=None, help="also write the dev rows here (so training can exclude them)")
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(f"[calibrate_fusion] {msg}", file=sys.stderr, flush=True)

    weights = sorted({float(w) for w in args.weights.split(",") if w.strip()})
    if not weights or any(not np.isfinite(w) or w < 0 for w in weights):
        raise InvalidInput(f"--weights expected finite numbers >= 0, got {args.weights!r}.")
    embedder = load_embedder(args.model, args.tokenizer)
    corpus = Path(args.corpus)
    pairs = _read_jsonl(corpus / "pairs.jsonl")
    passages = {row["text"] for row in _read_jsonl(corpus / "passages.jsonl")}
    exclude: set[str] = set()
    for path in sorted((corpus / "eval").glob("*.jsonl")):
        for row in _read_jsonl(path):
            exclude.update((row["query"], row["doc"]))
    sources = [s.strip() for s in args.dev_sources.split(",") if s.strip()]
    dev = dev_sets(pairs, exclude=exclude, passages=passages, per_source=args.per_source, seed=args.seed, sources=sources)
    log("dev rows: " + ", ".join(f"{s} {len(r)}" for s, r in dev.items()))
    if args.write_dev:
        with open(args.write_dev, "w", encoding="utf-8") as fh:
            for rows in dev.values():
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    t0 = time.perf_counter()
    res = calibrate(embedder, dev, weights, log)
    print(format_sweep(res["results"], res))
    print(f"chosen hybrid_weight {res['hybrid_weight']:g} (constraint hybrid >= max(lexical, vector): {res['constraint']})")
    out = {
        "hybrid_weight": res["hybrid_weight"],
        "fusion": "score",
        "formula": "BM25 / best BM25 of the lexical candidates + hybrid_weight * cosine (MemoryStore._hybrid)",
        "fingerprint": embedder.fingerprint,
        "metric": "ndcg@10",
        "constraint": res["constraint"],
        "dev": {
            "corpus": str(corpus), "sources": sources, "seed": args.seed, "per_source": args.per_source,
            "rows": {s: len(r) for s, r in dev.items()},
            "selection": ("seeded hash over groups (Python API: whole modules, dotted names only; Debian: single "
                          "pairs), cut at per_source, of pairs whose "
                          f"doc (>= {DOC_MIN_CHARS} chars) occurs in exactly one pair and in no passage, whose query "
                          "occurs once, and whose texts are in no eval set"),
            "trained_on": "these pairs are in pairs.jsonl, which train_embedder.py trains on unless told to exclude them",
        },
        "sweep": {s: {"lexical": r["lexical"], "vector": r["vector"], "rrf": r["rrf"],
                      "hybrid": {f"{w:g}": m for w, m in r["hybrid"].items()}} for s, r in res["results"].items()},
        "mean_ndcg@10": {f"{w:g}": m for w, m in res["mean"].items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    out_path = Path(args.out)
    if out_path.exists() and not out_path.is_file():  # /dev/null or a pipe: write through, never replace it
        out_path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        return out
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, args.out)
    return out


if __name__ == "__main__":
    main()
