"""Which words of a query FTS5 should match, so that lexical recall stays fast on large stores.

FTS5 computes bm25 for every row its MATCH selects, and an OR of common words selects most of the table
(61 ms at 100k facts). BM25 is a sum over the query's words of idf * saturated term frequency, with
idf = log((N - df + 0.5) / (df + 0.5)), so a common word adds little to any row's score. Two cuts, both from
document frequencies that FTS5's `fts5vocab` table gives without touching the rows:

1. Words no fact holds are dropped (they add nothing to any score), and so are words held by more than half
   of the facts when the query has rarer words: their idf is <= 0, which FTS5 clamps to 1e-6, so they do not
   change the ranking of the rows the rarer words select; they only add rows that score ~0. (Dropping words
   held by a quarter of the facts already costs ndcg@10 on corpus/eval: -0.003 on debian.)
2. When the words left still select more than OR_BUDGET postings, the rows holding all of them are fetched
   first (FTS5 AND: each such row's bm25 is the same as under OR, the same words being scored). If at least
   `limit` rows hold them all, those are the answer; otherwise the OR query runs. (A row missing one word can
   then, rarely, be left out although OR would rank it in; the store_speed benchmark reports how often.)

Ranking without FTS5's per-row bm25(). FTS5 scores every row a MATCH selects, one at a time, before its LIMIT
(about 1.5 us a match: 10-30 ms for a common word at 100k facts). On SQLite a whole-store recall whose words are one
term each is ranked by bm25_top instead: the same formula, vectorised over the terms' postings, which the session
reads from FTS5's instance vocabulary once per change and keeps (TermPostings). Same scores, same order, and the
exact OR ranking, so cut 2 is not needed there. A narrowing selection (below) ranks the same postings masked by
it. A word FTS5 splits into a phrase (`buffer_size`), a process without numpy (a CLI lexical recall, which reads
rows only) and PostgreSQL keep the paths above.

The vocabulary table holds porter-stemmed terms, so words are stemmed by a private in-memory FTS5 table with
the tokenizer of facts_fts (FTS_TOKENIZE, which must stay equal to the one in backend/sqlite.py's schema).

Statistics over what is searched. BM25's idf and average length are those of the facts a recall selects: a
recall in Ada's scope, or filtered to user=ada, weighs "Ada" by how many of *those* facts hold it (all of them:
idf 1e-6, no evidence), not by how many of the whole file do. Over the whole store FTS5's bm25() has exactly these
statistics; for a narrowing selection both engines count the query terms' postings among the selected facts and
score with `bm25_scores` (a session's selection_size keeps the count and total length per selection and change
sequence).
"""

from __future__ import annotations

import math
import re
import sqlite3
import threading
from typing import TYPE_CHECKING, NamedTuple, Sequence

from .._lazy import lazy_import

np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

if TYPE_CHECKING:
    import numpy

FTS_TOKENIZE = "porter unicode61"  # facts_fts's tokenizer (backend/sqlite.py); stems must come out the same
MAX_TERMS = 64
COMMON_FRACTION = 0.5  # a word in more than this share of the facts is dropped when the query has rarer words
OR_BUDGET = 10_000  # postings above which the rows holding every word are tried before the OR query
_STEM_CACHE_MAX = 100_000
_WORD_RE = re.compile(r"\w+", re.UNICODE)
STOPWORDS = frozenset(
    "a an and are as at be by can did do does for from has have how in is it its of on or that the this to was "
    "were what when where which who why will with "
    # pronouns, the pieces of "Ada's" and "can't", and auxiliaries: in a scope of one person's notes "my" or the
    # "s" of a possessive is as rare as a content word, and coverage counted it as the match ("who is Yuki's
    # spouse?" ranked "Yuki's daughters ..." above "Yuki and Bram got married")
    "i me my mine myself we us our ours ourselves you your yours yourself yourselves he him his himself she her "
    "hers herself they them their theirs themselves s t d ll m re ve don doesn didn isn aren wasn weren hasn "
    "haven hadn wouldn shouldn couldn am been being had having doing would should could shall might must "
    "these those there here then than so but if just also very".split())
