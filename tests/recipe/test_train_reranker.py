"""recipe/train_reranker.py's step on the CPU: the listwise loss is its definition, and the full-width form a CUDA
graph captures gives the same loss as the trimmed one.

A dev-time tool that needs torch (not a dependency of the package): skipped where torch is not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="recipe/train_reranker.py needs torch (a dev-time tool)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipe"))

import train_reranker as tr  # noqa: E402

from evermind_memory.lm.model import EvermindLM  # noqa: E402


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("residual_tau", [0.0, 0.05])
def test_list_loss_is_its_definition_at_both_widths(residual_tau, tiny_cfg, token_rows):
    rng = np.random.default_rng(4)
    cfg = tiny_cfg
    model = tr.Reranker(cfg, EvermindLM(cfg, seed=0).params)
    torch.nn.init.normal_(model.head.weight, std=0.5)  # a trained-looking head: scores differ between candidates
    n_texts, T = 40, 20
    mat, lengths = token_rows(rng, n_texts, T, cfg.vocab_size)
    tok_mat, tok_len = torch.as_tensor(mat), torch.as_tensor(lengths)
    emb = torch.nn.functional.normalize(torch.randn(n_texts, 16, generator=torch.Generator().manual_seed(1)), dim=-1)
    teach = torch.nn.functional.normalize(torch.randn(n_texts, 12, generator=torch.Generator().manual_seed(2)), dim=-1)
    B, K1, q_max, d_max, kd_tau, kd_w = 3, 4, 6, 10, 0.05, 1.5
    q_np = np.repeat(rng.choice(20, B, replace=False), K1)
    d_np = rng.choice(np.arange(20, 40), B * K1, replace=False)
    q, d = tr.to_device([q_np, d_np], torch.device("cpu"))
    args = (model, tok_mat, tok_len, emb, teach, q, d, 7, B, K1, q_max, d_max, residual_tau, kd_tau, kd_w)
    loss, ce, kd, scores = tr.list_loss(*args, True)
    full = tr.list_loss(*args, False)
    assert float(full[0].detach()) == pytest.approx(float(loss.detach()), rel=1e-5)
    np.testing.assert_allclose(full[3].detach().numpy(), scores.detach().numpy(), rtol=1e-4, atol=1e-5)

    s = scores.detach().numpy().astype(np.float64)  # (B, K1) as the model scored them, the embedder's part included
    with torch.no_grad():
        tokens, lens = tr.join_pairs(tok_mat, tok_len, q, d, 7, q_max, d_max)
        head = model(tokens, lens).numpy().reshape(B, K1).astype(np.float64)
    cos = (emb.numpy()[q_np] * emb.numpy()[d_np]).sum(1).reshape(B, K1)
    np.testing.assert_allclose(s, head + (cos / residual_tau if residual_tau else 0.0), rtol=1e-5, atol=1e-5)
    assert np.ptp(head, axis=1).min() > 1e-3  # the candidates are told apart
    t = (teach.numpy()[q_np] * teach.numpy()[d_np]).sum(1).reshape(B, K1) / kd_tau
    want_ce = -_log_softmax(s)[:, 0].mean()
    want_kd = (np.exp(_log_softmax(t)) * (_log_softmax(t) - _log_softmax(s))).sum(1).mean()
    assert float(ce.detach()) == pytest.approx(want_ce, rel=1e-5)
    assert float(kd.detach()) == pytest.approx(want_kd, rel=1e-4, abs=1e-6)
    assert float(loss.detach()) == pytest.approx(want_ce + kd_w * want_kd, rel=1e-5)
    loss.backward()
    assert model.head.weight.grad is not None and float(model.head.weight.grad.abs().sum()) > 0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.lm.parameters())


def test_labelled_negatives_are_the_same_persons_other_kinds_of_fact():
    # pairs: (doc, person, kind); person -1 names nobody
    rows = [(10, 0, 0), (11, 0, 1), (12, 0, 2), (10, 0, 0), (20, 1, 0), (21, 1, 0), (30, -1, -1), (13, 0, 1)]
    pair_d, person, kind = (np.array(col, dtype=np.int64) for col in zip(*rows))
    out = tr.labelled_negatives(pair_d, person, kind, 3, np.random.default_rng(0))
    assert out.shape == (len(rows), 3)
    for i, (doc, who, what) in enumerate(rows):
        got = out[i][out[i] >= 0].tolist()
        want = {d for d, p, kd in rows if p == who and kd != what and d != doc} if who >= 0 else set()
        assert len(got) == len(set(got)) == min(3, len(want)) and set(got) <= want, (i, got, want)
    assert sorted(out[0][out[0] >= 0].tolist()) == [11, 12, 13]  # every other fact of person 0


def test_merge_takes_the_labelled_first_then_mined_ones_not_taken():
    first = np.array([[5, 6], [-1, -1], [7, -1]])
    then = np.array([[6, 8, 9], [1, 2, 3], [4, 7, -1]])
    np.testing.assert_array_equal(tr.merge_negatives(first, then), [[5, 6, 8], [1, 2, 3], [7, 4, -1]])
