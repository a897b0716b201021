"""recipe/train_embedder.py's training step on the CPU: the router's top-k and the loss over the step's vectors.

A dev-time tool that needs torch (not a dependency of the package): skipped where torch is not installed.
"""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="recipe/train_embedder.py needs torch (a dev-time tool)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipe"))

# a plain import: the module test_train_embedder_lexicon.py registers, if it ran first (a second copy of the module
# would break the pickling of its functions there)
import train_embedder as te  # noqa: E402
from mirror import MirrorLM, embed_bucketed, top_k_first  # noqa: E402

from evermind_memory.lm.model import EvermindLM, param_shapes  # noqa: E402


def test_top_k_first_is_the_numpy_models_choice_ties_included():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 5, 4)).astype(np.float32)
    logits[:8, :, 1] = logits[:8, :, 3]  # ties: the lower index first, as a stable argsort of -logits
    logits[8:12] = 0.0
    for k in (1, 2, 3):
        values, idx = top_k_first(torch.from_numpy(logits), k)
        want = np.argsort(-logits, axis=-1, kind="stable")[..., :k]
        np.testing.assert_array_equal(idx.numpy(), want)
        np.testing.assert_array_equal(values.numpy(), np.take_along_axis(logits, want, axis=-1))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def _reference_loss(v, ids, teach, head_w, B, negatives, tau, kd_w, dis_w, sim_w):
    """The step's loss in float64 numpy, written from its definition (step_loss's docstring)."""
    v, teach, head_w = v.astype(np.float64), teach.astype(np.float64), head_w.astype(np.float64)
    eq, ed, p = v[:B], v[B:2 * B], v[2 * B:3 * B]
    cols = np.concatenate([ed, v[3 * B:]]) if negatives else ed
    col_ids = np.concatenate([ids[B:2 * B], ids[3 * B:]]) if negatives else ids[B:2 * B]
    mask = (col_ids[None, :] == ids[B:2 * B, None]) & ~np.eye(B, len(col_ids), dtype=bool)
    sim = np.where(mask, -1e4, eq @ cols.T / tau)
    ce = lambda s: -np.mean(np.diag(_log_softmax(s)[:, :B]))  # noqa: E731
    l_con = 0.5 * (ce(sim) + ce(sim[:, :B].T))
    t_sim = np.where(mask, -1e4, teach[ids[:B]] @ teach[col_ids].T / tau)
    lp, lq = _log_softmax(sim), _log_softmax(t_sim)
    l_kd = float((np.exp(lq) * (lq - lp)).sum() / B)
    all_ids = np.concatenate([ids[:B], col_ids, ids[2 * B:3 * B]])
    pooled = np.concatenate([eq, cols, p])
    h = pooled @ head_w.T
    h /= np.linalg.norm(h, axis=1, keepdims=True)
    l_dis = float(np.mean(1 - (h * teach[all_ids]).sum(1)))
    t_p = teach[ids[2 * B:3 * B]]
    l_sim = float(np.mean((p @ p.T - t_p @ t_p.T) ** 2))
    return l_con + dis_w * l_dis + sim_w * l_sim + kd_w * l_kd


@pytest.mark.parametrize("negatives", [False, True])
def test_step_loss_is_its_definition_and_trains(negatives, tiny_cfg, token_rows):
    rng = np.random.default_rng(1)
    cfg = tiny_cfg
    model = MirrorLM(cfg.to_dict(), param_shapes(cfg), EvermindLM(cfg, seed=0).params)
    n_texts, T = 40, 12
    mat, lengths = token_rows(rng, n_texts, T, cfg.vocab_size)
    args = Namespace(precision="fp32", compile="off", buckets=2, tau=0.05, kd_weight=4.0, kd_tau=None,
                     distill_weight=4.0, simmat_weight=1.0)
    dev = torch.device("cpu")
    embed = te.Embed(model, torch.as_tensor(mat), torch.as_tensor(lengths), lengths, args, dev)
    teach = torch.nn.functional.normalize(torch.randn(n_texts, 24, generator=torch.Generator().manual_seed(2)), dim=-1)
    head = torch.nn.Linear(cfg.d_model, 24, bias=False)
    B = 6
    q, d, p = rng.choice(20, B, replace=False), rng.choice(np.arange(20, 40), B, replace=False), rng.choice(40, B)
    d[1] = d[0]  # a duplicate doc: masked out of the other row's negatives
    h = rng.choice(40, B) if negatives else None
    loss, parts = te.step_loss(embed, head, teach, q, d, p, h, args)
    ids = np.concatenate([q, d, p] + ([h] if negatives else []))
    with torch.no_grad():
        v = embed(ids).numpy()
    want = _reference_loss(v, ids, teach.numpy(), head.weight.detach().numpy(), B, negatives, 0.05, 4.0, 4.0, 1.0)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-5)
    assert len(parts) == 4 and all(torch.isfinite(x) for x in parts)
    loss.backward()
    grads = [prm.grad for prm in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert head.weight.grad is not None and float(head.weight.grad.abs().sum()) > 0


def test_buckets_embed_each_text_as_alone(tiny_cfg, token_rows):
    """Length buckets (each padded to its own longest text) give every text the vector it has in one padded batch,
    in the order asked, and hand back the ids on the device."""
    rng = np.random.default_rng(3)
    cfg = tiny_cfg
    model = MirrorLM(cfg.to_dict(), param_shapes(cfg), EvermindLM(cfg, seed=0).params)
    n_texts, T = 30, 40
    mat, lengths = token_rows(rng, n_texts, T, cfg.vocab_size)
    mat_t, len_t = torch.as_tensor(mat), torch.as_tensor(lengths)
    ids = rng.choice(n_texts, 17)
    with torch.no_grad():
        one, ids_one = embed_bucketed(model.pooled, mat_t, len_t, ids, lengths[ids], 1)
        three, ids_three = embed_bucketed(model.pooled, mat_t, len_t, ids, lengths[ids], 3)
    assert ids_one.tolist() == ids.tolist() == ids_three.tolist()
    assert len({int(lengths[i]) for i in ids}) > 3  # the buckets differ in length
    np.testing.assert_allclose(three.numpy(), one.numpy(), rtol=1e-4, atol=1e-5)
