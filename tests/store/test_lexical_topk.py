"""Lexical top-k against the exhaustive BM25 ranking (issue 34 item 1): on a store of common and rare words, with
repeated words and facts of many lengths, every lexical recall (whole store, in a scope, under a filter; small and
large k) returns k facts whose scores are FTS5's bm25() formula computed here over every fact, and no fact left out
scores more than the last one returned. Both engines; the texts use words that no stemmer changes and no stopwords,
so counting them here is counting what the full-text index holds."""

from __future__ import annotations

import math

import numpy as np
import pytest

K1, B = 1.2, 0.75  # FTS5's bm25() constants
COMMON = ["tea", "river", "lamp", "jazz"]  # each in about a third of the facts
RARE = ["zebra", "kiwi", "mango"]  # each in two or three facts
FILLER = [f"x{i}" for i in range(40)]


def corpus(n: int, seed: int) -> list[str]:
    """`n` facts of 3 to 14 words: common words (sometimes twice), a few rare ones, filler."""
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(n):
        words = [str(w) for w in rng.choice(FILLER, size=int(rng.integers(2, 12)), replace=False)]
        words += [w for w in COMMON if rng.random() < 0.33]
        words += ["tea"] if rng.random() < 0.1 else []  # tf 2 for some
        words += [RARE[i % 3]] if i % 40 == 7 else []
        rng.shuffle(words)
        texts.append(" ".join(words))
    return texts


def exhaustive(texts: list[str], query: list[str]) -> dict[str, float]:
    """FTS5's bm25() of the OR of `query` over `texts` (its statistics), higher is better; facts with no query
    word left out."""
    tokens = [t.split() for t in texts]
    n, avg = len(texts), sum(map(len, tokens)) / len(texts)
    out = {}
    for text, toks in zip(texts, tokens):
        score = 0.0
        for word in query:
            df = sum(word in t for t in tokens)
            ratio = (n - df + 0.5) / (df + 0.5)
            weight = math.log(ratio) if ratio > 1 else 1e-6
            tf = toks.count(word)
            score += weight * (tf * (K1 + 1)) / (tf + K1 * (1 - B + B * len(toks) / avg))
        if score > 0:
            out[text] = score
    return out


def assert_exact_top_k(hits, ref: dict[str, float], k: int) -> None:
    got = [(h.text, h.score) for h in hits]
    assert len(got) == min(k, len(ref))
    for text, score in got:  # each hit scored as BM25 over everything selected scores it
        assert score == pytest.approx(ref[text], rel=1e-9)
    assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
    if got:  # nothing left out beats the last hit (ties may go either way)
        returned = {t for t, _ in got}
        assert max((s for t, s in ref.items() if t not in returned), default=0.0) <= got[-1][1] * (1 + 1e-9)


QUERIES = [["tea"], ["river", "lamp"], ["zebra", "tea"], ["kiwi", "jazz", "river"], ["tea", "river", "lamp", "jazz"]]


@pytest.mark.parametrize("k", [1, 5, 60])
def test_lexical_top_k_is_the_exhaustive_bm25_ranking(store, k):
    a, b = corpus(120, seed=1), corpus(80, seed=2)
    store.scope(user="a").remember_many(a, tags={"half": "a"})
    store.remember_many(b, tags={"half": "b"})
    for query in QUERIES:
        text = " ".join(query)
        assert_exact_top_k(store.recall(text, k=k, mode="lexical"), exhaustive(a + b, query), k)
        assert_exact_top_k(store.scope(user="a").recall(text, k=k, mode="lexical"), exhaustive(a, query), k)
        assert_exact_top_k(store.recall(text, k=k, mode="lexical", tags={"half": "b"}), exhaustive(b, query), k)


def test_the_ranking_follows_every_change(store):
    texts = corpus(60, seed=3)
    ids = store.remember_many(texts)
    assert_exact_top_k(store.recall("tea", k=5, mode="lexical"), exhaustive(texts, ["tea"]), 5)
    new = store.remember("tea okapi")  # a short fact: the best "tea" now, and the only "okapi"
    texts.append("tea okapi")
    assert_exact_top_k(store.recall("tea", k=5, mode="lexical"), exhaustive(texts, ["tea"]), 5)
    assert [h.id for h in store.recall("okapi", k=5, mode="lexical")] == [new]
    store.forget(new)
    texts.pop()
    assert store.recall("okapi", k=5, mode="lexical") == []
    store.update(ids[0], "okapi tea tea")
    texts[0] = "okapi tea tea"
    assert_exact_top_k(store.recall("tea okapi", k=5, mode="lexical"), exhaustive(texts, ["tea", "okapi"]), 5)


def test_a_change_that_keeps_a_words_count_still_changes_its_scores(store):
    """An update that leaves the number of facts holding "tea" as it was (but not its frequency or the fact's
    length), and a forget and a remember of "tea" facts between two recalls."""
    texts = corpus(40, seed=4) + ["tea lamp x1 x2 x3", "tea river x4"]
    ids = store.remember_many(texts)
    assert_exact_top_k(store.recall("tea", k=10, mode="lexical"), exhaustive(texts, ["tea"]), 10)
    store.update(ids[-2], "tea tea")
    texts[-2] = "tea tea"
    assert_exact_top_k(store.recall("tea lamp", k=10, mode="lexical"), exhaustive(texts, ["tea", "lamp"]), 10)
    store.forget(ids[-1])
    store.remember("tea jazz x5")
    texts[-1] = "tea jazz x5"
    assert_exact_top_k(store.recall("tea", k=50, mode="lexical"), exhaustive(texts, ["tea"]), 50)