_CAMEL_BOUNDARY = re.compile(r"[a-z0-9][A-Z]|[A-Z][A-Z][a-z]")  # ZipFile, Qt5Core, HTTPServer
_CAMEL_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z0-9]+|[A-Z][A-Z0-9]*")
_VOCAB = "temp.facts_fts_vocab"
BM25_K1, BM25_B = 1.2, 0.75  # FTS5's bm25() constants


class LexicalPlan(NamedTuple):
    """FTS5 MATCH strings to run: `all_words` first when not None (accepted if it fills the limit), then `any_word`."""

    all_words: str | None
    any_word: str | None


def query_words(query: str, max_terms: int = MAX_TERMS) -> list[str]:
    """The distinct lower-cased words of `query`, in order, then the parts of its identifiers; at most `max_terms`.

    An identifier such as `ZipFile`, `HTTPServer` or `buffer_size` is one term (or one phrase) to FTS5, and prose
    rarely holds it: its parts ("zip", "file"; "http", "server"; "buffer", "size") are what a description says.
    The whole word stays in, first. (Fusion dev set: Python API names, lexical ndcg@10 0.303 -> 0.434; Debian,
    0.916 -> 0.914.)

    English function words (STOPWORDS) are left out unless the query has nothing else. On a large store their
    idf is about zero anyway (dev set: lexical ndcg@10 moves by at most 0.0003); on a store of a few facts BM25
    counts "to" or "does" as evidence, and "travel plans to Portugal" would rank "Bob is allergic to peanuts"
    first.
    """
    words = _WORD_RE.findall(query)
    parts = [part for word in words if "_" in word or _CAMEL_BOUNDARY.search(word)
             for part in (_CAMEL_PART.findall(word) if word.isascii() else word.split("_")) if part]
    distinct = list(dict.fromkeys(w.lower() for w in words + parts))
    content = [w for w in distinct if w not in STOPWORDS]
    return (content or distinct)[:max_terms]


def phrase_query(words: list[str], op: str = "OR") -> str | None:
    """A safe FTS5 query: each word a quoted phrase, joined by `op` ("OR" or "AND"); None for no words."""
    if not words:
        return None
    return f" {op} ".join('"' + w.replace('"', '""') + '"' for w in words)


class _Stemmer:
    """Word -> the terms facts_fts indexes for it, by FTS5's own tokenizer (thread-safe, cached)."""

    def __init__(self, max_words: int = _STEM_CACHE_MAX) -> None:
        self._max = max_words
        self._conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self._conn.execute(f"CREATE VIRTUAL TABLE words USING fts5(w, tokenize='{FTS_TOKENIZE}')")
        self._conn.execute("CREATE VIRTUAL TABLE word_terms USING fts5vocab(words, instance)")
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[str, ...]] = {}

    def terms(self, words: list[str]) -> list[tuple[str, ...]]:
        with self._lock:
            missing = [w for w in dict.fromkeys(words) if w not in self._cache]
            if missing:
                if len(self._cache) + len(missing) > self._max:  # start afresh, with every word asked for now
                    self._cache.clear()
                    missing = list(dict.fromkeys(words))
                found: dict[int, list[str]] = {i: [] for i in range(len(missing))}
                self._conn.execute("BEGIN")
                try:  # rolled back: the table stays empty, the tokenizer's output is all we want
                    self._conn.executemany("INSERT INTO words (rowid, w) VALUES (?, ?)", enumerate(missing))
                    for doc, term in self._conn.execute("SELECT doc, term FROM word_terms ORDER BY doc, offset"):
                        found[doc].append(term)
                finally:
                    self._conn.execute("ROLLBACK")
                for i, word in enumerate(missing):
                    self._cache[word] = tuple(found[i])
            return [self._cache[w] for w in words]


    def counts(self, texts: Sequence[str]) -> list[tuple[str, int, int]]:
        """(term, index of the text, occurrences) for every term FTS5's tokenizer indexes for each text, by term."""
        with self._lock:
            self._conn.execute("BEGIN")
            try:  # rolled back, as in terms()
                self._conn.executemany("INSERT INTO words (rowid, w) VALUES (?, ?)", enumerate(texts))
                return self._conn.execute("SELECT term, doc, COUNT(*) FROM word_terms GROUP BY term, doc").fetchall()
            finally:
                self._conn.execute("ROLLBACK")


