"""Recall's three ways to find facts: lexical (FTS5 BM25), vector (HNSW, or exact when a selection is small or
the index cannot answer) and hybrid (both, fused by store/fusion.py), each among the facts a `Selection`
selects (scope, alive now, where-filter), plus the opt-in recency weight and recall's argument checks
(Search.query). Everything here reads one generation, passed in by the caller, who holds it for the whole recall.

Vector recall is exact under any selection: a selection of at most EXACT_FILTER_MAX facts (or under a tenth of the
index) is searched exhaustively; a larger one through the graph, asked for more candidates than k and filtered,
which drops the facts the selection leaves out (so none of the k slots goes to them); if that cannot fill k,
exhaustively. Without a selection, facts that expired but were not swept yet are skipped the same way. The index
itself searches exactly while it holds at most IndexConfig.exact_max distinct vectors, and its graph holds one node
per distinct vector, so facts sharing a vector are never stranded (store/index.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Callable, NamedTuple

from contextvars import ContextVar

from .._blas import single_blas
from .._lazy import lazy_import
from ..embedder.base import DEFAULT_HYBRID_WEIGHT
from ..errors import InvalidInput
from .backend.base import Backend, FactRow, Selection, VectorReads
from .embedding import embed_query
from .index import SearchFailed, VectorIndex
from .index_nodes import exact_search
from .lexical import MAX_TERMS, coverage, name_coverage, phrase_query, query_names, query_words, text_terms
from .damage import readable
from .records import Explain
from .selection import select
from .timing import apply_recency, check_half_life
from .validate import (
    FUSIONS, K_MAX, MODES, check_choice, check_flag, check_k, check_min_score, check_relevance, check_text,
)
from .vectors import Generation

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

if TYPE_CHECKING:  # (fusion.py is imported by the first hybrid recall: a lexical one never needs it)
    from ..embedder.base import Embedder
    from .fusion import CandidatePool, Fused, FusionParams

EXACT_FILTER_MAX = 4096  # a selection of at most this many facts is searched exactly (R9)

Hit = tuple[FactRow, float]


def _part_cosines(vecs: np.ndarray, qv: np.ndarray, split: int) -> np.ndarray:
    """(m,) the cosine of the first `split` dimensions of each stored vector (m, D) and of the query (D,)."""
    q = np.asarray(qv[:split], dtype=np.float64)  # (C,)
    part = np.asarray(vecs[:, :split], dtype=np.float64)  # (m, C)
    norms = np.linalg.norm(part, axis=1) * max(float(np.linalg.norm(q)), 1e-12)  # (m,)
    return part @ q / np.maximum(norms, 1e-12)


class Query(NamedTuple):
    """One recall's checked arguments (Search.query)."""

    text: str
    k: int
    sel: Selection
    half_life: float | None  # the recency weight's half-life in seconds (None: no weight)
    mode: str
    fusion: str
    min_score: float | None
    min_relevance: float | None
    explain: bool
    rerank: bool | None = None  # (hybrid) the second stage of store/rerank.py: True, False, None (short notes)


class Detail(NamedTuple):
    """What hybrid recall knows of a hit beyond its score."""

    relevance: float | None  # the calibrated probability that it is what the query asks for (fitted rules only)
    explain: Explain | None  # how the score was made (recall(..., explain=True))


def fts_match(query: str, max_terms: int = MAX_TERMS) -> str | None:
    """Turn free text into a safe FTS5 query: each word quoted, OR-joined (None when no words). Recall itself
    matches fewer words on large stores: see store/lexical.py."""
    return phrase_query(query_words(query, max_terms))


# Set by MemoryStore.recall while it may still catch up and ask again: rows_for then raises LabelsMoved instead of
# dropping hits whose labels another process's commit moved (a reembed moves every label: the answer was empty).
STRICT_LABELS: ContextVar[bool] = ContextVar("evermind_strict_labels", default=False)


class LabelsMoved(Exception):
    """Index labels not in SQLite any more (see rows_for): catch up with the store's changes and search again."""


