"""Where-filters through the store: typed tags round-trip, recall/list/count/forget_where agree with the Python
evaluator (Filter.matches over store.list()), and vector recall under a filter equals brute force, both below
the exhaustive threshold and above it (hnswlib's filtered search)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evermind_memory import InvalidInput, MemoryStore
from evermind_memory.store.filters import parse_where
from evermind_memory.store.search import EXACT_FILTER_MAX
from store_helpers import as_rows_hold

COLOURS = ["red", "green", "blue", "amber"]


def facts(n: int) -> list[tuple[str, dict]]:
    """n texts with typed tags: a str, an int, a float and a bool, some tags missing."""
    out = []
    for i in range(n):
        tags = {"colour": COLOURS[i % 4], "n": i % 7, "w": (i % 5) / 2, "even": i % 2 == 0}
        if i % 9 == 0:
            del tags["w"]
        out.append((f"fact {i}: the {COLOURS[i % 4]} box holds {i % 13} marbles and note {i % 17}", tags))
    return out


def brute_force(store: MemoryStore, embedder, query: str, where: dict, k: int,
                vectors: dict | None = None) -> list[tuple[str, float]]:
    """The exact answer: every fact the evaluator accepts, ranked by cosine of the query with its vector as stored
    (`vectors`: id -> the embedder's vector of that fact, when already computed)."""
    f = parse_where(where)
    kept = [fact for fact in store.list(limit=100_000) if f.matches(fact)]
    if not kept:
        return []
    if vectors is None:
        vecs = np.asarray(embedder.embed_many([fact.text for fact in kept]), dtype=np.float32)  # (N, D)
    else:
        vecs = np.stack([vectors[fact.id] for fact in kept])  # (N, D)
    vecs = as_rows_hold(vecs)  # (N, D) as a row stores them (int8 and a scale), read back at unit length
    scores = vecs @ np.asarray(embedder.embed(query), dtype=np.float32)  # (N,)
    order = np.lexsort((np.arange(len(kept)), -scores))[:k]
    return [(kept[i].id, float(scores[i])) for i in order]


def assert_same_ranking(got, want, *, tol: float = 1e-5) -> None:
    """Equal up to ties: the same scores position by position, and the same ids where scores differ."""
    assert len(got) == len(want)
    assert np.allclose([s for _, s in got], [s for _, s in want], atol=tol)
    kth = want[-1][1] if want else 0.0
    assert {i for i, s in got if s > kth + tol} == {i for i, s in want if s > kth + tol}


@pytest.fixture(scope="module")
def small(tmp_path_factory, embedder):
    with MemoryStore(tmp_path_factory.mktemp("small") / "m.db", embedder) as s:
        for text, tags in facts(60):
            s.remember(text, tags=tags, source="chat" if "red" in text else None)
        s.flush()
        yield s


WHERES = [
    {"colour": "red"},
    {"n": {"$gte": 3}, "even": True},
    {"$or": [{"colour": {"$in": ["green", "blue"]}}, {"w": {"$lt": 1}}]},
    {"w": {"$exists": False}},
    {"colour": {"$ne": "red"}, "n": {"$nin": [0, 1, 2]}},
    {"source": "chat"},
    {"n": 3.0},  # int and float compare by value
    {"n": "3"},  # a string is not a number: nothing
]


@pytest.mark.parametrize("where", WHERES)
def test_list_count_and_vector_recall_match_the_evaluator(small, embedder, where):
    f = parse_where(where)
    every = small.list(limit=1000)
    expected = [fact.id for fact in every if f.matches(fact)]
    assert [fact.id for fact in small.list(where=where, limit=1000)] == expected
    assert small.count(where=where) == len(expected)
    got = [(h.id, h.score) for h in small.recall("the blue box with marbles", k=7, mode="vector", where=where)]
    assert_same_ranking(got, brute_force(small, embedder, "the blue box with marbles", where, 7))
    lexical = small.recall("marbles", k=100, mode="lexical", where=where)
    assert {h.id for h in lexical} <= set(expected)
    assert {h.id for h in small.recall("marbles", k=100, mode="hybrid", where=where)} <= set(expected)


def test_typed_tags_round_trip_and_filter_by_type(store):
    fid = store.remember("typed", tags={"s": "3", "i": 3, "f": 2.5, "b": False, "big": 2**53 - 1})
    fact = store.get(fid)
    assert fact.tags == {"s": "3", "i": 3, "f": 2.5, "b": False, "big": 2**53 - 1}
    assert type(fact.tags["i"]) is int and type(fact.tags["b"]) is bool
    assert store.count(tags={"i": 3}) == 1 and store.count(tags={"i": "3"}) == 0 and store.count(tags={"s": 3}) == 0
    assert store.count(where={"b": False}) == 1 and store.count(where={"b": 0}) == 0  # a bool is not a number
    assert store.update(fid, tags={"i": 4}, replace_tags=True).tags == {"i": 4}
    assert store.count(where={"i": {"$gt": 3.5}}) == 1 and store.history(fid)[-1].tags == {"i": 4}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tags=st.dictionaries(
    st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True),
    st.one_of(st.text(max_size=8).filter(lambda t: "\x00" not in t and not any(0xD800 <= ord(c) <= 0xDFFF for c in t)),
              st.integers(-(2**53 - 1), 2**53 - 1), st.floats(allow_nan=False, allow_infinity=False), st.booleans()),
    max_size=5))
