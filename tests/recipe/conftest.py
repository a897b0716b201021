"""Fixtures of the recipe tests that grow the shipped model (test_widen.py, test_deepen.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def shipped():
    """The shipped model as (config, params, tokenizer)."""
    from evermind_memory import default_embedder

    emb = default_embedder()
    return emb.model.config, dict(emb.model.params), emb.tokenizer


@pytest.fixture(scope="session")
def grow_texts() -> list[str]:
    """Texts a grown model must embed as the trained one did."""
    return ["Ada takes her tea with lemon.", "what does Ada drink?", "Bob's flight to Lisbon leaves on Tuesday.",
            "sqlite3.connect(database, timeout=5.0) opens a connection."]


@pytest.fixture(scope="session")
def tiny_cfg():
    """A two-layer model shape small enough for exact checks of the training steps on the CPU."""
    from evermind_memory.lm.model import LMConfig

    return LMConfig(vocab_size=300, d_model=32, n_layers=2, conv_kernel=4, hidden_dim=32, n_experts=4, top_k=2,
                    attn_heads=4)


@pytest.fixture(scope="session")
def token_rows():
    """make(rng, n_texts, width, vocab) -> (token matrix (n_texts, width), lengths (n_texts,)): random texts of 2 to
    `width` tokens, padded with 0."""
    import numpy as np

    def make(rng, n_texts: int, width: int, vocab: int):
        lengths = rng.integers(2, width + 1, n_texts)
        mat = rng.integers(1, vocab, (n_texts, width))
        mat[np.arange(width)[None, :] >= lengths[:, None]] = 0
        return mat, lengths

    return make
