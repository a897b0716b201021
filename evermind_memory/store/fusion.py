"""Hybrid fusion: lexical (BM25) and vector (cosine) evidence for the same candidates -> one score each.

Pure functions over plain values, no store state, so the rule can be studied offline (recipe/, benchmarks/) on
exactly the candidates the store would fuse, and swapped without touching the store.

Two rules:

- `fuse_learned` (the default when the embedder has fitted parameters, see `params_for`): a linear score over
  named features of each candidate (`FEATURES`: BM25 over the best BM25, BM25 over the most the query's words
  could score, reciprocal ranks, cosine, the cosine's gap to the best one, ...), fitted per embedder by
  recipe/calibrate_fusion.py with leave-one-source-out checks, and a calibrated probability of relevance.
  Each feature belongs to the lexical or the vector side, so every hit's score splits into a lexical part and
  a vector part (`Explain`).
- `fuse_scores` (embedders without fitted parameters): BM25 over the best BM25 plus weight x cosine.
- `fuse_rrf`: reciprocal-rank fusion, for `fusion="rrf"`.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, Sequence, TypeVar

from .._lazy import lazy_import
from ..errors import CheckpointError
from .lexical import BM25_K1  # FTS5's bm25(): a word adds at most idf * (k1 + 1) to a row's score
from .trees import TreeEnsemble

if TYPE_CHECKING:
    from ..embedder.base import Embedder


if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

RRF_K = 60
# BM25 below this is no evidence: FTS5 clamps the idf of a word held by half the facts or more to 1e-6, so a row
# matched by such words alone scores ~1e-6, and normalising by the best BM25 would stretch that to a full 1.0.
LEXICAL_EVIDENCE = 1e-3
IDF_FLOOR = 1e-6        # FTS5 clamps idf <= 0 to this
VECTOR_CHARS = 600      # about the characters the shipped embedder reads (128 tokens); longer facts are cut
PARAMS_FORMAT = "evermind-fusion 1"
PARAMS_MAX_BYTES = 1 << 20


Key = TypeVar("Key", bound=Hashable)  # a candidate's id (a fact's rowid in the store)


def fuse_scores(lexical: Mapping[Hashable, float], vector: Mapping[Hashable, float],
                weight: float) -> dict[Hashable, float]:
    """BM25 over the best BM25, plus weight x cosine, for every candidate of either list.

    Min-max would score the weakest lexical match as no match at all, which on a small store lets a noise-level
    idf difference decide between two facts; over-the-best keeps its share.

    Args:
        lexical: candidate -> BM25 (higher is better; FTS5's rank negated).
        vector: candidate -> cosine, for every candidate whose vector is known.
        weight: the vector side's weight.
    Returns:
        candidate -> fused score.
    """
    bm = {c: s for c, s in lexical.items() if s > LEXICAL_EVIDENCE}
    hi = max(bm.values(), default=0.0)
    return {c: (bm[c] / hi if c in bm else 0.0) + weight * vector.get(c, 0.0) for c in {*lexical, *vector}}


def fuse_rrf(lexical_order: list[Hashable], vector_order: list[Hashable], k: int = RRF_K) -> dict[Hashable, float]:
    """Reciprocal-rank fusion of two rankings (best first): sum of 1 / (k + rank)."""
    fused: dict[Hashable, float] = {}
    for ranked in (vector_order, lexical_order):
        for rank, c in enumerate(ranked, start=1):
            fused[c] = fused.get(c, 0.0) + 1.0 / (k + rank)
    return fused


# ----------------------------------------------------------------------------------------------- the pool


def fts5_idf(df: Sequence[int] | np.ndarray, n_facts: int) -> np.ndarray:
    """FTS5's idf of words held by `df` of `n_facts` rows: log((N - df + 0.5) / (df + 0.5)), at least 1e-6."""
    df = np.asarray(df, dtype=np.float64)  # (m,)
    return np.maximum(np.log((n_facts - df + 0.5) / (df + 0.5)), IDF_FLOOR) if df.size else df


@dataclass(frozen=True)
class CandidatePool:
    """Everything hybrid recall knows about one query's candidates: the union of the lexical and vector lists.

    Attributes:
        ids: candidate keys (the store's rids), the lexical list first (best first), then vector-only ones.
        bm25: (n,) FTS5 BM25, negated so higher is better; 0 for candidates not in the lexical list.
        lex_rank: (n,) 0-based rank in the lexical list, -1 when not in it.
        cos: (n,) cosine to the query; NaN for a fact without a vector.
        vec_rank: (n,) 0-based rank in the vector list, -1 when not in it.
        chars: (n,) the fact's length in characters.
        idf: (m,) FTS5 idf of each of the query's words (store/lexical.py query_words), held by a fact or not.
        n_facts: facts in the store (in the selection searched, when it narrows).
        cover: (n,) the share of the query's idf that the candidate's words hold (store/lexical.py coverage):
            which words matched, without BM25's length normalisation; None when not gathered (old caches).
        names: (n,) the share of the query's names (capitalised words: store/lexical.py query_names) the
            candidate holds; 0 everywhere for a query without names; None when not gathered.
        cos_model: (n,) for an embedder whose vector is the model's followed by a lexicon's (lm.lexicon): the
            cosine of the model's part alone; NaN for a fact without a vector; None for other embedders.
    """

    ids: tuple
    bm25: np.ndarray
    lex_rank: np.ndarray
    cos: np.ndarray
    vec_rank: np.ndarray
    chars: np.ndarray
    idf: np.ndarray
    n_facts: int
    cover: np.ndarray | None = None
    names: np.ndarray | None = None
    cos_model: np.ndarray | None = None

    @classmethod
    def build(cls, lexical: Sequence[tuple[Key, float]], vector: Sequence[tuple[Key, float]],
              cosine: Mapping[Key, float], chars: Mapping[Key, int], df: Sequence[int],
              n_facts: int) -> "CandidatePool":
        """A pool from the two ranked lists.

        Args:
            lexical: (candidate, BM25 negated) best first.
            vector: (candidate, cosine) best first.
            cosine: candidate -> cosine for lexical candidates outside the vector list (missing: no vector).
            chars: candidate -> text length.
            df: how many facts hold each query word.
            n_facts: facts in the store.
        """
        ids = list(dict.fromkeys([c for c, _ in lexical] + [c for c, _ in vector]))
        pos = {c: i for i, c in enumerate(ids)}
        n = len(ids)
        bm25 = np.zeros(n, dtype=np.float64)  # (n,)
        lex_rank = np.full(n, -1, dtype=np.int32)  # (n,)
        vec_rank = np.full(n, -1, dtype=np.int32)  # (n,)
        cos = np.full(n, np.nan, dtype=np.float64)  # (n,)
        for r, (c, s) in enumerate(lexical):
            bm25[pos[c]], lex_rank[pos[c]] = s, r
        for c, s in cosine.items():
            if c in pos:
                cos[pos[c]] = s
        for r, (c, s) in enumerate(vector):
            cos[pos[c]], vec_rank[pos[c]] = s, r
        return cls(tuple(ids), bm25, lex_rank, cos, vec_rank,
                   np.array([chars.get(c, 0) for c in ids], dtype=np.float64), fts5_idf(df, n_facts), int(n_facts))

    def relabel(self, ids: Sequence[Hashable]) -> "CandidatePool":
        """The same pool with other candidate keys (one per candidate, in order): e.g. rids -> doc indices."""
        if len(ids) != len(self.ids):
            raise ValueError(f"relabel() expected {len(self.ids)} ids, got {len(ids)}")
        return replace(self, ids=tuple(ids))

    def truncate(self, pool: int) -> "CandidatePool":
        """The pool the store would gather with `pool` candidates per list (ranks past it forgotten)."""
        lex = np.where(self.lex_rank < pool, self.lex_rank, -1)  # (n,)
        vec = np.where(self.vec_rank < pool, self.vec_rank, -1)  # (n,)
        keep = (lex >= 0) | (vec >= 0)  # (n,)
        idx = np.flatnonzero(keep)
        return self.take(idx, np.where(lex >= 0, self.bm25, 0.0)[idx], lex[idx], vec[idx])

    def take(self, idx: np.ndarray, bm25: np.ndarray, lex_rank: np.ndarray, vec_rank: np.ndarray) -> "CandidatePool":
        """The candidates at `idx`, in that order, with the given BM25 and ranks (already of those candidates) and
        every other per-candidate field taken along."""
        def rows(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[idx]

        return replace(self, ids=tuple(self.ids[i] for i in idx), bm25=bm25, lex_rank=lex_rank, cos=self.cos[idx],
                       vec_rank=vec_rank, chars=self.chars[idx], cover=rows(self.cover), names=rows(self.names),
                       cos_model=rows(self.cos_model))

    def to_json(self) -> dict:
        """A JSON-ready dict (for caches): ids must be ints or strings."""
        return {"ids": list(self.ids), "bm25": self.bm25.tolist(), "lex_rank": self.lex_rank.tolist(),
                "cos": [None if math.isnan(c) else c for c in self.cos.tolist()], "vec_rank": self.vec_rank.tolist(),
                "chars": self.chars.tolist(), "idf": self.idf.tolist(), "n_facts": self.n_facts,
                **({} if self.cover is None else {"cover": self.cover.tolist()}),
                **({} if self.names is None else {"names": self.names.tolist()}),
                **({} if self.cos_model is None else
                   {"cos_model": [None if math.isnan(c) else c for c in self.cos_model.tolist()]})}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CandidatePool":
        """The inverse of to_json."""
        return cls(tuple(d["ids"]), np.asarray(d["bm25"], dtype=np.float64), np.asarray(d["lex_rank"], dtype=np.int32),
                   np.array([np.nan if c is None else c for c in d["cos"]], dtype=np.float64),
                   np.asarray(d["vec_rank"], dtype=np.int32), np.asarray(d["chars"], dtype=np.float64),
                   np.asarray(d["idf"], dtype=np.float64), int(d["n_facts"]),
                   None if d.get("cover") is None else np.asarray(d["cover"], dtype=np.float64),
                   None if d.get("names") is None else np.asarray(d["names"], dtype=np.float64),
                   None if d.get("cos_model") is None else
                   np.array([np.nan if c is None else c for c in d["cos_model"]], dtype=np.float64))


# ----------------------------------------------------------------------------------------------- features


def _lex(p: CandidatePool) -> np.ndarray:
    """BM25 over the best BM25 of the pool (BM25 <= LEXICAL_EVIDENCE counts as none)."""
    bm = np.where(p.bm25 > LEXICAL_EVIDENCE, p.bm25, 0.0)
    hi = bm.max(initial=0.0)
    return bm / hi if hi > 0 else bm


def _lex_abs(p: CandidatePool) -> np.ndarray:
    """BM25 over the most the query's words could add, idf * (k1 + 1) each: how much of the query matched."""
    most = (BM25_K1 + 1.0) * float(p.idf.sum())
    bm = np.where(p.bm25 > LEXICAL_EVIDENCE, p.bm25, 0.0)
    return np.minimum(bm / most, 1.0) if most > 0 else np.zeros_like(bm)


def _lex_rr(p: CandidatePool) -> np.ndarray:
    return np.where((p.lex_rank >= 0) & (p.bm25 > LEXICAL_EVIDENCE), 1.0 / (1.0 + np.maximum(p.lex_rank, 0)), 0.0)


SHORT_FACT_CHARS = 300.0  # about three sentences: below it a fact's words are evidence by which it holds, not how often


def _long(p: CandidatePool) -> np.ndarray:
    """How far a fact is from short: 0 for a one-liner, 1 from SHORT_FACT_CHARS on."""
    return np.minimum(1.0, p.chars / SHORT_FACT_CHARS)


def _notes(p: CandidatePool) -> float:
    """1.0 when the candidates are short notes (their median length under SHORT_FACT_CHARS: what agents store),
    0.0 when they are documents (manual sections, long messages): the two want different lexical evidence."""
    return float(np.median(p.chars) < SHORT_FACT_CHARS) if len(p.chars) else 0.0


def _cover(p: CandidatePool) -> np.ndarray:
    """The share of the query's idf that the candidate's words hold (0 without coverage data or evidence): which
    words matched, weighed by idf, with no length normalisation, so facts matching the same words tie and the
    vector side orders them."""
    if p.cover is None:
        return np.zeros(len(p.ids))
    return np.where(p.cover * float(p.idf.sum()) > LEXICAL_EVIDENCE, p.cover, 0.0)


def _cos(p: CandidatePool) -> np.ndarray:
    return np.nan_to_num(p.cos, nan=0.0)


def _cos_model(p: CandidatePool) -> np.ndarray:
    """The model part's cosine where the vector has a lexicon part, else the cosine."""
    return _cos(p) if p.cos_model is None else np.nan_to_num(p.cos_model, nan=0.0)


def _vec_rr(p: CandidatePool) -> np.ndarray:
    return np.where(p.vec_rank >= 0, 1.0 / (1.0 + np.maximum(p.vec_rank, 0)), 0.0)


def _cut(p: CandidatePool) -> np.ndarray:
    """The share of the fact the embedder did not read (0 for short facts, towards 1 for long ones)."""
    return 1.0 - np.minimum(1.0, VECTOR_CHARS / np.maximum(p.chars, 1.0))


def _words(p: CandidatePool) -> float:
    return math.log1p(p.idf.size)


def _z(x: np.ndarray, member: np.ndarray) -> np.ndarray:
    """(x - mean) / std over the members of one list; non-members get the list's minimum."""
    if not member.any():
        return np.zeros_like(x)
    vals = x[member]
    sd = vals.std()
    z = (x - vals.mean()) / (sd if sd > 1e-9 else 1.0)
    return np.where(member, z, z[member].min())


def _cos_z(p: CandidatePool) -> np.ndarray:
    return _z(_cos(p), p.vec_rank >= 0)


def _agree(p: CandidatePool, depth: int = 10) -> float:
    """The share of the lexical top `depth` that is also in the vector top `depth`."""
    lex = set(np.flatnonzero((p.lex_rank >= 0) & (p.lex_rank < depth) & (p.bm25 > LEXICAL_EVIDENCE)).tolist())
    vec = set(np.flatnonzero((p.vec_rank >= 0) & (p.vec_rank < depth)).tolist())
    return len(lex & vec) / depth


def _top_two(x: np.ndarray) -> tuple[float, float]:
    if x.size == 0:
        return 0.0, 0.0
    if x.size == 1:
        return float(x[0]), 0.0
    two = np.partition(x, x.size - 2)[-2:]
    return float(two[1]), float(two[0])


def _vec_gap1(p: CandidatePool) -> np.ndarray:
    """For the vector list's best hit: its cosine's lead over the second best; 0 for every other candidate."""
    first, second = _top_two(_cos(p)[p.vec_rank >= 0])
    return np.where(p.vec_rank == 0, first - second, 0.0)


def _lex_gap1(p: CandidatePool) -> np.ndarray:
    """For the lexical list's best hit: its BM25's lead over the second best, over its BM25; 0 for the others."""
    first, second = _top_two(np.where(p.bm25 > LEXICAL_EVIDENCE, p.bm25, 0.0))
    return np.where((p.lex_rank == 0) & (first > LEXICAL_EVIDENCE), (first - second) / max(first, 1e-12), 0.0)


# name -> (side, function of the pool -> (n,)): each feature is lexical or vector evidence, so a hit's score splits
# into a lexical and a vector part. The ones the shipped rule does not use are those recipe/calibrate_fusion.py
# weighs with --study (they did not win left out).
FEATURES: dict[str, tuple[str, Callable[[CandidatePool], np.ndarray]]] = {
    "lex": ("lexical", _lex),
    "lex_abs": ("lexical", _lex_abs),
    "lex_rr": ("lexical", _lex_rr),
    "lex_gap1": ("lexical", _lex_gap1),
    "lex_x_agree": ("lexical", lambda p: _lex(p) * _agree(p)),
    "cover": ("lexical", _cover),
    "names": ("lexical", lambda p: np.zeros(len(p.ids)) if p.names is None else p.names),
    "cover_sq": ("lexical", lambda p: _cover(p) ** 2),
    # BM25 over the best, scaled by how much of the query the fact holds: a match on one common word of a long
    # question (a name, "work") counts for little however short the fact
    "lex_x_cover": ("lexical", lambda p: _lex(p) * _cover(p)),
    # BM25 (term frequency, length normalisation) for documents, coverage for one-line facts: in a sentence each
    # word occurs once and BM25's length normalisation ranks the shortest fact holding the name first
    "lex_long": ("lexical", lambda p: _lex(p) * _long(p)),
    # one rule for stores of documents (BM25) and one for stores of short notes (coverage), by the candidates'
    # median length: "docs_lex" + w x cos + v x "notes_cover" + u x "notes_cos"
    "docs_lex": ("lexical", lambda p: _lex(p) * (1.0 - _notes(p))),
    "notes_cover": ("lexical", lambda p: _cover(p) * _notes(p)),
    "notes_cos": ("vector", lambda p: _cos(p) * _notes(p)),
    "notes": ("vector", lambda p: np.full(len(p.ids), _notes(p))),  # for relevance: which regime scored it
    # among short notes, the query's names held (a question naming a person asks about that person)
    "notes_names": ("lexical", lambda p: (np.zeros(len(p.ids)) if p.names is None else p.names) * _notes(p)),
    "cover_short": ("lexical", lambda p: _cover(p) * (1.0 - _long(p))),
    # the vectors weigh more when no candidate holds much of the query: a question in other words than its fact
    # (most of what agents are asked) leaves BM25 only a name or a common word to go on
    "cos_x_uncovered": ("vector", lambda p: _cos(p) * (1.0 - _cover(p).max(initial=0.0))),
    "cos": ("vector", _cos),
    # with a lexicon part in the vector (lm.lexicon): word knowledge helps short notes, while in documents it
    # repeats what BM25 already matched, so documents can take the model's cosine alone
    "cos_model": ("vector", _cos_model),
    "cos_z": ("vector", _cos_z),
    "vec_rr": ("vector", _vec_rr),
    "vec_gap1": ("vector", _vec_gap1),
    "cos_x_cut": ("vector", lambda p: _cos(p) * _cut(p)),
    "cos_x_words": ("vector", lambda p: _cos(p) * _words(p)),
    "cos_x_agree": ("vector", lambda p: _cos(p) * _agree(p)),
    "cos_x_abstop": ("vector", lambda p: _cos(p) * _lex_abs(p).max(initial=0.0)),
    "rr_both": ("vector", lambda p: _lex_rr(p) * _vec_rr(p)),
    # for relevance: how many facts were searched (a store of 5 facts makes every top hit look decisive)
    "log_facts": ("vector", lambda p: np.full(len(p.ids), np.log1p(max(p.n_facts, 0)))),
    "cos_x_log_facts": ("vector", lambda p: _cos(p) * np.log1p(max(p.n_facts, 0))),
}


def features(pool: CandidatePool, names: Sequence[str]) -> np.ndarray:
    """(n, F) float64 matrix of the named features (FEATURES) for every candidate of `pool`."""
    if not pool.ids:
        return np.zeros((0, len(names)), dtype=np.float64)
    return np.stack([FEATURES[name][1](pool) for name in names], axis=1)  # (n, F)


# ----------------------------------------------------------------------------------------------- the learned rule


@dataclass(frozen=True)
class FusionParams:
    """A fitted hybrid rule (written by recipe/calibrate_fusion.py; see fusion.json beside the shipped model).

    score = sum_i weights[i] * features[i]; the lexical part sums the lexical-side features, the vector part the
    vector-side ones. relevance = sigmoid(relevance_bias + sum_j relevance_weights[j] * relevance_features[j]),
    where a relevance feature is "score" (the fused score), "margin" (the score minus the best score of the
    query) or a FEATURES name; with `relevance_trees`, relevance = sigmoid(relevance_trees.raw(those features))
    instead (store/trees.py: gradient-boosted trees, which can let the store's size change what a cosine means).

    Attributes:
        features, weights: the ranking features and their weights.
        pool: candidates taken from each of the lexical and vector lists.
        relevance_features, relevance_weights, relevance_bias: the relevance model (weights unused with trees).
        relevance_trees: the relevance model as trees over relevance_features, or None (logistic).
        fingerprint: the embedder the rule was fitted for (None: any).
    """

    features: tuple[str, ...]
    weights: tuple[float, ...]
    pool: int
    relevance_features: tuple[str, ...] = ()
    relevance_weights: tuple[float, ...] = ()
    relevance_bias: float = 0.0
    fingerprint: str | None = None
    relevance_trees: TreeEnsemble | None = None  # when set, relevance = sigmoid(trees over relevance_features)

    @classmethod
    def from_dict(cls, d: Any, where: str = "fusion parameters") -> "FusionParams":
        """Validate and build from the JSON form (to_dict). Raises CheckpointError on anything malformed."""
        try:
            if d.get("format") != PARAMS_FORMAT:
                raise ValueError(f"format is {d.get('format')!r}, expected {PARAMS_FORMAT!r}")
            rank, rel = d["ranking"], d.get("relevance") or {}
            feats = tuple(str(f) for f in rank["features"])
            weights = tuple(float(w) for w in rank["weights"])
            rfeats = tuple(str(f) for f in rel.get("features", ()))
            rweights = tuple(float(w) for w in rel.get("weights", ()))
            trees = TreeEnsemble.from_dict(rel, len(rfeats)) if rel.get("model") == "trees" else None
            pool = int(rank["pool"])
            bias = float(rel.get("bias", 0.0))
            fingerprint = d.get("fingerprint")
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: unreadable ({e}); rewrite them with recipe/calibrate_fusion.py.") from e
        unknown = [f for f in feats if f not in FEATURES]
        unknown += [f for f in rfeats if f not in FEATURES and f not in ("score", "margin")]
        if unknown or not feats or len(feats) != len(weights) or (trees is None and len(rfeats) != len(rweights)):
            raise CheckpointError(f"{where}: expected known features with one weight each, got features {feats} "
                                  f"(unknown {unknown}) and {len(weights)} weights; rewrite them with "
                                  "recipe/calibrate_fusion.py.")
        if not 1 <= pool <= 1000 or not all(math.isfinite(x) for x in (*weights, *rweights, bias)):
            raise CheckpointError(f"{where}: expected 1 <= pool <= 1000 and finite weights, got pool {pool}.")
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise CheckpointError(f"{where}: fingerprint must be a string or null, got {fingerprint!r}.")
        return cls(feats, weights, pool, rfeats, rweights, bias, fingerprint, trees)

    def to_dict(self) -> dict:
        """The JSON form (from_dict reads it back)."""
        return {"format": PARAMS_FORMAT, "fingerprint": self.fingerprint,
                "ranking": {"features": list(self.features), "weights": list(self.weights), "pool": self.pool,
                            "sides": {f: FEATURES[f][0] for f in self.features}},
                "relevance": ({"model": "trees", "features": list(self.relevance_features),
                               **self.relevance_trees.to_dict()} if self.relevance_trees is not None else
                              {"features": list(self.relevance_features), "weights": list(self.relevance_weights),
                               "bias": self.relevance_bias})}


def load_params(path: str | Path) -> FusionParams:
    """Read fusion parameters from a JSON file (size-checked before parsing)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > PARAMS_MAX_BYTES:
            raise CheckpointError(f"{path} is {size} bytes; fusion parameters are at most {PARAMS_MAX_BYTES}.")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read fusion parameters from {path} ({e}); rewrite them with "
                              "recipe/calibrate_fusion.py.") from e
    return FusionParams.from_dict(data, str(path))


@functools.lru_cache(maxsize=1)
def shipped_params() -> FusionParams | None:
    """The shipped model's fitted hybrid rule (models/fusion.json, written by recipe/calibrate_fusion.py), or None
    when this installation has none. Raises CheckpointError when the file is there but malformed."""
    from ..embedder.shipped import shipped_file, shipped_path

    if not shipped_file("fusion.json").is_file():
        return None
    with shipped_path("fusion.json") as real:
        return load_params(real)


def params_for(embedder: Embedder) -> FusionParams | None:
    """The fitted rule for `embedder`: its own `fusion_params` attribute (FusionParams, a dict or a path), else the
    shipped model's fusion.json when the embedder is the shipped model (same fingerprint), else None."""
    own = getattr(embedder, "fusion_params", None)
    if isinstance(own, FusionParams):
        return own
    if isinstance(own, dict):
        return FusionParams.from_dict(own)
    if isinstance(own, (str, Path)):
        return load_params(own)
    shipped = shipped_params()
    if shipped is not None and shipped.fingerprint == getattr(embedder, "fingerprint", None):
        return shipped
    return None


@dataclass(frozen=True)
class Fused:
    """A fused pool: per candidate (same order as pool.ids) the score, its two parts and the relevance."""

    score: np.ndarray      # (n,) lexical + vector
    lexical: np.ndarray    # (n,)
    vector: np.ndarray     # (n,)
    relevance: np.ndarray | None  # (n,) in [0, 1], or None when the rule has no relevance model


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def relevance(pool: CandidatePool, score: np.ndarray, params: FusionParams) -> np.ndarray | None:
    """The calibrated probability that each candidate is the fact the query asks for (None: no relevance model)."""
    if not params.relevance_features:
        return None
    cols = []
    for name in params.relevance_features:
        if name == "score":
            cols.append(score)
        elif name == "margin":
            cols.append(score - score.max(initial=0.0))
        else:
            cols.append(FEATURES[name][1](pool))
    return relevance_of(np.stack(cols, axis=1), params.relevance_weights, params.relevance_bias,
                        params.relevance_trees)


def relevance_of(X: np.ndarray, weights: Sequence[float], bias: float, trees: TreeEnsemble | None) -> np.ndarray:
    """(n,) probabilities for relevance rows X (n, R): sigmoid of the trees' output, or of bias + X @ weights
    without trees. recipe/calibrate_fusion.py judges its fits through this, so it judges what the store computes."""
    X = np.nan_to_num(X)
    return _sigmoid(trees.raw(X) if trees is not None else bias + X @ np.asarray(weights))


def fuse_learned(pool: CandidatePool, params: FusionParams) -> Fused:
    """Score every candidate of `pool` with the fitted rule (see FusionParams)."""
    if not pool.ids:
        empty = np.zeros(0)
        return Fused(empty, empty, empty, empty if params.relevance_features else None)
    x = features(pool, params.features)  # (n, F)
    w = np.asarray(params.weights)  # (F,)
    lexical_side = np.array([FEATURES[f][0] == "lexical" for f in params.features])  # (F,)
    lex = x[:, lexical_side] @ w[lexical_side]  # (n,)
    vec = x[:, ~lexical_side] @ w[~lexical_side]  # (n,)
    score = lex + vec
    return Fused(score, lex, vec, relevance(pool, score, params))


def fuse_pool(pool: CandidatePool, fusion: str, params: FusionParams | None, weight: float) -> tuple[str, Fused]:
    """Fuse a pool the way hybrid recall does: (the rule's name, Fused).

    A lexical candidate with no vector (cos NaN: its vector is still being made, or was damaged) is fused on its
    words alone: its lexical share (rrf: its lexical rank) stands in for the vector evidence it lacks, so a
    pending fact that matches the query's rare words is not pushed down by a cosine of 0.

    Args:
        pool: the candidates.
        fusion: "score" (the fitted rule when `params` is given, else BM25 over the best + weight x cosine) or
            "rrf" (1 / (60 + rank) from each list).
        params: the embedder's fitted rule, or None.
        weight: the vector weight of the rule without parameters.
    Returns:
        ("learned" | "weight" | "rrf", Fused); relevance comes from `params` whatever the ranking rule.
    """
    alone = np.isnan(pool.cos) & (pool.lex_rank >= 0)  # (n,) lexical candidates without a vector
    if alone.any():
        pool = replace(pool, cos=np.where(alone, _lex(pool), pool.cos))
    learned = fuse_learned(pool, params) if params is not None else None
    if fusion == "rrf":
        lex = np.where(pool.lex_rank >= 0, 1.0 / (RRF_K + 1.0 + pool.lex_rank), 0.0)  # (n,)
        vec = np.where(pool.vec_rank >= 0, 1.0 / (RRF_K + 1.0 + pool.vec_rank), np.where(alone, lex, 0.0))  # (n,)
        return "rrf", Fused(lex + vec, lex, vec, None if learned is None else learned.relevance)
    if learned is not None:
        return "learned", learned
    lex, vec = _lex(pool), weight * _cos(pool)
    return "weight", Fused(lex + vec, lex, vec, None)