_STEMMER = _Stemmer()


def stem_terms(words: list[str]) -> list[tuple[str, ...]]:
    """For each word, the terms facts_fts indexes for it (FTS5's own tokenizer; most words give one)."""
    return _STEMMER.terms(words)


def document_frequencies(conn: sqlite3.Connection, words: list[str]) -> list[int]:
    """For each word, how many facts hold it (for a word FTS5 splits into several terms, the rarest term's count:
    an upper bound of the phrase's). Reads facts_fts's vocabulary, not the rows."""
    stems = _STEMMER.terms(words)
    df = term_counts(conn, sorted({t for s in stems for t in s}))
    return [min((df.get(t, 0) for t in s), default=0) for s in stems]


def term_counts(conn: sqlite3.Connection, terms: list[str]) -> dict[str, int]:
    """term -> how many facts hold it (terms no fact holds left out), from facts_fts's vocabulary."""
    if not terms:
        return {}
    conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {_VOCAB} USING fts5vocab(main, facts_fts, row)")
    marks = ", ".join("?" * len(terms))
    return dict(conn.execute(f"SELECT term, doc FROM {_VOCAB} WHERE term IN ({marks})", terms).fetchall())


def plan(conn: sqlite3.Connection, words: list[str], n_facts: int) -> LexicalPlan:
    """Choose the MATCH strings for `words` over a table of `n_facts` rows (see the module docstring).

    Args:
        conn: a connection that can read facts_fts.
        words: from query_words.
        n_facts: rows in facts_fts.
    Returns:
        LexicalPlan; both fields None when no fact holds any word.
    """
    kept, all_first = choose(words, document_frequencies(conn, words), n_facts)
    if not kept:
        return LexicalPlan(None, None)
    any_word = phrase_query(kept)
    return LexicalPlan(phrase_query(kept, "AND") if all_first else None, any_word)


def choose(words: list[str], df: list[int], n_facts: int) -> tuple[list[str], bool]:
    """The words worth matching, given each one's document frequency over `n_facts` rows, and whether the rows
    holding all of them should be tried first (the two cuts of the module docstring; any backend's full-text
    index plans with it).

    Returns:
        (kept words, in query order; True when they select more than OR_BUDGET postings together).
    """
    held = [(w, d) for w, d in zip(words, df) if d > 0]
    rare = [(w, d) for w, d in held if d <= COMMON_FRACTION * n_facts]
    kept = rare or held
    return [w for w, _ in kept], len(kept) > 1 and sum(d for _, d in kept) > OR_BUDGET


def idf(df: int, n: int) -> float:
    """BM25's idf as FTS5 computes it (a non-positive one counts as 1e-6)."""
    ratio = (n - df + 0.5) / (df + 0.5) if n else 0.0
    return math.log(ratio) if ratio > 1.0 else 1e-6


def word_postings(stems: list[tuple[str, ...]],
                  term_tf: dict[int, dict[str, int]]) -> tuple[list[int], dict[int, list[int]]]:
    """Per word, its frequency in each fact, from each fact's term frequencies (`term_tf`: rid -> term -> count).

    A word that the tokenizer splits into several terms counts as often as its rarest term (the phrase's count, at
    most). Returns (document frequency per word, rid -> frequency per word) over the facts in `term_tf`.
    """
    tf = {rid: [min((terms.get(t, 0) for t in s), default=0) for s in stems] for rid, terms in term_tf.items()}
    df = [sum(1 for v in tf.values() if v[i] > 0) for i in range(len(stems))]
    return df, tf


