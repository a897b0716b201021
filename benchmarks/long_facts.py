"""How much of a long fact should vector search read? Truncation lengths and chunk pooling, per left-out source.

The shipped model truncates every text to `max_tokens` (model.json). Here every dev source (/work/data/dev, the
nine manuals no training run read) and the held-out eval sets (corpus/eval/{debian,pyapi,foldoc}) are embedded
with the shipped weights under several ways of reading a document, and scored by exact cosine ndcg@10 (the
relevant doc of each query among all of the source's docs; queries always read as the store reads them, 128
tokens). Nothing is fitted, so every figure is already left out: no choice here saw the source it is scored on,
and the weights never saw the dev manuals.

Variants of the document side:
- `trunc-T`: the first T tokens in one forward (T = 128, 192, 256): the attention block sees all T.
- `chunk-WxN-mean`: the first W*N tokens cut into windows of W tokens, each embedded alone (unit vector),
  the fact's vector = the normalised mean of its chunk vectors.
- `chunk-WxN-len`: the same, each chunk weighted by its token count (a short tail chunk counts less).
- `chunk-WxN-firstF`: the same, the first chunk weighted F, the others 1 (the head of a fact usually says what
  it is about).
- `chunk-WxN-lenfirstF`: each chunk weighted by its token count, the first one's weight times F (what
  LMEmbedder(max_chunks=N, first_chunk_weight=F) computes).

A variant chosen by looking at this table is chosen on the sources it is scored on; the `left-out choice` row
is honest: for each source, the variant with the best mean over the other sources, scored on this one.
Vectors are cached under --cache (by source, fingerprint and reading), so more pooling variants cost nothing.

Also the document tokens read per second of each variant (one thread, this machine), and the share of the
source's document tokens each variant reads. all-MiniLM-L6-v2 (exact cosine, 256 word pieces) is the reference
column, read from the rankings benchmarks/dev_pools.py caches under EVERMIND_POOL_CACHE.

    python benchmarks/long_facts.py [--dev /work/data/dev] [--corpus /work/corpus] [--json out.json]
        [--variants trunc-128,trunc-256,chunk-128x4-mean] [--sources apache,gimp]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402

from dev_pools import CACHE_DIR, dev_sources, load_dev_source, load_eval_source  # noqa: E402
from recall_quality import exact_rankings, rank_metrics  # noqa: E402

EVAL_SOURCES = ("debian", "pyapi", "foldoc")
DEFAULT_VARIANTS = ("trunc-128", "trunc-256", "chunk-128x2-len", "chunk-128x4-len", "chunk-128x4-first2",
                    "chunk-128x4-first4", "chunk-128x4-lenfirst2", "chunk-128x4-lenfirst4", "chunk-128x4-lenfirst8")
QUERY_TOKENS = 128


def parse_variant(name: str) -> tuple[str, int, int, str]:
    """('trunc', T, 1, '') or ('chunk', W, N, weighting) from a variant name."""
    kind, _, rest = name.partition("-")
    if kind == "trunc":
        return "trunc", int(rest), 1, ""
    size, _, weighting = rest.partition("-")
    w, _, n = size.partition("x")
    if kind != "chunk" or not (weighting in ("mean", "len") or weighting.startswith(("first", "lenfirst"))):
        raise SystemExit(f"unknown variant {name!r}: expected trunc-T or chunk-WxN-(mean|len|firstF|lenfirstF)")
    return "chunk", int(w), int(n), weighting


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def cached_embed(engine, lists: list[list[int]], path: Path | None) -> tuple[np.ndarray, float | None]:
    """Unit vectors of token lists, read from `path` (.npy) when a run wrote it; seconds spent (None: cached)."""
    if path is not None and path.is_file():
        vecs = np.load(path, allow_pickle=False)
        if vecs.shape[0] == len(lists):
            return vecs, None
    t0 = time.perf_counter()
    vecs = _unit(np.asarray(engine.embed_batch(lists), dtype=np.float32))
    seconds = time.perf_counter() - t0
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, vecs, allow_pickle=False)
    return vecs, seconds


class ChunkVectors:
    """Unit vectors of W-token windows of each doc, embedded once and shared by every chunk variant."""

    def __init__(self, engine, token_lists: list[list[int]], w: int, cache: str | None = None) -> None:
        self.engine, self.tokens, self.w, self.cache = engine, token_lists, w, cache
        self.vecs: dict[int, np.ndarray] = {}  # chunk index -> (n_docs_with_it, C)
        self.rows: dict[int, np.ndarray] = {}  # chunk index -> doc indices that have it
        self.seconds: float | None = 0.0  # None once any chunk came from the cache
        self.tokens_read: dict[int, int] = {}

    def chunk(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        if j not in self.vecs:
            rows = np.array([i for i, t in enumerate(self.tokens) if len(t) > j * self.w], dtype=np.int64)
            lists = [self.tokens[i][j * self.w: (j + 1) * self.w] for i in rows]
            if lists:
                # the first window is the text truncated at w tokens: the same vectors as trunc-w
                path = (Path(f"{self.cache}-t{self.w}.npy") if j == 0 else Path(f"{self.cache}-w{self.w}-c{j}.npy")) \
                    if self.cache else None
                vecs, seconds = cached_embed(self.engine, lists, path)
                self.seconds = None if seconds is None or self.seconds is None else self.seconds + seconds
            else:
                vecs = np.zeros((0, 1), np.float32)
            self.vecs[j], self.rows[j] = vecs, rows
            self.tokens_read[j] = sum(len(x) for x in lists)
        return self.vecs[j], self.rows[j]

    def pooled(self, n: int, weighting: str, dims: int) -> tuple[np.ndarray, int]:
        """(docs, C) pooled unit vectors over the first n chunks, and the tokens those chunks hold."""
        acc = np.zeros((len(self.tokens), dims), dtype=np.float32)
        for j in range(n):
            vecs, rows = self.chunk(j)
            if not rows.size:
                break
            length = np.array([min(self.w, len(self.tokens[i]) - j * self.w) for i in rows], np.float32)
            if weighting == "len":
                weight = length
            elif weighting.startswith("lenfirst"):  # what LMEmbedder(max_chunks=N, first_chunk_weight=F) does
                weight = length * (float(weighting[8:]) if j == 0 else 1.0)
            elif weighting.startswith("first"):
                weight = np.full(rows.size, float(weighting[5:]) if j == 0 else 1.0, np.float32)
            else:
                weight = np.ones(rows.size, np.float32)
            acc[rows] += weight[:, None] * vecs
        read = sum(self.tokens_read.get(j, 0) for j in range(n))
        return _unit(acc), read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev", default=os.environ.get("EVERMIND_DEV_DIR", "/work/data/dev"))
    ap.add_argument("--corpus", default="/work/corpus", help="holds eval/<source>.jsonl ('': none)")
    ap.add_argument("--sources", default="", help="comma-separated subset")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--cache", default="/tmp/evermind_long_facts", help="vector cache folder ('': none)")
    args = ap.parse_args()

    from evermind_memory.embedder import default_embedder

    emb = default_embedder().load()
    engine, tok, dims = emb._engine, emb.tokenizer, emb.dimensions
    variants = [v for v in args.variants.split(",") if v]
    parsed = {v: parse_variant(v) for v in variants}
    names = dev_sources(Path(args.dev)) + (list(EVAL_SOURCES) if args.corpus else [])
    if args.sources:
        names = [n for n in names if n in args.sources.split(",")]

    results: dict[str, dict] = {}
    t_all = time.perf_counter()
    for name in names:
        src = (load_eval_source(name, Path(args.corpus)) if name in EVAL_SOURCES
               else load_dev_source(name, Path(args.dev)))
        doc_tokens = [list(tok.encode(d)) or [int(tok.bos_id)] for d in src.docs]
        total_tokens = sum(len(t) for t in doc_tokens)
        cache = (f"{args.cache}/{name}-{emb.fingerprint.rsplit('/', 1)[-1]}-{src.digest()}"
                 if args.cache else None)
        q_vecs, _ = cached_embed(engine, [list(tok.encode(q))[:QUERY_TOKENS] or [int(tok.bos_id)] for q in src.queries],
                                 Path(f"{cache}-queries.npy") if cache else None)
        row: dict[str, dict] = {}
        chunkers: dict[int, ChunkVectors] = {}
        for v in variants:
            kind, w, n, weighting = parsed[v]
            if kind == "trunc":
                lists = [t[:w] for t in doc_tokens]
                d_vecs, seconds = cached_embed(engine, lists, Path(f"{cache}-t{w}.npy") if cache else None)
                read = sum(len(x) for x in lists)
            else:
                ch = chunkers.setdefault(w, ChunkVectors(engine, doc_tokens, w, cache))
                d_vecs, read = ch.pooled(n, weighting, dims)
            m = rank_metrics(exact_rankings(q_vecs, d_vecs), src.gold)
            row[v] = {"ndcg@10": m["ndcg@10"], "recall@10": m["recall@10"],
                      "tokens_read_share": read / total_tokens, "tokens_read": read}
            if kind == "trunc" and seconds:
                row[v]["tokens_per_s"] = read / seconds
        for w, ch in chunkers.items():
            read = sum(ch.tokens_read.values())
            for v in variants:
                if parsed[v][0] == "chunk" and parsed[v][1] == w and ch.seconds:
                    row[v]["tokens_per_s"] = read / ch.seconds
        ranked = CACHE_DIR / f"{src.name}-minilm-{src.digest()}.json.gz"
        if ranked.is_file():  # MiniLM's exact-cosine top 50, as benchmarks/dev_pools.py cached it
            with gzip.open(ranked, "rt", encoding="utf-8") as fh:
                row["MiniLM"] = {"ndcg@10": rank_metrics(json.load(fh), src.gold)["ndcg@10"]}
        results[name] = {"queries": len(src.queries), "docs": len(src.docs),
                         "doc_tokens_median": float(np.median([len(t) for t in doc_tokens])),
                         "docs_over_128_tokens": float(np.mean([len(t) > 128 for t in doc_tokens])),
                         "variants": row}
        print(f"{name:<12} " + " ".join(f"{v}={r['ndcg@10']:.4f}" for v, r in row.items()), flush=True)

    cols = variants + (["MiniLM"] if all("MiniLM" in r["variants"] for r in results.values()) else [])
    mean = {c: float(np.mean([r["variants"][c]["ndcg@10"] for r in results.values()])) for c in cols}
    print(f"\nVector ndcg@10, exact cosine, shipped weights ({time.perf_counter() - t_all:.0f}s)")
    print(f"{'source':<12}{'tok med':>8}{'>128':>6}" + "".join(f"{c:>20}" for c in cols))
    for name, r in results.items():
        print(f"{name:<12}{r['doc_tokens_median']:>8.0f}{r['docs_over_128_tokens']:>6.0%}"
              + "".join(f"{r['variants'][c]['ndcg@10']:>20.4f}" for c in cols))
    print(f"{'mean':<26}" + "".join(f"{mean[c]:>20.4f}" for c in cols))
    if "trunc-128" in mean:
        print(f"{'- trunc-128':<26}" + "".join(f"{mean[c] - mean['trunc-128']:>+20.4f}" for c in cols))
    if "MiniLM" in mean:
        print(f"{'x MiniLM':<26}" + "".join(f"{mean[c] / mean['MiniLM']:>20.3f}" for c in cols))
    choice = {}
    for name in results:  # the variant the other sources prefer, scored on this one
        others = [r for n, r in results.items() if n != name]
        best = max(variants, key=lambda v: np.mean([r["variants"][v]["ndcg@10"] for r in others]))
        choice[name] = {"variant": best, "ndcg@10": results[name]["variants"][best]["ndcg@10"]}
    chosen = float(np.mean([c["ndcg@10"] for c in choice.values()]))
    print("\nleft-out choice (best mean on the other sources): " + ", ".join(
        f"{n}: {c['variant']} {c['ndcg@10']:.4f}" for n, c in choice.items()))
    base = f" ({chosen - mean['trunc-128']:+.4f} vs trunc-128)" if "trunc-128" in mean else ""
    print(f"left-out choice mean ndcg@10 {chosen:.4f}{base}")
    if args.json:
        Path(args.json).write_text(json.dumps({"sources": results, "mean_ndcg@10": mean, "left_out_choice": choice,
                                               "left_out_choice_mean": chosen,
                                               "fingerprint": emb.fingerprint, "query_tokens": QUERY_TOKENS},
                                              indent=1))


if __name__ == "__main__":
    main()
