"""Byte-level BPE primitives: GPT-2's byte <-> printable character map, the lossless text <-> bytes codec and
merge learning (greedy, with incremental pair counts). lm/tokenizer.py builds the tokenizer on them.
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping
from heapq import heapify, heappop, heappush

__all__ = ["BYTE_TO_CHAR", "CHAR_TO_BYTE", "DECODE_ERRORS", "bytes_to_unicode", "learn_merges", "merge_pair",
           "text_bytes", "unicode_to_bytes"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (used in vocab files, ours and Hugging Face's)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}
# the same maps as str.translate tables: a whole token converts at C speed (a tokenizer file holds 16,000 of them);
# a character below 256 that is not one of the 256 becomes U+FFFF, which latin-1 cannot encode
_CHARS_TO_LATIN1 = str.maketrans({**{c: chr(b) for c, b in CHAR_TO_BYTE.items()},
                                  **{chr(i): "\uffff" for i in range(256) if chr(i) not in CHAR_TO_BYTE}})
_LATIN1_TO_CHARS = str.maketrans({chr(b): c for b, c in BYTE_TO_CHAR.items()})


def unicode_to_bytes(text: str) -> bytes | None:
    """The bytes a string of BYTE_TO_CHAR characters stands for; None if a character is not one of them."""
    try:
        return text.translate(_CHARS_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        return None


def bytes_to_unicode(data: bytes) -> str:
    """`data` as BYTE_TO_CHAR characters (the inverse of unicode_to_bytes)."""
    return data.decode("latin-1").translate(_LATIN1_TO_CHARS)


def _surrogatepass_or_replace(exc: UnicodeError) -> tuple[str, int]:
    """Decode error handler: a UTF-8-encoded surrogate decodes to it; any other invalid bytes become U+FFFD."""
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    try:
        return codecs.lookup_error("surrogatepass")(exc)
    except UnicodeDecodeError:
        return "\ufffd", exc.end


DECODE_ERRORS = "evermind-bpe-surrogatepass-replace"
codecs.register_error(DECODE_ERRORS, _surrogatepass_or_replace)


def text_bytes(text: str) -> bytes:
    """UTF-8 bytes of any Python str (lone surrogates encoded, so every str round-trips)."""
    return text.encode("utf-8", "surrogatepass")


def merge_pair(seq: list[int], left: int, right: int, new: int) -> list[int]:
    """Replace every non-overlapping (left, right), scanning left to right, with new."""
    out: list[int] = []
    start = 0
    last = len(seq) - 1
    while True:
        try:
            j = seq.index(left, start)
        except ValueError:
            break
        if j < last and seq[j + 1] == right:
            out.extend(seq[start:j])
            out.append(new)
            start = j + 2
        else:
            out.extend(seq[start : j + 1])
            start = j + 1
    out.extend(seq[start:])
    return out


def learn_merges(word_counts: Mapping[str, int], n_merges: int, min_frequency: int) -> list[tuple[int, int]]:
    """Greedy BPE on unique pre-tokens with incremental pair counts.

    Each step merges the most frequent adjacent pair (ties: the smallest (left id, right id)); only the words
    holding that pair are rewritten, and only their pair counts are updated.
    """
    words = [list(text_bytes(w)) for w in word_counts]
    freqs = list(word_counts.values())
    counts: dict[tuple[int, int], int] = {}
    where: dict[tuple[int, int], list[int]] = {}  # pair -> words that hold (or once held) it
    for wi, w in enumerate(words):
        f = freqs[wi]
        for pair in zip(w, w[1:]):
            counts[pair] = counts.get(pair, 0) + f
            where.setdefault(pair, []).append(wi)
    heap = [(-c, pair) for pair, c in counts.items()]  # lazy max-heap: stale entries are skipped on pop
    heapify(heap)

    merges: list[tuple[int, int]] = []
    while len(merges) < n_merges and heap:
        neg_count, pair = heappop(heap)
        count = counts.get(pair, 0)
        if count != -neg_count:
            continue
        if count < min_frequency:
            break
        new = 256 + len(merges)
        merges.append(pair)
        left, right = pair
        delta: dict[tuple[int, int], int] = {}
        for wi in set(where.pop(pair)):
            w = words[wi]
            out = merge_pair(w, left, right, new)
            if len(out) == len(w):
                continue
            f = freqs[wi]
            for p in zip(w, w[1:]):
                delta[p] = delta.get(p, 0) - f
            for p in zip(out, out[1:]):
                delta[p] = delta.get(p, 0) + f
                if p[0] == new or p[1] == new:
                    where.setdefault(p, []).append(wi)
            words[wi] = out
        for p, d in delta.items():
            if d:
                c = counts.get(p, 0) + d
                if c > 0:
                    counts[p] = c
                    heappush(heap, (-c, p))
                else:
                    counts.pop(p, None)
    return merges
