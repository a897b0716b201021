"""LMEmbedder and the Embedder protocol: vectors, batching, and a fingerprint that names the whole function."""

from __future__ import annotations

import re

import numpy as np
import pytest

from evermind_memory import InvalidInput
from evermind_memory.embedder import Embedder, LMEmbedder, check_embedder
from evermind_memory.lm.model import EvermindLM
from evermind_memory.lm.tokenizer import BPETokenizer
from store_helpers import CORPUS

TEXTS = ["short", "a somewhat longer text about green tea and coffee", "x", "Ada", "the cat sat on the mat " * 3]


def test_protocol_and_shapes(embedder: LMEmbedder):
    assert isinstance(embedder, Embedder)
    assert check_embedder(embedder) == (32, embedder.fingerprint)
    v = embedder.embed("hello")
    assert v.shape == (32,) and v.dtype == np.float32 and np.linalg.norm(v) == pytest.approx(1.0, abs=1e-3)
    m = embedder.embed_many(TEXTS)
    assert m.shape == (len(TEXTS), 32) and m.dtype == np.float32
    assert embedder.embed_many([]).shape == (0, 32)


def test_batched_equals_one_by_one(embedder: LMEmbedder):
    many = embedder.embed_many(TEXTS)  # sorted by length internally, returned in input order
    one = np.stack([embedder.embed(t) for t in TEXTS])
    assert np.allclose(many, one, atol=1e-5)
    small_batches = LMEmbedder(embedder.model, embedder.tokenizer, batch_size=2).embed_many(TEXTS)
    assert np.allclose(small_batches, many, atol=1e-5)


def test_deterministic_and_distinct(embedder: LMEmbedder):
    a = embedder.embed_many(TEXTS)
    assert np.array_equal(a, embedder.embed_many(TEXTS))
    sims = a @ a.T
    assert (sims[~np.eye(len(TEXTS), dtype=bool)] < 0.9999).all()


def test_fingerprint_format(embedder: LMEmbedder):
    assert re.fullmatch(r"evermind-lm/320-32-2-3-64-4-2/[0-9a-f]{8}", embedder.fingerprint)
    assert embedder.fingerprint.endswith(embedder.digest[:8])


def _clone(embedder: LMEmbedder, **kw) -> LMEmbedder:
    params = {k: v.copy() for k, v in embedder.model.params.items()}
    return LMEmbedder(EvermindLM.from_params(embedder.model.config, params), embedder.tokenizer, **kw)


def test_fingerprint_is_stable_for_the_same_function(embedder: LMEmbedder):
    assert _clone(embedder).fingerprint == embedder.fingerprint


@pytest.mark.parametrize("name",
                         ["emb", "layers.0.conv", "layers.1.router", "layers.1.expert3.b2", "layers.0.shared.w1"])
def test_fingerprint_changes_with_any_weight(embedder: LMEmbedder, name: str):
    params = {k: v.copy() for k, v in embedder.model.params.items()}
    params[name].flat[0] += np.float32(1e-3)
    changed = LMEmbedder(EvermindLM.from_params(embedder.model.config, params), embedder.tokenizer)
    assert changed.fingerprint != embedder.fingerprint


def test_fingerprint_changes_with_tokenizer_pooling_inputs(embedder: LMEmbedder):
    other_tok = BPETokenizer.train(CORPUS[:3] * 4 + ["zebra zebra quartz"] * 9, 320)
    assert other_tok.digest() != embedder.tokenizer.digest()
    assert LMEmbedder(embedder.model, other_tok).fingerprint != embedder.fingerprint
    assert _clone(embedder, max_tokens=64).fingerprint != embedder.fingerprint
    assert _clone(embedder, adapter_digest="ab" * 32).fingerprint != embedder.fingerprint


def test_truncation_to_max_tokens(embedder: LMEmbedder):
    short = _clone(embedder, max_tokens=4)
    base = "the cat sat on the mat"
    assert np.array_equal(short.embed(base + " and then much more text"), short.embed(base + " and other words"))
    assert not np.array_equal(embedder.embed(base + " and then much more text"),
                              embedder.embed(base + " and other words"))


def test_bad_arguments(embedder: LMEmbedder):
    with pytest.raises(InvalidInput, match="max_tokens"):
        LMEmbedder(embedder.model, embedder.tokenizer, max_tokens=0)
    with pytest.raises(InvalidInput, match="batch_size"):
        LMEmbedder(embedder.model, embedder.tokenizer, batch_size=True)
