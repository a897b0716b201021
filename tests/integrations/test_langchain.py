"""EvermindVectorStore beyond LangChain's standard suite: the metadata mapping, filters, scores, retrievers, MMR,
scopes, persistence and the errors users read. The shipped model throughout."""

from __future__ import annotations

from pathlib import Path

import pytest
from extras import require

require("langchain_core", "langchain")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import DeterministicFakeEmbedding  # noqa: E402

from evermind_memory import InvalidInput, MemoryStore, default_embedder  # noqa: E402
from evermind_memory.integrations.langchain import (  # noqa: E402
    EvermindEmbeddings, EvermindVectorStore, LangChainEmbedder,
)

DOCS = [
    Document(page_content="Ada prefers green tea in the morning",
             metadata={"person": "ada", "n": 1, "source": "chat.txt"}),
    Document(page_content="Bob drinks strong black coffee", metadata={"person": "bob", "n": 2, "done": True}),
    Document(page_content="Ada's flight to Zurich is on Tuesday", metadata={"person": "ada", "n": 3, "score": 0.5}),
    Document(page_content="The quarterly report is due Friday", metadata={"person": "carol", "n": 4}),
]


@pytest.fixture
def vs():
    with EvermindVectorStore(":memory:") as v:
        v.add_documents(DOCS, ids=["tea", "coffee", "flight", "report"])
        yield v


def test_metadata_round_trips_typed_and_source_becomes_the_facts_source(vs: EvermindVectorStore) -> None:
    got = {d.id: d for d in vs.get_by_ids(["tea", "coffee", "flight", "report", "missing"])}
    assert sorted(got) == ["coffee", "flight", "report", "tea"]
    for doc, fid in zip(DOCS, ["tea", "coffee", "flight", "report"]):
        assert got[fid].metadata == doc.metadata and got[fid].page_content == doc.page_content
    fact = vs.store.get("tea")
    assert fact.source == "chat.txt" and fact.tags == {"person": "ada", "n": 1}
    assert type(got["coffee"].metadata["done"]) is bool and type(got["flight"].metadata["score"]) is float


def test_filters_use_the_where_language_over_metadata(vs: EvermindVectorStore) -> None:
    def ids(**kwargs) -> list[str]:
        return sorted(d.id for d in vs.similarity_search("drinks", k=10, **kwargs))

    assert ids(filter={"person": "ada"}) == ["flight", "tea"]
    assert ids(filter={"n": {"$gte": 2}, "person": {"$ne": "carol"}}) == ["coffee", "flight"]
    assert ids(filter={"$or": [{"done": True}, {"source": "chat.txt"}]}) == ["coffee", "tea"]
    assert ids(filter={"n": {"$in": [1, 4]}}) == ["report", "tea"]
    assert ids(filter={"n": "1"}) == []  # typed: the string "1" is not the number 1
    assert ids(where={"source": {"$exists": False}}) == ["coffee", "flight", "report"]
    with pytest.raises(InvalidInput, match="Python function"):
        vs.similarity_search("tea", filter=lambda doc: True)
    with pytest.raises(InvalidInput, match=r"\$regex"):
        vs.similarity_search("tea", filter={"person": {"$regex": "a.*"}})


def test_a_metadata_key_named_like_a_time_field_is_the_metadata_key(tmp_path: Path) -> None:
    with EvermindVectorStore(":memory:") as v:
        v.add_texts(["a dated note"], metadatas=[{"created_at": "2020-01-01"}], ids=["d"])
        assert [d.id for d in v.similarity_search("note", filter={"created_at": "2020-01-01"})] == ["d"]
        assert v.get_by_ids(["d"])[0].metadata == {"created_at": "2020-01-01"}


