"""Fit the hybrid fusion rule and its relevance model for an embedder, leave one source out, and write fusion.json.

Every query of every dev source goes through a real store once (benchmarks/dev_pools.py caches each query's
candidate pool, keyed by the embedder's fingerprint); everything below is fitted on those pools.

1. Ranking. Candidate rules (RULES): "BM25 over the best BM25 + w x cosine" and the same plus v x the vector list's
   first hit's lead over its second (store/fusion.py FEATURES), w and v from grids, each at candidate pools of 30,
   50 and 100 per list. A rule is fitted on a set of sources by taking the grid cell with the best mean ndcg@10
   among those where hybrid >= max(lexical, vector) on every one of them. The rule itself is chosen by
   leave-one-source-out: each rule is fitted on all sources but one and scored on that one; a rule qualifies when
   on every left-out source hybrid >= max(lexical, vector) - 0.005 ndcg@10 (NO_HARM), and the qualifying rule
   with the best mean wins (within TIE of it, the smallest pool; the best mean when none qualifies). The same
   choice made on all sources but one (nested) gives the honest left-out figures `evaluate_loso` reports.
   `--study` also weighs STUDY_RULES (a 13-feature linear score by listwise softmax regression: reciprocal
   ranks, BM25 coverage of the query, list agreement, query length, z-scored cosine ...), which lost.
2. Relevance. A logistic regression on the top 10 hits of the chosen rule: P(hit is the fact asked for) from
   RELEVANCE_FEATURES (the fused score, its margin to the best hit, the cosine, how much of the query BM25
   matched, the hit's ranks in both lists and the leads of each list's first hit). Its training
   queries are the dev queries (one right fact each), the same queries with their right fact taken out of the
   pool (near misses), and queries of another source run against the store (questions it holds no answer to),
   weighted so answerable and unanswerable queries count half each: a relevance of 0.5 means "as likely right
   as wrong when half of what is asked has an answer". Left-out AUC, reliability and thresholds are reported.

    python recipe/calibrate_fusion.py [--model M.evlm --tokenizer T.json] [--dev /work/data/dev]
        [--corpus /work/corpus] [--out evermind_memory/models/fusion.json] [--report loso.json]

Without --model it fits the shipped model and writes evermind_memory/models/fusion.json beside it (the store reads
it for embedders with the card's fingerprint). Run it again whenever the shipped model changes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402

from evermind_memory.errors import InvalidInput  # noqa: E402
from evermind_memory.store.fusion import FEATURES, CandidatePool, FusionParams, features, relevance_of  # noqa: E402
from evermind_memory.store.trees import TreeEnsemble  # noqa: E402

NO_HARM = 0.005          # hybrid may trail the better of lexical and vector by this much on a left-out source
TIE = 0.001              # rules whose left-out means are this close count as equal: the smaller pool wins
TOP = 10                 # metrics and the relevance model read the top 10
WEIGHT_GRID = tuple(float(f"{w:.4g}") for w in np.geomspace(0.05, 8.0, 41))
POOLS = (30, 50, 100)
L2 = 1e-3                # softmax / logistic ridge, per query
RELEVANCE_FEATURES = ("score", "margin", "cos", "lex_abs", "cos_z", "lex_rr", "vec_rr", "rr_both", "vec_gap1",
                      "lex_gap1", "notes", "notes_cos", "cover")
THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.5)
# The trees also see how many facts were searched and the model part's cosine: a linear model could not use them
# (benchmarks/relevance_study.py), trees can (the same cosine means less in a store of 5 facts than of 5,000)
TREE_FEATURES = ("log_facts", "cos_model")
TREES = {"max_iter": 200, "learning_rate": 0.1, "max_depth": 3, "min_samples_leaf": 100, "l2_regularization": 1.0}


def relevance_features(model: str = "trees") -> tuple[str, ...]:
    """The features the relevance model of kind `model` ("trees" or "logistic") reads."""
    return RELEVANCE_FEATURES + TREE_FEATURES if model == "trees" else RELEVANCE_FEATURES


@dataclass(frozen=True)
class Rule:
    """A ranking rule family over candidate features; the first feature's weight is 1.

    how "grid": the other features' weights range over `grids` (one tuple per feature), and the cell with the best
    mean ndcg@10 among those doing no harm on every fitting source (hybrid >= max(lexical, vector) there) wins;
    how "softmax": all weights by listwise softmax regression (no constraint).
    """

    name: str
    features: tuple[str, ...]
    pool: int
    how: str
    grids: tuple[tuple[float, ...], ...] = ()

    def cells(self) -> list[tuple[float, ...]]:
        """Every weight vector of a grid rule (the first weight 1)."""
        out = [(1.0,)]
        for grid in self.grids:
            out = [c + (v,) for c in out for v in grid]
        return out


GAP_GRID = (0.0,) + tuple(float(f"{v:.3g}") for v in np.geomspace(0.05, 20.0, 15))
ADAPTIVE = ("lex", "lex_abs", "lex_rr", "cos", "vec_rr", "vec_gap1", "lex_gap1", "lex_x_agree", "cos_x_agree",
            "cos_x_abstop", "cos_x_words", "cos_z", "cos_x_cut")
COVER_GRID = (0.0, 0.25, 0.5, 1.0, 2.0)
NAME_GRID = (0.0, 0.25, 0.5, 1.0, 2.0)
UNCOVERED_GRID = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)
RULES = tuple(
    [Rule(f"weight/pool{p}", ("lex", "cos"), p, "grid", (WEIGHT_GRID,)) for p in POOLS]
    + [Rule(f"weight+gap/pool{p}", ("lex", "cos", "vec_gap1"), p, "grid", (WEIGHT_GRID[::2], GAP_GRID))
       for p in POOLS]
    # coverage: which query words a fact holds, by idf, without BM25's length normalisation (issue 32 item 2)
    + [Rule(f"cover/pool{p}", ("cover", "cos"), p, "grid", (WEIGHT_GRID,)) for p in POOLS]
    + [Rule(f"weight+cover/pool{p}", ("lex", "cos", "cover"), p, "grid", (WEIGHT_GRID[::2], COVER_GRID))
       for p in POOLS]
    # BM25 over the best times coverage, and with coverage itself beside it
    + [Rule(f"lexcover/pool{p}", ("lex_x_cover", "cos"), p, "grid", (WEIGHT_GRID,)) for p in POOLS]
    + [Rule(f"lexcover+cover/pool{p}", ("lex_x_cover", "cos", "cover"), p, "grid", (WEIGHT_GRID[::2], COVER_GRID))
       for p in POOLS]
    # BM25 for documents, coverage for one-line facts (store/fusion.py SHORT_FACT_CHARS)
    + [Rule(f"bylength/pool{p}", ("lex_long", "cos", "cover_short"), p, "grid", (WEIGHT_GRID[::2], COVER_GRID))
       for p in POOLS]
    # documents by BM25, short notes by coverage, each with its own vector weight (store/fusion.py _notes)
    + [Rule(f"notes/pool{p}", ("docs_lex", "cos", "notes_cover", "notes_cos"), p, "grid",
            (WEIGHT_GRID[::2], COVER_GRID, (-1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0))) for p in POOLS]
    + [Rule(f"notes+names/pool{p}", ("docs_lex", "cos", "notes_cover", "notes_cos", "notes_names"), p, "grid",
            (WEIGHT_GRID[::2], COVER_GRID, (-1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0), NAME_GRID)) for p in POOLS]
    # the same with the model's cosine alone beside the cosine of notes, for a vector with a lexicon part (lm.lexicon)
    + [Rule(f"notes+names+model/pool{p}", ("docs_lex", "cos_model", "notes_cover", "notes_cos", "notes_names"), p,
            "grid", (WEIGHT_GRID[::2], COVER_GRID, (-1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0), NAME_GRID)) for p in POOLS]
    # the vector weight rising as the best lexical match covers less of the query (BM25 + (w + v x uncovered) x cos)
    + [Rule(f"weight+uncovered/pool{p}", ("lex", "cos", "cos_x_uncovered"), p, "grid",
            (WEIGHT_GRID[::2], UNCOVERED_GRID)) for p in POOLS]
    + [Rule(f"weight+uncovered+names/pool{p}", ("lex", "cos", "cos_x_uncovered", "names"), p, "grid",
            (WEIGHT_GRID[::2], UNCOVERED_GRID, NAME_GRID)) for p in POOLS]
    # and the query's names (capitalised words) held: a question naming a person asks about that person
    + [Rule(f"weight+cover+names/pool{p}", ("lex", "cos", "cover", "names"), p, "grid",
            (WEIGHT_GRID[::2], COVER_GRID, NAME_GRID)) for p in POOLS]
)
# Rules that lost on the shipped model's left-out figures (kept for --study, which reproduces the comparison).
STUDY_RULES = (Rule("softmax13/pool50", ADAPTIVE, 50, "softmax"),)

__all__ = ["NO_HARM", "RULES", "Rule", "Stack", "evaluate_loso", "fit_relevance", "fit_rule", "main", "ndcg",
           "select_rule"]


# ----------------------------------------------------------------------------------------------- data


class Stack:
    """The candidates of many queries as one flat design matrix (queries contiguous), for one feature set and pool.

    Args:
        pools: one CandidatePool per query (ids: doc indices).
        gold: (Q,) each query's relevant doc, or -1 when it has none.
        names: feature names.
        pool: candidates per list (CandidatePool.truncate).
        weight: (Q,) query weights for fitting (default 1).
    """

    def __init__(self, pools: Sequence[CandidatePool], gold: np.ndarray, names: Sequence[str], pool: int,
                 weight: np.ndarray | None = None) -> None:
        xs, ids, segs, labels, truncated = [], [], [], [], []
        for q, (p, g) in enumerate(zip(pools, gold)):
            p = p.truncate(pool)
            truncated.append(p)
            xs.append(features(p, names))
            ids.append(np.asarray(p.ids, dtype=np.int64))
            segs.append(np.full(len(p.ids), q, dtype=np.int64))
            labels.append(np.asarray(p.ids, dtype=np.int64) == g)
        self.pools = truncated
        self.names = tuple(names)
        self.nq = len(truncated)
        self.X = np.concatenate(xs) if xs else np.zeros((0, len(names)))  # (N, F)
        self.ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)  # (N,)
        self.seg = np.concatenate(segs) if segs else np.zeros(0, dtype=np.int64)  # (N,)
        self.y = np.concatenate(labels) if labels else np.zeros(0, dtype=bool)  # (N,)
        self.has = np.bincount(self.seg[self.y], minlength=self.nq) > 0  # (Q,) gold in the pool
        self.weight = np.ones(self.nq) if weight is None else np.asarray(weight, dtype=np.float64)  # (Q,)

    def select(self, names: Sequence[str]) -> "Stack":
        """The same candidates with only the named features (a view of the columns)."""
        out = object.__new__(Stack)
        out.__dict__.update(self.__dict__)
        out.names = tuple(names)
        out.X = self.X[:, [self.names.index(n) for n in names]]
        return out

    def order(self, score: np.ndarray) -> np.ndarray:
        """Row indices sorted by query, then score descending, then id (the store's tie rule)."""
        return np.lexsort((self.ids, -score, self.seg))

    def ranks(self, score: np.ndarray) -> np.ndarray:
        """(Q,) 0-based rank of each query's gold under `score` (ties: lower id first), -1 when not in the pool."""
        gold_score = np.full(self.nq, np.nan)
        gold_id = np.zeros(self.nq, dtype=np.int64)
        gold_score[self.seg[self.y]] = score[self.y]
        gold_id[self.seg[self.y]] = self.ids[self.y]
        gs, gi = gold_score[self.seg], gold_id[self.seg]  # (N,)
        ahead = (score > gs) | ((score == gs) & (self.ids < gi))  # (N,) NaN compares False
        out = np.bincount(self.seg, weights=ahead, minlength=self.nq).astype(np.int64)
        return np.where(self.has, out, -1)


def ndcg(ranks: np.ndarray) -> float:
    """Mean ndcg@10 with one relevant doc per query, from 0-based ranks (-1: missed)."""
    ok = (ranks >= 0) & (ranks < TOP)
    return float(np.where(ok, 1.0 / np.log2(np.maximum(ranks, 0) + 2.0), 0.0).mean()) if len(ranks) else 0.0


def ranks_of(rankings: Sequence[Sequence[int]], gold: np.ndarray) -> np.ndarray:
    """(Q,) 0-based rank of gold in each ranking's top 10, -1 when absent."""
    out = np.full(len(gold), -1, dtype=np.int64)
    for i, (ranked, g) in enumerate(zip(rankings, gold)):
        top = list(ranked)[:TOP]
        if g in top:
            out[i] = top.index(g)
    return out


# ----------------------------------------------------------------------------------------------- fitting


def _segments(stacks: Sequence[Stack], only_answerable: bool = True):
    parts = []
    for st in stacks:
        keep = st.has[st.seg] if only_answerable else np.ones(len(st.seg), dtype=bool)
        if not keep.any():
            continue
        X, seg, y = st.X[keep], st.seg[keep], st.y[keep]
        starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
        parts.append((X, starts, np.diff(np.r_[starts, len(seg)]), y, st.weight[seg[starts]]))
    return parts


def _softmax_loss(parts, w: np.ndarray, l2n: float, hessian: bool):
    F = len(w)
    loss, g, H = 0.5 * l2n * float(w @ w), l2n * w, l2n * np.eye(F)
    for X, starts, cnt, y, qw in parts:
        s = X @ w  # (N,)
        mx = np.maximum.reduceat(s, starts)  # (Q,)
        e = np.exp(s - np.repeat(mx, cnt))
        Z = np.add.reduceat(e, starts)  # (Q,)
        loss += float(qw @ (np.log(Z) + mx) - qw @ s[y])
        if hessian:
            rw = np.repeat(qw, cnt)  # (N,)
            p = e / np.repeat(Z, cnt)
            Xp = X * (p * rw)[:, None]  # (N, F)
            Ex = np.add.reduceat(X * p[:, None], starts, axis=0)  # (Q, F)
            g += Xp.sum(0) - (X[y] * qw[:, None]).sum(0)
            H += Xp.T @ X - (Ex * qw[:, None]).T @ Ex
    return loss, g, H


def fit_softmax(stacks: Sequence[Stack], l2: float = L2, iters: int = 50) -> np.ndarray:
    """Listwise softmax regression (damped Newton): the weights maximising the mean log-probability of each
    query's relevant candidate among its pool (queries whose relevant doc is outside the pool are skipped)."""
    parts = _segments(stacks)
    if not parts:
        raise InvalidInput("fit_softmax: no query has its relevant document in its candidate pool.")
    l2n = l2 * sum(float(p[4].sum()) for p in parts)
    w = np.zeros(parts[0][0].shape[1])
    loss, g, H = _softmax_loss(parts, w, l2n, True)
    for _ in range(iters):
        step = np.linalg.solve(H, g)
        t = 1.0
        while True:  # backtracking: Newton overshoots from far away
            new = _softmax_loss(parts, w - t * step, l2n, False)[0]
            if new <= loss - 1e-4 * t * float(g @ step) or t < 1e-6:
                break
            t *= 0.5
        w = w - t * step
        done = loss - new < 1e-10 * l2n / l2
        loss, g, H = _softmax_loss(parts, w, l2n, True)
        if done:
            break
    return w


def grid_table(stack: Stack, rule: Rule) -> np.ndarray:
    """(C,) ndcg@10 of every weight vector of a grid rule (Rule.cells) on one source."""
    return np.array([ndcg(stack.ranks(stack.X @ np.asarray(cell))) for cell in rule.cells()])


def balanced(sources: Sequence[str]) -> np.ndarray:
    """Each source's weight in a fit's or a choice's mean: the personal-memory sources (what agents store) and the
    manual sources weigh half each when both are there (12 manual sources would otherwise outvote 3 personal
    ones), equally within each group; plain equal weights otherwise."""
    personal = np.array([s.startswith("personal") for s in sources])
    if personal.all() or not personal.any():
        return np.full(len(sources), 1.0 / max(1, len(sources)))
    return np.where(personal, 0.5 / personal.sum(), 0.5 / (~personal).sum())


class RuleFits:
    """Fits of one rule on subsets of sources, memoised (nested leave-one-out reuses the pair fits).

    Args:
        rule: the rule.
        stacks: source -> Stack of the rule's features and pool.
        floors: source -> max(lexical, vector) ndcg@10 (grid rules fit under "no harm" on each fitting source).
    """

    def __init__(self, rule: Rule, stacks: dict[str, Stack], floors: dict[str, float]) -> None:
        self.rule, self.stacks, self.floors = rule, stacks, floors
        self.cells = rule.cells() if rule.how == "grid" else []
        self.tables = {s: grid_table(st, rule) for s, st in stacks.items()} if rule.how == "grid" else None
        self._memo: dict[frozenset, np.ndarray] = {}

    def weights(self, sources: Sequence[str]) -> np.ndarray:
        """The rule's weight vector fitted on `sources`."""
        key = frozenset(sources)
        if key not in self._memo:
            if self.rule.how == "grid":
                table = np.stack([self.tables[s] for s in sorted(key)])  # (S, C)
                floor = np.array([self.floors[s] for s in sorted(key)])[:, None]  # (S, 1)
                mean = balanced(sorted(key)) @ table  # (C,)
                safe = (table >= floor).all(axis=0)  # (C,)
                best = int(np.argmax(np.where(safe, mean, -np.inf))) if safe.any() else int(np.argmax(mean))
                self._memo[key] = np.asarray(self.cells[best])
            else:
                self._memo[key] = fit_softmax([self.stacks[s] for s in sorted(key)])
        return self._memo[key]

    def score(self, source: str, sources: Sequence[str]) -> float:
        """ndcg@10 on `source` of the rule fitted on `sources`."""
        w = self.weights(sources)
        if self.rule.how == "grid":
            return float(self.tables[source][self.cells.index(tuple(w.tolist()))])
        st = self.stacks[source]
        return ndcg(st.ranks(st.X @ w))


def select_rule(fits: dict[str, RuleFits], sources: Sequence[str], floors: dict[str, float]) -> tuple[str, dict]:
    """The rule with the best (balanced) mean leave-one-out ndcg@10 over `sources` among those that do no harm on any
    (within TIE of the best, the one with the smallest candidate pool: recall gathers and scores fewer rows).

    Args:
        fits: rule name -> RuleFits.
        sources: the sources to choose on (each left out in turn, fitted on the rest).
        floors: source -> max(lexical, vector) ndcg@10.
    Returns:
        (the chosen rule's name, {rule: {"mean", "worst_margin", "qualifies"}}).
    """
    summary = {}
    for name, f in fits.items():
        got = {s: f.score(s, [t for t in sources if t != s]) for s in sources}
        margin = min(got[s] - floors[s] for s in sources)
        summary[name] = {"mean": float(balanced(list(got)) @ np.array(list(got.values()))),
                         "worst_margin": float(margin), "qualifies": bool(margin >= -NO_HARM)}
    pool = [n for n in fits if summary[n]["qualifies"]] or list(fits)
    best = max(summary[n]["mean"] for n in pool)
    near = [n for n in pool if summary[n]["mean"] >= best - TIE]  # as good: the smaller pool is cheaper to recall
    return min(near, key=lambda n: (fits[n].rule.pool, -summary[n]["mean"])), summary


def fit_rule(fits: RuleFits, sources: Sequence[str]) -> np.ndarray:
    """The weights of a rule fitted on `sources`."""
    return fits.weights(sources)


# ----------------------------------------------------------------------------------------------- relevance


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def without(pool: CandidatePool, doc: int) -> CandidatePool:
    """The pool the store would gather if `doc` were not in it (its candidates' ranks close up behind it)."""
    keep = np.asarray(pool.ids) != doc
    if keep.all():
        return pool
    i = int(np.flatnonzero(~keep)[0])
    lex = np.where((pool.lex_rank > pool.lex_rank[i]) & (pool.lex_rank[i] >= 0), pool.lex_rank - 1, pool.lex_rank)
    vec = np.where((pool.vec_rank > pool.vec_rank[i]) & (pool.vec_rank[i] >= 0), pool.vec_rank - 1, pool.vec_rank)
    return pool.take(np.flatnonzero(keep), pool.bm25[keep], lex[keep], vec[keep])


class RelevanceStacks:
    """Per source and pool size, the stacks relevance is fitted on: the queries as asked ("answerable"), the same
    queries with their fact taken out of the store ("removed") and another source's queries ("foreign"), with
    every ranking feature of the rules and the relevance model's own, `features` (built once, memoised)."""

    def __init__(self, data: dict, rules: Sequence[Rule], features: Sequence[str] = RELEVANCE_FEATURES,
                 by_size: bool = False) -> None:
        self.data = data
        self.features = tuple(features)
        self.by_size = by_size  # relevance_set weighs each store size of a sizes source alike (size_weights)
        self.names = {pool: list(dict.fromkeys([f for r in rules if r.pool == pool for f in r.features]
                                               + [f for f in self.features if f in FEATURES]))
                      for pool in {r.pool for r in rules}}
        self._memo: dict[tuple[str, int], dict[str, Stack]] = {}

    def get(self, source: str, pool: int) -> dict[str, Stack]:
        """kind -> Stack for one source."""
        key = (source, pool)
        if key not in self._memo:
            d, names = self.data[source], self.names[pool]
            removed = [without(p, g) for p, g in zip(d["pools"], d["gold"])]
            self._memo[key] = {
                "answerable": Stack(d["pools"], d["gold"], names, pool),
                "removed": Stack(removed, np.full(len(removed), -1), names, pool),
                "foreign": Stack(d["foreign"], np.full(len(d["foreign"]), -1), names, pool),
            }
        return self._memo[key]


SHARES = {"answerable": 0.5, "removed": 0.25, "foreign": 0.25}  # each source weighs 1, split between the kinds


def relevance_rows(stack: Stack, rule: Rule, w: np.ndarray,
                   features: Sequence[str] = RELEVANCE_FEATURES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top-10 hits of every query of `stack` under the rule as relevance rows: (X (N, R), y (N,), top (N,):
    True for each query's first hit)."""
    score = stack.select(rule.features).X @ w  # (M,)
    order = stack.order(score)
    seg = stack.seg[order]
    starts = np.searchsorted(seg, np.arange(stack.nq))
    pos = np.arange(len(order)) - starts[seg]  # rank within its query
    keep = order[pos < TOP]
    best = np.full(stack.nq, -np.inf)
    np.maximum.at(best, stack.seg, score)
    cols = []
    for name in features:
        if name == "score":
            cols.append(score[keep])
        elif name == "margin":
            cols.append(score[keep] - best[stack.seg[keep]])
        else:
            cols.append(stack.X[keep, stack.names.index(name)])
    return np.stack(cols, axis=1), stack.y[keep], pos[pos < TOP] == 0


def fit_logistic(X: np.ndarray, y: np.ndarray, weight: np.ndarray, l2: float = L2) -> tuple[np.ndarray, float]:
    """Weighted logistic regression with an intercept (Newton): (weights (R,), bias)."""
    A = np.c_[X, np.ones(len(X))]  # (N, R+1)
    w = np.zeros(A.shape[1])
    lam = l2 * float(weight.sum()) * np.r_[np.ones(X.shape[1]), 0.0]
    for _ in range(50):
        p = _sigmoid(A @ w)
        g = A.T @ (weight * (p - y)) + lam * w
        H = (A * (weight * p * (1 - p))[:, None]).T @ A + np.diag(lam) + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w[:-1], float(w[-1])


def size_weights(d: dict, kind: str, share: float) -> np.ndarray | None:
    """(Q,) weights of one kind's queries of a source laid out in stores of every size (benchmarks/personal_sizes.py:
    labels "<facts> scoped|all"), summing to `share`: each store size weighs as many asks as it holds, and within
    it the kinds keep SHARES, so the relevance means the same in a store of 2 facts as in one of 2,000 (without
    it a five-fact store, whose asks are mostly unanswerable, weighs unanswerable asks 2.3 times). None for a
    source without such labels."""
    if "foreign_shapes" not in d:
        return None
    answerable = [label.split()[0] for label in d["source"].shapes]
    foreign = [label.split()[0] for label in d["foreign_shapes"]]
    sizes = answerable + foreign
    mine = foreign if kind == "foreign" else answerable
    per_size = {g: sizes.count(g) / len(sizes) for g in set(sizes)}
    count = {g: mine.count(g) for g in set(mine)}
    out = np.array([per_size[g] / count[g] for g in mine])
    return share * out / out.sum()


def relevance_set(rs: RelevanceStacks, sources: Sequence[str], rule: Rule, w: np.ndarray) -> dict[str, np.ndarray]:
    """Rows of the three kinds for `sources`, weighted by SHARES within each source (sources weigh the same), and
    with rs.by_size within each store size of the sources laid out by size (size_weights)."""
    X, y, wt, top, answerable = [], [], [], [], []
    for s in sources:
        for kind, stack in rs.get(s, rule.pool).items():
            if stack.nq == 0:
                continue
            Xk, yk, tk = relevance_rows(stack, rule, w, rs.features)
            X.append(Xk)
            y.append(yk)
            per_query = size_weights(rs.data[s], kind, SHARES[kind]) if rs.by_size else None
            if per_query is None:
                wt.append(np.full(len(yk), SHARES[kind] / stack.nq))
            else:
                if int(tk.sum()) != stack.nq or len(per_query) != stack.nq:
                    raise RuntimeError(f"{s} {kind}: {int(tk.sum())} top rows for {stack.nq} queries")
                wt.append(per_query[np.cumsum(tk) - 1])  # rows come query by query, each query's top row first
            top.append(tk)
            answerable.append(np.full(len(yk), kind == "answerable"))
    return {"X": np.concatenate(X), "y": np.concatenate(y).astype(np.float64), "w": np.concatenate(wt),
            "top": np.concatenate(top), "answerable": np.concatenate(answerable)}


@dataclass(frozen=True)
class RelevanceModel:
    """A fitted relevance model: logistic (weights, bias) or gradient-boosted trees (store/trees.py)."""

    weights: tuple[float, ...]
    bias: float
    trees: TreeEnsemble | None = None

    def predict(self, X: np.ndarray) -> np.ndarray:
        """(N,) probabilities for the relevance rows X (N, R), as the store computes them."""
        return relevance_of(X, self.weights, self.bias, self.trees)


def fit_trees(X: np.ndarray, y: np.ndarray, weight: np.ndarray) -> TreeEnsemble:
    """Gradient-boosted trees (scikit-learn's HistGradientBoostingClassifier, TREES) as a store/trees.py
    TreeEnsemble; checked to give scikit-learn's own raw predictions on X."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    clf = HistGradientBoostingClassifier(**TREES, early_stopping=False, random_state=0)
    clf.fit(X, y, sample_weight=weight / weight.mean())
    trees = []
    for (predictor,) in clf._predictors:  # one per boosting round (binary); scikit-learn's own node table
        nodes = predictor.nodes
        leaf = nodes["is_leaf"].astype(bool)
        trees.append({"feature": np.where(leaf, 0, nodes["feature_idx"].astype(np.int64)).tolist(),
                      "threshold": np.where(leaf, 0.0, nodes["num_threshold"]).tolist(),
                      "left": np.where(leaf, -1, nodes["left"].astype(np.int64)).tolist(),  # uint32 there
                      "right": np.where(leaf, -1, nodes["right"].astype(np.int64)).tolist(),
                      "value": np.where(leaf, nodes["value"], 0.0).tolist()})
    ens = TreeEnsemble.from_dict({"baseline": float(np.ravel(clf._baseline_prediction)[0]), "trees": trees},
                                 X.shape[1])
    gap = float(np.abs(ens.raw(X) - clf.decision_function(X)).max())
    if gap > 1e-6:
        raise RuntimeError(f"the exported trees differ from scikit-learn's by {gap}; its node table changed?")
    return ens


def fit_relevance(rs: RelevanceStacks, sources: Sequence[str], rule: Rule, w: np.ndarray,
                  model: str = "trees") -> RelevanceModel:
    """The relevance model fitted on `sources` (see the module docstring): "trees" or "logistic"."""
    return fit_relevance_rows(relevance_set(rs, sources, rule, w), model)


def fit_relevance_rows(rows: dict, model: str = "trees") -> RelevanceModel:
    """The relevance model of kind `model` ("trees" or "logistic") fitted on relevance_set rows."""
    if model == "trees":
        return RelevanceModel((), 0.0, fit_trees(rows["X"], rows["y"], rows["w"]))
    rw, rb = fit_logistic(rows["X"], rows["y"], rows["w"])
    return RelevanceModel(tuple(float(x) for x in rw), rb)


def auc(score: np.ndarray, label: np.ndarray, weight: np.ndarray | None = None) -> float:
    """Weighted ROC AUC (ties count half)."""
    weight = np.ones(len(score)) if weight is None else weight
    order = np.argsort(score, kind="stable")
    s, l, wt = score[order], label[order].astype(bool), weight[order]
    pos, neg = float(wt[l].sum()), float(wt[~l].sum())
    if pos == 0 or neg == 0:
        return float("nan")
    total, i = 0.0, 0
    cum_neg = 0.0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        wp, wn = float(wt[i:j][l[i:j]].sum()), float(wt[i:j][~l[i:j]].sum())
        total += wp * (cum_neg + 0.5 * wn)
        cum_neg += wn
        i = j
    return total / (pos * neg)


def reliability(p: np.ndarray, y: np.ndarray, w: np.ndarray, bins: int = 10) -> dict:
    """Expected calibration error and the per-bin (mean predicted, observed rate, weight share)."""
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(p, edges) - 1, 0, bins - 1)
    rows, ece = [], 0.0
    for b in range(bins):
        m = which == b
        if not m.any():
            continue
        wb = float(w[m].sum())
        pred, obs = float((p[m] * w[m]).sum() / wb), float((y[m] * w[m]).sum() / wb)
        ece += wb / float(w.sum()) * abs(pred - obs)
        rows.append([round(pred, 3), round(obs, 3), round(wb / float(w.sum()), 4)])
    return {"ece": ece, "bins": rows}


def relevance_report(rs: RelevanceStacks, source: str, rule: Rule, w: np.ndarray, model: RelevanceModel,
                     thresholds: Sequence[float] = THRESHOLDS) -> dict:
    """On one source: AUC of the top hit's relevance (a right top hit against any wrong one, from answerable queries
    or not), reliability over all top-10 rows, and what each of `thresholds` keeps and drops."""
    rows = relevance_set(rs, [source], rule, w)
    p = model.predict(rows["X"])
    top = rows["top"]
    right = rows["y"][top] > 0
    wt = rows["w"][top]
    unanswerable = ~rows["answerable"][top]
    def share(mask: np.ndarray, of: np.ndarray) -> float:
        return float((wt * (mask & of)).sum() / max((wt * of).sum(), 1e-12))

    return {
        "auc_top1": auc(p[top], right, wt),
        "reliability": reliability(p, rows["y"], rows["w"]),
        "thresholds": {f"{t:g}": {"right_top1_kept": share(p[top] >= t, right),
                                  "unanswerable_top1_dropped": share(p[top] < t, unanswerable),
                                  "kept_top1_right": share(right, p[top] >= t)} for t in thresholds},
        "mean_top1_relevance": {"right": float(np.average(p[top][right], weights=wt[right])) if right.any() else None,
                                "answerable_wrong": float(np.average(p[top][~right & ~unanswerable],
                                                                     weights=wt[~right & ~unanswerable]))
                                if (~right & ~unanswerable).any() else None,
                                "unanswerable": float(np.average(p[top][unanswerable], weights=wt[unanswerable]))
                                if unanswerable.any() else None},
    }


# ----------------------------------------------------------------------------------------------- the protocol


def load_data(embedder: object, dev_dir: Path, corpus_dir: Path | None, sources: Sequence[str] | None = None,
              minilm: object | None = None, log: Callable[[str], None] = lambda s: None,
              personal: bool = True, sizes: bool = True, few: Sequence[int] = (5,)) -> dict[str, dict]:
    """Every source's cached store pass (dev_pools.py): pools, gold, reference rankings and foreign pools.

    Sources: the dev folder's, plus the corpus's held-out eval sets (debian, pyapi, foldoc) when corpus_dir is
    given. Each source's foreign queries are the first FOREIGN_QUERIES of the next source (sorted, cyclic). With
    `personal`, also the personal-memory protocol's sources (benchmarks/personal_recall.py: "personal" and
    "personal-hand", asked in each person's scope and store-wide, with their unanswerable questions as foreign
    queries; "personal-small", the same questions in stores of 2 to 400 facts; "personal-val", the validation set's
    hand-written questions in a store of their own); with `sizes` too, "personal-sizes-a" and "-b"
    (benchmarks/personal_sizes.py: thirty more hand-written people in stores of 5 to 2,000 facts), which join the
    relevance fit only.
    """
    import dev_pools as dp

    srcs = {n: dp.load_dev_source(n, dev_dir) for n in dp.dev_sources(dev_dir)}
    if corpus_dir is not None:
        for name in ("debian", "foldoc", "pyapi"):
            if (Path(corpus_dir) / "eval" / f"{name}.jsonl").is_file():
                srcs[name] = dp.load_eval_source(name, corpus_dir)
    if sources:
        missing = [s for s in sources if s not in srcs]
        if missing:
            raise InvalidInput(f"unknown sources {missing}; the dev folder and corpus hold {sorted(srcs)}.")
        srcs = {s: srcs[s] for s in sources}
    if len(srcs) < 3:
        raise InvalidInput(f"leave-one-source-out needs at least 3 sources, found {sorted(srcs)}.")
    names = sorted(srcs)
    data = {}
    for i, name in enumerate(names):
        src = srcs[name]
        sp = dp.source_pools(src, embedder, minilm=minilm, log=log)
        other = srcs[names[(i + 1) % len(names)]]
        data[name] = {"source": src, "pools": sp.pools, "gold": src.gold, "store": sp.store, "fts5": sp.fts5,
                      "minilm": sp.minilm, "foreign": dp.foreign_pools(src, other, embedder, log=log),
                      "foreign_from": other.name}
    if personal and not sources:
        from personal_recall import personal_sources, small_store_source, validation_source

        data.update(personal_sources(embedder, minilm=minilm, log=log))
        data.update(small_store_source(embedder, log=log))
        data.update(validation_source(embedder, minilm=minilm, log=log))
        if sizes:
            from personal_data import fit_sets
            from personal_sizes import sizes_source

            for part, ps in fit_sets().items():
                data.update(sizes_source(embedder, ps, f"personal-sizes-{part}", few=few, log=log))
    return data


def ranking_sources(data: dict) -> list[str]:
    """The sources the ranking rule is chosen and fitted on: all but those marked "ranking": False, which join
    the relevance fit only (benchmarks/personal_sizes.py)."""
    return sorted(s for s, d in data.items() if d.get("ranking", True))


def _floors(data: dict) -> dict[str, float]:
    return {s: max(ndcg(ranks_of(d["store"]["lexical"], d["gold"])), ndcg(ranks_of(d["store"]["vector"], d["gold"])))
            for s, d in data.items()}


def build_fits(data: dict, rules: Sequence[Rule] = RULES, log: Callable[[str], None] = lambda s: None
               ) -> dict[str, RuleFits]:
    """RuleFits of every rule over every source (stacks built once)."""
    floors = _floors(data)
    fits = {}
    for pool in sorted({r.pool for r in rules}):
        t0 = time.perf_counter()
        names = list(dict.fromkeys(f for r in rules if r.pool == pool for f in r.features))
        stacks = {s: Stack(d["pools"], d["gold"], names, pool) for s, d in data.items()}
        log(f"pool {pool}: {len(names)} features stacked in {time.perf_counter() - t0:.1f}s")
        for rule in rules:
            if rule.pool == pool:
                t0 = time.perf_counter()
                fits[rule.name] = RuleFits(rule, {s: st.select(rule.features) for s, st in stacks.items()}, floors)
                log(f"{rule.name}: ready in {time.perf_counter() - t0:.1f}s")
    return fits


def evaluate_loso(data: dict, fits: dict[str, RuleFits], rs: RelevanceStacks,
                  log: Callable[[str], None] = lambda s: None, relevance_model: str = "trees") -> dict:
    """The honest left-out figures: for every source, the rule is chosen (select_rule) and fitted on the other
    sources only, then scored on it; the relevance model likewise.

    Returns:
        {"sources": {source: {"rule", "weights", "ndcg@10", "per_rule": {rule: ndcg on it fitted without it},
        "relevance": relevance_report}}, "floors": {...}}
    """
    names = sorted(data)
    floors = _floors(data)
    out = {"sources": {}, "floors": floors}
    for s in names:
        rest = [t for t in names if t != s]
        ranked = [t for t in ranking_sources(data) if t != s]
        t0 = time.perf_counter()
        chosen, _ = select_rule(fits, ranked, floors)
        f = fits[chosen]
        w = f.weights(ranked)
        model = fit_relevance(rs, rest, f.rule, w, relevance_model)
        out["sources"][s] = {
            "rule": chosen, "weights": w.tolist(), "ndcg@10": f.score(s, ranked),
            "per_rule": {n: fr.score(s, ranked) for n, fr in fits.items()},
            "relevance": relevance_report(rs, s, f.rule, w, model),
        }
        log(f"left out {s}: rule {chosen}, ndcg@10 {out['sources'][s]['ndcg@10']:.4f} "
            f"(floor {floors[s]:.4f}) in {time.perf_counter() - t0:.1f}s")
    return out


def final_params(data: dict, fits: dict[str, RuleFits], rs: RelevanceStacks, fingerprint: str,
                 relevance_model: str = "trees") -> tuple[FusionParams, dict]:
    """The rule chosen on all sources, fitted on all of them, with its relevance model."""
    names, ranked = sorted(data), ranking_sources(data)
    floors = _floors(data)
    chosen, summary = select_rule(fits, ranked, floors)
    f = fits[chosen]
    w = f.weights(ranked)
    model = fit_relevance(rs, names, f.rule, w, relevance_model)
    params = FusionParams(tuple(f.rule.features), tuple(float(x) for x in w), f.rule.pool, rs.features,
                          model.weights, model.bias, fingerprint, model.trees)
    return params, {"chosen": chosen, "selection": summary}


def main(argv: Sequence[str] | None = None) -> dict:
    """Command line: see the module docstring. Returns what it writes to --out (plus the report)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="the .evlm checkpoint (default: the shipped model)")
    ap.add_argument("--tokenizer", default=None, help="its tokenizer.json")
    ap.add_argument("--dev", default=os.environ.get("EVERMIND_DEV_DIR", "/work/data/dev"),
                    help="the dev folder (recipe/build_devsets.py)")
    ap.add_argument("--corpus", default="/work/corpus", help="also use its eval/{debian,pyapi,foldoc}.jsonl ('' : no)")
    ap.add_argument("--sources", default="", help="comma-separated subset of the sources")
    ap.add_argument("--out", default=None, help="fusion JSON to write (default: beside the shipped model when "
                                                "no --model is given)")
    ap.add_argument("--report", default=None, help="also write the left-out report here")
    ap.add_argument("--relevance-extra", default="", metavar="F1,F2",
                    help="add these store/fusion.py FEATURES to the relevance model's (a trial; the report says how "
                         "they do left out)")
    ap.add_argument("--relevance-model", choices=("trees", "logistic"), default="trees",
                    help="gradient-boosted trees (needs scikit-learn) or the logistic model of earlier fits")
    ap.add_argument("--study", action="store_true", help="also weigh the rules that lost (STUDY_RULES: slower)")
    ap.add_argument("--no-personal", action="store_true",
                    help="leave out the personal-memory sources (benchmarks/personal_recall.py)")
    ap.add_argument("--no-sizes", action="store_true",
                    help="leave out the hand-written people in stores of every size (benchmarks/personal_sizes.py)")
    ap.add_argument("--size-balance", action="store_true",
                    help="weigh each store size of the sizes sources alike in the relevance fit (size_weights)")
    ap.add_argument("--few", default="5",
                    help="sizes of the one-person stores of the sizes sources, comma-separated (default 5)")
    args = ap.parse_args(argv)
    extra = tuple(f for f in args.relevance_extra.split(",") if f.strip())
    unknown = [f for f in extra if f not in FEATURES]
    if unknown:
        raise InvalidInput(f"--relevance-extra: unknown features {unknown}; known: {sorted(FEATURES)}")

    def log(msg: str) -> None:
        print(f"[calibrate_fusion] {msg}", file=sys.stderr, flush=True)

    from recall_quality import load_embedder

    embedder = load_embedder(args.model, args.tokenizer)
    out_path = Path(args.out) if args.out else (REPO / "evermind_memory" / "models" / "fusion.json"
                                                if args.model is None else None)
    if out_path is None:
        raise InvalidInput("--out is required with --model (the shipped model's fusion.json is for the shipped model).")
    t0 = time.perf_counter()
    data = load_data(embedder, Path(args.dev), Path(args.corpus) if args.corpus else None,
                     [s for s in args.sources.split(",") if s.strip()] or None, log=log, personal=not args.no_personal,
                     sizes=not args.no_sizes, few=tuple(int(n) for n in args.few.split(",")))
    rules = RULES + STUDY_RULES if args.study else RULES
    fits = build_fits(data, rules, log=log)
    features = relevance_features(args.relevance_model)
    rs = RelevanceStacks(data, rules, features + tuple(f for f in extra if f not in features),
                         by_size=args.size_balance)
    loso = evaluate_loso(data, fits, rs, log, args.relevance_model)
    params, chosen = final_params(data, fits, rs, embedder.fingerprint, args.relevance_model)
    print(format_loso(loso))
    print(f"chosen on all sources: {chosen['chosen']}  weights {np.round(params.weights, 4).tolist()}  "
          f"pool {params.pool}")
    doc = params.to_dict()
    doc.update({
        "fitted_by": "recipe/calibrate_fusion.py",
        "rule": chosen["chosen"],
        "sources": sorted(data),
        "selection_leave_one_out": chosen["selection"],
        "left_out_ndcg@10": {s: r["ndcg@10"] for s, r in loso["sources"].items()},
        "left_out_relevance_auc_top1": {s: r["relevance"]["auc_top1"] for s, r in loso["sources"].items()},
        "relevance_prior": "answerable and unanswerable queries weigh half each (near misses and other sources' "
                           "questions a quarter each)",
        "seconds": round(time.perf_counter() - t0, 1),
    })
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out_path)
    log(f"wrote {out_path}")
    if args.report:
        Path(args.report).write_text(json.dumps({"loso": loso, "final": doc}, indent=1) + "\n", encoding="utf-8")
    return {"params": doc, "loso": loso}


def format_loso(loso: dict) -> str:
    """The left-out table of the fitting: per source the rule chosen without it, its ndcg and the floor."""
    lines = [f"  {'left out':<13}{'rule (fitted on the rest)':<22}{'ndcg@10':>9}{'floor':>9}{'margin':>9}"
             f"{'rel AUC':>9}"]
    for s, r in loso["sources"].items():
        fl = loso["floors"][s]
        lines.append(f"  {s:<13}{r['rule']:<22}{r['ndcg@10']:>9.4f}{fl:>9.4f}{r['ndcg@10'] - fl:>+9.4f}"
                     f"{r['relevance']['auc_top1']:>9.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
