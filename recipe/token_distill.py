"""Words in context from the teacher, for recipe/train_embedder.py's `--token-distill W`.

The sentence-level losses give the student one target a text: the teacher's pooled vector. A text of fifteen words
holds fifteen more: the teacher's last-layer state of each word in its sentence (its word pieces averaged), which is
what the teacher knows of "lacrosse" or "radiographer" there. MiniLM's sentence vector is the mean of those states, and
ours is the mean of the pooling block's outputs, so each word's student outputs (its BPE tokens averaged) are pulled
towards the teacher's state of the same word through a training-only linear map, as 1 - cosine over every word both
sides hold.

Words are the teacher tokenizer's (BERT's basic split: whitespace and punctuation; a piece starting "##" continues
the word before it). A student token belongs to the word holding its last byte (the GPT-2 pieces carry the space
before a word, which no word holds). Offsets are byte offsets, so texts that are not ASCII (where the teacher's
character offsets are not bytes) take no part; neither do words past MAX_WORDS or cut off by either side's
truncation. The alignment is computed once per text table on the CPU, vectorised over chunks, and cached beside the
tokens; the teacher runs on the step's texts under no_grad.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

TEACHER_TOKENS = 64  # word pieces the teacher reads of a text (its [CLS] and [SEP] included)
STUDENT_TOKENS = 64  # BPE tokens the student's word forward reads of a text
MAX_WORDS = 48  # words distilled per text; the rest of a long text is left to the sentence losses
_BIG = np.int64(1) << 32  # per-row key offset for one global search (a text's bytes stay below this)


@dataclass
class WordAlignment:
    t_ids: np.ndarray  # (N, TEACHER_TOKENS) int32: the teacher's piece ids, 0-padded
    t_word: np.ndarray  # (N, TEACHER_TOKENS) int8: the word of each piece, -1 for [CLS], [SEP], padding, dropped words
    s_word: np.ndarray  # (N, STUDENT_TOKENS) int8: the word holding each student token's last byte, -1 for none


def piece_bytes(tok) -> np.ndarray:
    """(V,) int64: the byte length of each of our tokenizer's ids (specials count 0: encode never makes them)."""
    return np.array([len(p) for p in tok._pieces], dtype=np.int64)


def continuation_table(hf_tok) -> np.ndarray:
    """(V,) bool over the teacher's vocabulary: the piece continues the word before it ("##...")."""
    table = np.zeros(len(hf_tok), dtype=bool)
    for piece, i in hf_tok.get_vocab().items():
        if i < len(table) and piece.startswith("##"):
            table[i] = True
    return table


def align_chunk(texts: list[str], tok_mat: np.ndarray, tok_len: np.ndarray, piece_len: np.ndarray, hf_tok,
                cont: np.ndarray) -> WordAlignment:
    """The alignment of `texts` whose student tokens are rows tok_mat (n, >= STUDENT_TOKENS) with lengths tok_len."""
    n = len(texts)
    enc = hf_tok(texts, max_length=TEACHER_TOKENS, truncation=True, padding="max_length",
                 return_offsets_mapping=True, return_attention_mask=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)  # (n, Lt)
    offs = np.asarray(enc["offset_mapping"], dtype=np.int64)  # (n, Lt, 2) character offsets
    special = (np.asarray(enc["attention_mask"]) == 0) | np.isin(ids, hf_tok.all_special_ids)
    special |= ~np.array([t.isascii() for t in texts])[:, None]  # characters are bytes only in ASCII
    starts = ~special & ~cont[ids]
    word = np.cumsum(starts, axis=1) - 1  # (n, Lt)
    word[special | (word >= MAX_WORDS)] = -1
    # a piece is its word's last when the next piece does not continue it
    nxt_cont = np.zeros_like(starts)
    nxt_cont[:, :-1] = ~special[:, 1:] & cont[ids[:, 1:]]
    wstart = np.full((n, MAX_WORDS), -1, dtype=np.int64)
    wend = np.full((n, MAX_WORDS), -1, dtype=np.int64)
    r, c = np.nonzero(starts & (word >= 0))
    wstart[r, word[r, c]] = offs[r, c, 0]
    r, c = np.nonzero((word >= 0) & ~nxt_cont)
    wend[r, word[r, c]] = offs[r, c, 1]
    held = (wstart >= 0) & (wend > wstart)  # (n, W)
    wr, ww = np.nonzero(held)  # row-major: within a row, words in order of their starts
    gstart = wr * _BIG + wstart[wr, ww]
    gend = wr * _BIG + wend[wr, ww]
    # the student's tokens: the byte each ends on
    Ls = STUDENT_TOKENS
    mat = tok_mat[:, :Ls]
    real = np.arange(Ls)[None, :] < np.minimum(tok_len, Ls)[:, None]
    last = np.cumsum(np.where(real, piece_len[mat], 0), axis=1) - 1  # (n, Ls)
    key = np.arange(n, dtype=np.int64)[:, None] * _BIG + last
    if len(wr):
        at = np.searchsorted(gstart, key, side="right") - 1  # the word starting at or before the byte
        safe = np.maximum(at, 0)
        inside = real & (at >= 0) & (wr[safe] == np.arange(n)[:, None]) & (key < gend[safe])
        s_word = np.where(inside, ww[safe], -1)
    else:  # no text of the chunk holds a word (all of them not ASCII, say)
        s_word = np.full(key.shape, -1)
    return WordAlignment(ids.astype(np.int32), word.astype(np.int8), s_word.astype(np.int8))


