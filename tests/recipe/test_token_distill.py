"""recipe/token_distill.py: the word alignment between our tokenizer and a BERT word-piece tokenizer, and the words
loss. A dev-time tool that needs torch and transformers: skipped where they are not installed (CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="recipe/token_distill.py needs torch (a dev-time tool)")
transformers = pytest.importorskip("transformers", reason="recipe/token_distill.py needs transformers")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipe"))

import token_distill as td  # noqa: E402

from evermind_memory.lm.tokenizer import BPETokenizer  # noqa: E402

PIECES = ["uma", "plays", "lac", "##ross", "##e", "on", "week", "##ends", "what", "sport", "does", "play", "radio",
          "##grapher", "##s", "and", "nurse", "ada", "'", "s", "flight", "to", "lisbon", "x"]
TEXTS = ["Uma plays lacrosse on weekends.", "what sport does Uma play?", "radiographers  and  nurses!!",
         "Ada's flight to Lisbon", "Ünïcödé radio", "x"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert")
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (folder / "vocab.txt").write_text("\n".join(specials + PIECES + list(".?!,")) + "\n", encoding="utf-8")
    return transformers.BertTokenizerFast.from_pretrained(str(folder), do_lower_case=True)  # how the recipe loads


@pytest.fixture(scope="module")
def ours():
    return BPETokenizer.load(ROOT / "evermind_memory" / "models" / "tokenizer.json")


def _aligned(ours, bert):
    enc = [ours.encode(t) for t in TEXTS]
    mat = np.zeros((len(TEXTS), 128), dtype=np.int32)
    lengths = np.array([len(e) for e in enc])
    for i, e in enumerate(enc):
        mat[i, : len(e)] = e
    return td.align_all(TEXTS, mat, lengths, ours, bert, chunk=4), mat, lengths


def _words(text: str) -> list[str]:
    """BERT's basic split of an ASCII text: runs of letters and digits, and each punctuation mark alone."""
    import re

    return re.findall(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]", text.lower())


def test_each_student_token_lands_in_the_word_holding_its_last_byte(ours, bert):
    align, mat, lengths = _aligned(ours, bert)
    for i, text in enumerate(TEXTS):
        if not text.isascii():
            assert (align.t_word[i] == -1).all() and (align.s_word[i] == -1).all()
            continue
        words = _words(text)
        n_words = int(align.t_word[i].max()) + 1
        assert n_words == len(words), (text, words)
        ours_words = [ours.decode(mat[i, : lengths[i]][align.s_word[i, : lengths[i]] == w].tolist()).lstrip()
                      for w in range(len(words))]
        for w, word in enumerate(words):
            pieces = bert.convert_ids_to_tokens(align.t_ids[i][align.t_word[i] == w].tolist())
            assert "".join(p.removeprefix("##") for p in pieces) in (word, "[UNK]")
            ours_text = ours_words[w]
            if not ours_text:  # a BPE token spanning it and the next word ("!!") belongs to the next one
                assert len(ours_words[w + 1]) > len(words[w + 1]), (text, word, ours_words)
                continue
            # a word's tokens spell it (a token begun in the word before, as "'s", ends in it)
            assert ours_text.lower() == word or ours_text.lower().endswith(word), (text, word, ours_text)
        # every token that holds a letter or digit belongs to some word
        for j in range(lengths[i]):
            if ours.decode([int(mat[i, j])]).strip().isalnum():
                assert align.s_word[i, j] >= 0, (text, j)


def test_word_means_and_loss_are_their_definitions():
    rng = np.random.default_rng(0)
    n, T, C, D, W = 3, 7, 5, 4, td.MAX_WORDS
    states = rng.normal(size=(n, T, C))
    word = rng.integers(-1, 4, size=(n, T))
    word[2] = -1  # a text with no word at all
    t_means = rng.normal(size=(n, W, D))
    t_counts = np.zeros((n, W))
    t_counts[:, :3] = 1  # the teacher holds words 0-2 of each text
    proj = rng.normal(size=(C, D))
    means, counts = td.word_means(torch.tensor(states), torch.tensor(word), W)
    loss = td.word_loss(torch.tensor(states), torch.tensor(word), torch.tensor(t_means), torch.tensor(t_counts),
                        torch.tensor(proj))
    total, held = 0.0, 0
    for i in range(n):
        for w in range(W):
            rows = states[i][word[i] == w]
            np.testing.assert_allclose(counts[i, w].item(), len(rows))
            if len(rows):
                np.testing.assert_allclose(means[i, w].numpy(), rows.mean(axis=0), rtol=1e-12)
            if len(rows) and t_counts[i, w]:
                s = rows.mean(axis=0) @ proj
                total += 1 - s @ t_means[i, w] / (np.linalg.norm(s) * np.linalg.norm(t_means[i, w]))
                held += 1
    assert held > 0
    np.testing.assert_allclose(loss.item(), total / held, rtol=1e-10)


def test_the_loss_is_zero_for_the_teachers_own_states_and_falls_under_training():
    g = torch.Generator().manual_seed(1)
    n, T, C = 4, 9, 6
    word = torch.randint(-1, 5, (n, T), generator=g)
    teacher_states = torch.randn(n, T, C, generator=g, dtype=torch.float64)
    t_means, t_counts = td.word_means(teacher_states, word, td.MAX_WORDS)
    eye = torch.eye(C, dtype=torch.float64)
    assert td.word_loss(teacher_states, word, t_means, t_counts, eye).item() == pytest.approx(0.0, abs=1e-12)
    proj = torch.randn(C, C, generator=g, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([proj], lr=0.5)
    first = None
    for _ in range(50):
        loss = td.word_loss(teacher_states, word, t_means, t_counts, proj)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first
