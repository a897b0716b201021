"""recipe/widen.py: a widened checkpoint computes what the trained one computed, and training can move every new
part."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from evermind_memory.embedder import LMEmbedder
from evermind_memory.lm.model import EvermindLM, LMConfig, param_shapes

SCRIPT = Path(__file__).resolve().parents[2] / "recipe" / "widen.py"
_spec = importlib.util.spec_from_file_location("widen", SCRIPT)
wd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wd)


def test_widened_model_embeds_as_the_trained_one_with_new_channels_zero(shipped, grow_texts):
    cfg, params, tok = shipped
    new_cfg, new_params = wd.widen(cfg, params, d_model=cfg.d_model + 128, hidden=cfg.hidden_dim + 64)
    assert new_cfg.d_model == cfg.d_model + 128 and new_cfg.hidden_dim == cfg.hidden_dim + 64
    assert new_cfg.attn_heads == cfg.attn_heads * (cfg.d_model + 128) // cfg.d_model  # head width kept
    assert {k: v.shape for k, v in new_params.items()} == param_shapes(new_cfg)
    old = LMEmbedder(EvermindLM.from_params(cfg, params), tok).embed_many(grow_texts)
    new = LMEmbedder(EvermindLM.from_params(new_cfg, new_params), tok).embed_many(grow_texts)
    assert new.shape == (len(grow_texts), new_cfg.d_model)
    np.testing.assert_allclose(new[:, : cfg.d_model], old, atol=1e-4)
    assert np.abs(new[:, cfg.d_model:]).max() == 0.0


def test_every_new_channel_has_a_nonzero_reader_so_gradients_reach_the_writers(shipped):
    cfg, params, _ = shipped
    c0, h0 = cfg.d_model, cfg.hidden_dim
    new_cfg, p = wd.widen(cfg, params, d_model=c0 + 64, hidden=h0 + 32, seed=3)
    c1 = new_cfg.d_model
    for layer in range(cfg.n_layers):
        pre = f"layers.{layer}."
        assert np.abs(p[pre + "router"][c0:]).min() > 0  # new channels are read by the router...
        assert np.abs(p[pre + "shared.w1"][c0:]).mean() > 0  # ...and by the experts
        assert np.abs(p[pre + "expert0.w1"][:, h0:]).mean() > 0  # new hidden units read every channel
        assert not p[pre + "expert0.w2"][h0:].any() and not p[pre + "expert0.w2"][:, c0:].any()  # writers start at 0
        assert (p[pre + "conv"][0, c0:] == 1).all()
    assert not p["emb"][:, c0:].any()
    assert not p["pool.wo"][c0:].any() and not p["pool.wo"][:, c0:].any()
    assert np.abs(p["pool.wqkv"][c0:]).mean() > 0
    assert np.abs(p["pool.wqkv"][:, c0:c1]).mean() > 0  # the new heads' queries


def test_widen_refuses_to_shrink_or_to_change_the_head_width(shipped):
    cfg, params, _ = shipped
    with pytest.raises(SystemExit, match="only grows"):
        wd.widen(cfg, params, d_model=cfg.d_model - 64)
    with pytest.raises(SystemExit, match="head width"):
        wd.widen(cfg, params, d_model=cfg.d_model + 128, attn_heads=cfg.attn_heads)


def test_widen_on_a_model_without_pooling_attention():
    cfg = LMConfig(vocab_size=300, d_model=16, n_layers=2, conv_kernel=3, hidden_dim=8, n_experts=2, top_k=1)
    params = dict(EvermindLM(cfg, seed=1).params)
    params["emb"] = params["emb"] * 50  # activations of a trained model's size: RMSNorm's eps (1e-5) then negligible
    model = EvermindLM.from_params(cfg, params)
    new_cfg, new_params = wd.widen(cfg, params, d_model=24, hidden=12)
    tokens = [[1, 5, 9, 42, 7], [3, 3, 2]]
    a = model.embed_batch(tokens)
    b = EvermindLM.from_params(new_cfg, new_params).embed_batch(tokens)
    np.testing.assert_allclose(b[:, :16], a, atol=1e-5)
    assert not b[:, 16:].any()