def bm25_scores(tf: dict[int, list[int]], lengths: dict[int, int], df: list[int], keep: list[int], n: int,
                total_tokens: int) -> dict[int, float]:
    """BM25 (FTS5's formula, higher is better) of each fact in `tf` over the words at positions `keep`, with the
    statistics of a selection of `n` facts holding `total_tokens` tokens."""
    avg = max(1.0, total_tokens / max(1, n))
    rids = np.fromiter(tf, dtype=np.int64, count=len(tf))  # (R,)
    if not len(rids):
        return {}
    freqs = np.array(list(tf.values()), dtype=np.int32).reshape(len(rids), -1)  # (R, Q)
    sizes = np.fromiter((lengths.get(rid, 1) for rid in tf), dtype=np.int32, count=len(rids))  # (R,)
    total = np.zeros(len(rids), dtype=np.float64)  # (R,) each term's part added in query order, as FTS5 sums
    for i in keep:  # query words, not facts
        hit = np.flatnonzero(freqs[:, i])  # (H,)
        total[hit] += _contributions(TermPostings(rids[hit], freqs[hit, i], sizes[hit]), idf(df[i], n), avg)
    return {rid: score for rid, score in zip(rids.tolist(), total.tolist()) if score > 0}


class TermPostings(NamedTuple):
    """One FTS5 term's postings over the whole table, in rowid order: what an unscoped lexical recall ranks."""

    rids: numpy.ndarray  # (P,) int64, ascending
    tf: numpy.ndarray  # (P,) int32: how often the term occurs in each fact
    lengths: numpy.ndarray  # (P,) int32: each fact's token count (facts_fts_docsize)


def postings_from_instances(docs: Sequence[int], sizes: Sequence[bytes]) -> TermPostings:
    """A term's postings from its fts5vocab 'instance' rows (one per occurrence, in doc order) and each row's
    docsize blob."""
    doc = np.fromiter(docs, dtype=np.int64, count=len(docs))  # (I,)
    if not len(doc):
        empty = np.zeros(0, dtype=np.int32)  # (0,)
        return TermPostings(np.zeros(0, dtype=np.int64), empty, empty)
    first, tf = instance_runs(doc)  # (P,), (P,)
    return TermPostings(doc[first], tf, varint_array(sizes)[first].astype(np.int32))


def instance_runs(doc: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray]:
    """For a term's instance rows' docs (I,), in doc order: (the first instance of each fact (P,), how many
    instances each fact has: its term frequency (P,))."""
    first = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])  # (P,)
    return first, np.diff(np.r_[first, len(doc)]).astype(np.int32)


def text_postings(texts: Sequence[str]) -> tuple[dict[str, tuple[numpy.ndarray, numpy.ndarray]], numpy.ndarray]:
    """What facts_fts indexes for `texts` (new or changed facts): (term -> (indices of the texts holding it (H,),
    occurrences (H,)), token count of each text (N,)), by FTS5's own tokenizer."""
    rows = _STEMMER.counts(texts)
    lengths = np.zeros(len(texts), dtype=np.int32)  # (N,)
    if not rows:
        return {}, lengths
    terms, docs, counts = zip(*rows)
    doc = np.array(docs, dtype=np.int64)  # (I,)
    tf = np.array(counts, dtype=np.int32)  # (I,)
    np.add.at(lengths, doc, tf)
    bounds = np.flatnonzero(np.r_[True, np.array(terms[1:], dtype=object) != np.array(terms[:-1], dtype=object)])
    ends = np.r_[bounds[1:], len(terms)]
    return {terms[a]: (doc[a:b], tf[a:b]) for a, b in zip(bounds.tolist(), ends.tolist())}, lengths


def patch_postings(p: TermPostings, changed: numpy.ndarray, rids: numpy.ndarray, tf: numpy.ndarray,
                   lengths: numpy.ndarray) -> TermPostings:
    """`p` with the facts `changed` (ascending) left out, then the postings (rids, tf, lengths) of those that now hold
    the term put in: a cached term brought up to date after remember or update without reading it again."""
    if len(changed) and len(p.rids) and changed[0] <= p.rids[-1]:  # (new facts come after every cached one)
        keep = ~np.isin(p.rids, changed)  # (P,)
        p = TermPostings(p.rids[keep], p.tf[keep], p.lengths[keep])
    if not len(rids):
        return p
    all_rids = np.concatenate([p.rids, rids])  # (P + A,)
    order = np.argsort(all_rids, kind="stable")  # (P + A,)
    return TermPostings(all_rids[order], np.concatenate([p.tf, tf])[order], np.concatenate([p.lengths, lengths])[order])


