"""Long texts: truncation at max_tokens, or up to max_chunks windows pooled into one vector; and embed_many's
buckets spread over worker threads giving the same vectors as one thread."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from evermind_memory.embedder import LMEmbedder, adapted_embedder, embedder_for
from evermind_memory.errors import InvalidInput
from evermind_memory.lm.inference import EMBED_THREADS_ENV, embed_threads
from evermind_memory.lm.model import EvermindLM, LMConfig
from evermind_memory.lm.tokenizer import BPETokenizer

from test_loader import adapter_for  # noqa: E402  (tests/embedder is on sys.path under pytest)

WORDS = ("tea coffee train seven green leaves morning server restart night report March flight Lisbon printer "
         "paper floor Ada Bob meeting room project deadline budget").split()


@pytest.fixture(scope="module")
def tokenizer() -> BPETokenizer:
    return BPETokenizer.train([" ".join(WORDS)] * 8, 300)


@pytest.fixture(scope="module")
def model(tokenizer) -> EvermindLM:
    return EvermindLM(LMConfig(vocab_size=len(tokenizer), d_model=16, n_layers=2, hidden_dim=16, attn_heads=2),
                      seed=5)


def _texts(n: int, seed: int = 0) -> list[str]:
    """n texts of 1 to 60 words (many longer than a 16-token window)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 60)))) for _ in range(n)]


def test_one_chunk_keeps_the_truncating_fingerprint_and_vectors(model, tokenizer):
    plain = LMEmbedder(model, tokenizer, max_tokens=16)
    one = LMEmbedder(model, tokenizer, max_tokens=16, max_chunks=1)
    assert one.fingerprint == plain.fingerprint
    np.testing.assert_array_equal(one.embed_many(_texts(20)), plain.embed_many(_texts(20)))


@pytest.mark.parametrize("first", [1.0, 4.0])
def test_chunks_change_the_fingerprint_and_pool_the_window_vectors_by_length(model, tokenizer, first):
    w, n = 16, 3
    chunked = LMEmbedder(model, tokenizer, max_tokens=w, max_chunks=n, first_chunk_weight=first)
    plain = LMEmbedder(model, tokenizer, max_tokens=w)
    assert chunked.fingerprint != plain.fingerprint
    assert chunked.fingerprint != LMEmbedder(model, tokenizer, max_tokens=w, max_chunks=n + 1,
                                             first_chunk_weight=first).fingerprint
    assert chunked.fingerprint != LMEmbedder(model, tokenizer, max_tokens=w, max_chunks=n,
                                             first_chunk_weight=first + 1).fingerprint
    texts = _texts(30)
    got = chunked.embed_many(texts)
    want = []
    for text in texts:
        ids = tokenizer.encode(text)[: w * n]
        windows = [ids[i : i + w] for i in range(0, len(ids), w)]
        vecs = np.stack([model.embed(win) for win in windows])  # unit rows, the training path's twin
        weights = np.array([len(win) * (first if j == 0 else 1.0) for j, win in enumerate(windows)])
        pooled = (vecs * weights[:, None]).sum(axis=0)
        want.append(pooled / np.linalg.norm(pooled))
    np.testing.assert_allclose(got, np.array(want), rtol=0, atol=1e-5)
    assert any(len(tokenizer.encode(t)) > w for t in texts) and any(len(tokenizer.encode(t)) <= w for t in texts)
    # embed() of a long text and a batch of one agree with the batch
    long_text = max(texts, key=lambda t: len(tokenizer.encode(t)))
    np.testing.assert_allclose(chunked.embed(long_text), got[texts.index(long_text)], rtol=0, atol=1e-6)
    np.testing.assert_allclose(chunked.embed_many([long_text])[0], got[texts.index(long_text)], rtol=0, atol=1e-6)
    # a text that fits one window is embedded exactly as the truncating embedder does
    short = min(texts, key=lambda t: len(tokenizer.encode(t)))
    np.testing.assert_allclose(chunked.embed(short), plain.embed(short), rtol=0, atol=1e-6)


def test_max_chunks_travels_through_the_loader_and_an_adapter(model, tokenizer):
    base = embedder_for(model, tokenizer, max_tokens=16, max_chunks=2, first_chunk_weight=3.0)
    assert (base.max_chunks, base.first_chunk_weight) == (2, 3.0)
    adapted = adapted_embedder(base, adapter_for(model))
    assert (adapted.max_chunks, adapted.first_chunk_weight) == (2, 3.0) and adapted.fingerprint != base.fingerprint
    for bad in (0, -1, 65, 2.0, True):
        with pytest.raises(InvalidInput, match="max_chunks"):
            LMEmbedder(model, tokenizer, max_tokens=16, max_chunks=bad)
    for bad in (0.0, -1.0, float("nan"), "2", True):
        with pytest.raises(InvalidInput, match="first_chunk_weight"):
            LMEmbedder(model, tokenizer, max_tokens=16, max_chunks=2, first_chunk_weight=bad)


def test_worker_threads_give_the_vectors_of_one_thread(model, tokenizer, monkeypatch):
    texts = _texts(300, seed=1)  # several buckets of several lengths
    emb = LMEmbedder(model, tokenizer, max_tokens=64, batch_size=300)
    monkeypatch.setenv(EMBED_THREADS_ENV, "1")
    serial = emb.embed_many(texts)
    for threads in ("2", "3"):
        monkeypatch.setenv(EMBED_THREADS_ENV, threads)
        np.testing.assert_array_equal(emb.embed_many(texts), serial)
    for bad in ("0", "two"):
        monkeypatch.setenv(EMBED_THREADS_ENV, bad)
        with pytest.raises(InvalidInput, match=EMBED_THREADS_ENV):
            emb.embed_many(texts)


def _in_thread(name: str) -> int:
    got: list[int] = []
    worker = threading.Thread(target=lambda: got.append(embed_threads()), name=name)
    worker.start()
    worker.join()
    return got[0]


def test_default_workers_are_the_usable_cores_up_to_two_and_one_in_the_background(monkeypatch):
    monkeypatch.delenv(EMBED_THREADS_ENV, raising=False)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert embed_threads() == min(2, cores)  # a caller's bulk write uses the machine
    assert _in_thread("a user's thread") == min(2, cores)
    for background in ("evermind-vectors", "evermind-adaptation", "evermind-embed_0"):
        assert _in_thread(background) == 1  # work nobody waits for leaves a core to recall
    monkeypatch.setenv(EMBED_THREADS_ENV, "3")  # the variable decides everywhere when set
    assert embed_threads() == 3 and _in_thread("evermind-vectors") == 3


def test_a_forked_child_embeds_with_its_own_workers(model, tokenizer, monkeypatch):
    import multiprocessing as mp

    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork on this platform")
    monkeypatch.setenv(EMBED_THREADS_ENV, "2")
    texts = _texts(200, seed=2)
    emb = LMEmbedder(model, tokenizer, max_tokens=64, batch_size=200)
    want = emb.embed_many(texts)  # the parent's pool now exists
    with mp.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(emb.embed_many, (texts,)).get(timeout=60)
    np.testing.assert_array_equal(got, want)
