"""EvermindStore against LangGraph's documented BaseStore semantics (langgraph ships no store conformance suite):
items, namespaces, list_namespaces, filters, semantic search, TTL, async and cancellation, scopes, and a real
graph using it. The shipped model throughout."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from extras import require

require("langgraph.store.base", "langgraph")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from langgraph.store.base import InvalidNamespaceError, Item, PutOp, SearchOp  # noqa: E402

from evermind_memory import InvalidInput, MemoryStore  # noqa: E402
from evermind_memory.integrations.langgraph import EvermindStore, item_id, item_tags, matches  # noqa: E402


@pytest.fixture
def lg():
    with EvermindStore(":memory:") as s:
        yield s


def test_put_get_update_delete_round_trip(lg: EvermindStore) -> None:
    ns = ("users", "ada", "memories")
    value = {"text": "Ada prefers green tea", "n": 2, "nested": {"a": [1, {"b": None}]}, "ok": True}
    assert lg.get(ns, "tea") is None
    lg.put(ns, "tea", value)
    item = lg.get(ns, "tea")
    assert type(item) is Item and item.value == value and item.key == "tea" and item.namespace == ns
    assert item.created_at.tzinfo is not None and item.created_at == item.updated_at
    time.sleep(0.01)
    lg.put(ns, "tea", {"text": "Ada prefers oolong"})
    again = lg.get(ns, "tea")
    assert again.value == {"text": "Ada prefers oolong"} and again.created_at == item.created_at
    assert again.updated_at > item.updated_at
    assert lg.get(("users", "ada"), "tea") is None and lg.get(ns, "other") is None
    lg.delete(ns, "tea")
    lg.delete(ns, "tea")  # deleting what is gone is a no-op
    assert lg.get(ns, "tea") is None
    assert [c.op for c in lg.store.history(item_id(ns, "tea"))] == ["remember", "update", "forget"]


def test_namespaces_are_validated_as_langgraph_does(lg: EvermindStore) -> None:
    for bad in [(), ("a", "b.c"), ("a", ""), ("langgraph", "x")]:
        with pytest.raises(InvalidNamespaceError):
            lg.put(bad, "k", {"v": 1})
    for bad in [(), ("a", "x.y"), ("a", "")]:  # through batch: ours, both an InvalidNamespaceError and an InvalidInput
        with pytest.raises(InvalidNamespaceError):
            lg.batch([PutOp(bad, "k", {"v": 1})])
        with pytest.raises(InvalidInput):
            lg.batch([PutOp(bad, "k", {"v": 1})])
    lg.batch([PutOp(("langgraph", "foo"), "bar", {"v": 1})])  # past the public put, as InMemoryStore allows
    assert lg.get(("langgraph", "foo"), "bar").value == {"v": 1}
    with pytest.raises(InvalidNamespaceError, match="at most 16"):
        lg.put(tuple(f"l{i}" for i in range(17)), "k", {"v": 1})


def test_values_must_be_json(lg: EvermindStore) -> None:
    for value in (["a"], "text", 3):  # not a dict: said so (it once leaked AttributeError from the tag reader)
        with pytest.raises(InvalidInput, match="expected value to be a dict"):
            lg.put(("a",), "k", value)
    with pytest.raises(InvalidInput, match="JSON value"):
        lg.put(("a",), "k", {"s": {1, 2}})
    with pytest.raises(InvalidInput, match="JSON value"):
        lg.put(("a",), "k", {"x": float("nan")})
    with pytest.raises(InvalidInput, match="100,000"):
        lg.put(("a",), "k", {"text": "x" * 100_001})
    with pytest.raises(InvalidInput, match="ttl"):
        lg.put(("a",), "k", {"v": 1}, ttl=-1)
    with pytest.raises(InvalidInput, match="lone surrogate"):
        lg.put(("a",), "k", {"s": "\ud800"})
    with pytest.raises(InvalidInput, match="key to be a str .* without NUL"):
        lg.put(("a",), "k\x00", {"v": 1})
    lg.put(("a",), "nul", {"s": "a\x00b", "n": 2**60})  # JSON text holds both; neither can be a tag, Python filters
    assert lg.get(("a",), "nul").value == {"s": "a\x00b", "n": 2**60}
    assert [r.key for r in lg.search(("a",), filter={"s": "a\x00b"})] == ["nul"]
    assert [r.key for r in lg.search(("a",), filter={"n": {"$gt": 2**60 - 1}})] == ["nul"]
    assert lg.search(("a",), filter={"s": "ab"}) == [] and lg.search(("a",), filter={"n": 2**60 + 1}) == []


NAMESPACES = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"), ("a", "c", "f"),
              ("b", "a", "f"), ("users", "123"), ("users", "456", "settings"), ("admin", "users", "789")]


def test_list_namespaces_prefix_suffix_wildcards_depth_and_pages(lg: EvermindStore) -> None:
    for i, ns in enumerate(NAMESPACES):
        lg.put(ns, f"id_{i}", {"data": f"value_{i:02d}"})
    lg.put(("a", "b", "c"), "second", {"data": "same namespace twice"})
    assert lg.list_namespaces() == sorted(NAMESPACES)
    assert lg.list_namespaces(prefix=("a", "b")) == [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"),
                                                     ("a", "b", "f")]
    assert lg.list_namespaces(suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert lg.list_namespaces(prefix=("a",), suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f")]
    assert lg.list_namespaces(prefix=("a", "b"), max_depth=3) == [("a", "b", "c"), ("a", "b", "d"), ("a", "b", "f")]
    assert lg.list_namespaces(prefix=("a", "b"), limit=2) == [("a", "b", "c"), ("a", "b", "d", "e")]
    assert lg.list_namespaces(prefix=("a", "b"), offset=2) == [("a", "b", "d", "i"), ("a", "b", "f")]
    assert lg.list_namespaces(prefix=("a", "*", "f")) == [("a", "b", "f"), ("a", "c", "f")]
    assert lg.list_namespaces(suffix=("*", "f")) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert lg.list_namespaces(prefix=("users", "123")) == [("users", "123")]
    assert lg.list_namespaces(prefix=("nonexistent",)) == []
    assert lg.list_namespaces(max_depth=1) == [("a",), ("admin",), ("b",), ("users",)]


def test_search_by_prefix_in_order_with_limit_and_offset(lg: EvermindStore) -> None:
    for i in range(12):
        lg.put(("docs", "team", f"p{i % 3}"), f"k{i:02d}", {"i": i})
    lg.put(("other",), "x", {"i": 99})
    assert [r.key for r in lg.search(("docs",), limit=20)] == [f"k{i:02d}" for i in range(12)]
    assert [r.key for r in lg.search(("docs", "team", "p1"))] == ["k01", "k04", "k07", "k10"]
    assert [r.key for r in lg.search(("docs",), limit=3, offset=4)] == ["k04", "k05", "k06"]
    assert len(lg.search((), limit=100)) == 13 and lg.search(("docs",), limit=0) == []
    assert all(r.score is None for r in lg.search(("docs",)))


def test_filters_exact_operators_nested_lists_and_types(lg: EvermindStore) -> None:
    items = {
        "a": {"kind": "note", "n": 3, "tags": ["x", "y"], "meta": {"lang": "en", "v": 1}},
        "b": {"kind": "note", "n": 7.5, "tags": ["y"], "meta": {"lang": "fr"}},
        "c": {"kind": "task", "n": "3", "done": True},
        "d": {"kind": "task", "n": True},
    }
    for key, value in items.items():
        lg.put(("f",), key, value)

    def keys(flt) -> list[str]:
        return [r.key for r in lg.search(("f",), filter=flt)]

    assert keys({"kind": "note"}) == ["a", "b"]
    assert keys({"n": 3}) == ["a"]  # typed: not "3", not True
    assert keys({"n": "3"}) == ["c"] and keys({"n": True}) == ["d"]
    assert keys({"n": {"$gt": 3}}) == ["b"] and keys({"n": {"$gte": 3, "$lt": 7.5}}) == ["a"]
    assert keys({"n": {"$ne": 3}}) == ["b", "c", "d"]
    assert keys({"done": {"$ne": True}}) == ["a", "b", "d"]  # $ne also matches items without the field
    assert keys({"meta": {"lang": "en"}}) == ["a"] and keys({"meta": {"v": {"$gte": 1}}}) == ["a"]
    assert keys({"tags": ["y"]}) == ["b"] and keys({"tags": ["x", "y"]}) == ["a"]
    assert keys({"kind": "task", "done": True}) == ["c"]
    with pytest.raises(InvalidInput, match=r"\$in.*not a LangGraph filter operator"):
        keys({"n": {"$in": [3]}})
    with pytest.raises(InvalidInput, match=r"\$gt orders numbers or strings"):
        keys({"n": {"$gt": True}})


def test_items_whose_fields_do_not_fit_the_tags_are_still_filtered_exactly(lg: EvermindStore) -> None:
    wide = {f"f{i:02d}": i for i in range(40)}  # more leaves than the 32-tag budget
    lg.put(("w",), "wide", wide)
    lg.put(("w",), "long", {"text": "x" * 600, "f39": 39})
    lg.put(("w",), "odd key", {"odd key!": 1, "f39": 0})
    assert [r.key for r in lg.search(("w",), filter={"f39": 39})] == ["wide", "long"]
    assert [r.key for r in lg.search(("w",), filter={"text": "x" * 600})] == ["long"]
    assert [r.key for r in lg.search(("w",), filter={"odd key!": 1})] == ["odd key"]
    assert [r.key for r in lg.search(("w",), filter={"f05": {"$lt": 6}}, query="numbers")] == ["wide"]


values = st.dictionaries(st.sampled_from(["a", "b", "c"]),
                        st.one_of(st.integers(-3, 3), st.sampled_from(["x", "y", "3"]), st.booleans(),
                                  st.lists(st.integers(0, 2), max_size=2),
                                  st.dictionaries(st.sampled_from(["p", "q"]), st.integers(0, 2), max_size=2)),
                        max_size=3)
conditions = st.one_of(
    st.integers(-3, 3), st.sampled_from(["x", "3"]), st.booleans(), st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"]), st.integers(-3, 3), min_size=1,
                    max_size=2),
    st.dictionaries(st.sampled_from(["$eq", "$ne"]), st.sampled_from(["x", True, 1]), min_size=1, max_size=1),
    st.dictionaries(st.sampled_from(["p", "q"]), st.integers(0, 2), min_size=1, max_size=2),
)
filters = st.dictionaries(st.sampled_from(["a", "b", "c"]), conditions, min_size=1, max_size=2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(values, min_size=1, max_size=8), flt=filters)
def test_search_returns_exactly_the_items_the_filter_matches(items, flt) -> None:
    with EvermindStore(":memory:") as s:
        for i, value in enumerate(items):
            s.put(("p", str(i % 2)), f"k{i}", value)
        want = [f"k{i}" for i, value in enumerate(items) if matches(value, flt)]
        assert [r.key for r in s.search(("p",), filter=flt, limit=50)] == want
        assert sorted(r.key for r in s.search(("p",), filter=flt, query="x", limit=50)) == sorted(want)


def test_matches_worked_examples() -> None:
    assert matches({"n": 1.0}, {"n": 1}) and not matches({"n": True}, {"n": 1}) and not matches({"n": 1}, {"n": "1"})
    assert matches({}, {"n": {"$ne": 1}}) and not matches({}, {"n": {"$lt": 1}})
    assert matches({"m": {"a": 1, "b": 2}}, {"m": {"a": 1}}) and not matches({"m": 3}, {"m": {"a": 1}})
    assert matches({"l": [1, {"x": "y"}]}, {"l": [1.0, {"x": "y"}]}) and not matches({"l": [1, 2]}, {"l": [1]})
    assert matches({"s": "b"}, {"s": {"$gt": "a"}}) and not matches({"s": "b"}, {"s": {"$gt": 1}})


def test_semantic_search_ranks_by_meaning_and_puts_unindexed_items_last(lg: EvermindStore) -> None:
    lg.put(("mem", "ada"), "tea", {"text": "Ada prefers green tea in the morning", "kind": "pref"})
    lg.put(("mem", "ada"), "flight", {"text": "Ada's flight to Zurich leaves on Tuesday", "kind": "travel"})
    lg.put(("mem", "ada"), "code", {"text": "The build uses CMake and Ninja", "kind": "work"})
    lg.put(("mem", "ada"), "secret", {"text": "green tea green tea green tea"}, index=False)
    hits = lg.search(("mem",), query="what does Ada drink in the morning?", limit=4)
    assert hits[0].key == "tea" and [h.key for h in hits][-1] == "secret" and hits[-1].score is None
    scores = [h.score for h in hits[:-1]]
    assert all(isinstance(x, float) for x in scores) and scores == sorted(scores, reverse=True)
    assert [h.key for h in lg.search(("mem",), query="green tea", filter={"kind": "travel"})] == ["flight"]
    assert [h.key for h in lg.search(("mem",), query="green tea", limit=1, offset=1)] != ["tea"]
    assert lg.search(("nothing",), query="tea") == []
    assert len(lg.search(("mem",), query="tea", offset=1, limit=5000)) == 3  # fewer items than the 1000 it ranks


def test_query_pages_reach_every_unindexed_item_in_turn(lg: EvermindStore) -> None:
    """Pages past the scored items go on into the unindexed ones, as InMemoryStore's do (every page after them
    once started again at the first unindexed item, and the last could never be reached)."""
    lg.put(("docs",), "i1", {"text": "apples are red fruit"})
    lg.put(("docs",), "i2", {"text": "bananas are yellow fruit"})
    for j in range(3):
        lg.put(("docs",), f"n{j}", {"text": f"unindexed {j}"}, index=False)
    pages = [[h.key for h in lg.search(("docs",), query="fruit", limit=2, offset=o)] for o in range(0, 6, 2)]
    assert sorted(pages[0]) == ["i1", "i2"] and pages[1:] == [["n0", "n1"], ["n2"]]


def test_semantic_search_under_a_selective_filter_is_not_cut_short() -> None:
    with EvermindStore(":memory:") as s:
        for i in range(60):
            s.put(("bulk",), f"k{i}", {"text": f"green tea note number {i}", "rare": i in (7, 41)})
        assert sorted(r.key
                      for r in s.search(("bulk",), query="green tea", filter={"rare": True}, limit=5)) == ["k41", "k7"]


@pytest.mark.slow
def test_a_query_page_past_the_ranked_matches_is_an_error_not_a_short_answer() -> None:
    with EvermindStore(":memory:") as s:
        # 1005 items in one batch (as many puts would make them; put embeds one at a time)
        s.store.remember_many([json.dumps({"text": f"note number {i}"}) for i in range(1005)],
                              tags=item_tags(("n",), "k", {"text": "note"}))
        assert len(s.search(("n",), query="note", limit=1000)) == 1000
        with pytest.raises(InvalidInput, match="ranks the 1000 best matches"):
            s.search(("n",), query="note", offset=10, limit=995)
        # a filter only Python can check (a long string) dropping matches past the 1000 ranked
        s.put(("n",), "rare", {"text": "y" * 600, "note": "note number rare"})
        with pytest.raises(InvalidInput, match="passed the filter"):
            s.search(("n",), query="note", filter={"text": "y" * 600}, limit=2)


def test_ttl_expiry_default_and_refresh_on_read(tmp_path: Path) -> None:
    with EvermindStore(tmp_path / "ttl.db", ttl={"default_ttl": 1.0, "refresh_on_read": True}) as lg:
        lg.put(("t",), "default", {"v": 1})  # default_ttl: one minute
        lg.put(("t",), "forever", {"v": 2}, ttl=None)
        lg.put(("t",), "long", {"v": 3}, ttl=600)
        lg.put(("t",), "short", {"v": 4}, ttl=0.002)  # 120 ms
        facts = {f.tags["lg.key"]: f for f in lg.store.list()}
        now = datetime.now(timezone.utc)
        assert abs(facts["default"].expires_at - (now + timedelta(minutes=1))) < timedelta(seconds=5)
        assert facts["forever"].expires_at is None
        lg.search(("t",))  # a read at once, well within 1% of 600 minutes: "long" is not rewritten
        assert lg.store.get(item_id(("t",), "long")).expires_at == facts["long"].expires_at
        time.sleep(0.7)  # past the 120 ms of "short", and past 1% (0.6 s) of the minute of "default"
        assert lg.get(("t",), "short") is None  # expired: never returned, swept or not
        assert sorted(r.key for r in lg.search(("t",), refresh_ttl=False)) == ["default", "forever", "long"]
        assert lg.sweep() in (0, 1) and lg.store.stats().expired == 0  # (the store's sweeper may have been first)
        before = lg.store.get(item_id(("t",), "default")).expires_at
        lg.get(("t",), "default", refresh_ttl=False)
        assert lg.store.get(item_id(("t",), "default")).expires_at == before
        lg.get(("t",), "default")
        after = lg.store.get(item_id(("t",), "default")).expires_at
        assert after - before >= timedelta(seconds=0.6)
    with EvermindStore(tmp_path / "ttl.db", ttl={"refresh_on_read": False}) as lg:
        time.sleep(0.7)
        lg.get(("t",), "default")
        assert lg.store.get(item_id(("t",), "default")).expires_at == after
    with pytest.raises(InvalidInput, match="TTLConfig"):
        EvermindStore(":memory:", ttl={"default": 3})


def test_async_api_and_a_cancelled_abatch_still_completes() -> None:
    async def main() -> None:
        with EvermindStore(":memory:") as lg:
            await lg.aput(("a",), "k", {"text": "async value"})
            assert (await lg.aget(("a",), "k")).value == {"text": "async value"}
            assert [r.key for r in await lg.asearch(("a",), query="value")] == ["k"]
            assert await lg.alist_namespaces() == [("a",)]
            await lg.adelete(("a",), "k")
            assert await lg.aget(("a",), "k") is None
            task = asyncio.create_task(lg.abatch([PutOp(("b",), f"k{i}", {"i": i}) for i in range(20)]))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(300):  # the batch runs on in its thread, to its end
                if len(lg.search(("b",), limit=50)) == 20:
                    break
                await asyncio.sleep(0.02)
            assert [r.value["i"] for r in lg.search(("b",), limit=50)] == list(range(20))

    asyncio.run(main())


def test_batches_run_in_order(lg: EvermindStore) -> None:
    out = lg.batch([PutOp(("o",), "k", {"v": 1}), SearchOp(("o",)), PutOp(("o",), "k", None), SearchOp(("o",))])
    assert out[0] is None and [r.value for r in out[1]] == [{"v": 1}] and out[3] == []


def test_scopes_keep_agents_apart_and_other_facts_are_invisible(tmp_path: Path) -> None:
    with MemoryStore(tmp_path / "s.db") as store:
        store.remember("a plain fact remembered by other code", tags={"lg.depth": "not an int"})
        store.remember("another plain fact")
        ada, bob = EvermindStore(store.scope(user="ada")), EvermindStore(store.scope(user="bob"))
        ada.put(("mem",), "k", {"text": "Ada's memory"})
        bob.put(("mem",), "k", {"text": "Bob's memory"})
        assert ada.get(("mem",), "k").value == {"text": "Ada's memory"}
        assert [r.value["text"] for r in bob.search((), query="memory")] == ["Bob's memory"]
        whole = EvermindStore(store)  # the whole store's handle sees the items of every scope under it
        assert whole.list_namespaces() == [("mem",)] and len(whole.search(())) == 2
        assert whole.get(("mem",), "k") is None  # its own item at ("mem",) "k" is not Ada's
        whole.put(("mem",), "k", {"text": "the store's own item"})
        assert ada.get(("mem",), "k").value == {"text": "Ada's memory"} and len(whole.search(())) == 3
        ada.close()
        assert store.count() == 5


def test_a_langgraph_graph_uses_it_as_its_store(tmp_path: Path) -> None:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.store.base import BaseStore

    class State(TypedDict):
        user: str
        fact: str
        recalled: list

    def remember(state: State, *, store: BaseStore) -> dict:
        store.put(("users", state["user"], "memories"), f"m{len(store.search(('users', state['user'])))}",
                  {"text": state["fact"]})
        return {}

    def recall(state: State, *, store: BaseStore) -> dict:
        return {"recalled": [h.value["text"] for h in store.search(("users", state["user"]), query="drink", limit=2)]}

    graph = StateGraph(State)
    graph.add_node("remember", remember)
    graph.add_node("recall", recall)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "recall")
    graph.add_edge("recall", END)
    with EvermindStore(tmp_path / "graph.db") as lg:
        app = graph.compile(store=lg)
        app.invoke({"user": "ada", "fact": "Ada drinks green tea", "recalled": []})
        out = app.invoke({"user": "ada", "fact": "Ada's flight is on Tuesday", "recalled": []})
        assert out["recalled"][0] == "Ada drinks green tea" and len(out["recalled"]) == 2
    with EvermindStore(tmp_path / "graph.db") as lg:
        assert lg.list_namespaces() == [("users", "ada", "memories")]


def test_an_index_config_sets_the_model_as_in_langgraph(tmp_path: Path) -> None:
    require("langchain_core", "langchain")
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from evermind_memory.integrations.langchain import EvermindEmbeddings

    fake = DeterministicFakeEmbedding(size=8)
    with EvermindStore(tmp_path / "fake.db", index={"dims": 8, "embed": fake, "fields": ["$"]}) as lg:
        lg.put(("a",), "x", {"text": "x"})
        lg.put(("a",), "y", {"text": "y"})
        assert lg.store.fingerprint == "langchain/langchain_core.embeddings.fake.DeterministicFakeEmbedding/8/8"
        # the fake's vector of the exact value text is the item's own: cosine 1
        hit = lg.search(("a",), query='{"text": "y"}', limit=1)[0]
        assert hit.key == "y" and hit.score == pytest.approx(1.0, abs=1e-3)

    def embed(texts: list[str]) -> list[list[float]]:  # a plain function, as LangGraph accepts
        return [[1.0, float(len(t)), float(t.count("a"))] for t in texts]

    with EvermindStore(":memory:", index={"dims": 3, "embed": embed}, fingerprint="test/len-and-a/3") as lg:
        lg.put(("a",), "k", {"text": "banana"})
        assert lg.store.fingerprint == "test/len-and-a/3" and len(lg.search(("a",), query="papaya")) == 1
    ours = EvermindEmbeddings()
    with EvermindStore(":memory:", index={"dims": ours.dimensions, "embed": ours}) as lg:
        assert lg.store.fingerprint == EvermindEmbeddings().fingerprint
    for index, message in [({"dims": 9, "embed": fake}, "dims.*size, 8, got 9"),
                           ({"dims": 8, "embed": fake, "fields": ["text"]}, r"whole value \(fields=\['\$'\]\)"),
                           ({"dims": 8}, "IndexConfig dict with embed"),
                           ({"embed": "nowhere:model"}, "could not use index"),
                           ({"embed": fake, "distance_type": "l2"}, "IndexConfig dict")]:
        with pytest.raises(InvalidInput, match=message):
            EvermindStore(":memory:", index=index)
    with MemoryStore(tmp_path / "open.db") as store:
        with pytest.raises(InvalidInput, match="give index to MemoryStore"):
            EvermindStore(store, index={"embed": fake})
