"""recipe/deepen.py: a deepened checkpoint computes what the trained one computed, and training can move every new
layer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from evermind_memory.embedder import LMEmbedder
from evermind_memory.lm.model import EvermindLM, param_shapes

SCRIPT = Path(__file__).resolve().parents[2] / "recipe" / "deepen.py"
_spec = importlib.util.spec_from_file_location("deepen", SCRIPT)
dp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dp)


def test_plan_keeps_the_old_layers_in_order_and_spreads_the_new():
    assert dp.plan(4, 6) == [0, 1, None, 2, None, 3]
    assert dp.plan(4, 5) == [0, 1, 2, None, 3]
    assert dp.plan(4, 8) == [0, None, 1, None, 2, None, 3, None]
    assert dp.plan(4, 4) == [0, 1, 2, 3]
    with pytest.raises(SystemExit):
        dp.plan(4, 3)


def test_deepened_model_embeds_as_the_trained_one(shipped, grow_texts):
    cfg, params, tok = shipped
    new_cfg, new_params = dp.deepen(cfg, params, cfg.n_layers + 2)
    assert new_cfg.n_layers == cfg.n_layers + 2
    assert {k: v.shape for k, v in new_params.items()} == param_shapes(new_cfg)
    old = LMEmbedder(EvermindLM.from_params(cfg, params), tok).embed_many(grow_texts)
    new = LMEmbedder(EvermindLM.from_params(new_cfg, new_params), tok).embed_many(grow_texts)
    np.testing.assert_allclose(new, old, atol=1e-5)


def test_new_layers_read_trained_features_and_write_nothing_yet(shipped):
    cfg, params, _ = shipped
    new_cfg, p = dp.deepen(cfg, params, cfg.n_layers + 2)
    for layer, old in enumerate(dp.plan(cfg.n_layers, new_cfg.n_layers)):
        names = [n for n in p if n.startswith(f"layers.{layer}.")]
        writers = [n for n in names if n.rsplit(".", 1)[-1] in dp.WRITERS]
        readers = [n for n in names if n not in writers]
        assert writers and readers
        if old is None:
            assert all(not p[n].any() for n in writers)
            assert all(np.abs(p[n]).sum() > 0 for n in readers if not n.endswith(".b1"))
        else:
            for n in names:
                np.testing.assert_array_equal(p[n], params[n.replace(f"layers.{layer}.", f"layers.{old}.")])