def test_the_ranking_holds_while_the_term_cache_evicts(store, monkeypatch):
    """With caps far below what the queries need, the kept postings are evicted least recently used first (SQLite;
    PostgreSQL keeps none): every recall is still the exhaustive ranking, whether its terms were kept (and patched
    by the changes since) or read again, and a query whose terms alone exceed the cap still ranks them all."""
    from evermind_memory.store.backend import sqlite_session

    monkeypatch.setattr(sqlite_session, "TERM_CACHE_MAX", 40)
    monkeypatch.setattr(sqlite_session, "TERM_CACHE_TERMS", 3)
    held = dict(zip(store.remember_many(corpus(90, seed=5)), corpus(90, seed=5)))  # id -> text
    for round_ in range(3):
        for query in QUERIES + [["kiwi"], ["tea", "x3"], ["mango", "lamp"]]:
            ref = exhaustive(list(held.values()), query)
            assert_exact_top_k(store.recall(" ".join(query), k=7, mode="lexical"), ref, 7)
        first, last = list(held)[round_], list(held)[-1]
        store.update(first, f"tea kiwi x{round_}")
        held[first] = f"tea kiwi x{round_}"
        store.forget(last)
        del held[last]


def test_a_long_lived_store_scores_like_a_fresh_one_while_another_writes(target, embedder):
    """The statistics a session keeps between recalls (the facts counted at a change seq, the kept terms checked
    against the full-text index once per seq, the document frequencies hybrid reads from them) follow every change
    another store makes: lexical and hybrid scores equal those of a store opened after the change."""
    from evermind_memory import MemoryStore

    texts = corpus(80, seed=6)
    with MemoryStore(target, embedder) as kept, MemoryStore(target, embedder) as other:
        ids = other.remember_many(texts)
        other.flush()
        for step in range(4):
            for mode in ("lexical", "hybrid"):
                for query in (["tea", "river"], ["kiwi", "lamp"], ["jazz"]):
                    got = kept.recall(" ".join(query), k=8, mode=mode)
                    with MemoryStore(target, embedder) as fresh:
                        want = fresh.recall(" ".join(query), k=8, mode=mode)
                        assert len(kept) == len(fresh) == kept.check().facts == 80 - step  # (-2 +1 a step)
                    assert [h.id for h in got] == [h.id for h in want], (step, mode, query)
                    # (a stale count or frequency moves a score by 1e-3 or more; the vectors' float32 sums by 1e-7)
                    assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-6, abs=1e-6)
            other.forget(ids[step])  # fewer facts: every idf and the count move
            other.forget(ids[40 + step])
            other.remember(f"tea river kiwi x{step}")
            other.update(ids[10 + step], "jazz lamp lamp")
            other.flush()


def test_pruned_top_k_is_the_exhaustive_sum():
    """bm25_top scores only the facts that can reach the answer when the query has common words (MaxScore): on
    random postings of one rare, one common and one very common term (with long and short facts, counts above one
    and many ties), its answer is the exhaustive one, scores to the last bit, ties by rid, for every k."""
    from evermind_memory.store.lexical import (
        TermPostings, _best, _contributions, _essential_candidates, _sum_by_fact, bm25_top, idf,
    )

    rng = np.random.default_rng(21)
    n, pruned = 60_000, 0
    lengths = rng.integers(3, 40, size=n).astype(np.int32)  # (n,)
    lengths[rng.random(n) < 0.3] = 8  # many ties
    for trial in range(6):
        terms = []
        for share in (0.004 * (trial + 1), 0.2, 0.45):
            rids = np.flatnonzero(rng.random(n) < share).astype(np.int64)
            tf = np.where(rng.random(len(rids)) < 0.1, 2, 1).astype(np.int32)
            terms.append(TermPostings(rids, tf, lengths[rids]))
        order = rng.permutation(3)
        terms = [terms[i] for i in order]  # the rare word anywhere in the query
        total_tokens = int(lengths.sum())
        avg = total_tokens / n
        parts = [p for p in terms if len(p.rids)]
        contrib = np.concatenate([_contributions(p, idf(len(p.rids), n), avg) for p in parts])
        all_facts, all_scores = _sum_by_fact(np.concatenate([p.rids for p in parts]), contrib)
        for k in (1, 10, 100, 5_000):
            weights = [idf(len(p.rids), n) for p in parts]
            pruned += _essential_candidates(parts, weights, avg, k) is not None
            want = _best(all_facts, all_scores, k)
            got = bm25_top(terms, n, total_tokens, k)
            assert got[0].tolist() == want[0].tolist(), (trial, k)
            assert got[1].tolist() == want[1].tolist(), (trial, k)
    assert pruned >= 12  # (the pruned path was the one compared, for most queries and k)
