"""recipe/train_word_rerank.py on the CPU: the pairs it prepares and the lexicon it exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "recipe" / "train_word_rerank.py"
sys.path.insert(0, str(SCRIPT.parent))

torch = pytest.importorskip("torch", reason="recipe/train_word_rerank.py needs torch (a dev-time tool)")

import train_word_rerank as twr  # noqa: E402

from evermind_memory.lm.lexicon import Lexicon  # noqa: E402

WORDS = ["ada", "drinks", "green", "tea", "bob", "likes", "coffee", "what", "does", "drink", "who", "plays", "chess",
         "sugar", "milk"]  # the last two in no pair
PAIRS = [("what does Ada drink?", "Ada drinks green tea."), ("Ada tea", "Ada drinks green tea."),
         ("who likes coffee?", "Bob likes coffee."), ("who plays chess?", "Bob plays chess."),
         ("zzz", "Bob likes coffee."), ("what does Bob drink?", "qqq")]


def lexicon_words(text: str) -> list[str]:
    return [w for w in text.lower().replace("?", " ").replace(".", " ").split()]


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Lexicon, Path]:
    rng = np.random.default_rng(0)
    lexicon = Lexicon(WORDS, rng.integers(-127, 128, (len(WORDS), 8)).astype(np.int8),
                      rng.uniform(0.01, 0.02, len(WORDS)), rng.uniform(0.5, 1.5, len(WORDS)))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": q, "doc": d, "source": "t"}) + "\n" for q, d in PAIRS))
    return lexicon, pairs


def test_prepare_keeps_pairs_with_known_words_and_numbers_each_memory(tiny, tmp_path: Path) -> None:
    lexicon, pairs = tiny
    stats = twr.prepare(lexicon, [str(pairs)], [100], tmp_path / "ids.npz", seed=0)
    assert stats == {"pairs": 4, "docs": 3, "per_file": [4]}  # "zzz" and "qqq" know no word: dropped
    data = np.load(tmp_path / "ids.npz")
    queries = [[WORDS[i] for i in row if i != twr.PAD] for row in data["q"]]
    docs = [[WORDS[i] for i in row if i != twr.PAD] for row in data["d"]]
    by_doc: dict[int, set] = {}
    for d, doc_id in zip(docs, data["doc"].tolist()):
        by_doc.setdefault(doc_id, set()).add(tuple(d))
    assert all(len(v) == 1 for v in by_doc.values()) and len(by_doc) == 3  # one id a memory, repeats share it
    assert ["what", "does", "ada", "drink"] in queries and ["ada", "drinks", "green", "tea"] in docs


def train(tmp_path: Path, out: str, *flags: str) -> dict:
    """`train_word_rerank.py train` on the CPU in a process of its own (torch's optimiser loads triton, which
    crashes a process that has loaded wgpu, as the GPU tests do); returns the run's summary."""
    subprocess.run([sys.executable, str(SCRIPT), "train", "--lexicon", str(tmp_path / "lex.evlx"), "--data",
                    str(tmp_path / "ids.npz"), "--out", str(tmp_path / out), "--device", "cpu", "--batch", "4",
                    "--tau", "0.05", "--seed", "0", *flags], check=True, capture_output=True, timeout=300)
    return json.loads((tmp_path / f"{out}.json").read_text())


def test_train_exports_a_lexicon_of_the_same_words(tiny, tmp_path: Path) -> None:
    lexicon, pairs = tiny
    lexicon.save(tmp_path / "lex.evlx")
    twr.prepare(lexicon, [str(pairs)], [100], tmp_path / "ids.npz", seed=0)
    # lr 0: the export is the lexicon's own rows (unit, re-quantised) and weights
    train(tmp_path, "same.evlx", "--steps", "2", "--lr", "0", "--anchor", "1")
    same = Lexicon.load(tmp_path / "same.evlx")
    base = lexicon.table.astype(np.float64)
    got = same.table.astype(np.float64) * same.scale[:, None]
    cos = np.sum(base * got, axis=1) / (np.linalg.norm(base, axis=1) * np.linalg.norm(got, axis=1))
    assert same.words == lexicon.words and cos.min() > 0.999
    np.testing.assert_allclose(same.weight, lexicon.weight, rtol=1e-4)
    # trained: the rows it read moved, the others did not
    summary = train(tmp_path, "moved.evlx", "--steps", "20", "--lr", "0.05", "--anchor", "0")
    moved = Lexicon.load(tmp_path / "moved.evlx")
    rows = moved.table.astype(np.float64) * moved.scale[:, None]
    cos = np.sum(base * rows, axis=1) / (np.linalg.norm(base, axis=1) * np.linalg.norm(rows, axis=1))
    read = {WORDS.index(w) for q, d in PAIRS[:4] for w in lexicon_words(q + " " + d)}
    assert min(cos[i] for i in read) < 0.99 and min(cos[i] for i in set(range(len(WORDS))) - read) > 0.999
    assert summary["steps"] == 20 and np.isfinite([r["loss"] for r in summary["log"]]).all()
