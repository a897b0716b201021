"""Adaptation pieces on their own: the contrastive loss and its gradient, the LoRA projection through the
pooled embedding, fitting, the gate (NaN, degenerate, worse, equal), the probe split and the adapter history."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evermind_memory.embedder import LMEmbedder
from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.adapter import LoRAWeights, adapter_digest, merge_adapter
from evermind_memory.lm.model import EvermindLM, LMConfig
from evermind_memory.lm.tokenizer import BPETokenizer
from evermind_memory.adaptation import (
    AdaptationPolicy, anchor_loss_and_grad, check_hooks, contrastive_loss_and_grad, default_targets,
    fit_adapter, gate_candidate, pad_batch, query_view, retrieval_loss_and_grad, split_probe, text_span, token_span,
    word_weights,
)
from evermind_memory.store.adapter_history import AdapterHistory  # (the store owns the adapter files)
from evermind_memory.training.lora import lora_grads

TEXTS = [
    f"{who} {verb} {what} every {when}"
    for who in ("Ada", "Bob", "Cyd", "Dee")
    for verb in ("drinks", "paints", "reads")
    for what in ("green tea", "river maps", "old ledgers")
    for when in ("morning", "evening")
]


@pytest.fixture(scope="module")
def base() -> LMEmbedder:
    tok = BPETokenizer.train(TEXTS * 2, 300)
    cfg = LMConfig(vocab_size=len(tok), d_model=16, n_layers=2, hidden_dim=32, attn_heads=2)
    return LMEmbedder(EvermindLM(cfg, seed=3), tok)


def test_contrastive_gradient_matches_finite_differences(rng: np.random.Generator) -> None:
    pooled = rng.normal(size=(8, 5))  # (2B, C) float64
    loss, grad = contrastive_loss_and_grad(pooled, 0.3)
    assert grad.shape == pooled.shape and grad.dtype == np.float64
    eps = 1e-6
    numeric = np.zeros_like(pooled)  # (2B, C)
    for i in range(pooled.shape[0]):  # a gradient check: loops over elements are the point
        for j in range(pooled.shape[1]):
            up, down = pooled.copy(), pooled.copy()
            up[i, j] += eps
            down[i, j] -= eps
            numeric[i, j] = ((contrastive_loss_and_grad(up, 0.3)[0] - contrastive_loss_and_grad(down, 0.3)[0])
                             / (2 * eps))
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)
    # aligned views give a lower loss than shuffled ones
    z = rng.normal(size=(4, 5))
    aligned = contrastive_loss_and_grad(np.concatenate([z, z + 0.01]), 0.1)[0]
    shuffled = contrastive_loss_and_grad(np.concatenate([z, z[::-1]]), 0.1)[0]
    assert aligned < shuffled


def _numeric_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):  # a gradient check: loops over elements are the point
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        out[idx] = (f(up) - f(down)) / (2 * eps)
    return out


def test_retrieval_and_anchor_gradients_match_finite_differences(rng: np.random.Generator) -> None:
    pooled = rng.normal(size=(4, 6))  # (B, C) float64
    targets = rng.normal(size=(9, 6))  # (N, C)
    targets /= np.linalg.norm(targets, axis=1, keepdims=True)
    positives = np.array([0, 3, 3, 8])
    loss, grad = retrieval_loss_and_grad(pooled, targets, positives, 0.2)
    assert grad.dtype == np.float64 and loss > 0
    numeric = _numeric_grad(lambda x: retrieval_loss_and_grad(x, targets, positives, 0.2)[0], pooled)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)
    weights = np.array([0.5, 1.0, 0.0, 2.0])
    loss_w, grad_w = retrieval_loss_and_grad(pooled, targets, positives, 0.2, weights=weights)
    numeric = _numeric_grad(lambda x: retrieval_loss_and_grad(x, targets, positives, 0.2, weights=weights)[0], pooled)
    np.testing.assert_allclose(grad_w, numeric, rtol=1e-5, atol=1e-8)
    assert np.all(grad_w[2] == 0.0)  # a zero-weight query contributes nothing
    # a query that already points at its memory has a lower loss than one pointing elsewhere
    near = retrieval_loss_and_grad(targets[[3]] * 2.0, targets, np.array([3]), 0.2)[0]
    far = retrieval_loss_and_grad(targets[[5]] * 2.0, targets, np.array([3]), 0.2)[0]
    assert near < far
    loss, grad = anchor_loss_and_grad(pooled, targets[:4])
    numeric = _numeric_grad(lambda x: anchor_loss_and_grad(x, targets[:4])[0], pooled)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)
    assert anchor_loss_and_grad(targets[:4] * 3.0, targets[:4])[0] == pytest.approx(0.0, abs=1e-12)


def test_query_views_are_short_runs_of_rare_words() -> None:
    memories = ["the cat sat on the mat", "the cat sat on the log", "the cat zyxquart on the mat"]
    lists = [m.split() for m in memories]
    idf = word_weights(lists)
    assert idf[2][2] > idf[2][5] > idf[2][0]  # zyxquart (in 1 memory) > mat (2) > the (3)
    assert word_weights([["(x,", "x"], ["--", "y"]])[1][0] == 0.0  # no letter or digit: never drawn
    rng = np.random.default_rng(0)
    rare = AdaptationPolicy(views="rare-span-memory", query_min_words=1, query_max_words=2, query_idf_power=8)
    views = [query_view(lists[2], idf[2], rng, rare) for _ in range(200)]
    assert all(1 <= len(v.split()) <= 2 and v in memories[2] for v in views)  # contiguous runs of the memory
    assert sum("zyxquart" in v for v in views) > 150  # centred on the rarest word
    words = AdaptationPolicy(views="words-memory", query_min_words=3, query_max_words=3)
    view = query_view(lists[0], idf[0], rng, words).split()
    assert len(view) == 3 and [lists[0].index(w) for w in view] == sorted(lists[0].index(w) for w in view)
    assert query_view(["solo"], np.zeros(1), rng, rare) == "solo"


def test_sentence_views_are_whole_sentences_or_rare_spans() -> None:
    text = "Opens a file for reading. It takes two arguments: a path and a mode. Returns a handle or fails."
    words = text.split()
    idf = word_weights([words])[0]
    sentences = ["Opens a file for reading.", "It takes two arguments:", "a path and a mode.",
                 "Returns a handle or fails."]
    rng = np.random.default_rng(1)
    mixed = AdaptationPolicy(views="sentence-or-span", sentence_share=0.5, query_max_words=2)
    views = [query_view(words, idf, rng, mixed) for _ in range(300)]
    whole = [v for v in views if v in sentences]
    assert 100 < len(whole) < 200 and set(whole) == set(sentences)  # about half, every sentence reachable
    assert all(v in text and len(v.split()) <= 2 for v in views if v not in sentences)  # the rest: rare spans
    cut = AdaptationPolicy(views="sentence-or-span", sentence_share=1.0, sentence_max_words=3)
    assert all(len(query_view(words, idf, rng, cut).split()) <= 3 for _ in range(20))


def test_fit_adapter_against_store_vectors_learns_retrieval_and_keeps_the_anchors(base: LMEmbedder) -> None:
    vectors = base.embed_many(TEXTS)  # (N, D) what a store holds
    policy = AdaptationPolicy(steps=60, batch_size=12, lr=1e-2, anchor_batch=6, views="span-memory",
                              query_min_words=2, query_max_words=3, seed=2)
    fit = fit_adapter(base, TEXTS, policy, vectors=vectors)
    assert fit.steps == 60 and all(np.isfinite(c) for _, _, c in fit.losses)
    adapted = merge_adapter(base.model, fit.weights)
    rng = np.random.default_rng(9)
    lists = [t.split() for t in TEXTS]
    queries = [base.tokenizer.encode(query_view(w, np.ones(len(w)), rng, policy)) for w in lists]
    tokens, lengths = pad_batch(queries)
    rows = np.arange(len(TEXTS))
    before = retrieval_loss_and_grad(base.model.pooled_forward(tokens, lengths)[0], vectors, rows, 0.05)[0]
    after = retrieval_loss_and_grad(adapted.pooled_forward(tokens, lengths)[0], vectors, rows, 0.05)[0]
    assert after < before
    moved = LMEmbedder(adapted, base.tokenizer).embed_many(TEXTS)  # (N, D)
    free = fit_adapter(base, TEXTS, AdaptationPolicy(**{**policy.__dict__, "anchor_weight": 0.0}), vectors=vectors)
    drifted = LMEmbedder(merge_adapter(base.model, free.weights), base.tokenizer).embed_many(TEXTS)
    assert np.einsum("nd,nd->n", moved, vectors).mean() > np.einsum("nd,nd->n", drifted, vectors).mean()
    with pytest.raises(InvalidInput):
        fit_adapter(base, TEXTS, policy, vectors=vectors[:3])


def test_fit_adapter_learns_logged_queries_that_share_no_word_with_their_memory(base: LMEmbedder) -> None:
    vectors = base.embed_many(TEXTS)  # (N, D)
    # real queries in other words than the memory (what a query log holds), each with the memory it found
    names = {"Ada": "the first", "Bob": "the second", "Cyd": "the third", "Dee": "the fourth"}
    pairs = [(f"{names[t.split()[0]]} person, {t.split()[-1]} habit", i, 1.0) for i, t in enumerate(TEXTS)]
    policy = AdaptationPolicy(steps=80, batch_size=8, lr=1e-2, anchor_batch=6, query_batch=16, seed=4)
    tokens, lengths = pad_batch([base.tokenizer.encode(q) for q, _, _ in pairs])
    rows = np.array([i for _, i, _ in pairs])
    plain = merge_adapter(base.model, fit_adapter(base, TEXTS, policy, vectors=vectors).weights)
    logged = merge_adapter(base.model, fit_adapter(base, TEXTS, policy, vectors=vectors, pairs=pairs).weights)
    loss_plain = retrieval_loss_and_grad(plain.pooled_forward(tokens, lengths)[0], vectors, rows, 0.05)[0]
    loss_logged = retrieval_loss_and_grad(logged.pooled_forward(tokens, lengths)[0], vectors, rows, 0.05)[0]
    assert loss_logged < loss_plain
    # pairs pointing outside texts, with no tokens or with zero weight are dropped, not an error
    junk = [("x", len(TEXTS) + 5, 1.0), ("", 0, 1.0), ("y", 1, 0.0)]
    fit = fit_adapter(base, TEXTS, AdaptationPolicy(steps=3, seed=4), vectors=vectors, pairs=junk)
    assert fit.steps == 3


@pytest.mark.parametrize("target", ["pool.wo", "emb"])
def test_lora_projection_through_pooled_embedding(base: LMEmbedder, rng: np.random.Generator, target: str) -> None:
    """d loss / d A from pooled_backward + gA = s B^T G equals a float64 finite difference."""
    model = EvermindLM.from_params(base.model.config, base.model.params)
    model.params = {k: v.astype(np.float64) for k, v in model.params.items()}  # the maths follow this dtype
    w0 = model.params[target].copy()
    rows, cols = w0.shape
    a = rng.normal(size=(2, cols)) * 0.3  # (R, cols)
    b = rng.normal(size=(rows, 2)) * 0.3  # (rows, R)
    scale = 1.5
    seqs = [base.tokenizer.encode(t) for t in TEXTS[:3]] + [base.tokenizer.encode(t)[:4] for t in TEXTS[:3]]
    tokens, lengths = pad_batch(seqs)

    def loss_at(a_: np.ndarray) -> float:
        model.params[target] = w0 + scale * (b @ a_)
        pooled, _ = model.pooled_forward(tokens, lengths)
        return contrastive_loss_and_grad(pooled, 0.5)[0]

    loss_at(a)
    pooled, cache = model.pooled_forward(tokens, lengths)
    _, dpooled = contrastive_loss_and_grad(pooled, 0.5)
    g = model.pooled_backward(dpooled, cache, grads_for=[target])[target]
    ga, _ = lora_grads(g, a, b, scale)
    direction = rng.normal(size=a.shape)  # (R, cols)
    eps = 1e-6
    numeric = (loss_at(a + eps * direction) - loss_at(a - eps * direction)) / (2 * eps)
    assert np.isclose(float((ga * direction).sum()), numeric, rtol=1e-4, atol=1e-9)


def test_fit_adapter_lowers_contrastive_loss_and_leaves_base_alone(base: LMEmbedder) -> None:
    before = {k: v.copy() for k, v in base.model.params.items()}
    policy = AdaptationPolicy(steps=40, batch_size=12, lr=1e-2, lm_weight=0.1, seed=1)
    fit = fit_adapter(base, TEXTS, policy)
    assert fit.steps == 40 and len(fit.losses) == 40 and not fit.stopped
    assert all(np.array_equal(before[k], base.model.params[k]) for k in before)
    assert set(fit.weights.tensors) == set(default_targets(base.model.config))
    assert fit.weights.base_fingerprint == base.fingerprint
    assert any(np.abs(b).max() > 0 for _, b in fit.weights.tensors.values())
    # the contrastive loss on fixed spans drops from the base model to the adapted one
    adapted = merge_adapter(base.model, fit.weights)
    span_rng = np.random.default_rng(5)
    toks = [base.tokenizer.encode(t) for t in TEXTS[:16]]
    views = [token_span(t, span_rng) for t in toks] + [token_span(t, span_rng) for t in toks]
    tokens, lengths = pad_batch(views)
    loss_base = contrastive_loss_and_grad(base.model.pooled_forward(tokens, lengths)[0], 0.05)[0]
    loss_adapted = contrastive_loss_and_grad(adapted.pooled_forward(tokens, lengths)[0], 0.05)[0]
    assert loss_adapted < loss_base


def test_fit_adapter_budget_stop_and_init(base: LMEmbedder) -> None:
    stopped = fit_adapter(base, TEXTS, AdaptationPolicy(steps=50), should_stop=lambda: True)
    assert stopped.stopped and stopped.steps == 0
    no_cpu = fit_adapter(base, TEXTS, AdaptationPolicy(steps=50, max_cpu_seconds=0.0))
    assert no_cpu.steps == 0 and not no_cpu.stopped
    first = fit_adapter(base, TEXTS, AdaptationPolicy(steps=3, lr=1e-2))
    more = fit_adapter(base, TEXTS, AdaptationPolicy(steps=1, lr=0.0), init=first.weights)
    assert adapter_digest(more.weights) == adapter_digest(first.weights)  # lr 0: the init carries over exactly
    with pytest.raises(InvalidInput):
        fit_adapter(base, TEXTS, AdaptationPolicy(targets=("conv_norm_nope",)))
    with pytest.raises(InvalidInput):
        fit_adapter(object(), TEXTS, AdaptationPolicy())


def _poisoned(base: LMEmbedder, how: str) -> LMEmbedder:
    model = EvermindLM.from_params(base.model.config, base.model.params)
    if how == "nan":
        model.params["emb"][...] = np.nan  # a broken candidate: every vector is NaN
    else:
        model.params["emb"][...] = model.params["emb"][0]  # every token looks the same
        model.params["pool.wqkv"][...] = 0.0
    return LMEmbedder(model, base.tokenizer)


def test_gate_refuses_nan_and_degenerate_candidates(base: LMEmbedder) -> None:
    policy = AdaptationPolicy(probe_k=3)
    nan = gate_candidate(base, _poisoned(base, "nan"), TEXTS[:8], TEXTS[8:], policy)
    assert not nan.passed and not nan.finite and "finite" in nan.reason
    flat = gate_candidate(base, _poisoned(base, "flat"), TEXTS[:8], TEXTS[8:], policy)
    assert not flat.passed and flat.finite
    assert flat.recall_candidate < flat.recall_current or flat.mean_cosine_candidate > 0.99


def test_gate_refuses_a_tie_and_passes_an_equal_candidate_only_when_told(base: LMEmbedder) -> None:
    policy = AdaptationPolicy(probe_k=3, min_probe_queries=8)
    labels = np.arange(len(TEXTS))
    tie = gate_candidate(base, base, TEXTS[:8], TEXTS[8:], policy, corpus_labels=labels)
    assert not tie.passed and tie.recall_candidate == tie.recall_current and tie.probes == 8
    assert tie.queries == 8 * policy.probe_views and tie.mrr_gain == 0.0 and "not better" in tie.reason
    assert tie.candidate_vectors is None  # nothing to publish
    lenient = AdaptationPolicy(probe_k=3, require_gain=False)
    same = gate_candidate(base, base, TEXTS[:8], TEXTS[8:], lenient, corpus_labels=labels)
    assert same.passed and same.candidate_vectors.shape == (len(TEXTS), base.dimensions)
    stored = base.embed_many(TEXTS)
    with_stored = gate_candidate(base, base, TEXTS[:8], TEXTS[8:], lenient, current_doc_vectors=stored)
    assert with_stored.recall_current == same.recall_current and with_stored.mrr_current == same.mrr_current
    few = gate_candidate(base, base, TEXTS[:8], TEXTS[8:], AdaptationPolicy(min_probe_queries=100))
    assert not few.passed and "too few" in few.reason


def test_gate_passes_only_a_gain_beyond_its_standard_error(base: LMEmbedder) -> None:
    other = LMEmbedder(EvermindLM(base.model.config, seed=99), base.tokenizer)
    for margin in (0.0, AdaptationPolicy().gate_margin, 2.0):  # the default (1 SE) between the extremes
        policy = AdaptationPolicy(probe_k=1, min_probe_queries=8, gate_margin=margin, gate_tolerance=1.0)
        for a, b in ((base, other), (other, base)):  # one way round is a gain, the other a loss (or both tie)
            v = gate_candidate(a, b, TEXTS[:12], TEXTS[12:], policy)
            assert np.isclose(v.mrr_gain, v.mrr_candidate - v.mrr_current)
            assert v.passed == (v.mrr_gain > 0 and v.mrr_gain > margin * v.mrr_gain_se), v.reason
            assert json.dumps(v.to_dict())
    worse = gate_candidate(other, base, TEXTS[:12], TEXTS[12:], AdaptationPolicy(min_probe_queries=8))
    better = gate_candidate(base, other, TEXTS[:12], TEXTS[12:], AdaptationPolicy(min_probe_queries=8))
    assert not (worse.passed and better.passed)  # at most one direction wins
    assert np.isclose(worse.mrr_gain, -better.mrr_gain)


def test_probe_split_and_spans_are_seeded() -> None:
    policy = AdaptationPolicy(probe_fraction=0.2, min_probe=3, max_probe=50, seed=4)
    train, probe = split_probe(100, policy)
    assert len(probe) == 20 and not set(train) & set(probe) and len(train) + len(probe) == 100
    assert np.array_equal(probe, split_probe(100, policy)[1])
    assert len(split_probe(10, policy)[1]) == 3
    span = text_span("one two three four five six seven eight", np.random.default_rng(0))
    assert 3 <= len(span.split()) <= 4 and span in "one two three four five six seven eight"
    assert text_span("short text", np.random.default_rng(0)) == "short text"


@pytest.mark.parametrize("bad", [
    {"rank": 0}, {"steps": -1}, {"lr": float("nan")}, {"probe_fraction": 0.95}, {"batch_size": 1},
    {"gate_tolerance": 2.0}, {"targets": "emb"}, {"targets": ("emb", "emb")}, {"min_probe": 9, "max_probe": 3},
    {"rank": True}, {"poll_seconds": 0}, {"views": "halves"}, {"negatives": "none"}, {"lr_schedule": "step"},
    {"query_min_words": 5, "query_max_words": 2}, {"anchor_weight": -1.0},
])
def test_policy_rejects_bad_values(bad: dict) -> None:
    with pytest.raises(InvalidInput):
        AdaptationPolicy(**bad)


def test_hooks_validation() -> None:
    assert check_hooks(None).before_swap is None
    assert check_hooks({"on_error": print}).on_error is print
    with pytest.raises(InvalidInput):
        check_hooks({"on_swap": print})
    with pytest.raises(InvalidInput):
        check_hooks({"on_error": 3})


def test_adapter_history_files_index_and_pins(tmp_path, base: LMEmbedder) -> None:
    hist = AdapterHistory(tmp_path / "m.db.adapters")
    assert hist.entries() == []
    w = fit_adapter(base, TEXTS, AdaptationPolicy(steps=2, lr=1e-2)).weights
    first = hist.add(w, round=1)
    second = hist.add(LoRAWeights(w.rank, w.alpha, {t: (a, b * 2) for t, (a, b) in w.tensors.items()}), round=2)
    assert [e["id"] for e in hist.entries()] == ["0001", "0002"]
    assert first["digest"] == adapter_digest(w) and second["status"] == "candidate"
    assert adapter_digest(hist.load(first, base.model)) == adapter_digest(w)
    hist.update("0002", status="published")
    assert hist.get("0002")["status"] == "published"
    with pytest.raises(InvalidInput):
        hist.get("0009")
    (tmp_path / "m.db.adapters" / "index.json").write_text("{not json")
    listed = hist.entries()
    assert [e["id"] for e in listed] == ["0001", "0002"] and listed[0]["status"] == "unlisted"
    assert hist.add(w)["id"] == "0003"  # never reuses a file name
    path = hist.path(second)
    data = bytearray(path.read_bytes())
    data[-7] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        hist.load(second, base.model)


def test_fit_adapter_reads_the_model_part_of_vectors_with_a_lexicon_part(base: LMEmbedder) -> None:
    """A store of an embedder with a lexicon holds [model, lexicon] vectors; the adapter is fitted against the
    model's part, so the fit goes as it goes against the model's own vectors."""
    from evermind_memory.lm.lexicon import Lexicon

    words = sorted({w for t in TEXTS for w in t.lower().replace(".", " ").split() if w.isalpha() and w.isascii()})
    rng = np.random.default_rng(4)
    lex = Lexicon(words, rng.integers(-127, 128, size=(len(words), 6)).astype(np.int8),
                  np.full(len(words), 0.01, np.float32), np.ones(len(words), np.float32))
    mixed = LMEmbedder(base.model, base.tokenizer, max_tokens=base.max_tokens, lexicon=lex, lexicon_weight=0.8)
    policy = AdaptationPolicy(steps=5, batch_size=8, lr=1e-2, anchor_batch=4, views="span-memory", seed=2)
    with_lexicon = fit_adapter(mixed, TEXTS, policy, vectors=mixed.embed_many(TEXTS))  # (N, C + 6)
    model_only = fit_adapter(base, TEXTS, policy, vectors=base.embed_many(TEXTS))  # (N, C)
    # the same targets up to float32 rounding: the same first loss, and the later steps within 1% (Adam magnifies
    # the rounding a little from step to step)
    got, want = np.array(with_lexicon.losses, dtype=np.float64), np.array(model_only.losses, dtype=np.float64)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-2)
