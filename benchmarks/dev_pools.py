"""The dev sets through a real store, once: every query's hybrid candidate pool and the reference rankings, cached.

For each dev source (/work/data/dev/<source>.jsonl queries + <source>.docs.jsonl distractors, written by
recipe/build_devsets.py) a fresh store holds every document; for every query we keep

- the candidate pool hybrid recall would fuse (`store/search.py gather`: the top POOL_MAX of the lexical and
  of the vector list, BM25, ranks, cosines, fact lengths, the idf of the query's words), as a CandidatePool;
- the store's own top 10 in lexical, vector and hybrid (the embedder's current rule) mode;
- plain FTS5 BM25 (an OR of the query's words over the store's facts_fts table) top 50;
- all-MiniLM-L6-v2 exact cosine top 50 (vectors cached on disk by text hash, when sentence-transformers is
  installed).

A rule fitted offline then scores exactly the candidates the store would fuse (CandidatePool.truncate gives the
pool of any smaller size), so every choice can be fitted on some sources and scored on the one left out.
The cache is keyed by the embedder's fingerprint, POOL_MAX and a hash of the source's rows.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from evermind_memory.errors import InvalidInput  # noqa: E402
from evermind_memory.store.fusion import CandidatePool  # noqa: E402
from evermind_memory.store.study import gather  # noqa: E402
from recall_quality import (  # noqa: E402
    QueryCachingEmbedder, build_store, exact_rankings, plain_bm25_rankings, store_rankings,
)

POOL_MAX = 100          # candidates per list kept in the cache; rules may use any pool up to this
POOL_FORMAT = "p5"      # in every cache name: p3 pools hold each candidate's coverage and names held, and
                        # per-selection statistics; p4 also the model part's cosine of a vector with a lexicon part;
                        # p5 after the longer function-word list (store/lexical.py STOPWORDS)
                        # and names that skip sentence-initial words (query_names)
REF_K = 50              # depth of the reference rankings kept (FTS5, MiniLM) for RRF
FOREIGN_QUERIES = 200   # queries of another source run against a store: real questions it holds no answer to
CACHE_DIR = Path(os.environ.get("EVERMIND_POOL_CACHE", "/work/data/pool_cache"))
MINILM_CACHE = Path(os.environ.get("EVERMIND_MINILM_CACHE", "/work/data/minilm_cache"))

__all__ = ["DevSource", "SourcePools", "VectorCache", "dev_sources", "foreign_pools", "load_dev_source",
           "load_eval_source", "open_store", "source_pools", "store_path"]


def save_json_gz(path: Path, obj: object) -> None:
    """Write a cache file atomically (a temporary file, then a rename)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp_path = Path(path).with_name(Path(path).name + ".tmp")
    with gzip.open(tmp_path, "wt", encoding="utf-8") as fh:
        json.dump(obj, fh)
    os.replace(tmp_path, path)


def load_json_gz(path: Path) -> object:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


@dataclass(frozen=True)
class DevSource:
    """One dev source: queries with one relevant doc each, and every doc the store holds."""

    name: str
    queries: list[str]
    shapes: list[str]
    docs: list[str]
    gold: np.ndarray  # (Q,) index into docs

    def digest(self) -> str:
        """A hash of the rows (the cache key's data part)."""
        h = hashlib.sha256()
        for text in (*self.queries, "\x01", *self.docs, "\x01", *map(str, self.gold.tolist())):
            h.update(text.encode("utf-8") + b"\x00")
        return h.hexdigest()[:16]


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise InvalidInput(f"expected {path}; write it with `python recipe/build_devsets.py --out {path.parent}`.")
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def dev_sources(dev_dir: Path) -> list[str]:
    """The sources of a dev folder (every <source>.jsonl with a <source>.docs.jsonl beside it), sorted."""
    return sorted(p.name[: -len(".jsonl")] for p in Path(dev_dir).glob("*.jsonl")
                  if not p.name.endswith(".docs.jsonl") and (p.parent / (p.name[:-6] + ".docs.jsonl")).is_file())


def load_dev_source(name: str, dev_dir: Path, limit: int = 0) -> DevSource:
    """Read one dev source; `limit` keeps the first that many queries (their docs and all distractors stay)."""
    rows = _read_jsonl(Path(dev_dir) / f"{name}.jsonl")
    extra = _read_jsonl(Path(dev_dir) / f"{name}.docs.jsonl")
    if limit:
        rows = rows[:limit]
    docs: dict[str, int] = {}
    for text in [r["doc"] for r in rows] + [r["doc"] for r in extra]:
        docs.setdefault(text, len(docs))
    gold = np.array([docs[r["doc"]] for r in rows], dtype=np.int64)  # (Q,)
    return DevSource(name, [r["query"] for r in rows], [r.get("shape", "") for r in rows], list(docs), gold)


