"""The one embedder loader: a model + tokenizer pair, base + adapter, and the lazy shipped default."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from evermind_memory.embedder import LazyEmbedder, LMEmbedder, adapted_embedder, embedder_for, load_embedder
from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.adapter import LoRAWeights, save_adapter
from evermind_memory.lm.model import EvermindLM, LMConfig
from evermind_memory.lm.tokenizer import BPETokenizer

TEXTS = ["Ada prefers green tea.", "Bob drinks coffee.", "The train leaves at seven.", "tea"]


@pytest.fixture(scope="module")
def tokenizer() -> BPETokenizer:
    return BPETokenizer.train(TEXTS * 8, 290)


@pytest.fixture(scope="module")
def model(tokenizer) -> EvermindLM:
    return EvermindLM(LMConfig(vocab_size=len(tokenizer), d_model=16, n_layers=2, hidden_dim=16, attn_heads=2),
                      seed=3)


def adapter_for(model: EvermindLM, seed: int = 0) -> LoRAWeights:
    rng = np.random.default_rng(seed)
    name = "layers.0.shared.w1"
    rows, cols = model.params[name].shape
    return LoRAWeights(rank=2, alpha=4.0, tensors={name: (rng.standard_normal((2, cols)).astype(np.float32) * 0.1,
                                                          rng.standard_normal((rows, 2)).astype(np.float32) * 0.1)})


def test_files_and_objects_give_the_same_embedder(model, tokenizer, tmp_path):
    model.save(tmp_path / "m.evlm")
    tokenizer.save(tmp_path / "t.json")
    from_files = load_embedder(tmp_path / "m.evlm", tmp_path / "t.json", max_tokens=32, hybrid_weight=3.0)
    from_objects = embedder_for(model, tokenizer, max_tokens=32, hybrid_weight=3.0)
    assert isinstance(from_files, LMEmbedder)
    assert from_files.fingerprint == from_objects.fingerprint
    assert from_files.hybrid_weight == 3.0 and from_files.max_tokens == 32
    np.testing.assert_array_equal(from_files.embed_many(TEXTS), from_objects.embed_many(TEXTS))


def test_an_adapter_from_a_file_an_object_or_adapted_embedder_is_the_same_function(model, tokenizer, tmp_path):
    weights = adapter_for(model)
    model.save(tmp_path / "m.evlm")
    save_adapter(tmp_path / "a.evlra", weights)
    base = embedder_for(model, tokenizer)
    via_file = load_embedder(tmp_path / "m.evlm", tokenizer, adapter=tmp_path / "a.evlra")
    via_object = embedder_for(model, tokenizer, adapter=weights)
    via_base = adapted_embedder(base, weights)
    assert via_file.fingerprint == via_object.fingerprint == via_base.fingerprint != base.fingerprint
    np.testing.assert_allclose(via_file.embed_many(TEXTS), via_base.embed_many(TEXTS), atol=1e-6)
    assert not np.allclose(via_base.embed_many(TEXTS), base.embed_many(TEXTS), atol=1e-4)


def test_the_loader_refuses_what_it_cannot_wrap(model, tokenizer):
    with pytest.raises(InvalidInput, match="embedder_for expected a BPETokenizer"):
        embedder_for(model, object())
    with pytest.raises(InvalidInput, match="embedder_for expected an EvermindLM or a SequenceBackbone"):
        embedder_for(object(), tokenizer)


def lazy_over(inner: LMEmbedder, calls: list, fingerprint: str | None = None) -> LazyEmbedder:
    def load() -> LMEmbedder:
        calls.append(threading.get_ident())
        return inner

    return LazyEmbedder(fingerprint=fingerprint or inner.fingerprint, dimensions=inner.dimensions, load=load,
                        max_tokens=inner.max_tokens, hybrid_weight=inner.hybrid_weight)


def test_a_lazy_embedder_knows_its_identity_before_loading_and_loads_once_across_threads(model, tokenizer):
    inner = embedder_for(model, tokenizer)
    calls: list = []
    lazy = lazy_over(inner, calls)
    assert (lazy.fingerprint, lazy.dimensions, lazy.loaded, calls) == (inner.fingerprint, 16, False, [])
    start = threading.Barrier(8)
    results: list = [None] * 8

    def worker(i: int) -> None:
        start.wait()
        results[i] = lazy.embed_many(TEXTS) if i % 2 else lazy.embed(TEXTS[0])[None, :]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and lazy.loaded
    expected = inner.embed_many(TEXTS)
    for i, got in enumerate(results):
        np.testing.assert_allclose(got, expected[: len(got)], atol=1e-6)
    assert lazy.model is inner.model and lazy.tokenizer is inner.tokenizer


def test_a_lazy_embedder_refuses_weights_that_are_not_the_announced_ones(model, tokenizer):
    inner = embedder_for(model, tokenizer)
    calls: list = []
    lazy = lazy_over(inner, calls, fingerprint="evermind-lm/other/00000000")
    with pytest.raises(CheckpointError, match="announced as evermind-lm/other/00000000 .* files give evermind-lm/"):
        lazy.embed("tea")
    assert not lazy.loaded
    with pytest.raises(CheckpointError):  # and again: a failed load is not cached as a success
        lazy.embed_many(["tea"])
    assert len(calls) == 2


def test_a_lazy_embedder_announces_the_model_part_of_a_vector_with_a_lexicon(model, tokenizer):
    from evermind_memory.lm.lexicon import Lexicon

    words = ["ada", "tea", "bob", "coffee"]
    lex = Lexicon(words, np.eye(4, 6, dtype=np.int8) * 100, np.full(4, 0.01, np.float32), np.ones(4, np.float32))
    inner = embedder_for(model, tokenizer, lexicon=lex, lexicon_weight=0.8)
    announced = LazyEmbedder(fingerprint=inner.fingerprint, dimensions=inner.dimensions, load=lambda: inner,
                             max_tokens=inner.max_tokens, hybrid_weight=1.0, model_dimensions=16)
    assert (announced.dimensions, announced.model_dimensions, announced.loaded) == (22, 16, False)
    assert announced.lexicon is lex and announced.lexicon_weight == 0.8 and announced.loaded
    unannounced = LazyEmbedder(fingerprint=inner.fingerprint, dimensions=inner.dimensions, load=lambda: inner,
                               max_tokens=inner.max_tokens, hybrid_weight=1.0)  # a card that forgot the lexicon
    with pytest.raises(CheckpointError, match="model part None.* model part 16"):
        unannounced.embed("tea")
