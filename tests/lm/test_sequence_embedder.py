"""SequenceEmbedder: pooling, batching, fingerprint, the one loader, a store round trip and adaptation refusal."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from evermind_memory import MemoryStore
from evermind_memory.adaptation import AdaptationPolicy, fit_adapter
from evermind_memory.embedder import LMEmbedder, SequenceEmbedder, check_embedder, load_embedder
from evermind_memory.errors import InvalidInput
from evermind_memory.lm.model import EvermindLM, LMConfig
from evermind_memory.lm.sequence import SequenceBackbone, SequenceModelConfig
from evermind_memory.lm.tokenizer import BPETokenizer

CORPUS = [
    "Ada prefers green tea in the morning and black coffee after lunch.",
    "Bob drinks espresso and reads the news every day at eight.",
    "The cat sat on the mat while the dog slept by the fire.",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "Python is a programming language; SQLite is a small database engine.",
    "Memories are stored as text, tags and vectors in one transaction.",
]
SCHEDULES = ["mamba1", "mamba2", "mamba3", "attention", ("mamba2", "attention", "mamba1")]


@pytest.fixture(scope="module")
def tokenizer() -> BPETokenizer:
    return BPETokenizer.train(CORPUS * 4, 300)


def backbone(tokenizer: BPETokenizer, block="mamba2", seed: int = 0) -> SequenceBackbone:
    n_layers = len(block) if isinstance(block, tuple) else 2
    cfg = SequenceModelConfig(vocab_size=len(tokenizer), d_model=16, n_layers=n_layers, block=block, d_state=4,
                              n_heads=2)
    rng = np.random.default_rng(seed)
    base = SequenceBackbone.init(cfg, rng)
    return SequenceBackbone(cfg, {n: a + (rng.standard_normal(a.shape) * 0.2).astype(np.float32)
                                  for n, a in base.params.items()})


def with_one_weight_changed(emb: SequenceEmbedder, name: str) -> SequenceEmbedder:
    params = dict(emb.model.params)
    params[name] = params[name].copy()
    params[name].reshape(-1)[0] += 1e-3
    return SequenceEmbedder(SequenceBackbone(emb.model.config, params), emb.tokenizer)


@pytest.mark.parametrize("block", SCHEDULES, ids=str)
def test_embed_many_equals_embed_per_text(block, tokenizer):
    emb = SequenceEmbedder(backbone(tokenizer, block), tokenizer, batch_size=4)
    texts = CORPUS + ["tea", "", "Bob " * 40]  # lengths from 1 token (the empty text gets bos) to the cap
    many = emb.embed_many(texts)
    assert many.shape == (len(texts), 16) and many.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(many, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(many, np.stack([emb.embed(t) for t in texts]), atol=1e-5)
    assert emb.embed_many([]).shape == (0, 16)


def test_pooling_is_the_mean_over_real_tokens(tokenizer):
    emb = SequenceEmbedder(backbone(tokenizer, "attention"), tokenizer)
    ids = tokenizer.encode(CORPUS[0])
    pooled = emb.model.forward(np.array([ids])).mean(axis=1)[0]  # (C,)
    np.testing.assert_allclose(emb.embed(CORPUS[0]), pooled / np.linalg.norm(pooled), atol=1e-6)


def test_fingerprint_format_and_identity(tokenizer, tmp_path: Path):
    emb = SequenceEmbedder(backbone(tokenizer, ("mamba2", "attention", "mamba1")), tokenizer)
    assert check_embedder(emb) == (16, emb.fingerprint)
    assert re.fullmatch(r"evermind-seq/mamba2\+attention\+mamba1/V\d+-C16-N4-K4-E2-H2-G1-Q64-F0/[0-9a-f]{8}",
                        emb.fingerprint)
    emb.model.save(tmp_path / "seq.evlm")
    first, second = load_embedder(tmp_path / "seq.evlm", tokenizer), load_embedder(tmp_path / "seq.evlm", tokenizer)
    assert first.fingerprint == second.fingerprint == emb.fingerprint
    changed = {with_one_weight_changed(emb, name).fingerprint for name in emb.model.params}
    assert emb.fingerprint not in changed and len(changed) == len(emb.model.params)
    other_tok = BPETokenizer.train(CORPUS[::-1] * 4, 290)
    assert SequenceEmbedder(emb.model, other_tok).fingerprint != emb.fingerprint
    assert SequenceEmbedder(emb.model, tokenizer, max_tokens=64).fingerprint != emb.fingerprint


@pytest.mark.parametrize("block", SCHEDULES, ids=str)
def test_reloaded_embedder_gives_identical_vectors(block, tokenizer, tmp_path: Path):
    emb = SequenceEmbedder(backbone(tokenizer, block), tokenizer)
    emb.model.save(tmp_path / "seq.evlm")
    tokenizer.save(tmp_path / "tokenizer.json")
    loaded = load_embedder(tmp_path / "seq.evlm", tmp_path / "tokenizer.json")
    assert isinstance(loaded, SequenceEmbedder)
    np.testing.assert_array_equal(loaded.embed_many(CORPUS), emb.embed_many(CORPUS))


def test_load_embedder_gives_an_lm_embedder_for_an_evermind_lm_file(tokenizer, tmp_path: Path):
    lm = EvermindLM(LMConfig(vocab_size=len(tokenizer), d_model=16, n_layers=1, hidden_dim=32))
    lm.save(tmp_path / "lm.evlm")
    loaded = load_embedder(tmp_path / "lm.evlm", tokenizer)
    assert isinstance(loaded, LMEmbedder)
    assert loaded.fingerprint == LMEmbedder(lm, tokenizer).fingerprint


def test_bad_arguments_are_refused(tokenizer):
    with pytest.raises(InvalidInput, match="expected a SequenceBackbone"):
        SequenceEmbedder(EvermindLM(LMConfig(vocab_size=len(tokenizer), d_model=16)), tokenizer)
    small = SequenceBackbone.init(SequenceModelConfig(vocab_size=100, d_model=16, n_layers=1))
    with pytest.raises(InvalidInput, match="vocabulary is 100"):
        SequenceEmbedder(small, tokenizer)
    with pytest.raises(InvalidInput, match="max_tokens"):
        SequenceEmbedder(backbone(tokenizer), tokenizer, max_tokens=0)


def test_store_round_trip_and_reembed_on_a_changed_weight(tokenizer, tmp_path: Path):
    emb = SequenceEmbedder(backbone(tokenizer, ("mamba2", "attention")), tokenizer)
    facts = CORPUS[:3]
    db = tmp_path / "seq.db"
    with MemoryStore(db, emb, background_embedding=False) as store:
        ids = [store.remember(text) for text in facts]
        assert store.fingerprint == emb.fingerprint
        for fid, text in zip(ids, facts):
            assert store.recall(text, k=1, mode="vector")[0].id == fid
            assert store.recall(text, k=1)[0].id == fid
    changed = with_one_weight_changed(emb, "layer1.w_qkv")
    with MemoryStore(db, changed, background_embedding=False) as store:
        assert store.fingerprint == changed.fingerprint != emb.fingerprint
        assert all(f.fingerprint == changed.fingerprint for f in store.list())
        # a new model is a generation swap, not a change of the fact
        assert [c.op for c in store.history(ids[0])] == ["remember"]
        hit = store.recall(facts[1], k=1, mode="vector")[0]
        assert hit.id == ids[1] and hit.score == pytest.approx(1.0, abs=1e-3)
        assert store.check().ok


def test_adaptation_is_refused_for_a_sequence_backbone(tokenizer, tmp_path: Path):
    emb = SequenceEmbedder(backbone(tokenizer), tokenizer)
    with MemoryStore(tmp_path / "adapt.db", emb, background_embedding=False) as store:
        store.remember_many(CORPUS)
        with pytest.raises(InvalidInput, match="LMEmbedder"):
            store.start_adaptation()
    with pytest.raises(InvalidInput, match="LoRA adaptation is EvermindLM-only.*sequence backbone"):
        fit_adapter(emb, CORPUS, AdaptationPolicy())