def load_eval_source(name: str, corpus_dir: Path) -> DevSource:
    """A held-out eval set of the corpus (corpus/eval/<name>.jsonl) as a dev source (its docs are all it holds)."""
    rows = _read_jsonl(Path(corpus_dir) / "eval" / f"{name}.jsonl")
    docs: dict[str, int] = {}
    for r in rows:
        docs.setdefault(r["doc"], len(docs))
    return DevSource(name, [r["query"] for r in rows], ["eval"] * len(rows), list(docs),
                     np.array([docs[r["doc"]] for r in rows], dtype=np.int64))


class VectorCache:
    """Vectors of texts by one model, on disk as <dir>/<model>.npz (sha1 of text -> row), loaded once."""

    def __init__(self, directory: Path, model: str) -> None:
        self.path = Path(directory) / f"{model}.npz"
        self.index: dict[str, int] = {}
        self.vecs = np.zeros((0, 0), dtype=np.float32)
        if self.path.is_file():
            with np.load(self.path, allow_pickle=False) as z:
                self.vecs = z["vecs"].astype(np.float32)
                self.index = {k: i for i, k in enumerate(z["keys"].tolist())}

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    def get(self, texts: Sequence[str], embed: Callable[[list[str]], np.ndarray], batch: int = 256,
            log: Callable[[str], None] = lambda s: None) -> np.ndarray:
        """(N, D) vectors of `texts`, embedding (and saving) only the ones not cached yet."""
        todo = list(dict.fromkeys(t for t in texts if self._key(t) not in self.index))
        if todo and len(todo) < 32:  # a few new texts (single queries): kept in memory, not worth rewriting the file
            new = np.asarray(embed(todo), dtype=np.float32)  # (n, D)
            self.vecs = new if self.vecs.size == 0 else np.concatenate([self.vecs, new])
            for t in todo:
                self.index[self._key(t)] = len(self.index)
        elif todo:
            t0 = time.perf_counter()
            parts = [np.asarray(embed(todo[i: i + batch]), dtype=np.float32) for i in range(0, len(todo), batch)]
            new = np.concatenate(parts)  # (n, D)
            self.vecs = new if self.vecs.size == 0 else np.concatenate([self.vecs, new])
            for t in todo:
                self.index[self._key(t)] = len(self.index)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp.npz")
            keys = np.array(sorted(self.index, key=self.index.get))
            np.savez(tmp, keys=keys, vecs=self.vecs)
            os.replace(tmp, self.path)
            log(f"embedded {len(todo)} texts in {time.perf_counter() - t0:.1f}s ({self.path.name})")
        return self.vecs[[self.index[self._key(t)] for t in texts]]  # (N, D)


@dataclass
class SourcePools:
    """The cached store pass of one dev source."""

    source: DevSource
    pools: list[CandidatePool]            # ids are doc indices
    store: dict[str, list[list[int]]]     # the store's own "lexical" and "vector" recall, top 10
    fts5: list[list[int]]                 # plain FTS5 top REF_K
    minilm: list[list[int]] | None        # MiniLM exact cosine top REF_K


def store_path(src: DevSource, embedder: object, cache_dir: Path | None = None) -> Path:
    """Where the store of `src` built with `embedder` is kept (so a later check can reopen it)."""
    fp = hashlib.sha1(embedder.fingerprint.encode("utf-8")).hexdigest()[:12]
    return Path(cache_dir or CACHE_DIR) / f"{src.name}-{fp}-{src.digest()}.db"


def open_store(src: DevSource, embedder: object, cache_dir: Path | None = None,
               log: Callable[[str], None] = lambda s: None):
    """(store, fact id -> doc index): the kept store of `src`, built (every doc embedded) the first time."""
    from evermind_memory import MemoryStore

    cache_dir = Path(cache_dir or CACHE_DIR)
    path = store_path(src, embedder, cache_dir)
    if path.is_file():
        store = MemoryStore(path, embedder)
        by_text = {f.text: f.id for f in store.list(limit=100_000)}
        if len(by_text) == len(src.docs) and all(d in by_text for d in src.docs):
            return store, {by_text[d]: i for i, d in enumerate(src.docs)}
        store.close()
        for stale in path.parent.glob(path.name + "*"):  # the db, its WAL, lock, index and manifest
            stale.unlink()
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    store, id_to_doc = build_store(path, embedder, src.docs)
    log(f"{src.name}: stored {len(src.docs)} docs in {time.perf_counter() - t0:.1f}s")
    return store, id_to_doc


def pool_of(store, query: str, id_to_doc: dict[str, int], embedder: QueryCachingEmbedder,
            pool: int = POOL_MAX) -> CandidatePool:
    """The hybrid candidate pool `store` (or a scoped view) gathers for `query`, its candidates renumbered by
    id_to_doc (fact id -> the source's doc index)."""
    rows, p = gather(store, query, pool, embedder.embed(query))
    return p.relabel([id_to_doc[rows[r].id] for r in p.ids])


