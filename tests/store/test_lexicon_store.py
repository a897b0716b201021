"""A store whose embedder has a lexicon part, on both backends: hybrid pools carry the model part's cosine."""

from __future__ import annotations

import numpy as np

from evermind_memory import MemoryStore
from evermind_memory.embedder import LMEmbedder
from evermind_memory.lm.lexicon import Lexicon
from evermind_memory.store.study import gather

FACTS = ["Ada prefers green tea in the morning.", "Bob plays squash on Tuesdays.", "The train leaves at seven.",
         "Cy is allergic to peanuts."]
WORDS = ["ada", "prefers", "green", "tea", "morning", "bob", "plays", "squash", "train", "leaves", "seven", "sport"]


def lexicon(dims: int = 8) -> Lexicon:
    rng = np.random.default_rng(7)
    return Lexicon(WORDS, rng.integers(-127, 128, size=(len(WORDS), dims)).astype(np.int8),
                   np.full(len(WORDS), 0.01, dtype=np.float32), np.ones(len(WORDS), dtype=np.float32))


def test_hybrid_reads_both_cosines_on_either_backend(target, embedder):
    mixed = LMEmbedder(embedder.model, embedder.tokenizer, max_tokens=embedder.max_tokens, lexicon=lexicon(),
                       lexicon_weight=0.8)
    with MemoryStore(target, mixed) as store:
        store.remember_many(FACTS)
        rows, pool = gather(store, "which sport does Bob play", 10)
        hits = store.recall("which sport does Bob play", k=4)
    q = embedder.embed("which sport does Bob play")
    d = embedder.embed_many([rows[rid].text for rid in pool.ids])
    assert pool.cos_model is not None
    np.testing.assert_allclose(pool.cos_model, d @ q, atol=5e-3)  # the stored vectors are int8 (the row's scale)
    full = mixed.embed_many([rows[rid].text for rid in pool.ids]) @ mixed.embed("which sport does Bob play")
    np.testing.assert_allclose(pool.cos, full, atol=2e-3)
    assert len(hits) == 4 and {h.text for h in hits} == set(FACTS)
