"""The lexicon (word vectors appended to the model's vector): its file, its vectors and the embedder that uses it."""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory import MemoryStore
from evermind_memory.embedder import LMEmbedder, adapted_embedder, embedder_for, load_embedder
from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.adapter import LoRAWeights
from evermind_memory.lm.checkpoint import read_tensor_file
from evermind_memory.lm.lexicon import LEXICON_KIND, LEXICON_MAGIC, Lexicon
from evermind_memory.lm.model import EvermindLM, LMConfig, load_model
from evermind_memory.lm.tokenizer import BPETokenizer

TEXTS = ["Ada prefers green tea.", "Bob drinks coffee.", "The train leaves at seven.", "tea", "12345"]
WORDS = ["ada", "prefers", "green", "tea", "bob", "drinks", "coffee", "the", "train", "leaves", "at", "seven"]


def make_lexicon(seed: int = 0, dims: int = 8) -> Lexicon:
    rng = np.random.default_rng(seed)
    table = rng.integers(-127, 128, size=(len(WORDS), dims)).astype(np.int8)
    scale = rng.uniform(0.01, 0.02, len(WORDS)).astype(np.float32)
    weight = rng.uniform(0.1, 1.0, len(WORDS)).astype(np.float32)
    return Lexicon(WORDS, table, scale, weight)


@pytest.fixture(scope="module")
def tokenizer() -> BPETokenizer:
    return BPETokenizer.train(TEXTS * 8, 290)


@pytest.fixture(scope="module")
def model(tokenizer) -> EvermindLM:
    return EvermindLM(LMConfig(vocab_size=len(tokenizer), d_model=16, n_layers=2, hidden_dim=16, attn_heads=2),
                      seed=3)


def test_a_texts_vector_is_the_weighted_sum_of_its_known_words_normalised():
    lex = make_lexicon()
    vecs = lex.embed_many(["Ada's GREEN tea, tea!", "nothing known here", ""])
    rows = [WORDS.index(w) for w in ("ada", "green", "tea", "tea")]  # "s" is no word of the table
    want = sum(lex.table[i].astype(np.float64) * lex.scale[i] * lex.weight[i] for i in rows)
    np.testing.assert_allclose(vecs[0], want / np.linalg.norm(want), atol=1e-6)
    assert vecs.dtype == np.float32 and vecs.shape == (3, lex.dims)
    assert not vecs[1].any() and not vecs[2].any()  # no known word: the zero vector
    assert lex.word_ids("Bob, bob; BOB") == [WORDS.index("bob")] * 3
    # words are letter runs of any script; a word with a letter outside the ASCII table is unknown, not cut up
    assert lex.word_ids("Zürich tea, naïve green_tea 2tea") == [WORDS.index(w) for w in ("tea", "green", "tea", "tea")]


def test_one_texts_vector_is_its_row_of_the_batch_bit_for_bit():
    lex = make_lexicon(seed=2)
    texts = TEXTS + ["Ada's GREEN tea, tea!", "nothing known here", "", "the the the seven"]
    for text, row in zip(texts, lex.embed_many(texts)):
        one = lex.embed_many([text])  # (the one-text path)
        assert one.dtype == np.float32 and one.shape == (1, lex.dims)
        np.testing.assert_array_equal(one[0], row)


def test_a_lexicon_round_trips_through_its_file_and_a_damaged_file_is_refused(tmp_path):
    lex = make_lexicon()
    path = tmp_path / "l.evlx"
    lex.save(path)
    back = Lexicon.load(path)
    assert back.words == lex.words and back.digest() == lex.digest()
    np.testing.assert_array_equal(back.embed_many(TEXTS), lex.embed_many(TEXTS))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    (tmp_path / "bad.evlx").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC"):
        Lexicon.load(tmp_path / "bad.evlx")
    with pytest.raises(CheckpointError, match="cap"):
        Lexicon.load(path, max_bytes=100)
    with pytest.raises(CheckpointError, match="magic"):  # a lexicon is not a model
        load_model(path)
    # a model reader refuses the int8 dtype even under the lexicon's magic: readers opt in to it
    with pytest.raises(CheckpointError, match="dtype"):
        read_tensor_file(path, magic=LEXICON_MAGIC, kind=LEXICON_KIND)


@pytest.mark.parametrize("change, match", [
    (lambda w, t, s, x: (w[:-1] + ["ada"], t, s, x), "distinct"),
    (lambda w, t, s, x: (w[:-1] + ["Tea"], t, s, x), "not a run"),
    # the words are checked joined by newlines first: a newline or an empty word must still be refused
    (lambda w, t, s, x: (w[:-1] + ["ada\nbob"], t, s, x), "not a run"),
    (lambda w, t, s, x: (w[:-1] + [""], t, s, x), "not a run"),
    (lambda w, t, s, x: (w[:-1] + ["a" * 65], t, s, x), "not a run"),
    (lambda w, t, s, x: (w[:-1] + [b"tea"], t, s, x), "not a run"),
    (lambda w, t, s, x: (w, t.astype(np.float32), s, x), "int8"),
    (lambda w, t, s, x: (w, t, s[:-1], x), "shape"),
    (lambda w, t, s, x: (w, t, s, -x), "non-negative"),
    (lambda w, t, s, x: (w, t, s * np.nan, x), "finite"),
])
def test_bad_tables_are_refused(change, match):
    lex = make_lexicon()
    with pytest.raises(InvalidInput, match=match):
        Lexicon(*change(list(lex.words), lex.table, lex.scale, lex.weight))


