"""EvermindStore against LangGraph's own InMemoryStore, the reference BaseStore: the same random puts and deletes go
to both, then every get, prefix search (with filters), page of one namespace and list_namespaces answer the same.

Filters are drawn where the two agree by design: InMemoryStore compares with Python's == and float() (so 1 == True
and $gt on a string raises), where we compare typed values (test_langgraph.py covers those cases), so the values
here hold no bools and order operators only meet fields that are always numbers. Query searches are compared
apart, with InMemoryStore indexed by our model (without an index it ignores the query). The shipped model
throughout.
"""

from __future__ import annotations

import pytest
from extras import require

require("langgraph.store.memory", "langgraph")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from langgraph.store.memory import InMemoryStore  # noqa: E402

from evermind_memory.integrations.langgraph import EvermindStore  # noqa: E402

NAMESPACES = [("a",), ("a", "b"), ("a", "c"), ("a", "b", "c"), ("b", "a", "c"), ("users", "ada", "memories")]
KEYS = ["k0", "k1", "k2", "k3"]
LEAVES = [ns for ns in NAMESPACES if not any(o != ns and o[: len(ns)] == ns for o in NAMESPACES)]
PREFIXES = [(), ("a",), ("a", "b"), ("b",), ("users", "ada"), ("z",)]

values = st.fixed_dictionaries(
    {"kind": st.sampled_from(["note", "task"]), "n": st.integers(-2, 2),
     "m": st.fixed_dictionaries({"p": st.integers(0, 2)}), "l": st.lists(st.integers(0, 1), max_size=2)},
    optional={"opt": st.sampled_from(["x", "y"]), "text": st.text(max_size=20)},
)
writes = st.lists(st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(KEYS), st.none() | values), min_size=1,
                  max_size=25)
filters = st.one_of(
    st.fixed_dictionaries({"kind": st.sampled_from(["note", "task"])}),
    st.fixed_dictionaries({"n": st.integers(-2, 2) | st.dictionaries(
        st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"]), st.integers(-2, 2), min_size=1, max_size=2)}),
    st.fixed_dictionaries({"m": st.fixed_dictionaries({"p": st.integers(0, 2)})}),
    st.fixed_dictionaries({"l": st.lists(st.integers(0, 1), max_size=2)}),
    st.fixed_dictionaries({"opt": st.sampled_from(["x", "y"]) | st.fixed_dictionaries({"$ne": st.just("x")})}),
    st.fixed_dictionaries({"kind": st.just("note"), "n": st.fixed_dictionaries({"$gte": st.integers(-1, 1)})}),
)
conditions = st.fixed_dictionaries({}, optional={
    "prefix": st.sampled_from([("a",), ("a", "*", "c"), ("*", "a"), ("users",)]),
    "suffix": st.sampled_from([("c",), ("*", "c"), ("memories",), ("b",)]),
    "max_depth": st.integers(1, 3),
    "limit": st.integers(1, 4),
    "offset": st.integers(0, 3),
})


def snapshot(item) -> tuple:
    return (item.namespace, item.key, item.value)


@pytest.fixture(scope="module")
def shared():
    """One EvermindStore for every example (emptied in between), so the examples do not each open a store."""
    with EvermindStore(":memory:") as s:
        yield s


@settings(max_examples=40, deadline=None)
@given(ops=writes, flts=st.lists(filters, min_size=1, max_size=3), lists=st.lists(conditions, min_size=1, max_size=4),
       page=st.tuples(st.integers(1, 4), st.integers(0, 4)))
def test_every_answer_is_the_reference_stores(shared: EvermindStore, ops, flts, lists, page) -> None:
    ours, ref = shared, InMemoryStore()
    ours.store.clear(confirm=True)
    for ns, key, value in ops:  # value None: a delete
        ours.put(ns, key, value)
        ref.put(ns, key, value)
    for ns in NAMESPACES:
        for key in KEYS:
            got, want = ours.get(ns, key), ref.get(ns, key)
            assert (got and snapshot(got)) == (want and snapshot(want)), (ns, key)
    for prefix in PREFIXES:
        # across namespaces the order is each store's own (ours: the order remembered; InMemoryStore: by namespace)
        assert (sorted(map(snapshot, ours.search(prefix, limit=100)))
                == sorted(map(snapshot, ref.search(prefix, limit=100)))), prefix
        for flt in flts:
            assert (sorted(map(snapshot, ours.search(prefix, filter=flt, limit=100)))
                    == sorted(map(snapshot, ref.search(prefix, filter=flt, limit=100)))), (prefix, flt)
    limit, offset = page
    for ns in LEAVES:  # one namespace: both keep the order items were first put (an update keeps its place)
        assert ([snapshot(i) for i in ours.search(ns, limit=limit, offset=offset)]
                == [snapshot(i) for i in ref.search(ns, limit=limit, offset=offset)]), (ns, limit, offset)
    # InMemoryStore lists a namespace whose items were all deleted (and one a get only looked in: its dict makes
    # an entry on reading); LangGraph's database stores list the namespaces of the items there, as we do
    live = InMemoryStore()
    for item in ref.search((), limit=1000):
        live.put(item.namespace, item.key, item.value)
    for cond in lists:
        assert ours.list_namespaces(**cond) == live.list_namespaces(**cond), cond


NOTES = ["Ada prefers green tea in the morning", "Bob drinks strong black coffee",
         "Ada's flight to Zurich is on Tuesday", "The quarterly report is due on Friday",
         "Carol plays the violin in an orchestra", "The build uses CMake and Ninja", "Ada is allergic to peanuts",
         "The team meets every Monday at nine", "Bob's cat is called Pixel", "Zurich is cold in January"]


def test_query_search_ranks_and_scores_as_the_reference_store_on_our_model() -> None:
    """InMemoryStore indexed with EvermindEmbeddings (our model) is the oracle of semantic search: values of one
    field, so its text of the whole value ("$", keys sorted) is ours too."""
    require("langchain_core", "langchain")
    from evermind_memory.integrations.langchain import EvermindEmbeddings

    emb = EvermindEmbeddings()
    ref = InMemoryStore(index={"dims": emb.dimensions, "embed": emb})
    with EvermindStore(":memory:") as ours:
        for i, note in enumerate(NOTES):
            for store in (ours, ref):
                store.put(("notes", "ada" if "Ada" in note else "other"), f"n{i}", {"text": note})
                store.put(("hidden",), f"h{i}", {"text": note}, index=False)
        for query, prefix, kwargs in [("what does Ada drink?", ("notes",), {}),
                                      ("travel plans", ("notes",), {"limit": 3}),
                                      ("meetings and deadlines", ("notes",), {"limit": 4, "offset": 2}),
                                      ("coffee", ("notes", "other"), {}), ("Zurich", (), {"limit": 13})]:
            got, want = ours.search(prefix, query=query, **kwargs), ref.search(prefix, query=query, **kwargs)
            assert [(i.namespace, i.key) for i in got] == [(i.namespace, i.key) for i in want], query
            # (our rows hold int8 vectors, the reference float32 ones: a cosine moves by a few 1e-4)
            assert [i.score for i in got] == pytest.approx([i.score for i in want], abs=2e-3), query