def test_remember_then_get_gives_back_the_same_typed_tags(tmp_path_factory, embedder, tags):
    with MemoryStore(":memory:", embedder, background_embedding=True) as s:
        fact = s.get(s.remember("x", tags=tags))
        assert fact.tags == tags and {k: type(v) for k, v in fact.tags.items()} == {k: type(v) for k, v in tags.items()}
        assert s.count(tags=tags) == 1


def test_forget_where_removes_exactly_the_matching_facts(tmp_path, embedder):
    with MemoryStore(tmp_path / "f.db", embedder) as s:
        for text, tags in facts(30):
            s.remember(text, tags=tags)
        where = {"$or": [{"n": {"$lte": 1}}, {"colour": "amber"}]}
        f = parse_where(where)
        doomed = {fact.id for fact in s.list() if f.matches(fact)}
        assert s.forget_where(where=where) == len(doomed) > 0
        assert not doomed & {fact.id for fact in s.list()} and len(s) == 30 - len(doomed)
        assert all(s.history(fid)[-1].op == "forget" for fid in doomed)
        assert s.check().ok


def test_filter_errors_name_the_argument_and_the_place(store):
    with pytest.raises(InvalidInput, match=r'where\["\$or"\]\[1\]\["n"\]: \$gt expects a number or a string'):
        store.recall("x", where={"$or": [{"a": 1}, {"n": {"$gt": True}}]})
    with pytest.raises(InvalidInput, match="where expects a dict"):
        store.list(where="person=ada")
    with pytest.raises(InvalidInput, match="since .* must not be after until"):
        store.count(since="2025-06-01T00:00:00Z", until="2025-05-01T00:00:00Z")
    with pytest.raises(InvalidInput, match="naive"):
        store.recall("x", since="2025-06-01T00:00:00")
    with pytest.raises(InvalidInput, match="source expected a str"):
        store.recall("x", source=3)


# ---- above the exhaustive threshold: hnswlib's filtered search ------------------------------------------------
@pytest.fixture(scope="module")
def large(tmp_path_factory, embedder):
    n = int(EXACT_FILTER_MAX * 1.5)
    rows = facts(n)
    with MemoryStore(tmp_path_factory.mktemp("large") / "m.db", embedder) as s:
        for start in range(0, n, 2000):  # one transaction per tag set: the batch API shares its tags
            chunk = rows[start:start + 2000]
            for colour in COLOURS:
                texts = [t for t, tags in chunk if tags["colour"] == colour]
                s.remember_many(texts, tags={"colour": colour, "big": colour != "amber"})
        every = s.list(limit=100_000)
        vectors = np.asarray(embedder.embed_many([f.text for f in every]), dtype=np.float32)  # (N, D), once
        yield s, dict(zip([f.id for f in every], vectors))


@pytest.mark.parametrize("where", [{"big": True}, {"colour": {"$ne": "amber"}}])
def test_filtered_hnsw_recall_matches_brute_force(large, embedder, where):
    large, vectors = large
    matching = large.count(where=where)
    assert matching > EXACT_FILTER_MAX and matching * 10 > len(large)  # the filtered-HNSW branch, not exhaustive
    found, wanted = 0, 0
    for q in ["the red box holds 3 marbles", "note 12 about a green box", "blue marbles", "amber box note 5"]:
        got = [(h.id, h.score) for h in large.recall(q, k=10, mode="vector", where=where)]
        want = brute_force(large, embedder, q, where, 10, vectors)
        assert len(got) == 10 and {i for i, _ in got} <= {f.id for f in large.list(where=where, limit=100_000)}
        kth = want[-1][1]
        found += sum(1 for _, s in got if s >= kth - 1e-5)  # tie-aware recall@10
        wanted += len(want)
    assert found / wanted >= 0.95