def hybrid_weight(embedder: Embedder) -> float:
    """The embedder's own `hybrid_weight` when it is a finite number, else DEFAULT_HYBRID_WEIGHT."""
    weight = getattr(embedder, "hybrid_weight", DEFAULT_HYBRID_WEIGHT)
    return float(weight) if isinstance(weight, (int, float)) and math.isfinite(weight) else DEFAULT_HYBRID_WEIGHT


class Search:
    """Recall's searches over one store.

    Args:
        db: the backend.
        dim: vector length.
    """

    def __init__(self, db: Backend, dim: int, embedder: Embedder | None = None) -> None:
        self._db = db
        self._dim = dim
        self._base = embedder  # the model the store was opened with: its fitted fusion rule is hybrid's
        self._params: FusionParams | None = None
        self._params_read = False  # params_for runs once; None is a valid answer

    def query(self, scope: str, text: object, k: object, *, tags: object, where: object, source: object, since: object,
              until: object, recency: object, mode: object, min_score: object, fusion: object, min_relevance: object,
              explain: object, rerank: object = None) -> Query:
        """MemoryStore.recall()'s arguments checked, the filters made one Selection in `scope`.

        Raises:
            InvalidInput: bad query, k, filter, recency, mode, fusion, min_score, min_relevance, explain or rerank
                (None, or a flag; True for hybrid mode only).
        """
        text = check_text(text, "query")
        k = check_k(k)
        sel = select("recall", scope, tags=tags, where=where, source=source, since=since, until=until)
        half_life = check_half_life(recency)
        mode = check_choice(mode, "mode", MODES, "recall")
        fusion = check_choice(fusion, "fusion", FUSIONS, "recall")
        min_score, min_relevance = check_min_score(min_score), self.relevance_floor(min_relevance, mode)
        second = None if rerank is None else check_flag(rerank, "rerank", "recall")
        if second and mode != "hybrid":
            raise InvalidInput(f"recall: rerank reorders hybrid recall's best hits; mode is {mode!r}.")
        return Query(text, k, sel, half_life, mode, fusion, min_score, min_relevance,
                     check_flag(explain, "explain", "recall"), second)

    def recall(self, gen: Generation, q: Query, weight: float) -> list[tuple[FactRow, float, Detail]]:
        """The hits of a checked recall in generation `gen` (held by the caller), best first: at most q.k before
        the recency weight (a pool of candidate_pool(k) with it), above both floors."""
        want = q.k if q.half_life is None else candidate_pool(q.k)
        lexicon, keep = None, None
        if q.mode == "hybrid" and q.rerank is not False:
            from . import rerank

            lexicon = rerank.lexicon_of(gen.embedder) if q.rerank else rerank.auto_lexicon(gen.embedder, q.fusion)
            if lexicon is not None:  # the second stage reads the best RERANK_POOL of the same candidate pool
                keep = max(want, rerank.RERANK_POOL)
        qv = None if q.mode == "lexical" else embed_query(gen.embedder, q.text, self._dim)  # (D,)
        scored, detail = self.run(gen, q.text, qv, want, q.sel, q.mode, q.fusion, weight, q.explain, keep)
        if q.half_life is not None:
            scored = rerank_by_recency(scored, q.sel.now, q.half_life)
        hits = above(scored, detail, q.min_score, q.min_relevance)
        # judged and scaled on the candidates before the floors, so a floor only drops hits: it changes neither
        # whether the rest are reranked nor their scores
        if lexicon is not None and (q.rerank or rerank.short_notes(scored)):
            hits = rerank.rerank(hits, q.text, lexicon, candidates=scored)
        return hits

    @single_blas
    def run(self, gen: Generation, query: str, qv: np.ndarray | None, k: int, sel: Selection, mode: str,
            fusion: str, weight: float, explain: bool = False,
            keep: int | None = None) -> tuple[list[Hit], dict[int, Detail]]:
        """((row, score) best first, at most k; rid -> Detail, hybrid only) for validated arguments (qv (D,) is
        None for lexical mode; `keep`: see hybrid)."""
        if mode == "lexical":
            return self.lexical(query, k, sel), {}
        assert qv is not None, "vector and hybrid recall embed the query"
        if mode == "vector":
            return self.rows_for(self.vector(gen, qv, k, sel)), {}
        return self.hybrid(gen, query, qv, k, sel, fusion, weight, explain, keep)

    def lexical(self, query: str, k: int, sel: Selection) -> list[Hit]:
        """FTS5 BM25 over the words of `query` (see store/lexical.py for which words are matched)."""
        words = query_words(query)
        if not words:
            return []
        with self._db.reading() as r:
            return r.lexical(words, k, sel)

    def vector(self, gen: Generation, qv: np.ndarray, k: int, sel: Selection) -> list[tuple[int, float]]:
        """(label, cosine) best first among the facts `sel` selects: exactly, or by filtered HNSW (see above)."""
        index, fp = gen.index, gen.fingerprint
        if sel.narrows:
            with self._db.reading() as r:
                matching = r.count_selected(sel, fp)
                if matching == 0:
                    return []
                if matching <= EXACT_FILTER_MAX or matching * 10 <= index.live_count:
                    return self._exact(r, gen, qv, k, sel)
                allowed = set(r.selected_labels(sel, fp).tolist())
            hits = _query(index, qv, min(k, len(allowed)), allowed.__contains__)
        else:
            with self._db.reading() as r:
                expired = r.expired_labels(fp, sel.now)  # usually none: then a plain search
            live = index.live_count - sum(1 for label in expired if label in index)
            hits = _query(index, qv, min(k, live), (lambda label: label not in expired) if expired else None)
        if hits is not None:
            return hits
        with self._db.reading() as r:  # the index could not fill k (a failed search, or it lags): exactly
            return self._exact(r, gen, qv, k, sel)

    def _exact(self, r: VectorReads, gen: Generation, qv: np.ndarray, k: int,
               sel: Selection) -> list[tuple[int, float]]:
        labels, vecs = r.vectors(gen.fingerprint, self._dim, sel=sel)
        return list(zip(*[a.tolist() for a in exact_search(vecs, labels, qv, k)]))

    def rows_for(self, hits: list[tuple[int, float]]) -> list[Hit]:
        """The fact rows of (label, score) hits, in order.

        Raises:
            LabelsMoved: (while STRICT_LABELS is set) a label is not in SQLite any more: another process committed
                a change after this one caught up (a reembed or an update gives a fact a new label, a forget takes
                it away). Unset, such a hit is dropped.
        """
        if not hits:
            return []
        with self._db.reading() as r:
            rows = r.fetch_where("label", [label for label, _ in hits])
        if len(rows) < len(hits) and STRICT_LABELS.get():
            raise LabelsMoved(f"{len(hits) - len(rows)} of {len(hits)} labels moved")
        return [(rows[label], score) for label, score in hits if label in rows]

    def fusion_params(self) -> FusionParams | None:
        """The fitted hybrid rule of the store's embedder (store/fusion.py params_for), looked up once; an adapted
        model keeps its base model's rule. None: the embedder has none (hybrid then fuses by weight)."""
        if not self._params_read:
            from .fusion import params_for

            self._params = None if self._base is None else params_for(self._base)
            self._params_read = True
        return self._params

    def relevance_floor(self, min_relevance: object, mode: str) -> float | None:
        """recall's checked min_relevance: None, or a number in [0, 1] for hybrid mode with a fitted rule.

        Raises:
            InvalidInput: anything else.
        """
        floor = check_relevance(min_relevance)
        if floor is not None and mode != "hybrid":
            raise InvalidInput(f"recall(min_relevance=...) judges hybrid recall, not mode={mode!r}; use min_score "
                               "there.")
        if floor is not None and self.fusion_params() is None:
            raise InvalidInput("recall(min_relevance=...) needs an embedder with a fitted fusion rule, which this "
                               "store's has not (the shipped model has one; recipe/calibrate_fusion.py fits one); use "
                               "min_score otherwise.")
        return floor

    def pool(self, gen: Generation, query: str, qv: np.ndarray, size: int, sel: Selection,
             stats: bool = True) -> tuple[dict, CandidatePool]:
        """The hybrid candidates: the top `size` of each list among the facts `sel` selects, with every score
        fusion may read (the cosine of lexical candidates the vector list missed, computed exactly; with `stats`,
        the query words' document frequencies and the fact count, which only a fitted rule reads).

        Returns:
            (rid -> FactRow, CandidatePool keyed by rid).
        """
        from .fusion import CandidatePool

        vec = self.rows_for(self.vector(gen, qv, size, sel))
        lex = self.lexical(query, size, sel)
        rows = {row.rid: row for row, _ in vec}
        rows.update({row.rid: row for row, _ in lex})
        damaged = {rid for rid, row in rows.items() if not isinstance(row.text, str)}
        if damaged:  # a text damaged outside the library cannot be read for words: skipped, as reads skip it
            readable([rows.pop(rid) for rid in damaged], lambda row: row.to_fact(), "recall")  # (warns)
            vec = [hit for hit in vec if hit[0].rid not in damaged]
            lex = [hit for hit in lex if hit[0].rid not in damaged]
        in_vec = {row.rid for row, _ in vec}
        missing = [row.label for row, _ in lex if row.rid not in in_vec and row.label is not None]
        words = query_words(query)
        split = self._model_split(gen) if stats else None
        model_cos: dict[int, float] = {}  # label -> cosine of the model's part (a vector with a lexicon part)
        with self._db.reading() as r:
            cosine: dict[int, float] = {}
            wanted = missing if split is None else [row.label for row in rows.values() if row.label is not None]
            if wanted:  # lexical candidates the vector pool missed: their cosine, exactly (and every candidate's
                # model-part cosine when the vector has a lexicon part: one read of the stored vectors for both)
                labels, vecs = r.vectors(gen.fingerprint, self._dim, labels=wanted)
                by_label = dict(zip(labels.tolist(), (vecs @ qv).tolist()))
                cosine = {row.rid: by_label[row.label] for row, _ in lex
                          if row.rid not in in_vec and row.label in by_label}
                if split is not None:
                    model_cos = dict(zip(labels.tolist(), _part_cosines(vecs, qv, split).tolist()))
            df = r.document_frequencies(words, sel) if words and stats else []
            n_facts = (r.selection_size(sel)[0] if sel.narrows else r.count()) if stats else 0
        pool = CandidatePool.build([(row.rid, s) for row, s in lex], [(row.rid, s) for row, s in vec], cosine,
                                   {rid: len(row.text) for rid, row in rows.items()}, df, n_facts)
        if stats:  # which query words and names each candidate holds (the fitted rule's "cover" and "names")
            held = text_terms([rows[rid].text for rid in pool.ids])
            pool = replace(pool, cover=np.array(coverage(words, pool.idf.tolist(), held), dtype=np.float64),
                           names=np.array(name_coverage(query_names(query), held), dtype=np.float64))
            if split is not None:
                labels_of = [rows[rid].label for rid in pool.ids]
                pool = replace(pool, cos_model=np.array([np.nan if label is None else model_cos.get(label, np.nan)
                                                         for label in labels_of], dtype=np.float64))
        return rows, pool

    def _model_split(self, gen: Generation) -> int | None:
        """The length of the model's part of this generation's vectors when they also hold a lexicon part (the
        store's own embedder serving), else None."""
        base = self._base
        split = getattr(base, "model_dimensions", None)
        if isinstance(split, int) and 0 < split < self._dim and base is not None \
                and gen.fingerprint == base.fingerprint:
            return split
        return None

    def hybrid(self, gen: Generation, query: str, qv: np.ndarray, k: int, sel: Selection, fusion: str,
               weight: float, explain: bool = False, keep: int | None = None) -> tuple[list[Hit], dict[int, Detail]]:
        """Lexical and vector candidates fused by `fusion` ("score": the embedder's fitted rule, or BM25 over the
        best plus weight x cosine without one; "rrf"): store/fusion.py fuse_pool. The pool is the fitted rule's
        (at least 2k) or max(50, 4k) without one.

        A fact with no vector in this generation yet (another process is still embedding it, or its vector was
        damaged) is fused on its lexical evidence alone (fuse_pool): scored as cosine 0 beside facts that have
        one, an exact match on a rare word fell out of the top k for as long as its vector was pending.

        Returns:
            ((row, score) best first, at most k (at most `keep` when given: more of the same pool, which k sizes);
            rid -> Detail (relevance, and an Explain when `explain`)).
        """
        from .fusion import fuse_pool

        params = self.fusion_params()
        size = candidate_pool(k) if params is None else min(K_MAX, max(params.pool, 2 * k))
        rows, pool = self.pool(gen, query, qv, size, sel, stats=params is not None)
        rule, fused = fuse_pool(pool, fusion, params, weight)
        order = sorted(range(len(pool.ids)), key=lambda i: (-fused.score[i], pool.ids[i]))[:keep or k]
        hits, details = [], {}
        for i in order:
            rid = pool.ids[i]
            hits.append((rows[rid], float(fused.score[i])))
            why = explained(rule, pool, fused, i) if explain else None
            details[rid] = Detail(None if fused.relevance is None else float(fused.relevance[i]), why)
        return hits, details


