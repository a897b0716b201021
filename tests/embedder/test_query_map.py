"""The query map: a matrix applied to recall queries only, its file, its place in the fingerprint and in recall."""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory import MemoryStore
from evermind_memory.embedder import LMEmbedder, adapted_embedder, embedder_for, load_embedder
from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.model import EvermindLM, LMConfig
from evermind_memory.lm.query_map import QueryMap
from evermind_memory.lm.tokenizer import BPETokenizer

from test_loader import adapter_for  # noqa: E402  (tests/embedder is on sys.path under pytest)

FACTS = ["Ada prefers green tea in the morning.", "The backup server restarts at three."]
DIM = 16


@pytest.fixture(scope="module")
def tokenizer() -> BPETokenizer:
    return BPETokenizer.train(FACTS * 8, 290)


@pytest.fixture(scope="module")
def model(tokenizer) -> EvermindLM:
    return EvermindLM(LMConfig(vocab_size=len(tokenizer), d_model=DIM, n_layers=2, hidden_dim=16, attn_heads=2),
                      seed=5)


def random_map(seed: int = 0, dim: int = DIM) -> QueryMap:
    rng = np.random.default_rng(seed)
    return QueryMap(np.eye(dim, dtype=np.float32) + 0.3 * rng.standard_normal((dim, dim)).astype(np.float32))


def test_a_map_changes_queries_only_and_names_itself_in_the_fingerprint(model, tokenizer):
    plain = LMEmbedder(model, tokenizer)
    qmap = random_map()
    mapped = LMEmbedder(model, tokenizer, query_map=qmap)
    texts = FACTS + ["when does the server restart?"]
    np.testing.assert_array_equal(mapped.embed_many(texts), plain.embed_many(texts))  # what a store keeps
    np.testing.assert_array_equal(mapped.embed(texts[2]), plain.embed(texts[2]))
    want = plain.embed(texts[2]) @ qmap.matrix
    got = mapped.embed_query(texts[2])
    np.testing.assert_allclose(got, want / np.linalg.norm(want), rtol=1e-5, atol=1e-6)
    assert abs(np.linalg.norm(got) - 1) < 1e-5 and not np.allclose(got, plain.embed(texts[2]), atol=1e-3)
    np.testing.assert_allclose(mapped.embed_queries(texts), np.stack([mapped.embed_query(t) for t in texts]),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(plain.embed_query(texts[0]), plain.embed(texts[0]))  # no map: the same vector
    assert mapped.fingerprint != plain.fingerprint
    assert LMEmbedder(model, tokenizer, query_map=random_map()).fingerprint == mapped.fingerprint
    assert LMEmbedder(model, tokenizer, query_map=random_map(1)).fingerprint != mapped.fingerprint
    with pytest.raises(InvalidInput, match="QueryMap of 16 dimensions"):
        LMEmbedder(model, tokenizer, query_map=random_map(dim=8))


def test_the_map_file_round_trips_and_a_damaged_one_is_refused(model, tokenizer, tmp_path):
    qmap = random_map()
    qmap.save(tmp_path / "q.evqm")
    back = QueryMap.load(tmp_path / "q.evqm")
    np.testing.assert_array_equal(back.matrix, qmap.matrix)
    assert back.digest() == qmap.digest()
    loaded = load_embedder(_saved(model, tmp_path), tokenizer, query_map=tmp_path / "q.evqm")
    assert loaded.fingerprint == LMEmbedder(model, tokenizer, query_map=qmap).fingerprint
    data = (tmp_path / "q.evqm").read_bytes()
    for name, damaged in (("short", data[:-7]), ("flipped", data[:-40] + bytes([data[-40] ^ 0x55]) + data[-39:]),
                          ("empty", b""), ("lexicon magic", b"\x89EVLEX\r\n" + data[8:])):
        (tmp_path / f"{name}.evqm").write_bytes(damaged)
        with pytest.raises(CheckpointError):
            QueryMap.load(tmp_path / f"{name}.evqm")
    with pytest.raises(CheckpointError):
        QueryMap.load(tmp_path / "missing.evqm")
    for bad in (np.ones((3, 4)), np.ones(4), np.full((2, 2), np.nan), np.array([["a"]])):
        with pytest.raises(InvalidInput):
            QueryMap(bad)


def _saved(model: EvermindLM, tmp_path) -> str:
    path = tmp_path / "m.evlm"
    if not path.exists():
        model.save(path)
    return str(path)


def test_the_map_travels_with_an_adapter_and_not_onto_a_sequence_backbone(model, tokenizer):
    qmap = random_map()
    base = embedder_for(model, tokenizer, query_map=qmap)
    adapted = adapted_embedder(base, adapter_for(model))
    assert adapted.query_map is qmap and adapted.fingerprint != base.fingerprint


def test_recall_asks_with_the_mapped_query_and_stores_what_embed_many_makes(model, tokenizer, tmp_path):
    plain = LMEmbedder(model, tokenizer)
    tea, server = plain.embed_many(FACTS)
    query = FACTS[0]  # the tea fact's own words: without a map it comes first
    q = plain.embed(query).astype(np.float64)
    # a map that sends this query's vector exactly onto the server fact's: q @ W = q + (server - q) = server
    W = np.eye(DIM) + np.outer(q, server.astype(np.float64) - q) / (q @ q)
    mapped = LMEmbedder(model, tokenizer, query_map=QueryMap(W))
    for name, embedder, first in (("plain", plain, FACTS[0]), ("mapped", mapped, FACTS[1])):
        with MemoryStore(tmp_path / f"{name}.db", embedder=embedder) as store:
            store.remember_many(FACTS)
            hits = store.recall(query, k=2, mode="vector")
            assert [h.text for h in hits] == [first, FACTS[1 - FACTS.index(first)]]
            if embedder is mapped:  # the mapped query is the server fact's stored vector: cosine ~1
                assert hits[0].score == pytest.approx(1.0, abs=1e-3)
                assert len(store.recall(query, k=2)) == 2  # hybrid asks with the same mapped vector
