"""Token input checked at EvermindLM's boundary: a right-padded (B, T) batch with optional lengths, or one token
list, against the model's vocabulary. Padded positions are replaced by id 0 (so lookups stay in range) and named
by flat row ids, which is all the maths in model.py needs to keep them out. Shape letters as in model.py.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from evermind_memory.errors import InvalidInput


class Batch(NamedTuple):
    tokens: np.ndarray  # (B, T) intp; padded positions replaced by 0 so lookups stay in range
    lengths: np.ndarray  # (B,) intp
    real: np.ndarray | None  # (N,) flat row ids of real positions; None when nothing is padded
    pad: np.ndarray | None  # (B*T - N,) flat row ids of padded positions; None when nothing is padded


def check_ids(ids: np.ndarray, vocab_size: int, where: str, locate: Callable[[int], str] | None = None) -> None:
    """Raise InvalidInput unless every id is in [0, V); `locate(i)` names flat index i in the message."""
    v = vocab_size
    if ids.size == 0 or (ids.min() >= 0 and ids.max() < v):
        return
    i = int(np.argmax((ids < 0) | (ids >= v)))
    at = f"position {i}" if locate is None else locate(i)
    raise InvalidInput(
        f"{where} expected token ids in [0, {v}), got {int(ids[i])} at {at}. "
        "Check that the tokenizer's vocab_size matches LMConfig.vocab_size."
    )


def prepare_batch(tokens: Any, lengths: Any, vocab_size: int, where: str) -> Batch:
    """Validate a (B, T) token batch with optional lengths; neutralise padding.

    Raises:
        InvalidInput: a ragged or non-2-D batch, non-integer ids or lengths, lengths outside [1, T], or an id
            outside [0, V) at a real position (the message names batch and position).
    """
    try:
        arr = np.asarray(tokens)  # (B, T)
    except ValueError as e:  # ragged nested lists
        raise InvalidInput(
            f"{where} expected a rectangular (B, T) batch of token ids; pad the sequences and pass lengths."
        ) from e
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise InvalidInput(f"{where} expected tokens of shape (B, T) with B, T >= 1, got shape {arr.shape}.")
    if arr.dtype.kind not in "iu":
        raise InvalidInput(f"{where} expected integer token ids, got dtype {arr.dtype}.")
    b, t = arr.shape
    if lengths is None:
        lens = np.full(b, t, dtype=np.intp)  # (B,)
    else:
        lens = np.asarray(lengths)  # (B,)
        if lens.shape != (b,) or lens.dtype.kind not in "iu":
            raise InvalidInput(
                f"{where} expected integer lengths of shape ({b},), got shape {lens.shape} dtype {lens.dtype}."
            )
        if lens.min() < 1 or lens.max() > t:
            raise InvalidInput(
                f"{where} expected 1 <= lengths <= T={t}, got lengths in [{lens.min()}, {lens.max()}]."
            )
        lens = lens.astype(np.intp)
    if lens.min() == t:
        check_ids(arr.ravel(), vocab_size, where, lambda i: "(batch {}, position {})".format(*divmod(i, t)))
        return Batch(arr.astype(np.intp, copy=False), lens, None, None)
    mask = np.arange(t)[None, :] < lens[:, None]  # (B, T)
    check_ids(arr[mask], vocab_size, where, lambda i: "(batch {}, position {})".format(*np.argwhere(mask)[i]))
    clean = np.where(mask, arr, 0).astype(np.intp)  # (B, T)
    flat_mask = mask.ravel()  # (B*T,)
    return Batch(clean, lens, np.flatnonzero(flat_mask), np.flatnonzero(~flat_mask))


def prepare_list(tokens: Any, vocab_size: int, where: str) -> np.ndarray:
    """Validate one non-empty token list; return it as (T,) intp.

    Raises:
        InvalidInput: text instead of ids, not flat, empty, non-integer, or an id outside [0, V).
    """
    if isinstance(tokens, (str, bytes)):
        raise InvalidInput(f"{where} expected a list of token ids, got {type(tokens).__name__}; encode text first.")
    arr = np.asarray(tokens)  # (T,)
    if arr.ndim != 1:
        raise InvalidInput(f"{where} expected a flat list of token ids, got shape {arr.shape}.")
    if arr.size == 0:
        raise InvalidInput(f"{where} expected at least one token, got an empty list.")
    if arr.dtype.kind not in "iu":
        raise InvalidInput(f"{where} expected integer token ids, got dtype {arr.dtype}.")
    check_ids(arr, vocab_size, where)
    return arr.astype(np.intp)
