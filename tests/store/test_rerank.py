"""recall(..., rerank=...): the hybrid top 30 reordered by the lexicon word match (store/rerank.py), on both
backends, with the shipped embedder (the one with a lexicon): always with True, never with False, for short notes
only by default; refused where True cannot apply."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evermind_memory import InvalidInput, MemoryStore, default_embedder
from evermind_memory.store.rerank import NOTES_CHARS, RERANK_POOL, RERANK_WEIGHT

FACTS = ["Ada gets migraines every spring", "Ada visits her sister every spring", "Ada plays squash on Fridays",
         "Bob keeps a headache cream in the cupboard", "Ada drinks green tea", "Ada's dog is called Rex",
         "Ada works as a pharmacist in Leeds", "Ada's car needs new brake pads"]


@pytest.fixture(scope="module")
def shipped():
    return default_embedder()


def _match(lexicon, query: str, text: str) -> float:
    """The word match written out: each query word's best cosine with the text's words, by lexicon weight."""
    def unit(i: int) -> list[float]:
        row = [float(x) for x in lexicon.table[i]]
        norm = math.sqrt(sum(x * x for x in row))
        return [x / norm for x in row]

    q_ids, d_ids = lexicon.word_ids(query), lexicon.word_ids(text)
    if not q_ids or not d_ids:
        return 0.0
    total = sum(float(lexicon.weight[i]) for i in q_ids)
    best = [max(sum(a * b for a, b in zip(unit(i), unit(j))) for j in d_ids) for i in q_ids]
    return sum(float(lexicon.weight[i]) * b for i, b in zip(q_ids, best)) / total


def test_rerank_orders_the_hybrid_pool_by_scaled_score_plus_word_match(target, shipped):
    query = "what gives Ada headaches?"
    with MemoryStore(target, shipped) as store:
        store.remember_many(FACTS)
        plain = store.recall(query, k=len(FACTS), rerank=False)
        hits = store.recall(query, k=len(FACTS), rerank=True)
        top3 = store.recall(query, k=3, rerank=True)
    assert {h.id for h in hits} == {h.id for h in plain}  # the same pool, reordered
    low, high = min(h.score for h in plain), max(h.score for h in plain)
    want = {h.id: (h.score - low) / (high - low) + RERANK_WEIGHT * _match(shipped.lexicon, query, h.text)
            for h in plain}
    for h in hits:
        assert h.score == pytest.approx(want[h.id], abs=1e-6)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert [h.id for h in top3] == [h.id for h in hits[:3]]  # k below the pool: the same order, cut
    # the word match reads "headaches" against "migraines", which the summed vectors did not put first
    assert plain[0].text != FACTS[0] and hits[0].text == FACTS[0]


def test_rerank_keeps_hits_past_the_pool_below_it(db_path, shipped):
    facts = [f"note {i}: Ada keeps item {i} in box {i % 7}" for i in range(RERANK_POOL + 12)]
    with MemoryStore(db_path, shipped) as store:
        store.remember_many(facts)
        hits = store.recall("where does Ada keep item 3?", k=RERANK_POOL + 10, rerank=True)
    assert len(hits) == RERANK_POOL + 10
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True) and max(scores[RERANK_POOL:]) <= 0.0 <= min(scores[:RERANK_POOL])


def test_rerank_is_refused_outside_hybrid_and_without_a_lexicon(db_path, embedder, shipped):
    with MemoryStore(db_path, shipped) as store:
        store.remember_many(FACTS)
        for mode in ("vector", "lexical"):
            with pytest.raises(InvalidInput, match="hybrid"):
                store.recall("tea", mode=mode, rerank=True)
            assert store.recall("tea", mode=mode)  # the default (None) asks for nothing outside hybrid
        with pytest.raises(InvalidInput, match="rerank"):
            store.recall("tea", rerank="yes")
    with MemoryStore(db_path.with_name("plain.db"), embedder) as store:  # the test model has no lexicon
        store.remember_many(FACTS)
        assert [h.id for h in store.recall("tea", k=2)] == [h.id for h in store.recall("tea", k=2, rerank=False)]
        with pytest.raises(InvalidInput, match="lexicon"):
            store.recall("tea", rerank=True)


def test_rerank_word_match_is_zero_without_known_words(shipped):
    from evermind_memory.store.rerank import word_match

    got = word_match(shipped.lexicon, "zzqx vvbn", ["Ada drinks green tea", "zzqx"])
    np.testing.assert_array_equal(got, [0.0, 0.0])
    got = word_match(shipped.lexicon, "tea", ["Ada drinks green tea", "qqzz", "coffee"])
    assert got[0] == pytest.approx(1.0, abs=1e-6) and got[1] == 0.0 and 0.0 < got[2] < 1.0


def test_the_default_reranks_short_notes_only(target, shipped):
    query = "what gives Ada headaches?"
    padding = " She wrote it down in the notebook she keeps on the kitchen shelf beside the radio, as usual."
    long_facts = [f + padding * 2 for f in FACTS]
    assert min(len(f) for f in long_facts) >= NOTES_CHARS > max(len(f) for f in FACTS)

    def ranked(view, **kw):
        return [(h.id, h.score) for h in view.recall(query, k=5, **kw)]

    with MemoryStore(target, shipped) as store:
        short, long = store.scope(user="short"), store.scope(user="long")
        short.remember_many(FACTS)
        long.remember_many(long_facts)
        assert ranked(short) == ranked(short, rerank=True) != ranked(short, rerank=False)
        assert short.recall(query, k=1)[0].text == FACTS[0]
        assert ranked(long) == ranked(long, rerank=False) != ranked(long, rerank=True)
        # only the fitted rule's fusion is reranked by default
        assert ranked(short, fusion="rrf") == ranked(short, fusion="rrf", rerank=False)


def test_a_floor_only_drops_reranked_hits(target, shipped):
    """min_relevance and min_score judge the hybrid score and drop hits; the reranked scores and order of the rest
    are the ones recall gives without the floor (they were once scaled among the survivors only, so a lone
    survivor's score fell by 1)."""
    query = "what does Ada drink?"
    with MemoryStore(target, shipped) as store:
        store.remember_many(FACTS)
        plain = store.recall(query, k=len(FACTS))
        hybrid = {h.id: h.score for h in store.recall(query, k=len(FACTS), rerank=False)}
        kept = store.recall(query, k=len(FACTS), min_relevance=0.2)
        floor = sorted(hybrid.values())[len(FACTS) // 2]
        above_score = store.recall(query, k=len(FACTS), min_score=floor)
    assert 0 < len(kept) < len(plain) and plain[0].text == "Ada drinks green tea"
    assert 0 < len(above_score) < len(plain)
    for got, keep in ((kept, lambda h: h.relevance >= 0.2), (above_score, lambda h: hybrid[h.id] >= floor)):
        want = [h for h in plain if keep(h)]
        assert [h.id for h in got] == [h.id for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-9)


def test_explain_shows_the_word_match_of_a_reranked_hit(target, shipped):
    query = "what gives Ada headaches?"
    with MemoryStore(target, shipped) as store:
        store.remember_many(FACTS)
        plain = store.recall(query, k=len(FACTS), rerank=False, explain=True)
        hits = store.recall(query, k=len(FACTS), explain=True)  # short notes: reranked by default
    assert all(h.explain.word_match is None for h in plain)
    low, high = min(h.explain.fused for h in hits), max(h.explain.fused for h in hits)
    for h in hits:
        assert h.explain.word_match == pytest.approx(_match(shipped.lexicon, query, h.text), abs=1e-6)
        assert h.score == pytest.approx((h.explain.fused - low) / (high - low) + RERANK_WEIGHT * h.explain.word_match,
                                        abs=1e-6)
