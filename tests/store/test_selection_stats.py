"""Lexical statistics over what is searched: inside a scope (or a filter) BM25's idf and average length are
those of the selected facts, so a word held by every one of them (the person's name in that person's scope)
weighs nothing. Checked through MemoryStore on both engines: a scoped or filtered lexical recall scores exactly as
the same recall in a store that holds only the selected facts."""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory import MemoryStore

ADA = ["Ada takes her espresso without sugar.", "Ada prefers green tea in the morning and coffee after lunch.",
       "Ada's flight to Lisbon leaves on Tuesday morning.", "Ada adopted a grey tabby cat named Pixel.",
       "Ada and her cousin share a flat near the river in Porto."]
BOB = ["Bob drinks black coffee every day.", "Bob is allergic to peanuts.", "Bob's sister lives in Zurich.",
       "Bob once lent Cy a book about tea.", "Bob cycles along the river to work every morning.",
       "Bob plays chess on Thursdays.", "Bob's flat has a view of the harbour."]
QUERIES = ["what does Ada drink in the morning?", "Ada tea", "coffee morning river", "Ada cat", "Lisbon flight"]


def _scores(view, query: str) -> dict[str, float]:
    return {h.text: h.score for h in view.recall(query, k=10, mode="lexical")}


def _another(backend: str, tmp_path, request):
    """A second new store of the same engine."""
    return tmp_path / "alone.db" if backend == "sqlite" else request.getfixturevalue("pg_server").new_schema()


@pytest.fixture
def mixed(store):
    store.scope(user="ada").remember_many(ADA)
    store.scope(user="bob").remember_many(BOB)
    return store


def test_scoped_lexical_scores_equal_a_store_of_the_scope_alone(mixed, embedder, tmp_path, backend, request):
    other = _another(backend, tmp_path, request)
    with MemoryStore(other, embedder) as alone:
        alone.remember_many(ADA)
        for q in QUERIES:
            scoped, ref = _scores(mixed.scope(user="ada"), q), _scores(alone, q)
            assert scoped.keys() == ref.keys(), q
            assert np.allclose([scoped[t] for t in ref], list(ref.values()), rtol=1e-6, atol=1e-9), (q, scoped, ref)


def test_a_filter_narrows_the_statistics_too(store, embedder, tmp_path, backend, request):
    store.remember_many(ADA, tags={"person": "ada"})
    store.remember_many(BOB, tags={"person": "bob"})
    other = _another(backend, tmp_path, request)
    with MemoryStore(other, embedder) as alone:
        alone.remember_many(BOB)
        for q in QUERIES:
            got = {h.text: h.score for h in store.recall(q, k=10, mode="lexical", tags={"person": "bob"})}
            ref = _scores(alone, q)
            assert got.keys() == ref.keys(), q
            assert np.allclose([got[t] for t in ref], list(ref.values()), rtol=1e-6, atol=1e-9), (q, got, ref)


def test_the_name_in_every_fact_of_a_scope_weighs_nothing_there(mixed):
    """Store-wide "Ada" is evidence (half the facts lack it); in Ada's scope it is in all of them."""
    wide = {h.text: h.score for h in mixed.recall("Ada", k=10, mode="lexical")}
    scoped = _scores(mixed.scope(user="ada"), "Ada")
    assert min(wide[t] for t in ADA) > 1e-3
    assert max(scoped.values()) < 1e-3
    tea = _scores(mixed.scope(user="ada"), "Ada tea")
    assert max(tea, key=tea.get) == ADA[1]  # the one fact with the informative word, though it is the longest


def test_statistics_follow_new_facts(mixed):
    """The per-selection counts are kept per change: a new fact in the scope changes the idf at once."""
    before = _scores(mixed.scope(user="ada"), "Lisbon")[ADA[2]]
    mixed.scope(user="ada").remember_many([f"Ada packed note {i}." for i in range(6)])
    after = _scores(mixed.scope(user="ada"), "Lisbon")[ADA[2]]
    assert after > before  # "Lisbon" is rarer among more facts