def test_non_scalar_metadata_is_refused_or_kept_as_json() -> None:
    meta = {"pages": [1, 2], "author": {"name": "Ada"}, "title": None, "kind": "note"}
    with EvermindVectorStore(":memory:") as v:
        with pytest.raises(InvalidInput,
                           match=r"metadatas\[1\]\['pages'\] is \[1, 2\] \(list\).*non_scalar_metadata='json'"):
            v.add_texts(["first text", "second text"], metadatas=[{"kind": "ok"}, meta])
        assert v.store.count() == 0  # checked before anything was stored
        with pytest.raises(InvalidInput, match="source.*Store it as a str"):
            v.add_texts(["x"], metadatas=[{"source": 3}])
        with pytest.raises(InvalidInput, match="keys must match"):
            v.add_texts(["x"], metadatas=[{"page label": 3}])
        with pytest.raises(InvalidInput, match="non-blank"):
            v.add_texts(["   "])
        with pytest.raises(InvalidInput, match=r"'user' names a scope level.*EvermindVectorStore\(store\.scope"):
            v.add_texts(["x"], metadatas=[{"user": "ada"}])  # one meaning of "user": a scope view
        with pytest.raises(InvalidInput, match="names a scope level"):
            v.similarity_search("x", filter={"user": "ada"})
    with EvermindVectorStore(":memory:", non_scalar_metadata="json") as v:
        (fid,) = v.add_texts(["a text with rich metadata"], metadatas=[meta])
        assert v.get_by_ids([fid])[0].metadata == meta
        assert v.store.get(fid).tags["pages"] == "[1, 2]"
        assert [d.id for d in v.similarity_search("text", filter={"pages": "[1, 2]"})] == [fid]
        with pytest.raises(InvalidInput, match="reserves"):
            v.add_texts(["x"], metadatas=[{"lc.json": "a"}])


def test_scores_and_relevance_scores(vs: EvermindVectorStore) -> None:
    scored = vs.similarity_search_with_score("Ada prefers green tea in the morning", k=4)
    assert scored[0][0].id == "tea" and scored[0][1] == pytest.approx(1.0, abs=1e-4)
    assert [s for _, s in scored] == sorted((s for _, s in scored), reverse=True)
    rel = vs.similarity_search_with_relevance_scores("Ada prefers green tea in the morning", k=4)
    assert all(0.0 <= s <= 1.0 for _, s in rel) and rel[0][0].id == "tea"
    kept = vs.similarity_search_with_relevance_scores("Ada prefers green tea in the morning", k=4, score_threshold=0.99)
    assert [d.id for d, _ in kept] == ["tea"]
    with pytest.raises(InvalidInput, match="mode='vector'"):
        vs.similarity_search_with_relevance_scores("tea", mode="hybrid")
    assert [d.id for d in vs.similarity_search("quarterly report", k=1, mode="lexical")] == ["report"]


def test_retrievers_pass_their_search_kwargs(vs: EvermindVectorStore) -> None:
    r = vs.as_retriever(search_kwargs={"k": 2, "filter": {"person": "ada"}})
    assert sorted(d.id for d in r.invoke("travel plans")) == ["flight", "tea"]
    thr = vs.as_retriever(search_type="similarity_score_threshold",
                          search_kwargs={"score_threshold": 0.99, "k": 3})
    assert [d.id for d in thr.invoke("Bob drinks strong black coffee")] == ["coffee"]
    mmr = vs.as_retriever(search_type="mmr", search_kwargs={"k": 2, "fetch_k": 4})
    assert len(mmr.invoke("Ada")) == 2


def test_mmr_prefers_a_different_second_document() -> None:
    with EvermindVectorStore(":memory:") as v:
        v.add_texts(["Ada prefers green tea", "Ada prefers green tea.", "Ada's flight is on Tuesday"],
                    ids=["a", "b", "c"])
        plain = [d.id for d in v.similarity_search("Ada prefers green tea", k=2)]
        mmr = [d.id for d in v.max_marginal_relevance_search("Ada prefers green tea", k=2, fetch_k=3, lambda_mult=0.3)]
        assert sorted(plain) == ["a", "b"] and mmr[0] == "a" and mmr[1] == "c"


def test_delete_by_ids_and_by_filter_and_never_everything_by_accident(vs: EvermindVectorStore) -> None:
    assert vs.delete(["tea", "not-there"]) is True
    assert vs.get_by_ids(["tea"]) == []
    assert vs.delete(filter={"person": "bob"}) is True
    assert sorted(f.id for f in vs.store.list()) == ["flight", "report"]
    with pytest.raises(InvalidInput, match="clear"):
        vs.delete()