def bm25_top(postings: Sequence[TermPostings], n: int, total_tokens: int,
             limit: int) -> tuple[numpy.ndarray, numpy.ndarray]:
    """The `limit` best facts under FTS5's bm25() of an OR of single-term phrases, one TermPostings per phrase, over
    a table of `n` rows holding `total_tokens` tokens: (rids (L,), scores (L,)), best first, ties by rid.

    The same arithmetic as FTS5's fts5Bm25Function (fts5_aux.c), operation for operation (each fact's terms summed in
    query order from 0.0, idf from the term's document count, a non-positive idf counted as 1e-6), so the scores
    and their order are those of `ORDER BY rank` (negated: higher is better). Vectorised; with several terms, only the
    facts that can reach the answer are scored (_essential_candidates): a query of a rare and two very common words
    over a million facts scores the rare word's postings, not the common words' 600,000. The postings themselves are
    read once per change (SQLiteSession keeps them).
    """
    avg = total_tokens / n if n else 1.0
    parts = [p for p in postings if len(p.rids)]
    if not parts or limit <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    weights = [idf(len(p.rids), n) for p in parts]
    if len(parts) > 1:
        found = _essential_candidates(parts, weights, avg, limit)
        if found is not None:  # the facts that can reach the top, each scored over every term
            return _best(found, _scores_of(found, parts, weights, avg), limit)
    rids = np.concatenate([p.rids for p in parts])  # (M,) in query order: each fact's terms add up in that order
    contrib = np.concatenate([_contributions(p, w, avg) for p, w in zip(parts, weights)])  # (M,)
    if len(parts) == 1:  # one term: its postings are the facts (ascending, distinct)
        return _best(rids, contrib, limit)
    return _best(*_sum_by_fact(rids, contrib), limit)  # each fact's terms summed one by one from 0.0, in query order


SEED_FACTS = 1_024  # facts scored in full to find a score the top `limit` must reach (_essential_candidates)


def _contributions(p: TermPostings, weight: float, avg: float, at: numpy.ndarray | None = None) -> numpy.ndarray:
    """One term's BM25 part of each of its postings (or of those at positions `at`), in float64 as FTS5 computes
    it (float32 scores would reorder facts FTS5 ranks a few ulps apart). Elementwise IEEE arithmetic: a posting's
    part is the same number whichever subset it is computed in."""
    tf, length = (p.tf, p.lengths) if at is None else (p.tf[at], p.lengths[at])
    tf, length = tf.astype(np.float64), length.astype(np.float64)  # (P,), (P,)
    return weight * ((tf * (BM25_K1 + 1.0)) / (tf + BM25_K1 * (1 - BM25_B + BM25_B * length / avg)))


def _scores_of(facts: numpy.ndarray, parts: Sequence[TermPostings], weights: Sequence[float],
               avg: float) -> numpy.ndarray:
    """The BM25 scores (F,) of `facts` (F,) over every term: each term's part added in query order from 0.0, a term
    a fact lacks adding nothing, which is the sum FTS5 makes."""
    total = np.zeros(len(facts), dtype=np.float64)  # (F,)
    for p, w in zip(parts, weights):
        at = np.minimum(np.searchsorted(p.rids, facts), len(p.rids) - 1)  # (F,)
        hit = np.flatnonzero(p.rids[at] == facts)  # (H,)
        total[hit] += _contributions(p, w, avg, at[hit])
    return total


