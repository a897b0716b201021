"""recipe/train_embedder.py --lexicon: the vector every training loss sees is the one the shipped embedder returns.

A dev-time tool that needs torch (not a dependency of the package): skipped where torch is not installed.
"""

from __future__ import annotations

import importlib.util
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="recipe/train_embedder.py needs torch (a dev-time tool)")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "recipe" / "train_embedder.py"
sys.path.insert(0, str(SCRIPT.parent))
_spec = importlib.util.spec_from_file_location("train_embedder", SCRIPT)
te = importlib.util.module_from_spec(_spec)
sys.modules["train_embedder"] = te  # its dataclasses look their module up
_spec.loader.exec_module(te)

TEXTS = ["Ada prefers green tea in the morning.", "what does Ada drink?", "x", "1234 5678",
         "Odile sings alto in a church choir on Thursday evenings.", "Zürich Ünïcödé 汉字"]


def test_the_training_join_is_the_embedders_vector(tmp_path):
    from evermind_memory import default_embedder
    from evermind_memory.embedder import LMEmbedder

    shipped = default_embedder().load()
    lexicon = shipped.lexicon
    path = tmp_path / "lexicon.evlx"
    lexicon.save(path)
    args = Namespace(lexicon=str(path), lexicon_weight=0.8, cache=str(tmp_path / "cache"), state=None)
    (tmp_path / "cache").mkdir()
    join = te.LexiconJoin(args, TEXTS, torch.device("cpu"))
    assert join.dims == lexicon.dims
    model_part = LMEmbedder(shipped.model, shipped.tokenizer, max_tokens=shipped.max_tokens).embed_many(TEXTS)
    joined = join(torch.tensor(model_part), torch.arange(len(TEXTS))).numpy()  # (N, C + D)
    product = LMEmbedder(shipped.model, shipped.tokenizer, max_tokens=shipped.max_tokens, lexicon=lexicon,
                         lexicon_weight=0.8).embed_many(TEXTS)
    assert joined.shape == product.shape
    np.testing.assert_allclose(joined, product, atol=2e-3)  # the cached lexicon vectors are float16
    # "1234 5678" holds no word of the table: its vector is the model's alone, unit length
    np.testing.assert_allclose(np.linalg.norm(joined, axis=1), 1.0, atol=1e-5)
    # a second join reads the cache instead of computing again, and gives the same vectors
    again = te.LexiconJoin(args, TEXTS, torch.device("cpu"))
    assert torch.equal(again.vecs, join.vecs)
    assert len(list((tmp_path / "cache").glob("lexicon-*.npy"))) == 1


def test_without_a_lexicon_nothing_is_joined(tmp_path):
    args = Namespace(lexicon=None, lexicon_weight=0.8, cache=str(tmp_path), state=None)
    assert te.LexiconJoin(args, TEXTS, torch.device("cpu")).dims == 0