def test_a_scope_view_keeps_each_users_documents_apart(tmp_path: Path) -> None:
    with MemoryStore(tmp_path / "s.db") as store:
        ada = EvermindVectorStore(store.scope(user="ada"))
        bob = EvermindVectorStore(store.scope(user="bob"))
        ada.add_texts(["Ada's secret: green tea"], ids=["t"])
        bob.add_texts(["Bob's secret: black coffee"])
        assert [d.page_content for d in bob.similarity_search("secret", k=5)] == ["Bob's secret: black coffee"]
        assert bob.get_by_ids(["t"]) == [] and bob.delete(["t"]) and ada.get_by_ids(["t"])
        with pytest.raises(InvalidInput, match="another scope|outside this scope"):
            bob.add_texts(["Bob takes Ada's id"], ids=["t"])
        ada.close()  # a store handed in stays open
        assert store.count() == 2


def test_from_texts_persists_and_reopens(tmp_path: Path) -> None:
    path = tmp_path / "lc.db"
    with EvermindVectorStore.from_texts(["Ada prefers green tea"], EvermindEmbeddings(), [{"person": "ada"}],
                                        ids=["tea"], store=path) as v:
        assert v.get_by_ids(["tea"])[0].metadata == {"person": "ada"}
    with EvermindVectorStore(path) as v:
        assert v.similarity_search("tea", k=1)[0].id == "tea"
        v.add_texts(["Ada prefers oolong now"], metadatas=[{"person": "ada"}], ids=["tea"])  # upsert
        assert [(d.id, d.page_content) for d in v.similarity_search("tea", k=5)] == [("tea", "Ada prefers oolong now")]
        assert [c.op for c in v.store.history("tea")] == ["remember", "update"]


def test_from_documents_needs_no_embedding_as_from_texts_does() -> None:
    """It once raised TypeError (LangChain's base needs an embedding); ids and metadata come from the documents."""
    docs = [Document(page_content="Ada prefers green tea", metadata={"person": "ada"}),
            Document(page_content="Bob drinks black coffee", id="bob-coffee")]
    with EvermindVectorStore.from_documents(docs) as v:
        got = {d.page_content: (d.id, d.metadata) for d in v.similarity_search("a hot drink", k=2)}
    assert got["Bob drinks black coffee"] == ("bob-coffee", {}) and got["Ada prefers green tea"][1] == {"person": "ada"}


def test_embeddings_are_the_stores_vectors() -> None:
    emb = EvermindEmbeddings()
    q, (d,) = emb.embed_query("green tea"), emb.embed_documents(["green tea"])
    assert len(q) == emb.dimensions == default_embedder().dimensions
    assert sum(x * x for x in q) == pytest.approx(1.0, abs=1e-3)
    assert q == pytest.approx(d, abs=1e-6)
    assert emb.embed_documents([]) == []
    with pytest.raises(InvalidInput, match="list of str"):
        emb.embed_documents("green tea")


def test_a_langchain_embeddings_as_the_stores_model(tmp_path: Path) -> None:
    fake = DeterministicFakeEmbedding(size=8)
    path = tmp_path / "fake.db"
    with EvermindVectorStore(path, fake) as v:
        v.add_texts(["foo", "bar"], ids=["1", "2"])
        assert v.store.fingerprint == "langchain/langchain_core.embeddings.fake.DeterministicFakeEmbedding/8/8"
        assert v.embeddings is fake and v.similarity_search("bar", k=1)[0].id == "2"
    with MemoryStore(path, LangChainEmbedder(fake)) as store:
        assert EvermindVectorStore(store, store.embedder.embeddings).similarity_search("foo", k=1)[0].id == "1"
        with pytest.raises(InvalidInput, match="not the store's model"):
            EvermindVectorStore(store, DeterministicFakeEmbedding(size=8))
        with pytest.raises(InvalidInput, match="open MemoryStore"):
            EvermindVectorStore(store, durability="full")


def test_unknown_options_are_refused_and_batch_size_is_accepted(vs: EvermindVectorStore) -> None:
    with pytest.raises(InvalidInput, match="unknown options colour"):
        vs.add_texts(["x"], colour="red")
    assert vs.add_texts(["a text with a ttl"], ttl=3600, batch_size=10)
    with pytest.raises(InvalidInput, match="one of ids per text"):
        vs.add_texts(["x", "y"], ids=["only-one"])
