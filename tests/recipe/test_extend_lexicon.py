"""recipe/extend_lexicon.py: new words join after the table's own rows, mapped into its space, proper nouns left out.

Needs PyPI wordfreq (a dev-time tool's dependency, not the package's): skipped where it is not installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from evermind_memory.lm.lexicon import Lexicon

pytest.importorskip("wordfreq", reason="recipe/extend_lexicon.py reads wordfreq's frequencies")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipe"))
_spec = importlib.util.spec_from_file_location("extend_lexicon", ROOT / "recipe" / "extend_lexicon.py")
el = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(el)


class WordTeacher:
    """A stand-in for the sentence encoder: a fixed pseudo-random 12-dim vector per word (seeded by its digest)."""

    def encode(self, words, **_):
        return np.stack([np.random.default_rng(int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(),
                                                              "little")).normal(size=12) for w in words])


def test_affine_map_recovers_an_exact_affine_relation(rng):
    src = rng.normal(size=(200, 12))
    a, b = rng.normal(size=(12, 6)), rng.normal(size=6)
    mapping = el.affine_map(src, src @ a + b)
    np.testing.assert_allclose(mapping[:-1], a, atol=1e-9)
    np.testing.assert_allclose(mapping[-1], b, atol=1e-9)


def test_candidates_are_lower_case_table_words_the_table_lacks_most_frequent_first(tmp_path):
    word_list = tmp_path / "words"
    word_list.write_text("\n".join(["Ingrid", "pharmacist", "tea", "walnuts", "don't", "café", "walnuts",
                                    "zzyzzxq", "mornings"]) + "\n", encoding="utf-8")
    got = el.candidates(word_list, known={"tea"}, min_zipf=1.5)
    words = [w for w, _ in got]
    assert set(words) == {"pharmacist", "walnuts", "mornings"}  # no name, no known word, no apostrophe or accent
    freqs = [f for _, f in got]
    assert freqs == sorted(freqs, reverse=True) and all(f > 0 for f in freqs)


def test_extend_keeps_the_table_and_maps_new_words_into_its_space(rng):
    import wordfreq

    teacher = WordTeacher()
    words = [w for w in wordfreq.top_n_list("en", 600) if w.isascii() and w.isalpha() and w.islower()][:300]
    true_map = rng.normal(size=(12, 8)) * 0.1
    rows = teacher.encode(words) @ true_map  # (300, 8): the table is an exact linear image of the teacher here
    table, scale = el.quantise(rows)
    # the table's weights from corpus frequencies three times wordfreq's: the new words' weights follow that scale
    weight = (1e-3 / (1e-3 + 3 * np.array([wordfreq.word_frequency(w, "en") for w in words]))).astype(np.float32)
    base = Lexicon(words, table, scale, weight)
    new = [("pharmacist", 2e-6), ("walnuts", 1e-6)]
    out = el.extend(base, new, teacher)
    assert out.words[:300] == base.words and out.words[300:] == ["pharmacist", "walnuts"]
    np.testing.assert_array_equal(out.table[:300], base.table)
    np.testing.assert_array_equal(out.weight[:300], base.weight)
    want = teacher.encode(["pharmacist", "walnuts"]) @ true_map  # what the table's own map gives the new words
    got = out.table[300:].astype(np.float64) * out.scale[300:, None]
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 0.99
    np.testing.assert_allclose(out.weight[300:], [1e-3 / (1e-3 + 3 * f) for _, f in new], rtol=1e-3)