def _essential_candidates(parts: Sequence[TermPostings], weights: Sequence[float], avg: float,
                          limit: int) -> numpy.ndarray | None:
    """The facts that can be among the best `limit` (MaxScore, Turtle and Flood 1995): each term's largest part
    bounds what it adds to any fact; the `limit`-th best full score among SEED_FACTS facts of the term with the
    largest bound is a score the answer reaches; the terms whose bounds add up to less than that cannot lift a
    fact that holds only them into the answer, so only the postings of the other terms are candidates. None when
    that prunes too little to be worth it (the exhaustive sum is then cheaper)."""
    bounds = [float(_contributions(TermPostings(p.rids[:1], p.tf.max(keepdims=True), p.lengths.min(keepdims=True)),
                                   w, avg)[0]) * (1 + 1e-9) for p, w in zip(parts, weights)]  # (a margin for rounding)
    top = int(np.argmax(bounds))
    own = _contributions(parts[top], weights[top], avg)  # (P,)
    seed = parts[top].rids  # (S,) the facts of the term that adds the most, at most SEED_FACTS of its best
    if len(own) > SEED_FACTS:
        seed = seed[np.argpartition(-own, SEED_FACTS)[:SEED_FACTS]]
    if len(seed) < limit:
        return None
    reach = np.partition(-_scores_of(np.sort(seed), parts, weights, avg), limit - 1)[limit - 1] * -1.0
    dropped, total = set(), 0.0
    for i in np.argsort(bounds).tolist():  # the smallest bounds first
        if total + bounds[i] >= reach * (1 - 1e-9):
            break
        dropped.add(i)
        total += bounds[i]
    essential = [p.rids for i, p in enumerate(parts) if i not in dropped]
    if not dropped or 2 * sum(map(len, essential)) > sum(len(p.rids) for p in parts):
        return None
    return essential[0] if len(essential) == 1 else np.unique(np.concatenate(essential))


def _best(facts: numpy.ndarray, scores: numpy.ndarray, limit: int) -> tuple[numpy.ndarray, numpy.ndarray]:
    """The best `limit` of `facts` by `scores` (ties by rid): the rows at or above the limit-th score, then sorted
    exactly."""
    if len(facts) > limit:
        cut = np.partition(-scores, limit - 1)[limit - 1]
        keep = np.flatnonzero(-scores <= cut)  # (F',)
        facts, scores = facts[keep], scores[keep]
    order = np.lexsort((facts, -scores))[:limit]  # (L,)
    return facts[order], scores[order]


def _sum_by_fact(rids: numpy.ndarray, contrib: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray]:
    """(facts (F,) ascending, each fact's contributions summed (F,)), from postings `rids` (M,) that are ascending
    runs, one run per term in query order, and their contributions (M,). A stable sort (a merge of the runs) puts
    each fact's terms together in query order; they are then added one position at a time, so every sum is the
    same sequence of float64 additions FTS5 makes (a pairwise or blocked sum would differ in the last bit and
    reorder facts FTS5 ranks a few ulps apart). The sort of 400,000 postings takes ~10 ms on the runs; the
    bincount over a million rids it replaces took twice as long, np.unique's sort longer still."""
    order = np.argsort(rids, kind="stable")  # (M,)
    r, c = rids[order], contrib[order]  # (M,), (M,)
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])  # (F,)
    runs = np.diff(np.r_[starts, len(r)])  # (F,) how many of the query's terms each fact holds
    scores = c[starts].copy()  # (F,)
    for j in range(1, int(runs.max())):  # (at most the number of query terms)
        more = np.flatnonzero(runs > j)  # (F_j,)
        scores[more] += c[starts[more] + j]
    return r[starts], scores


def table_totals(averages: bytes) -> tuple[int, int]:
    """(rows, tokens) of a one-column FTS5 table, from its averages record (facts_fts_data, id 1)."""
    rows, used = _varint_at(averages, 0)
    tokens, _ = _varint_at(averages, used)
    return rows, tokens


def _varint_at(blob: bytes, start: int) -> tuple[int, int]:
    """The SQLite varint at `start`: (value, the offset after it)."""
    value = 0
    for i in range(start, min(len(blob), start + 9)):
        byte = blob[i]
        if i == start + 8:
            return (value << 8) | byte, i + 1
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, i + 1
    return value, len(blob)