def _collect(store, id_to_doc: dict[str, int], queries: Sequence[str], embedder: QueryCachingEmbedder,
             pool: int) -> list[CandidatePool]:
    return [pool_of(store, query, id_to_doc, embedder, pool) for query in queries]


def foreign_pools(src: DevSource, other: DevSource, embedder: object, n: int = FOREIGN_QUERIES, *,
                  cache_dir: Path | None = None, log: Callable[[str], None] = lambda s: None) -> list[CandidatePool]:
    """Pools of `n` queries of `other` (its first n) against the store of `src`: real questions whose answer the
    store does not hold (for calibrating relevance on no-match queries)."""
    cache_dir = Path(cache_dir or CACHE_DIR)
    fp = hashlib.sha1(embedder.fingerprint.encode("utf-8")).hexdigest()[:12]
    queries = other.queries[:n]
    digest = hashlib.sha256("\x00".join(queries).encode("utf-8")).hexdigest()[:12]
    path = Path(cache_dir) / f"{src.name}-{fp}-foreign{POOL_FORMAT}-{other.name}-{n}-{src.digest()}-{digest}.json.gz"
    if path.is_file():
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return [CandidatePool.from_json(p) for p in json.load(fh)]
    t0 = time.perf_counter()
    wrapped = QueryCachingEmbedder(embedder)
    store, id_to_doc = open_store(src, wrapped, cache_dir, log)
    try:
        wrapped.warm(queries)
        pools = _collect(store, id_to_doc, queries, wrapped, POOL_MAX)
    finally:
        store.close()
    tmp_path = path.with_name(path.name + ".tmp")
    with gzip.open(tmp_path, "wt", encoding="utf-8") as fh:
        json.dump([p.to_json() for p in pools], fh)
    os.replace(tmp_path, path)
    log(f"{src.name}: {len(queries)} queries of {other.name} pooled in {time.perf_counter() - t0:.1f}s")
    return pools


def source_pools(src: DevSource, embedder: object, *, minilm: object | None = None, cache_dir: Path | None = None,
                 minilm_cache: Path | None = None, log: Callable[[str], None] = lambda s: None) -> SourcePools:
    """The store pass of `src` with `embedder` (from the cache when it has it).

    Args:
        src: the dev source.
        embedder: ours (its fingerprint keys the cache).
        minilm: a SentenceTransformer for the MiniLM ranking, or None (then a cached ranking is used if any).
        cache_dir: where pools are cached.
        minilm_cache: where MiniLM vectors are cached.
        log: progress lines.
    """
    cache_dir, minilm_cache = Path(cache_dir or CACHE_DIR), Path(minilm_cache or MINILM_CACHE)
    fp = hashlib.sha1(embedder.fingerprint.encode("utf-8")).hexdigest()[:12]
    path = Path(cache_dir) / f"{src.name}-{fp}-{POOL_MAX}{POOL_FORMAT}-{src.digest()}.json.gz"
    cached = None
    if path.is_file():
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            cached = json.load(fh)
    if cached is None:
        t0 = time.perf_counter()
        wrapped = QueryCachingEmbedder(embedder)
        store, id_to_doc = open_store(src, wrapped, cache_dir, log)
        try:
            wrapped.warm(src.queries)
            pools = _collect(store, id_to_doc, src.queries, wrapped, POOL_MAX)
            runs = {mode: store_rankings(store, id_to_doc, src.queries, mode=mode) for mode in ("lexical", "vector")}
        finally:
            store.close()
        fts5 = plain_bm25_rankings(store_path(src, embedder, cache_dir), id_to_doc, src.queries, REF_K)
        cached = {"fingerprint": embedder.fingerprint, "pools": [p.to_json() for p in pools], "store": runs,
                  "fts5": fts5}
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_name(path.name + ".tmp")
        with gzip.open(tmp_path, "wt", encoding="utf-8") as fh:
            json.dump(cached, fh)
        os.replace(tmp_path, path)
        log(f"{src.name}: {len(src.queries)} queries pooled in {time.perf_counter() - t0:.1f}s")
    minilm_rank = None
    mpath = Path(cache_dir) / f"{src.name}-minilm-{src.digest()}.json.gz"
    if mpath.is_file():
        with gzip.open(mpath, "rt", encoding="utf-8") as fh:
            minilm_rank = json.load(fh)
    elif minilm is not None:
        from recall_quality import _minilm_embed

        vc = VectorCache(minilm_cache, "all-MiniLM-L6-v2")
        d = vc.get(src.docs, lambda t: _minilm_embed(minilm, t), log=log)  # (N, 384)
        q = vc.get(src.queries, lambda t: _minilm_embed(minilm, t), log=log)  # (Q, 384)
        minilm_rank = exact_rankings(q, d, REF_K)
        with gzip.open(mpath, "wt", encoding="utf-8") as fh:
            json.dump(minilm_rank, fh)
    return SourcePools(src, [CandidatePool.from_json(p) for p in cached["pools"]], cached["store"], cached["fts5"],
                       minilm_rank)