def align_all(texts: list[str], tok_mat: np.ndarray, tok_len: np.ndarray, tok, hf_tok,
              chunk: int = 20000) -> WordAlignment:
    """align_chunk over every text, a chunk at a time."""
    piece_len, cont = piece_bytes(tok), continuation_table(hf_tok)
    parts = [align_chunk(texts[i:i + chunk], tok_mat[i:i + chunk], tok_len[i:i + chunk], piece_len, hf_tok, cont)
             for i in range(0, len(texts), chunk)]
    return WordAlignment(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("t_ids", "t_word", "s_word")))


def word_means(states: torch.Tensor, word: torch.Tensor, n_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(means (n, W, D), counts (n, W)) of states (n, T, D) grouped by word (n, T) (-1: no word)."""
    onehot = (word[..., None] == torch.arange(n_words, device=word.device)).to(states.dtype)  # (n, T, W)
    sums = onehot.transpose(1, 2) @ states  # (n, W, D)
    counts = onehot.sum(dim=1)  # (n, W)
    return sums / counts.clamp(min=1)[..., None], counts


def word_loss(s_states: torch.Tensor, s_word: torch.Tensor, t_means: torch.Tensor, t_counts: torch.Tensor,
              proj: torch.Tensor) -> torch.Tensor:
    """1 - cosine between each word's mean student state mapped by proj (C, D_teacher) and the teacher's mean state
    of the same word, averaged over the words both sides hold (0 when there is none)."""
    s_means, s_counts = word_means(s_states, s_word, t_means.shape[1])
    both = (s_counts > 0) & (t_counts > 0)  # (n, W)
    cos = F.cosine_similarity(s_means @ proj, t_means, dim=-1, eps=1e-6)  # (n, W)
    return ((1 - cos) * both).sum() / both.sum().clamp(min=1)


class WordTeacher:
    """The teacher's word states for the step's texts, and the student's word map of the same texts."""

    def __init__(self, model_dir: str, texts: list[str], tok_mat: np.ndarray, tok_len: np.ndarray, tok,
                 dev: torch.device, cache_dir: Path) -> None:
        from transformers import AutoModel, AutoTokenizer

        hf_tok = AutoTokenizer.from_pretrained(model_dir)
        digest = hashlib.sha1(("\x00".join(texts) + tok.digest()).encode("utf-8")).hexdigest()[:12]
        path = cache_dir / f"words-{TEACHER_TOKENS}-{STUDENT_TOKENS}-{MAX_WORDS}-{digest}.npz"
        if path.exists():
            z = np.load(path, allow_pickle=False)
            self.align = WordAlignment(z["t_ids"], z["t_word"], z["s_word"])
        else:
            t0 = time.time()
            self.align = align_all(texts, tok_mat, tok_len, tok, hf_tok)
            np.savez(path, t_ids=self.align.t_ids, t_word=self.align.t_word, s_word=self.align.s_word)
            held = (self.align.s_word >= 0).any(axis=1).mean()
            print(f"aligned the words of {len(texts)} texts in {time.time() - t0:.0f}s ({held:.3f} with a word "
                  f"both sides hold)", flush=True)
        self.dev = dev
        self.model = AutoModel.from_pretrained(model_dir).to(dev).eval()
        if dev.type == "cuda":
            self.model.half()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.dims = int(self.model.config.hidden_size)

    @torch.no_grad()
    def targets(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(teacher word means (n, W, D) float32, their counts (n, W), the student's word map (n, STUDENT_TOKENS)
        int64) of text ids `ids`."""
        t_ids = torch.from_numpy(self.align.t_ids[ids].astype(np.int64)).to(self.dev, non_blocking=True)
        t_word = torch.from_numpy(self.align.t_word[ids].astype(np.int64)).to(self.dev, non_blocking=True)
        s_word = torch.from_numpy(self.align.s_word[ids].astype(np.int64)).to(self.dev, non_blocking=True)
        states = self.model(input_ids=t_ids, attention_mask=(t_ids != 0).long()).last_hidden_state.float()
        means, counts = word_means(states, t_word, MAX_WORDS)
        return means, counts, s_word