def test_the_embedder_appends_the_weighted_lexicon_vector_and_names_it_in_the_fingerprint(model, tokenizer):
    lex = make_lexicon()
    plain = LMEmbedder(model, tokenizer, max_tokens=32)
    mixed = LMEmbedder(model, tokenizer, max_tokens=32, lexicon=lex, lexicon_weight=0.8)
    assert mixed.dimensions == plain.dimensions + lex.dims
    assert "+lex8/" in mixed.fingerprint and mixed.fingerprint != plain.fingerprint
    other_weight = LMEmbedder(model, tokenizer, max_tokens=32, lexicon=lex, lexicon_weight=0.5)
    other_table = LMEmbedder(model, tokenizer, max_tokens=32, lexicon=make_lexicon(seed=1), lexicon_weight=0.8)
    assert len({mixed.fingerprint, other_weight.fingerprint, other_table.fingerprint}) == 3
    vecs = mixed.embed_many(TEXTS)
    want = np.concatenate([plain.embed_many(TEXTS), 0.8 * lex.embed_many(TEXTS)], axis=1)
    np.testing.assert_allclose(vecs, want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    for text, row in zip(TEXTS, vecs):  # the one-text path gives the batch's vector
        np.testing.assert_allclose(mixed.embed(text), row, atol=1e-6)
    with pytest.raises(InvalidInput, match="lexicon_weight"):
        LMEmbedder(model, tokenizer, lexicon=lex, lexicon_weight=0)
    with pytest.raises(InvalidInput, match="Lexicon"):
        LMEmbedder(model, tokenizer, lexicon="not a lexicon")


def test_files_objects_and_an_adapter_keep_the_lexicon(model, tokenizer, tmp_path):
    lex = make_lexicon()
    model.save(tmp_path / "m.evlm")
    tokenizer.save(tmp_path / "t.json")
    lex.save(tmp_path / "l.evlx")
    from_files = load_embedder(tmp_path / "m.evlm", tmp_path / "t.json", max_tokens=32, lexicon=tmp_path / "l.evlx",
                               lexicon_weight=0.8)
    from_objects = embedder_for(model, tokenizer, max_tokens=32, lexicon=lex, lexicon_weight=0.8)
    assert from_files.fingerprint == from_objects.fingerprint
    np.testing.assert_array_equal(from_files.embed_many(TEXTS), from_objects.embed_many(TEXTS))
    rng = np.random.default_rng(0)
    name = "layers.0.shared.w1"
    rows, cols = model.params[name].shape
    weights = LoRAWeights(rank=2, alpha=4.0, tensors={name: (rng.standard_normal((2, cols)).astype(np.float32) * 0.1,
                                                             rng.standard_normal((rows, 2)).astype(np.float32) * 0.1)})
    adapted = adapted_embedder(from_objects, weights)
    assert adapted.lexicon is lex and adapted.lexicon_weight == 0.8 and adapted.dimensions == from_objects.dimensions
    assert adapted.fingerprint != from_objects.fingerprint and "+lex8/" in adapted.fingerprint


def test_a_store_recalls_through_the_mixed_vector(model, tokenizer, tmp_path):
    emb = LMEmbedder(model, tokenizer, max_tokens=32, lexicon=make_lexicon(), lexicon_weight=0.8)
    with MemoryStore(tmp_path / "m.db", embedder=emb) as store:
        ids = store.remember_many(TEXTS)
        hits = store.recall("Bob drinks coffee.", k=2, mode="vector")
        assert hits[0].id == ids[1]
        assert store.info()["dimensions"] == emb.dimensions


def test_hybrid_candidates_carry_the_model_parts_cosine(model, tokenizer, tmp_path):
    """Hybrid recall's pool holds, beside each candidate's cosine, the cosine of the model's part alone (a fitted
    rule may weigh the lexicon differently for documents and for notes)."""
    from evermind_memory.store.fusion import FEATURES
    from evermind_memory.store.study import gather

    emb = LMEmbedder(model, tokenizer, max_tokens=32, lexicon=make_lexicon(), lexicon_weight=0.8)
    plain = LMEmbedder(model, tokenizer, max_tokens=32)
    assert emb.model_dimensions == plain.dimensions and plain.model_dimensions is None
    with MemoryStore(tmp_path / "m.db", embedder=emb) as store:
        store.remember_many(TEXTS)
        rows, pool = gather(store, "green tea for Ada", 10)
        texts = [rows[rid].text for rid in pool.ids]
        stored = store.recall("green tea for Ada", k=len(TEXTS), mode="vector")
    assert pool.cos_model is not None and len(pool.cos_model) == len(texts) == len(TEXTS)
    q, d = plain.embed("green tea for Ada"), plain.embed_many(texts)
    np.testing.assert_allclose(pool.cos_model, d @ q, atol=2e-3)  # stored vectors are float16
    assert not np.allclose(pool.cos_model, pool.cos, atol=1e-3)
    np.testing.assert_allclose(FEATURES["cos_model"][1](pool), pool.cos_model)
    assert {h.text for h in stored} == set(texts)
    with MemoryStore(tmp_path / "p.db", embedder=plain) as store:  # no lexicon: no second cosine
        store.remember_many(TEXTS)
        assert gather(store, "green tea", 10)[1].cos_model is None
