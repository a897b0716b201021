"""store/fusion.py: candidate pools, features, the fitted rule and its parameters, checked by hand; and the store's
hybrid recall against the same functions run offline on the pool it gathered (parity), with the tiny real
embedder and fitted parameters set on it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from evermind_memory import MemoryStore
from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.store import fusion as fu
from evermind_memory.store.study import gather

from store_helpers import build_embedder


def _pool() -> fu.CandidatePool:
    # lexical list: 10 (bm25 4), 11 (bm25 2), 12 (bm25 1e-6: no evidence); vector list: 11 (0.9), 13 (0.5), 10 (0.4)
    return fu.CandidatePool.build([(10, 4.0), (11, 2.0), (12, 1e-6)], [(11, 0.9), (13, 0.5), (10, 0.4)],
                                  {12: 0.1}, {10: 100, 11: 1200, 12: 50, 13: 600}, df=[1, 3, 0], n_facts=20)


def test_pool_holds_both_lists_with_ranks_and_the_cosine_of_lexical_only_candidates() -> None:
    p = _pool()
    assert p.ids == (10, 11, 12, 13)
    assert p.lex_rank.tolist() == [0, 1, 2, -1] and p.vec_rank.tolist() == [2, 0, -1, 1]
    np.testing.assert_allclose(p.cos, [0.4, 0.9, 0.1, 0.5])
    np.testing.assert_allclose(p.idf, [math.log(19.5 / 1.5), math.log(17.5 / 3.5), math.log(20.5 / 0.5)])
    small = p.truncate(1)  # first of each list only
    assert small.ids == (10, 11) and small.lex_rank.tolist() == [0, -1] and small.vec_rank.tolist() == [-1, 0]
    again = fu.CandidatePool.from_json(json.loads(json.dumps(p.to_json())))
    assert again.ids == p.ids and np.array_equal(again.cos, p.cos) and again.n_facts == 20


def test_features_by_hand() -> None:
    p = _pool()
    names = ["lex", "lex_abs", "lex_rr", "cos", "vec_rr", "vec_gap1", "lex_gap1", "rr_both", "cos_x_cut"]
    x = dict(zip(names, fu.features(p, names).T))
    np.testing.assert_allclose(x["lex"], [1.0, 0.5, 0.0, 0.0])  # 1e-6 is below LEXICAL_EVIDENCE
    most = 2.2 * float(p.idf.sum())
    np.testing.assert_allclose(x["lex_abs"], [4.0 / most, 2.0 / most, 0.0, 0.0])
    np.testing.assert_allclose(x["lex_rr"], [1.0, 0.5, 0.0, 0.0])
    np.testing.assert_allclose(x["vec_rr"], [1 / 3, 1.0, 0.0, 0.5])
    np.testing.assert_allclose(x["vec_gap1"], [0.0, 0.4, 0.0, 0.0])  # 0.9 - 0.5, on the vector list's first only
    np.testing.assert_allclose(x["lex_gap1"], [0.5, 0.0, 0.0, 0.0])  # (4 - 2) / 4
    np.testing.assert_allclose(x["rr_both"], [1 / 3, 0.5, 0.0, 0.0])
    np.testing.assert_allclose(x["cos_x_cut"], [0.0, 0.9 * 0.5, 0.0, 0.0])  # 1200 chars: half unseen
    size = dict(zip(["log_facts", "cos_x_log_facts"], fu.features(p, ["log_facts", "cos_x_log_facts"]).T))
    np.testing.assert_allclose(size["log_facts"], [math.log(21)] * 4)  # 20 facts searched
    np.testing.assert_allclose(size["cos_x_log_facts"], np.array([0.4, 0.9, 0.1, 0.5]) * math.log(21))


def test_learned_rule_splits_into_lexical_and_vector_parts_and_calibrates() -> None:
    params = fu.FusionParams(("lex", "cos", "vec_gap1"), (1.0, 2.0, 0.5), 50, ("score", "margin"), (1.0, 2.0), -1.0)
    p = _pool()
    f = fu.fuse_learned(p, params)
    np.testing.assert_allclose(f.lexical, [1.0, 0.5, 0.0, 0.0])
    np.testing.assert_allclose(f.vector, [0.8, 1.8 + 0.2, 0.2, 1.0])  # 2 x cos (+ 0.5 x 0.4 lead for 11)
    np.testing.assert_allclose(f.score, f.lexical + f.vector)
    z = -1.0 + f.score + 2.0 * (f.score - f.score.max())
    np.testing.assert_allclose(f.relevance, 1 / (1 + np.exp(-z)))
    assert fu.FusionParams.from_dict(json.loads(json.dumps(params.to_dict()))) == params


def test_rules_without_parameters_match_the_dict_functions() -> None:
    p = _pool()
    rule, f = fu.fuse_pool(p, "score", None, 3.0)
    want = fu.fuse_scores({10: 4.0, 11: 2.0, 12: 1e-6}, {10: 0.4, 11: 0.9, 12: 0.1, 13: 0.5}, 3.0)
    assert rule == "weight" and f.relevance is None
    np.testing.assert_allclose(f.score, [want[c] for c in p.ids])
    rule, f = fu.fuse_pool(p, "rrf", None, 3.0)
    want = fu.fuse_rrf([10, 11, 12], [11, 13, 10])
    assert rule == "rrf"
    np.testing.assert_allclose(f.score, [want[c] for c in p.ids])


def test_a_candidate_without_a_vector_is_fused_on_its_words() -> None:
    # 12 is in the lexical list with no vector (cos NaN): its lexical share stands in for the cosine it lacks
    p = fu.CandidatePool.build([(10, 4.0), (12, 4.0)], [(10, 0.5), (13, 0.9)], {}, {10: 9, 12: 9, 13: 9}, [1], 20)
    assert math.isnan(p.cos[1])
    _, weight = fu.fuse_pool(p, "score", None, 2.0)
    np.testing.assert_allclose(weight.score, [1.0 + 2.0 * 0.5, 1.0 + 2.0 * 1.0, 2.0 * 0.9])
    _, rrf = fu.fuse_pool(p, "rrf", None, 2.0)
    np.testing.assert_allclose(rrf.score, [2 / 61, 2 / 62, 1 / 62])  # 12: its lexical rank twice
    params = fu.FusionParams(("lex", "cos"), (1.0, 0.5), 50, ("score",), (1.0,), 0.0)
    _, learned = fu.fuse_pool(p, "score", params, 2.0)
    np.testing.assert_allclose(learned.vector, [0.25, 0.5, 0.45])
    assert np.isfinite(learned.relevance).all()


@pytest.mark.parametrize("damage", [
    {"format": "other"}, {"ranking": {"features": ["nope"], "weights": [1.0], "pool": 50}},
    {"ranking": {"features": ["lex", "cos"], "weights": [1.0], "pool": 50}},
    {"ranking": {"features": ["lex"], "weights": [float("nan")], "pool": 50}},
    {"ranking": {"features": ["lex"], "weights": [1.0], "pool": 0}},
    {"relevance": {"features": ["score"], "weights": [], "bias": 0.0}},
    {"fingerprint": 7},
])
def test_malformed_parameters_are_refused(damage: dict, tmp_path) -> None:
    good = fu.FusionParams(("lex", "cos"), (1.0, 0.5), 50, ("score",), (1.0,), 0.0, "fp").to_dict()
    bad = {**good, **damage}
    with pytest.raises(CheckpointError):
        fu.FusionParams.from_dict(bad)
    path = tmp_path / "f.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(CheckpointError):
        fu.load_params(path)
    path.write_bytes(b" " * (fu.PARAMS_MAX_BYTES + 1))
    with pytest.raises(CheckpointError, match="bytes"):
        fu.load_params(path)


FACTS = [f"fact {i} about {w} and {v}" for i, (w, v) in enumerate(
    [("apples", "pears"), ("trains", "buses"), ("apples", "trains"), ("music", "films"), ("pears", "music"),
     ("rivers", "lakes"), ("buses", "rivers"), ("films", "lakes")])]


def test_store_hybrid_is_the_offline_rule_on_the_pool_it_gathered() -> None:
    emb = build_embedder(seed=2)  # its own instance: the attribute below must not reach other tests
    emb.fusion_params = fu.FusionParams(("lex", "cos", "vec_gap1"), (1.0, 0.7, 0.3), 4, ("score", "lex_abs"),
                                        (1.5, 2.0), -2.0)
    with MemoryStore(":memory:", emb, background_embedding=False) as store:
        store.remember_many(FACTS)
        for query in ("apples and trains", "music films", "lakes", "zzz unknown"):
            hits = store.recall(query, k=5, explain=True)
            rows, pool = gather(store, query, 10)
            f = fu.fuse_learned(pool, emb.fusion_params)
            order = sorted(range(len(pool.ids)), key=lambda i: (-f.score[i], pool.ids[i]))[:5]
            assert [h.text for h in hits] == [rows[pool.ids[i]].text for i in order]
            for h, i in zip(hits, order):
                assert h.score == pytest.approx(f.score[i]) and h.relevance == pytest.approx(f.relevance[i])
                e = h.explain
                assert e.rule == "learned" and e.fused == pytest.approx(e.lexical + e.vector) == pytest.approx(h.score)
                assert (e.bm25 is None) == (pool.lex_rank[i] < 0) and e.cosine == pytest.approx(pool.cos[i])
        plain = store.recall("apples and trains", k=3)
        assert all(h.explain is None and h.relevance is not None for h in plain)
        kept = store.recall("apples and trains", k=8, min_relevance=0.5)
        assert all(h.relevance >= 0.5 for h in kept)
        rrf = store.recall("apples and trains", k=3, fusion="rrf", explain=True)
        assert rrf[0].explain.rule == "rrf" and rrf[0].relevance is not None


def test_min_relevance_needs_hybrid_and_a_fitted_rule() -> None:
    with MemoryStore(":memory:", build_embedder(seed=2), background_embedding=False) as store:
        store.remember_many(FACTS)
        hit = store.recall("apples", k=1, explain=True)[0]
        assert hit.relevance is None and hit.explain.rule == "weight"
        with pytest.raises(InvalidInput, match="fitted fusion rule") as no_rule:
            store.recall("apples", min_relevance=0.2)
        assert "mode=" not in str(no_rule.value)  # hybrid is what was asked: the rule is what is missing
        with pytest.raises(InvalidInput, match="judges hybrid recall, not mode='vector'"):
            store.recall("apples", mode="vector", min_relevance=0.2)
        for bad in (-0.1, 1.5, True, "0.5", float("nan")):
            with pytest.raises(InvalidInput, match="min_relevance"):
                store.recall("apples", min_relevance=bad)
        with pytest.raises(InvalidInput, match="explain"):
            store.recall("apples", explain=1)


def test_relevance_and_explain_hold_under_filters_scopes_and_recency() -> None:
    emb = build_embedder(seed=2)
    emb.fusion_params = fu.FusionParams(("lex", "cos"), (1.0, 0.7), 4, ("score", "lex_abs"), (1.5, 2.0), -2.0)
    with MemoryStore(":memory:", emb, background_embedding=False) as store:
        ada, bob = store.scope(user="ada"), store.scope(user="bob")
        for i, text in enumerate(FACTS):
            (ada if i % 2 else bob).remember(text, tags={"n": i})
        every = store.recall("apples trains music", k=8, explain=True)
        assert {h.text for h in every} == set(FACTS)
        hits = ada.recall("apples trains music", k=8, where={"n": {"$gte": 3}}, explain=True, recency=3600.0)
        assert hits and {h.text for h in hits} == {FACTS[i] for i in (3, 5, 7)}
        for h in hits:
            assert h.explain.rule == "learned" and 0.0 <= h.relevance <= 1.0
            assert h.score == pytest.approx(h.explain.fused, rel=1e-3)  # just made: the recency weight is ~1
        again = {h.id: h.relevance for h in ada.recall("apples trains music", k=8, where={"n": {"$gte": 3}})}
        assert again == pytest.approx({h.id: h.relevance for h in hits})  # relevance ignores recency
        floor = sorted(again.values())[1]
        kept = ada.recall("apples trains music", k=8, where={"n": {"$gte": 3}}, min_relevance=floor, recency=3600.0)
        assert {h.id for h in kept} == {i for i, r in again.items() if r >= floor} and len(kept) == 2
        assert bob.recall("apples", k=8, min_relevance=0.0, since="2000-01-01T00:00:00+00:00")
        assert all(h.text in FACTS[::2] for h in bob.recall("apples", k=8, min_relevance=0.0))


def test_the_pool_says_which_query_words_and_names_each_candidate_holds(tmp_path):
    """Coverage (the share of the query's idf a fact's words hold) and names (the share of the query's capitalised
    words it holds) are gathered for every hybrid candidate, without BM25's length normalisation: two facts that
    hold the same words cover the query equally, however long."""
    from evermind_memory import MemoryStore
    from evermind_memory.store.study import gather
    from store_helpers import build_embedder

    facts = ["Ada prefers green tea in the morning.", "Bob drinks black coffee every day.",
             "Ada likes tea, and in the long summer evenings she also likes to sit in the garden with a book.",
             "The train leaves at seven."]
    filler = [f"Note {i}: the meeting room is booked." for i in range(6)]  # so "ada" and "tea" are rare words
    with MemoryStore(tmp_path / "m.db", build_embedder(seed=0)) as store:
        store.remember_many(facts + filler)
        rows, pool = gather(store, "does Ada drink tea?", 10)
    by_text = {rows[r].text: (c, n) for r, c, n in zip(pool.ids, pool.cover, pool.names)}
    assert by_text[facts[0]] == pytest.approx(by_text[facts[2]])  # same words held, lengths differ
    assert by_text[facts[0]][1] == 1.0 and by_text[facts[1]][1] == 0.0  # "Ada" held / not held
    assert 0 < by_text[facts[1]][0] < by_text[facts[0]][0]  # "drink" (1 fact) < "ada" + "tea" (2 facts each)
    assert facts[3] not in by_text or by_text[facts[3]] == (0.0, 0.0)


def test_short_notes_and_documents_get_their_own_lexical_evidence():
    """The candidates' median length picks the regime: documents are scored by BM25 ("docs_lex"), short notes by
    which query words they hold ("notes_cover"), each side with its own vector weight ("notes_cos")."""
    def pool(chars: list[int]) -> fu.CandidatePool:
        n = len(chars)
        return fu.CandidatePool(tuple(range(n)), np.linspace(2.0, 1.0, n), np.arange(n, dtype=np.int32),
                                np.full(n, 0.5), np.arange(n, dtype=np.int32), np.array(chars, dtype=np.float64),
                                np.array([1.0, 1.0]), 100, np.linspace(1.0, 0.5, n), np.zeros(n))
    notes, docs = pool([40, 60, 80, 900]), pool([400, 900, 1200, 60])
    f_notes = fu.features(notes, ["docs_lex", "notes_cover", "notes_cos", "notes"])
    f_docs = fu.features(docs, ["docs_lex", "notes_cover", "notes_cos", "notes"])
    assert (f_notes[:, 0] == 0).all() and np.allclose(f_notes[:, 1], notes.cover) and (f_notes[:, 3] == 1).all()
    assert np.allclose(f_docs[:, 0], fu.features(docs, ["lex"])[:, 0]) and (f_docs[:, 1:] == 0).all()
    assert np.allclose(f_notes[:, 2], 0.5) and (f_docs[:, 2] == 0).all()
