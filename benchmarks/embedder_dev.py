"""Vector search quality on the left-out dev sources, and embedding speed, of embedder variants beside
all-MiniLM-L6-v2, in one run.

For each dev source (/work/data/dev/<source>.jsonl: queries with one relevant doc; <source>.docs.jsonl: the
other docs of the pool; written by recipe/build_devsets.py, never trained on) every doc and query is embedded
and ranked by exact cosine; the table gives ndcg@10 per source for each variant and for MiniLM (float32 CPU,
vectors cached on disk by text hash), and each variant's ratio to MiniLM. Speed: docs/s of each variant and of
MiniLM on the same sample of dev docs (long facts as they come, mixed over the sources) and on short docs
(the 40-60-token paragraphs of benchmarks/embed_speed.py), alternating between models, best of --repeats.

A variant is NAME=MODEL.evlm,TOKENIZER.json[,key=value...] (or NAME=shipped[,key=value...]) with keys:
    chunks=K     embed a doc as up to K windows of max_tokens tokens (stride max_tokens) ...
    pool=max     ... and score it by the best window's cosine (several vectors per doc), or
    pool=mean    ... by the cosine of the windows' mean vector (one vector per doc)
    max_tokens=N truncation length (default: the card's 128)

    python benchmarks/embedder_dev.py [--variant shipped] [--variant c384=runs/c384/model.evlm,runs/c384/tokenizer.json]
        [--sources octave,maxima] [--speed-docs 600] [--repeats 3] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

DEV_DIR = Path(os.environ.get("EVERMIND_DEV_DIR", "/work/data/dev"))
CACHE_DIR = Path(os.environ.get("EVERMIND_VECTOR_CACHE", "/work/data/i16m_vectors"))
SHARED_MINILM = Path("/work/data/minilm_cache")  # another benchmark's MiniLM cache (same key), read if present


@dataclass
class Source:
    name: str
    queries: list[str]
    docs: list[str]
    gold: np.ndarray  # (Q,) index into docs
    shapes: list[str] = field(default_factory=list)  # (Q,) the query's shape: name, title, summary, question


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def load_source(name: str, dev_dir: Path = DEV_DIR) -> Source:
    rows = read_jsonl(dev_dir / f"{name}.jsonl")
    docs = list(dict.fromkeys([r["doc"] for r in rows]
                              + [r["doc"] for r in read_jsonl(dev_dir / f"{name}.docs.jsonl")]))
    col = {d: i for i, d in enumerate(docs)}
    return Source(name, [r["query"] for r in rows], docs, np.array([col[r["doc"]] for r in rows]),
                  [r.get("shape", "?") for r in rows])


def dev_sources(dev_dir: Path = DEV_DIR) -> list[str]:
    return sorted(p.name[:-6] for p in dev_dir.glob("*.jsonl")
                  if not p.name.endswith(".docs.jsonl") and (dev_dir / (p.name[:-6] + ".docs.jsonl")).is_file())


def ndcg_at_10(scores: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Per-query ndcg@10 with one relevant doc (gold[i] is its column of scores (Q, D))."""
    g = scores[np.arange(len(gold)), gold][:, None]  # (Q, 1)
    rank = (scores > g).sum(axis=1)  # (Q,) docs strictly above the relevant one (ties favour it, as argsort may)
    return np.where(rank < 10, 1.0 / np.log2(rank + 2.0), 0.0)