def varint_array(blobs: Sequence[bytes]) -> numpy.ndarray:
    """The first varint of each blob (docsize records: one column's token count), as (N,) int64, vectorised over the
    blobs (one step per byte of the longest varint, not per blob)."""
    if not blobs:
        return np.zeros(0, dtype=np.int64)
    sizes = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs))  # (N,)
    data = np.frombuffer(b"".join(blobs), dtype=np.uint8).astype(np.int64)  # (sum of sizes,)
    start = np.r_[0, np.cumsum(sizes)[:-1]]  # (N,)
    value = np.zeros(len(blobs), dtype=np.int64)  # (N,)
    going = sizes > 0  # (N,) still reading: the previous byte had its high bit set
    for i in range(9):
        if not going.any():
            break
        byte = data[np.minimum(start + i, len(data) - 1)]  # (N,)
        going &= i < sizes
        step = (value << 8) | byte if i == 8 else (value << 7) | (byte & 0x7F)
        value = np.where(going, step, value)
        going &= byte >= 0x80
    return value


def varint(blob: bytes) -> int:
    """The first SQLite varint of an FTS5 docsize blob (the token count of the table's one column)."""
    value = 0
    for i, byte in enumerate(blob):
        if i == 8:
            return (value << 8) | byte
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            break
    return value


def text_terms(texts: Sequence[str]) -> list[set[str]]:
    """Each text's FTS5 terms (the set coverage and name_coverage test query words against)."""
    return [{t for st in stem_terms(list(dict.fromkeys(w.lower() for w in _WORD_RE.findall(text)))) for t in st}
            for text in texts]


def coverage(words: list[str], idf: Sequence[float], held: Sequence[set[str]]) -> list[float]:
    """For each text's terms (`held`, text_terms), the share of the query's idf (one weight per word of `words`)
    that it holds: a word counts when every term FTS5 indexes for it is among the text's. 0 for a query of no
    weight."""
    total = float(sum(idf))
    if not words or total <= 0:
        return [0.0] * len(held)
    need = stem_terms(words)
    return [sum(w for st, w in zip(need, idf) if st and all(t in terms for t in st)) / total for terms in held]


QUESTION_WORDS = frozenset("what when where which who whom whose why how do does did is are was were can could should "
                           "would will shall may might must has have had please tell show find give list "
                           "remind".split())


_SENTENCE_END = re.compile(r"[.!?:;]\s*$")
_POSSESSIVE = re.compile(r"['\u2019]s\b")


def query_names(query: str) -> list[str]:
    """The query's names: capitalised words that are not English function or question words ("what does Ada
    drink?" -> ["ada"]; "What is FTS5?" -> ["fts5"]), lower-cased, in order.

    A word that starts a sentence is capitalised whatever it is ("Returns the inverse of a matrix."), so there it
    counts only as a possessive ("Ada's tea" -> ["ada"]). Counted, a manual's "Returns" or "Computes" was a name
    that one fact in ten held, and the rules that weigh names lost on those manuals' no-harm check."""
    out = []
    previous = 0  # where the previous word ended
    for m in _WORD_RE.finditer(query):
        gap, previous = query[previous:m.start()], m.end()  # what stands between this word and the one before
        word, low = m.group(), m.group().lower()
        if not word[:1].isupper() or low in STOPWORDS or low in QUESTION_WORDS or low in out:
            continue
        starts = (m.start() == len(gap) and not gap.strip()) or bool(_SENTENCE_END.search(gap))
        if starts and not _POSSESSIVE.match(query, m.end()):
            continue
        out.append(low)
    return out


def name_coverage(names: list[str], held: Sequence[set[str]]) -> list[float]:
    """For each text's terms (`held`, text_terms), the share of `names` (query_names) it holds; 0 when there are
    none."""
    if not names:
        return [0.0] * len(held)
    need = stem_terms(names)
    return [sum(1 for st in need if st and all(t in terms for t in st)) / len(names) for terms in held]
