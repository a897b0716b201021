"""Lexicon: a table of word vectors distilled from a sentence encoder, the second part of the shipped vector.

EvermindLM reads a text in context but knows only the words its training text used in telling contexts: it has
no way to learn that squash is a sport or that a bowler plays cricket from manuals. A sentence encoder trained on
a billion pairs knows that of nearly every word. The lexicon keeps that knowledge as one vector per word (the
teacher's vector of the word alone, centred, projected to `dims` by PCA and stored as int8 with a float32 scale per
row: recipe/build_lexicon.py), and the embedder appends a text's lexicon vector to the model's (lm_embedder).

A text's lexicon vector is the sum of the vectors of its known words, each weighted by smooth inverse frequency
a / (a + p(word)) (p from the training corpus, so "the" and "is" weigh nearly nothing), L2-normalised; a text
with no known word gets the zero vector. Words are the runs of letters of the lower-cased text (WORD_PATTERN,
any script): "Ada's flight" reads as "ada", "s", "flight"; the table holds words of ASCII letters only
(TABLE_WORD), so "Zürich" is one unknown word rather than "z" and "rich".

File layout: the checkpoint container (lm.checkpoint) with its own magic; meta {"words": [...], "pattern",
"dims"}; tensors table (V, D) int8, scale (V,) float32, weight (V,) float32. Sizes, shapes, duplicates and
finiteness are checked before the table is used.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from ..errors import CheckpointError, InvalidInput
from .checkpoint import TensorSpec, read_tensor_file, write_tensor_file

__all__ = ["Lexicon", "LEXICON_MAGIC", "LEXICON_KIND", "TABLE_WORD", "WORD_PATTERN"]

LEXICON_MAGIC = b"\x89EVLEX\r\n"
LEXICON_KIND = "evermind-lexicon 1"
WORD_PATTERN = r"[^\W\d_]+"  # runs of letters of any script (no digits, no underscore)
TABLE_WORD = "[a-z]+"  # what a word of the table may be
MAX_WORDS = 2_000_000
MAX_DIMS = 4096
MAX_WORD_CHARS = 64
MAX_FILE_BYTES = 1 << 30
_WORD_RE = re.compile(WORD_PATTERN)
_TABLE_WORD_RE = re.compile(TABLE_WORD)
_TABLE_WORDS_RE = re.compile(f"(?:{TABLE_WORD}\n)*{TABLE_WORD}")  # the words joined by newlines (none holds one)


class Lexicon:
    """Word vectors for the lexicon part of an embedder's vector.

    Args:
        words: the V distinct words, each a run of TABLE_WORD of at most MAX_WORD_CHARS characters.
        table: (V, D) int8 quantised vectors.
        scale: (V,) float32, the factor of each row (vector = table[i] * scale[i]).
        weight: (V,) float32 >= 0, each word's weight in a text's sum.
    Raises:
        InvalidInput: shapes, dtypes, words or values out of range.
    """

    def __init__(self, words: Sequence[str], table: np.ndarray, scale: np.ndarray, weight: np.ndarray) -> None:
        words = list(words)
        table = np.asarray(table)
        scale = np.asarray(scale, dtype=np.float32)
        weight = np.asarray(weight, dtype=np.float32)
        v = len(words)
        if not 1 <= v <= MAX_WORDS:
            raise InvalidInput(f"Lexicon expected 1 to {MAX_WORDS} words, got {v}.")
        if table.dtype != np.int8 or table.ndim != 2 or table.shape[0] != v or not 1 <= table.shape[1] <= MAX_DIMS:
            raise InvalidInput(f"Lexicon expected an int8 table of shape ({v}, D) with 1 <= D <= {MAX_DIMS}, got "
                               f"{table.dtype} {table.shape}.")
        if scale.shape != (v,) or weight.shape != (v,):
            raise InvalidInput(f"Lexicon expected scale and weight of shape ({v},), got {scale.shape} and "
                               f"{weight.shape}.")
        if not (np.all(np.isfinite(scale)) and np.all(np.isfinite(weight)) and np.all(scale >= 0)
                and np.all(weight >= 0)):
            raise InvalidInput("Lexicon scale and weight must be finite and non-negative.")
        # every word at once (60,000 of them at each load), joined by newlines (as many lines as words: no word
        # holds one); a table that fails is searched word by word for the message
        joined = "\n".join(words) if all(type(w) is str for w in words) else None
        ok = (joined is not None and max(map(len, words), default=0) <= MAX_WORD_CHARS
              and (not words or (joined.count("\n") == len(words) - 1
                                 and _TABLE_WORDS_RE.fullmatch(joined) is not None)))
        bad = None if ok else next((w for w in words if not isinstance(w, str) or len(w) > MAX_WORD_CHARS
                                    or _TABLE_WORD_RE.fullmatch(w) is None), None)
        if bad is not None:
            raise InvalidInput(f"Lexicon word {bad!r} is not a run of {TABLE_WORD} of at most {MAX_WORD_CHARS} "
                               "characters.")
        index = {w: i for i, w in enumerate(words)}
        if len(index) != v:
            raise InvalidInput("Lexicon words must be distinct.")
        self.words = words
        self.table = np.ascontiguousarray(table)
        self.scale = scale
        self.weight = weight
        self._index = index
        self._row_factor = scale * weight  # (V,) one multiply per word at embedding time
        self._digest: str | None = None

    @property
    def dims(self) -> int:
        """Length of a lexicon vector."""
        return int(self.table.shape[1])

    def __len__(self) -> int:
        return len(self.words)

    def digest(self) -> str:
        """sha256 over the format, the words, the table, the scales and the weights (computed once)."""
        if self._digest is None:
            h = hashlib.sha256()
            h.update(f"{LEXICON_KIND}\n{WORD_PATTERN}\n".encode())
            h.update("\n".join(self.words).encode("utf-8"))
            for arr in (self.table, self.scale.astype("<f4"), self.weight.astype("<f4")):
                h.update(f"\n{arr.dtype.str}{arr.shape}:".encode())
                h.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)  # its bytes, hashed in place
            self._digest = h.hexdigest()
        return self._digest

    def word_ids(self, text: str) -> list[int]:
        """Rows of the known words of `text`, in order, repeats kept."""
        index = self._index
        return [i for i in (index.get(w) for w in _WORD_RE.findall(text.lower())) if i is not None]

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """(N, D) float32: each text's unit lexicon vector, or a zero row for a text with no known word."""
        out = np.zeros((len(texts), self.dims), dtype=np.float32)  # (N, D)
        if len(texts) == 1:  # a recall's query: the same row without the batch's bookkeeping (26 us against 63)
            flat = np.array(self.word_ids(texts[0]), dtype=np.intp)  # (W,)
            if len(flat):
                out[:] = self._unit_sums(flat, [0])
            return out
        ids = [self.word_ids(t) for t in texts]
        counts = np.array([len(x) for x in ids], dtype=np.intp)  # (N,)
        total = int(counts.sum())
        if total == 0:
            return out
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.intp, count=total)  # (W,)
        has = counts > 0  # (N,)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[has]  # (n,) first word of each text that has one
        out[has] = self._unit_sums(flat, starts)
        return out

    def _unit_sums(self, flat: np.ndarray, starts: Any) -> np.ndarray:
        """(n, D) float32: the weighted rows of the words `flat` (W,) summed from each of `starts` (n,) to the next,
        each sum L2-normalised (an exactly zero sum stays zero)."""
        rows = self.table[flat].astype(np.float32)  # (W, D)
        rows *= self._row_factor[flat, None]
        out = np.add.reduceat(rows, starts, axis=0)  # (n, D)
        norms = np.linalg.norm(out, axis=1, keepdims=True)  # (n, 1)
        np.divide(out, norms, out=out, where=norms > 0)
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the lexicon atomically (lm.checkpoint container, LEXICON_MAGIC)."""
        write_tensor_file(path, magic=LEXICON_MAGIC, kind=LEXICON_KIND,
                          meta={"words": self.words, "pattern": WORD_PATTERN, "dims": self.dims},
                          tensors={"table": self.table, "scale": self.scale, "weight": self.weight})

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES) -> Lexicon:
        """Read and validate a lexicon file.

        Raises:
            CheckpointError: the file is missing, damaged, too large or not a lexicon.
        """
        label = os.fspath(path)

        def check(meta: dict[str, Any], specs: dict[str, TensorSpec]) -> None:
            words = meta.get("words")
            if meta.get("pattern") != WORD_PATTERN or not isinstance(words, list):
                raise CheckpointError(f"{label}: a lexicon for word pattern {meta.get('pattern')!r}; this build "
                                      f"reads {WORD_PATTERN!r} with a word list.")
            v, d = len(words), meta.get("dims")
            want = {"table": ("i8", (v, d)), "scale": ("f32", (v,)), "weight": ("f32", (v,))}
            if specs != want:
                raise CheckpointError(f"{label}: lexicon tensors {specs} do not match {v} words of {d} dims.")

        meta, tensors = read_tensor_file(path, magic=LEXICON_MAGIC, kind=LEXICON_KIND, max_bytes=max_bytes,
                                         dtypes=("i8", "f32"), check=check)
        try:
            return cls(meta["words"], tensors["table"], tensors["scale"], tensors["weight"])
        except InvalidInput as e:
            raise CheckpointError(f"{label}: {e} The file is damaged; use another copy.") from e

    def __repr__(self) -> str:
        return f"Lexicon({len(self.words)} words x {self.dims}, {self.digest()[:8]})"