class VectorCache:
    """Vectors of texts by one model on disk (<dir>/<model>.npz: sha1(text) -> row), loaded once."""

    def __init__(self, path: Path, also: Sequence[Path] = ()) -> None:
        self.path = path
        self.index: dict[str, int] = {}
        self.vecs: list[np.ndarray] = []
        for p in [path, *also]:
            if p.is_file():
                with np.load(p, allow_pickle=False) as z:
                    for k, v in zip(z["keys"].tolist(), z["vecs"].astype(np.float32)):
                        if k not in self.index:
                            self.index[k] = len(self.vecs)
                            self.vecs.append(v)

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    def get(self, texts: Sequence[str], embed: Callable[[list[str]], np.ndarray], batch: int = 256) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if self.key(t) not in self.index))
        for i in range(0, len(todo), batch):
            part = todo[i: i + batch]
            for t, v in zip(part, np.asarray(embed(part), dtype=np.float32)):
                self.index[self.key(t)] = len(self.vecs)
                self.vecs.append(v)
            if (i // batch) % 20 == 19 or i + batch >= len(todo):
                self.save()
                print(f"  {self.path.name}: {min(i + batch, len(todo))}/{len(todo)} new texts embedded",
                      file=sys.stderr, flush=True)
        return np.stack([self.vecs[self.index[self.key(t)]] for t in texts])

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(sorted(self.index, key=self.index.get))
        tmp = self.path.with_name(self.path.stem + ".tmp.npz")
        np.savez(tmp, keys=keys, vecs=np.stack(self.vecs))
        os.replace(tmp, self.path)


@dataclass
class Variant:
    name: str
    embedder: object
    chunks: int = 1
    pool: str = "max"
    spec: dict = field(default_factory=dict)
    cache: object = None

    def token_windows(self, text: str) -> list[list[int]]:
        emb = self.embedder
        ids = list(emb.tokenizer.encode(text)) or [int(emb.tokenizer.bos_id)]
        n = emb.max_tokens
        return [ids[i: i + n] for i in range(0, min(len(ids), n * self.chunks), n)]

    def _cached(self, texts: Sequence[str]) -> np.ndarray:
        """Plain embed_many vectors, cached on disk by fingerprint and text (reruns of a variant are cheap)."""
        if self.cache is None:
            fp = hashlib.sha1(self.embedder.fingerprint.encode("utf-8")).hexdigest()[:12]
            self.cache = VectorCache(CACHE_DIR / f"ours-{fp}-{self.embedder.max_tokens}.npz")
        return self.cache.get(texts, lambda t: self.embedder.embed_many(list(t)), batch=1024)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._cached(texts)

    def embed_docs(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(vectors (W, C), owner (W,)): one row per window (per doc when chunks == 1 or pool == mean)."""
        if self.chunks == 1:
            return self._cached(texts), np.arange(len(texts))
        windows, owner = [], []
        for i, t in enumerate(texts):
            w = self.token_windows(t)
            windows += w
            owner += [i] * len(w)
        engine = self.embedder.model.frozen()
        vecs = engine.embed_batch(windows)  # (W, C) unit rows
        owner = np.array(owner)
        if self.pool == "mean":
            summed = np.zeros((len(texts), vecs.shape[1]), dtype=np.float32)
            np.add.at(summed, owner, vecs)
            return summed / np.linalg.norm(summed, axis=1, keepdims=True), np.arange(len(texts))
        return vecs, owner

    def scores(self, queries: Sequence[str], docs: Sequence[str]) -> np.ndarray:
        q = self.embed_queries(queries)
        d, owner = self.embed_docs(docs)
        s = q @ d.T  # (Q, W)
        if len(owner) == len(docs):
            return s
        starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])  # (D,) windows are grouped by doc
        return np.maximum.reduceat(s, starts, axis=1)  # (Q, D) the best window of each doc

    def embed_for_speed(self, texts: Sequence[str]) -> None:
        if self.chunks == 1:
            self.embedder.embed_many(list(texts))
        else:
            self.embed_docs(texts)


def build_variant(spec: str) -> Variant:
    from evermind_memory.embedder import card, default_embedder, load_embedder

    name, _, rest = spec.partition("=")
    parts = (rest or name).split(",")
    opts = dict(p.split("=", 1) for p in parts if "=" in p)
    files = [p for p in parts if "=" not in p]
    max_tokens = int(opts.get("max_tokens", card()["max_tokens"]))
    if files in (["shipped"], []):
        base = default_embedder()
        emb = base.load() if max_tokens == base.max_tokens else load_embedder(
            *_shipped_paths(), max_tokens=max_tokens, hybrid_weight=base.hybrid_weight)
    else:
        emb = load_embedder(files[0], files[1], max_tokens=max_tokens)
    return Variant(name, emb, int(opts.get("chunks", 1)), opts.get("pool", "max"), {"spec": spec, **opts})


def _shipped_paths() -> tuple[str, str]:
    from evermind_memory.embedder import card

    root = REPO / "evermind_memory" / "models"
    meta = card()
    return str(root / meta["model_file"]), str(root / meta["tokenizer_file"])


def short_docs(n: int) -> list[str]:
    """embed_speed.py's documents: stdlib docstring paragraphs, here 150-400 characters (about 40-60 tokens)."""
    from embed_speed import paragraphs

    pool = [p for p in paragraphs() if 200 <= len(p) <= 330]
    return [pool[i % len(pool)] for i in range(n)]


def speed(runners: dict[str, Callable[[list[str]], object]], docs: list[str], repeats: int) -> dict[str, float]:
    for run in runners.values():
        run(docs[:32])
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, run in runners.items():
            t0 = time.perf_counter()
            run(docs)
            best[name] = max(best.get(name, 0.0), len(docs) / (time.perf_counter() - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=None, help="NAME=MODEL,TOKENIZER[,k=v] or shipped")
    ap.add_argument("--sources", default=None, help="comma-separated dev sources (default: all in --dev-dir)")
    ap.add_argument("--dev-dir", type=Path, default=DEV_DIR)
    ap.add_argument("--speed-docs", type=int, default=600, help="docs per timed pass (0: no speed rows)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads for MiniLM")
    ap.add_argument("--teacher", default=None, help="all-MiniLM-L6-v2 directory")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from recall_quality import _minilm_embed, load_minilm

    sources = args.sources.split(",") if args.sources else dev_sources(args.dev_dir)
    variants = [build_variant(s) for s in (args.variant or ["shipped"])]
    minilm = load_minilm(args.teacher, args.threads)
    cache = VectorCache(CACHE_DIR / "minilm.npz",
                        also=sorted(SHARED_MINILM.glob("*.npz")) if SHARED_MINILM.is_dir() else [])
    load_start = os.getloadavg()
    table: dict[str, dict[str, float]] = {}
    per_shape: dict[str, dict[str, list[float]]] = {}  # shape -> model -> per-query ndcg@10, all sources
    for name in sources:
        src = load_source(name, args.dev_dir)
        row = {}
        if minilm is not None:
            q = cache.get(src.queries, lambda t: _minilm_embed(minilm, t))
            d = cache.get(src.docs, lambda t: _minilm_embed(minilm, t))
            per_query = ndcg_at_10(q @ d.T, src.gold)
            row["MiniLM"] = float(per_query.mean())
            for shape, x in zip(src.shapes, per_query):
                per_shape.setdefault(shape, {}).setdefault("MiniLM", []).append(float(x))
        for v in variants:
            t0 = time.perf_counter()
            per_query = ndcg_at_10(v.scores(src.queries, src.docs), src.gold)
            row[v.name] = float(per_query.mean())
            for shape, x in zip(src.shapes, per_query):
                per_shape.setdefault(shape, {}).setdefault(v.name, []).append(float(x))
            print(f"  {name} {v.name}: {row[v.name]:.4f} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr,
                  flush=True)
        table[name] = row
        print(f"{name:12s} " + "  ".join(f"{k} {x:.4f}" for k, x in row.items()), flush=True)

    rates: dict[str, dict[str, float]] = {}
    if args.speed_docs:
        rng = np.random.default_rng(0)
        pool = [d for name in sources for d in load_source(name, args.dev_dir).docs]
        long_docs = [pool[i] for i in rng.choice(len(pool), size=args.speed_docs, replace=False)]
        for label, docs in (("dev docs", long_docs), ("short docs", short_docs(args.speed_docs))):
            runners = {v.name: v.embed_for_speed for v in variants}
            if minilm is not None:
                runners["MiniLM"] = lambda t: minilm.encode(t, batch_size=32, convert_to_numpy=True,
                                                            show_progress_bar=False)
            rates[label] = speed(runners, docs, args.repeats)

    names = [v.name for v in variants]
    print("\n## vector ndcg@10 on the left-out dev sources (exact cosine)\n")
    head = "| source | MiniLM | " + " | ".join(f"{n} | {n}/MiniLM" for n in names) + " |"
    print(head)
    print("|" + "---|" * (2 + 2 * len(names)))
    for name, row in table.items():
        m = row.get("MiniLM", float("nan"))
        print(f"| {name} | {m:.4f} | " + " | ".join(f"{row[n]:.4f} | {row[n] / m:.3f}" for n in names) + " |")
    mean = {k: float(np.mean([r[k] for r in table.values()])) for k in next(iter(table.values()))}
    worst = {n: min(r[n] / r["MiniLM"] for r in table.values()) for n in names} if minilm is not None else {}
    print(f"| **mean** | {mean.get('MiniLM', float('nan')):.4f} | " + " | ".join(
        f"{mean[n]:.4f} | {mean[n] / mean.get('MiniLM', float('nan')):.3f}" for n in names) + " |")
    if worst:
        print("| worst source ratio | | " + " | ".join(f" | {worst[n]:.3f}" for n in names) + " |")
    if "MiniLM" in next(iter(table.values())):
        print("\n## by query shape (all sources' queries pooled)\n")
        print("| shape | queries | MiniLM | " + " | ".join(f"{n} | {n}/MiniLM" for n in names) + " |")
        print("|" + "---|" * (3 + 2 * len(names)))
        for shape, by in sorted(per_shape.items()):
            m = float(np.mean(by["MiniLM"]))
            print(f"| {shape} | {len(by['MiniLM'])} | {m:.4f} | " + " | ".join(
                f"{np.mean(by[n]):.4f} | {np.mean(by[n]) / m:.3f}" for n in names) + " |")
    if rates:
        print("\n## docs/s on 2 cores, same run (best of %d)\n" % args.repeats)
        print("| docs | MiniLM | " + " | ".join(f"{n} | x MiniLM" for n in names) + " |")
        print("|" + "---|" * (2 + 2 * len(names)))
        for label, r in rates.items():
            m = r.get("MiniLM", float("nan"))
            print(f"| {label} | {m:.1f} | " + " | ".join(f"{r[n]:.1f} | {r[n] / m:.2f}" for n in names) + " |")
    load_end = os.getloadavg()
    print(f"\nload average {load_start[0]:.2f} -> {load_end[0]:.2f}; variants: " +
          "; ".join(f"{v.name}: {v.embedder.fingerprint} {v.spec}" for v in variants))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "ndcg10": table, "mean": mean,
            "by_shape": {s: {k: float(np.mean(v)) for k, v in by.items()} for s, by in per_shape.items()},
                                         "worst_ratio": worst, "docs_per_s": rates,
            "variants": {v.name: {"fingerprint": v.embedder.fingerprint, **v.spec} for v in variants},
            "load_avg": [load_start, load_end], "sources": sources}, indent=1))


if __name__ == "__main__":
    main()