def above(scored: list[Hit], detail: dict[int, Detail], min_score: float | None,
          min_relevance: float | None) -> list[tuple[FactRow, float, Detail]]:
    """The hits at or above both floors (None: no floor), each with its Detail (empty outside hybrid mode)."""
    none = Detail(None, None)
    hits = [(row, score, detail.get(row.rid, none)) for row, score in scored]
    return [hit for hit in hits if (min_score is None or hit[1] >= min_score)
            and (min_relevance is None or (hit[2].relevance is not None and hit[2].relevance >= min_relevance))]


def candidate_pool(k: int) -> int:
    """How many candidates a ranking step draws to return k: hybrid fusion and the recency weight."""
    return min(K_MAX, max(50, 4 * k))


def explained(rule: str, pool: CandidatePool, fused: Fused, i: int) -> Explain:
    """The Explain of candidate `i` of a fused pool."""
    lex_rank, vec_rank = int(pool.lex_rank[i]), int(pool.vec_rank[i])
    return Explain(rule, float(fused.lexical[i]), float(fused.vector[i]), float(fused.score[i]),
                   float(pool.bm25[i]) if lex_rank >= 0 else None,
                   None if np.isnan(pool.cos[i]) else float(pool.cos[i]), lex_rank + 1 if lex_rank >= 0 else None,
                   vec_rank + 1 if vec_rank >= 0 else None)


def _query(index: VectorIndex, qv: np.ndarray, want: int,
           allow: Callable[[int], bool] | None) -> list[tuple[int, float]] | None:
    """The index's top `want` (among the allowed labels), or None when it cannot return that many."""
    if want <= 0:
        return []
    try:
        labels, scores = index.query(qv, want, allow)
    except SearchFailed:
        return None
    return list(zip(labels.tolist(), scores.tolist())) if len(labels) >= want else None


def rerank_by_recency(scored: list[Hit], now: datetime, half_life_s: float) -> list[Hit]:
    """Scores decayed by the age of each fact's last change (timing.apply_recency), best first; pinned facts keep
    their score. Ties keep the order they came in."""
    if not scored:
        return scored
    rows = [row for row, _ in scored]
    decayed = apply_recency([s for _, s in scored], [datetime.fromisoformat(row.updated_at) for row in rows], now,
                            half_life_s)  # (N,)
    final = [float(s) if row.pinned else float(d) for (row, s), d in zip(scored, decayed.tolist())]
    order = sorted(range(len(rows)), key=lambda i: -final[i])
    return [(rows[i], final[i]) for i in order]
