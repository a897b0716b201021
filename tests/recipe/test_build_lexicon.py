"""recipe/build_lexicon.py: word counts over a corpus, and a lexicon whose int8 rows keep the projected vectors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from evermind_memory.lm.lexicon import Lexicon

SCRIPT = Path(__file__).resolve().parents[2] / "recipe" / "build_lexicon.py"
_spec = importlib.util.spec_from_file_location("build_lexicon", SCRIPT)
bl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bl)


def write_corpus(folder: Path) -> Path:
    folder.mkdir()
    with open(folder / "pairs.jsonl", "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"query": "Tea with lemon", "doc": "Ada's tea: green tea, no sugar.", "n": 3}) + "\n")
    with open(folder / "passages.jsonl", "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"text": "Bob plays squash; squash is a sport."}) + "\n")
    return folder


def test_words_are_counted_over_every_string_field_of_pairs_and_passages(tmp_path):
    counts = bl.count_words([write_corpus(tmp_path / "c")])
    assert counts["tea"] == 3 and counts["squash"] == 2 and counts["ada"] == 1 and counts["s"] == 1
    assert "3" not in counts and "Tea" not in counts
    texts = bl.sample_texts([tmp_path / "c"], 10, seed=0)
    assert sorted(texts) == sorted(["Tea with lemon", "Ada's tea: green tea, no sugar.",
                                    "Bob plays squash; squash is a sport."])
    with pytest.raises(SystemExit, match="missing"):
        bl.count_words([tmp_path])


def test_the_lexicon_keeps_the_projected_vectors_and_weighs_frequent_words_less(tmp_path, rng):
    words = [f"{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(40)]
    vectors = rng.standard_normal((40, 24)).astype(np.float32)
    counts = np.linspace(1000, 1, 40)
    lex = bl.build(words, vectors, counts, total=int(counts.sum()), dims=8, sif=1e-3)
    assert isinstance(lex, Lexicon) and lex.dims == 8 and len(lex) == 40
    x = vectors - vectors.mean(axis=0)
    _, _, vt = np.linalg.svd(x.astype(np.float64), full_matrices=False)
    proj = x @ vt[:8].T  # (40, 8)
    back = lex.table.astype(np.float32) * lex.scale[:, None]
    np.testing.assert_allclose(back, proj, atol=float(np.abs(proj).max()) / 127)
    assert np.all(np.diff(lex.weight) > 0)  # rarer words weigh more
    lex.save(tmp_path / "l.evlx")
    assert Lexicon.load(tmp_path / "l.evlx").digest() == lex.digest()
