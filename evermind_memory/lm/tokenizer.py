"""Byte-level BPE tokenizer: GPT-2 pre-tokenizer, training, encode/decode, JSON files, Hugging Face import.

Text is split with the GPT-2 pattern, turned into UTF-8 bytes (lone surrogates via 'surrogatepass', so every
Python str round-trips) and merged by rank. Leaves out: normalisation, dropout, and matching special-token
strings inside text (encode never emits a special id from text; "<eos>" in text is ordinary bytes).
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from heapq import heapify, heappop, heappush
from itertools import chain

import regex

from .._atomic import write_atomic
from ..errors import InvalidInput, TokenizerError
from .bpe import DECODE_ERRORS, bytes_to_unicode, learn_merges, text_bytes, unicode_to_bytes

__all__ = ["BPETokenizer", "FORMAT", "GPT2_PATTERN", "MAX_FILE_BYTES"]

FORMAT = "evermind-bpe 1"
MAX_FILE_BYTES = 64 * 1024 * 1024  # refuse bigger tokenizer files before reading them
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ROLES = ("bos", "eos", "pad", "unk")
DEFAULT_SPECIALS = ("<bos>", "<eos>", "<pad>", "<unk>")

_PATTERN = regex.compile(GPT2_PATTERN)
_CACHE_MAX_ENTRIES = 100_000  # pre-token -> ids cache; cleared when full
_CACHE_MAX_CHARS = 256  # longer pre-tokens are rare and would make the cache large; not cached
_LONG_WORD = 512  # longer pre-tokens (in bytes) merge with a heap, O(n log n); shorter ones with list edits (faster)

# HF tokenizer.json files do not say which added token plays which role; these are the usual names.
_ROLE_CANDIDATES = {
    "bos": ("<bos>", "<s>", "<|begin_of_text|>", "<|startoftext|>", "<|im_start|>", "<|endoftext|>"),
    "eos": ("<eos>", "</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>"),
    "pad": ("<pad>", "<|pad|>", "<|padding|>", "[PAD]"),
    "unk": ("<unk>", "<|unk|>", "[UNK]"),
}


def _read_json_file(path: str | os.PathLike, what: str) -> object:
    """Read a JSON file of at most MAX_FILE_BYTES; every problem becomes a TokenizerError."""
    try:
        size = os.stat(path).st_size
        if size > MAX_FILE_BYTES:
            raise TokenizerError(
                f"{what} {path} is {size} bytes; expected at most {MAX_FILE_BYTES} bytes (64 MiB). "
                "Check that the path points at a tokenizer file."
            )
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise TokenizerError(f"cannot read {what} {path}: {e.strerror or e}.") from e
    if len(data) > MAX_FILE_BYTES:
        raise TokenizerError(f"{what} {path} grew past {MAX_FILE_BYTES} bytes while being read; refusing it.")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise TokenizerError(f"{what} {path} is not valid UTF-8 JSON ({e}); the file is corrupt or truncated.") from e


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _checked_specials(special_tokens: Mapping, n: int) -> dict[str, int]:
    """special_tokens as a dict, after checking contents and ids (distinct, in [0, n))."""
    specials: dict[str, int] = {}
    for content, i in special_tokens.items():
        if not isinstance(content, str) or not content:
            raise TokenizerError(f"special token {content!r}: expected a non-empty str.")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError:
            raise TokenizerError(f"special token {content!r} contains a lone surrogate; expected valid text.") from None
        if not _is_int(i) or not 0 <= i < n:
            raise TokenizerError(f"special token {content!r} has id {i!r}; expected an int in [0, {n}).")
        specials[content] = i
    if len(set(specials.values())) != len(specials):
        raise TokenizerError(f"two special tokens share an id: {specials}.")
    return specials


def _first_bad_id(ids: list, n: int) -> object:
    """The first element of ids that is not an integer in [0, n) (for error messages)."""
    for i in ids:
        try:
            k = operator.index(i)
        except TypeError:
            return i
        if not 0 <= k < n:
            return i
    return None


class BPETokenizer:
    """A byte-level BPE tokenizer.

    Ids of a trained tokenizer: 0..255 are the single bytes (id = byte value), then one id per merge in
    merge order (256, 257, ...), then the special tokens in the order given to `train` (so the specials
    are the last ids). An imported Hugging Face tokenizer keeps that file's ids. Four special tokens have
    roles: bos, eos, pad, unk (the first four given to `train`). `encode` never produces a special id from
    text (and never needs unk: every byte has a token); `decode` skips special ids unless asked not to.

    Thread-safe: encode/decode may be called from several threads (the pre-token cache is a plain dict,
    and a race only repeats work).
    """

    def __init__(
        self,
        pieces: Sequence[bytes],
        merges: Sequence[tuple[int, int, int]],
        special_tokens: Mapping[str, int],
        roles: Mapping[str, str],
    ) -> None:
        """Build a tokenizer from explicit tables (most code calls train, load or from_hf_tokenizer_json).

        Args:
            pieces: the bytes of every id (a special id's entry is ignored; its content is used).
            merges: (left id, right id, result id) in rank order; pieces[result] == pieces[left] + pieces[right].
            special_tokens: content -> id for every special token.
            roles: "bos", "eos", "pad", "unk" -> the content of a special token.

        Raises:
            TokenizerError: if the tables are inconsistent (the message names the first problem).
        """
        n = len(pieces)
        specials = _checked_specials(special_tokens, n)
        if not isinstance(roles, Mapping) or set(roles) != set(ROLES):
            raise TokenizerError(f"roles must map exactly {list(ROLES)} to special tokens, got {roles!r}.")
        for role in ROLES:
            if not isinstance(roles[role], str) or roles[role] not in specials:
                raise TokenizerError(
                    f"role {role} names {roles[role]!r}, which is not a special token; known: {sorted(specials)}."
                )
        special_ids = set(specials.values())

        table: list[bytes] = []
        for i, piece in enumerate(pieces):
            if i in special_ids:
                piece = b""
            elif not isinstance(piece, bytes) or not piece:
                raise TokenizerError(f"token {i} is {piece!r}; expected non-empty bytes.")
            table.append(piece)
        byte_ids: dict[int, int] = {}
        for i, piece in enumerate(table):
            if len(piece) == 1 and piece[0] not in byte_ids:
                byte_ids[piece[0]] = i
        if len(byte_ids) != 256:
            missing = sorted(set(range(256)) - set(byte_ids))
            raise TokenizerError(
                f"a byte-level tokenizer needs a token for each of the 256 bytes; {len(missing)} are missing "
                f"(first: 0x{missing[0]:02x}). Text with those bytes could not be encoded."
            )

        ranks: dict[tuple[int, int], int] = {}
        merge_out: list[int] = []
        for rank, merge in enumerate(merges):
            # (the common case checked inline, without a generator: three plain ints in range; anything else takes
            # the general test, which says what is wrong)
            plain = False
            if type(merge) in (tuple, list) and len(merge) == 3:
                a, b, c = merge
                plain = (type(a) is int and type(b) is int and type(c) is int
                         and 0 <= a < n and 0 <= b < n and 0 <= c < n)
            if not plain and (
                not isinstance(merge, (tuple, list))
                or len(merge) != 3
                or not all(_is_int(x) and 0 <= x < n for x in merge)
            ):
                raise TokenizerError(f"merge {rank} is {merge!r}; expected [left id, right id, result id] in [0, {n}).")
            left, right, out = merge
            if special_ids.intersection(merge):
                raise TokenizerError(f"merge {rank} {list(merge)} uses a special token id; specials never merge.")
            if table[left] + table[right] != table[out]:
                raise TokenizerError(
                    f"merge {rank}: token {left} {table[left]!r} + token {right} {table[right]!r} "
                    f"should give token {out}, which is {table[out]!r}."
                )
            if (left, right) in ranks:
                raise TokenizerError(f"merge {rank} repeats the pair ({left}, {right}) of merge {ranks[left, right]}.")
            ranks[left, right] = rank
            merge_out.append(out)

        self._pieces = table  # id -> bytes; b"" for specials (what decode emits when skipping them)
        self._shown = list(table)  # id -> bytes, specials as their UTF-8 content
        for content, i in specials.items():
            self._shown[i] = text_bytes(content)
        self._specials = dict(sorted(specials.items(), key=lambda kv: kv[1]))
        self._roles = {role: roles[role] for role in ROLES}
        self._merges = [(int(a), int(b), int(c)) for a, b, c in merges]
        self._ranks = ranks
        self._merge_out = merge_out
        self._byte_ids = [byte_ids[b] for b in range(256)]
        self._bytes_are_ids = self._byte_ids == list(range(256))
        self._cache: dict[str, tuple[int, ...]] = {}

    # ---------------------------------------------------------------- construction

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        *,
        special_tokens: Sequence[str] = DEFAULT_SPECIALS,
        min_frequency: int = 2,
    ) -> BPETokenizer:
        """Learn merges from texts until the vocabulary (bytes + merges + specials) reaches vocab_size.

        Deterministic: the same texts in the same order give the same tokenizer. Each step merges the most
        frequent adjacent pair within pre-tokens; ties go to the smallest (left id, right id). Training stops
        early (a smaller vocabulary) when no pair occurs at least min_frequency times.

        Args:
            texts: the training texts (an iterable of str, read once).
            vocab_size: target size, at least 256 + len(special_tokens).
            special_tokens: the specials, appended after the merges; the first four take the roles
                bos, eos, pad, unk.
            min_frequency: a pair seen fewer times than this is never merged.

        Returns:
            The trained tokenizer.

        Raises:
            InvalidInput: if an argument is out of range or texts is not an iterable of str.
        """
        if isinstance(special_tokens, str) or not isinstance(special_tokens, Sequence):
            raise InvalidInput(f"train() expected special_tokens as a sequence of str, got {special_tokens!r}.")
        specials = list(special_tokens)
        valid = all(isinstance(s, str) and s for s in specials)
        if len(specials) < 4 or not valid or len(set(specials)) != len(specials):
            raise InvalidInput(
                f"train() expected at least 4 distinct non-empty special tokens (bos, eos, pad, unk), got {specials!r}."
            )
        for s in specials:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInput(f"special token {s!r} contains a lone surrogate; use valid text.") from None
        if not _is_int(vocab_size) or vocab_size < 256 + len(specials):
            raise InvalidInput(
                f"train() expected vocab_size >= 256 byte tokens + {len(specials)} special tokens = "
                f"{256 + len(specials)}, got vocab_size={vocab_size!r}."
            )
        if not _is_int(min_frequency) or min_frequency < 1:
            raise InvalidInput(f"train() expected min_frequency >= 1, got {min_frequency!r}.")
        if isinstance(texts, str):
            raise InvalidInput("train() expected an iterable of str, got a single str; wrap it in a list.")

        word_counts: Counter[str] = Counter()
        for k, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidInput(f"train() expected every text to be a str; text {k} is {type(text).__name__}.")
            word_counts.update(_PATTERN.findall(text))

        pairs = learn_merges(word_counts, vocab_size - 256 - len(specials), min_frequency)
        pieces = [bytes([b]) for b in range(256)]
        merges = []
        for left, right in pairs:
            merges.append((left, right, len(pieces)))
            pieces.append(pieces[left] + pieces[right])
        special_ids = {s: len(pieces) + k for k, s in enumerate(specials)}
        pieces.extend(b"" for _ in specials)
        return cls(pieces, merges, special_ids, dict(zip(ROLES, specials)))

    @classmethod
    def from_dict(cls, d: Mapping) -> BPETokenizer:
        """Rebuild a tokenizer from `to_dict()` output.

        Args:
            d: a mapping with format "evermind-bpe 1", as written by to_dict.

        Returns:
            The tokenizer.

        Raises:
            TokenizerError: if the format is unknown or any field is missing, mistyped or inconsistent.
        """
        if not isinstance(d, Mapping):
            raise TokenizerError(f"expected a tokenizer dict (format {FORMAT!r}), got {type(d).__name__}.")
        if d.get("format") != FORMAT:
            raise TokenizerError(
                f"unknown tokenizer format {d.get('format')!r}; expected {FORMAT!r}. "
                "The file was written by another program or another version of evermind_memory."
            )
        if d.get("pre_tokenizer") != "gpt2":
            raise TokenizerError(f"unknown pre_tokenizer {d.get('pre_tokenizer')!r}; expected 'gpt2'.")
        tokens, merges, specials, roles = (d.get(k) for k in ("tokens", "merges", "special_tokens", "roles"))
        if not isinstance(tokens, list):
            raise TokenizerError("tokenizer dict: 'tokens' must be a list (one entry per id).")
        if not isinstance(merges, list):
            raise TokenizerError("tokenizer dict: 'merges' must be a list of [left, right, result] ids.")
        if not isinstance(specials, Mapping) or not isinstance(roles, Mapping):
            raise TokenizerError("tokenizer dict: 'special_tokens' and 'roles' must be objects.")
        special_ids = set(_checked_specials(specials, len(tokens)).values())
        pieces = []
        for i, tok in enumerate(tokens):
            if i in special_ids:
                if tok is not None:
                    raise TokenizerError(f"tokenizer dict: token {i} is a special token; its entry must be null.")
                pieces.append(b"")
                continue
            if not isinstance(tok, str) or not tok:
                raise TokenizerError(f"tokenizer dict: token {i} is {tok!r}; expected a non-empty str.")
            piece = unicode_to_bytes(tok)
            if piece is None:
                raise TokenizerError(f"tokenizer dict: token {i} {tok!r} is not in GPT-2 byte-to-unicode form.")
            pieces.append(piece)
        return cls(pieces, [tuple(m) if isinstance(m, list) else m for m in merges], specials, roles)

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """Read a tokenizer saved by `save`.

        Args:
            path: the JSON file.

        Returns:
            The tokenizer.

        Raises:
            TokenizerError: if the file is missing, larger than 64 MiB, not JSON, or not a valid tokenizer.
        """
        d = _read_json_file(path, "tokenizer file")
        try:
            return cls.from_dict(d)
        except TokenizerError as e:
            raise TokenizerError(f"{path}: {e}") from e

    @classmethod
    def from_hf_tokenizer_json(
        cls,
        path: str | os.PathLike,
        *,
        bos: str | None = None,
        eos: str | None = None,
        pad: str | None = None,
        unk: str | None = None,
    ) -> BPETokenizer:
        """Import a Hugging Face byte-level BPE tokenizer.json (GPT-2, RoBERTa, ByteLevelBPETokenizer ...).

        Ids are kept. Added tokens marked special become our special tokens. A role left as None goes to
        the first usual name present (e.g. eos: "<eos>", "</s>", "<|endoftext|>"); a role with no such
        token gets a new special token ("<bos>" ...) with the next free id. Differences from Hugging Face:
        the pre-tokenizer is always the GPT-2 pattern without a prefix space, no normalizer runs,
        model.ignore_merges is not honoured, and added tokens are not matched inside text. For GPT-2-style
        files (ByteLevel pre-tokenizer, add_prefix_space false) the ids on plain text are the same.

        Args:
            path: the tokenizer.json file.
            bos, eos, pad, unk: the content of the special token to use for each role.

        Returns:
            The tokenizer.

        Raises:
            TokenizerError: if the file is unreadable, too large, or not a byte-level BPE tokenizer.json.
            InvalidInput: if a role names a token that is not a special token of the file.
        """
        spec = _read_json_file(path, "Hugging Face tokenizer.json")
        model = spec.get("model") if isinstance(spec, dict) else None
        if not isinstance(model, dict):
            raise TokenizerError(f"{path} has no 'model' object; expected a Hugging Face tokenizer.json.")
        if model.get("type", "BPE") != "BPE":
            raise TokenizerError(f"{path} holds a {model.get('type')!r} model; only BPE models can be imported.")
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                raise TokenizerError(f"{path} sets model.{key}={model[key]!r}; byte-level BPE does not use it.")
        vocab, raw_merges = model.get("vocab"), model.get("merges")
        if not isinstance(vocab, dict) or not isinstance(raw_merges, list):
            raise TokenizerError(f"{path}: expected model.vocab (object) and model.merges (list).")
        added = spec.get("added_tokens") or []
        if not isinstance(added, list):
            raise TokenizerError(f"{path}: 'added_tokens' must be a list.")

        ids: dict[int, bytes | None] = {}
        specials: dict[str, int] = {}
        for tok in added:
            if not isinstance(tok, dict) or not _is_int(tok.get("id")) or not isinstance(tok.get("content"), str):
                raise TokenizerError(f"{path}: added token {tok!r} needs an int 'id' and a str 'content'.")
            if tok["id"] < 0 or not tok["content"]:
                raise TokenizerError(f"{path}: added token {tok!r} needs an id >= 0 and non-empty content.")
            if tok.get("special", False):
                specials[tok["content"]] = tok["id"]
                ids[tok["id"]] = None
        for tok_str, i in vocab.items():
            if not _is_int(i) or i < 0:
                raise TokenizerError(f"{path}: vocab entry {tok_str!r} has id {i!r}; expected an int >= 0.")
            if i in ids:
                if ids[i] is None:
                    continue  # a special token that is also in the vocab: the special wins
                raise TokenizerError(f"{path}: id {i} is given to two vocab entries.")
            piece = unicode_to_bytes(tok_str)
            if piece is None:
                raise TokenizerError(
                    f"{path}: vocab entry {tok_str!r} (id {i}) is not in GPT-2 byte-to-unicode form; only "
                    "byte-level BPE tokenizers can be imported (not SentencePiece/Metaspace ones)."
                )
            ids[i] = piece
        for tok in added:
            if not tok.get("special", False) and tok["id"] not in ids:
                ids[tok["id"]] = text_bytes(tok["content"])
        n = len(ids)
        if n == 0 or max(ids) != n - 1:
            missing = min(set(range(n)) - set(ids), default=n)
            raise TokenizerError(f"{path}: ids must run from 0 without gaps; id {missing} is missing.")
        pieces = [ids[i] or b"" for i in range(n)]

        merges = []
        for rank, m in enumerate(raw_merges):
            parts = m.split(" ") if isinstance(m, str) else m
            if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) for p in parts):
                raise TokenizerError(f"{path}: merge {rank} is {m!r}; expected 'a b' or ['a', 'b'].")
            left, right = parts
            for t in (left, right, left + right):
                if t not in vocab:
                    raise TokenizerError(f"{path}: merge {rank} {m!r} uses {t!r}, which is not in the vocab.")
            merges.append((vocab[left], vocab[right], vocab[left + right]))

        given = {"bos": bos, "eos": eos, "pad": pad, "unk": unk}
        roles: dict[str, str] = {}
        for role in ROLES:
            name = given[role]
            if name is not None:
                if name not in specials:
                    raise InvalidInput(
                        f"from_hf_tokenizer_json({role}={name!r}): not a special token of {path}; "
                        f"it has {sorted(specials)}."
                    )
            else:
                candidates = _ROLE_CANDIDATES[role]
                if role == "unk" and isinstance(model.get("unk_token"), str):
                    candidates = (model["unk_token"], *candidates)
                name = next((c for c in candidates if c in specials), None)
                if name is None:
                    name = f"<{role}>"
                    specials[name] = len(pieces)
                    pieces.append(b"")
            roles[role] = name
        try:
            return cls(pieces, merges, specials, roles)
        except TokenizerError as e:
            raise TokenizerError(f"{path}: {e}") from e

    # ---------------------------------------------------------------- serialisation

    def to_dict(self) -> dict:
        """The tokenizer as plain JSON-ready data (format "evermind-bpe 1").

        Returns:
            {"format", "pre_tokenizer": "gpt2", "tokens": id -> GPT-2 byte-to-unicode string (null for
            specials), "merges": [[left, right, result], ...] in rank order, "special_tokens": content -> id,
            "roles": role -> content}.
        """
        special_ids = set(self._specials.values())
        tokens = [None if i in special_ids else bytes_to_unicode(piece) for i, piece in enumerate(self._pieces)]
        return {
            "format": FORMAT,
            "pre_tokenizer": "gpt2",
            "tokens": tokens,
            "merges": [list(m) for m in self._merges],
            "special_tokens": dict(self._specials),
            "roles": dict(self._roles),
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the tokenizer as JSON, atomically (temp file in the same folder, fsync, rename).

        Args:
            path: the target file; replaced if it exists.

        Raises:
            OSError: if the file cannot be written (the old file, if any, is left intact).
        """
        data = (json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        write_atomic(path, data)

    def digest(self) -> str:
        """Hex sha256 of the canonical serialisation (pattern, tokens, merges, specials, roles).

        Returns:
            64 hex characters; equal tokenizers give equal digests, any change gives another.
        """
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(canonical.encode("ascii")).hexdigest()

    # ---------------------------------------------------------------- properties

    def __len__(self) -> int:
        return len(self._pieces)

    @property
    def vocab_size(self) -> int:
        """Number of ids (bytes + merges + specials); valid ids are 0 .. vocab_size - 1."""
        return len(self._pieces)

    @property
    def bos_id(self) -> int:
        return self._specials[self._roles["bos"]]

    @property
    def eos_id(self) -> int:
        return self._specials[self._roles["eos"]]

    @property
    def pad_id(self) -> int:
        return self._specials[self._roles["pad"]]

    @property
    def unk_id(self) -> int:
        return self._specials[self._roles["unk"]]

    @property
    def special_tokens(self) -> dict[str, int]:
        """Content -> id of every special token (a copy)."""
        return dict(self._specials)

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={len(self)}, merges={len(self._merges)}, specials={list(self._specials)})"

    # ---------------------------------------------------------------- encode / decode

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of text; `decode` gives text back exactly, for any str (lone surrogates included).

        Args:
            text: any Python str.
            add_bos: put bos_id first.
            add_eos: put eos_id last.

        Returns:
            The ids.

        Raises:
            InvalidInput: if text is not a str.
        """
        if not isinstance(text, str):
            raise InvalidInput(f"encode() expected a str, got {type(text).__name__}.")
        pieces = _PATTERN.findall(text)
        found = list(map(self._cache.get, pieces))
        if None in found:
            for k, ids in enumerate(found):
                if ids is None:
                    found[k] = self._encode_piece(pieces[k])
        out = list(chain.from_iterable(found))
        if add_bos:
            out.insert(0, self.bos_id)
        if add_eos:
            out.append(self.eos_id)
        return out

    def encode_batch(self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        """`encode` for each text.

        Args:
            texts: a sequence of str.
            add_bos, add_eos: as in encode.

        Returns:
            One id list per text.

        Raises:
            InvalidInput: if texts is a single str or holds a non-str.
        """
        if isinstance(texts, str):
            raise InvalidInput("encode_batch() expected a sequence of str, got a single str; use encode().")
        return [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of ids; never fails on a valid id sequence, whatever the order.

        Rule: the ids' bytes are joined and read as UTF-8. A 3-byte sequence encoding a surrogate code
        point (what encode makes of a lone surrogate) becomes that surrogate; every other invalid byte
        sequence becomes one U+FFFD per maximal invalid part (as Python's "replace" does). So
        decode(encode(s)) == s for every str s.

        Args:
            ids: token ids in [0, vocab_size) (Python or numpy ints).
            skip_special: leave special tokens out (default); if False they appear as their content.

        Returns:
            The text.

        Raises:
            InvalidInput: if an id is not an integer in [0, vocab_size).
        """
        table = self._pieces if skip_special else self._shown
        ids = list(ids)
        try:
            if ids and (min(ids) < 0 or max(ids) >= len(table)):
                raise IndexError
            data = b"".join([table[i] for i in ids])
        except (IndexError, TypeError):
            bad = _first_bad_id(ids, len(table))
            raise InvalidInput(f"decode() expected ids in [0, {len(table)}), got {bad!r}.") from None
        return data.decode("utf-8", DECODE_ERRORS)

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        """Merge one pre-token's bytes by rank; cache the result."""
        data = text_bytes(piece)
        ids = list(data) if self._bytes_are_ids else [self._byte_ids[b] for b in data]
        if len(ids) > _LONG_WORD:
            ids = self._merge_long(ids)
        elif len(ids) > 1:
            ids = self._merge_short(ids)
        result = tuple(ids)
        if len(piece) <= _CACHE_MAX_CHARS:
            if len(self._cache) >= _CACHE_MAX_ENTRIES:
                self._cache.clear()
            self._cache[piece] = result
        return result

    def _merge_short(self, ids: list[int]) -> list[int]:
        """Merge the leftmost lowest-rank pair until none is left (O(n^2) list edits: short pre-tokens only)."""
        ranks = self._ranks
        merge_out = self._merge_out
        none = len(merge_out)
        r = [ranks.get(p, none) for p in zip(ids, ids[1:])]  # r[i]: rank of (ids[i], ids[i + 1])
        while r:
            rank = min(r)
            if rank == none:
                break
            i = r.index(rank)
            ids[i] = merge_out[rank]
            del ids[i + 1]
            del r[i]
            if i > 0:
                r[i - 1] = ranks.get((ids[i - 1], ids[i]), none)
            if i < len(r):
                r[i] = ranks.get((ids[i], ids[i + 1]), none)
        return ids

    def _merge_long(self, ids: list[int]) -> list[int]:
        """Same result as _merge_short in O(n log n): a linked list of symbols and a heap of (rank, position)."""
        ranks = self._ranks
        merge_out = self._merge_out
        n = len(ids)
        sym = list(ids)  # sym[i] == -1 once node i has been merged into its left neighbour
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = [(r, i) for i, r in enumerate(map(ranks.get, zip(sym, sym[1:]))) if r is not None]
        heapify(heap)
        while heap:
            rank, i = heappop(heap)
            j = nxt[i]
            if sym[i] < 0 or j < 0 or ranks.get((sym[i], sym[j])) != rank:
                continue  # stale: one side of this pair has merged since it was pushed
            sym[i] = merge_out[rank]
            sym[j] = -1
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
                r = ranks.get((sym[i], sym[k]))
                if r is not None:
                    heappush(heap, (r, i))
            p = prv[i]
            if p >= 0:
                r = ranks.get((sym[p], sym[i]))
                if r is not None:
                    heappush(heap, (r, p))
        out = []
        i = 0
        while i >= 0:
            out.append(sym[i])
            i = nxt[i]
        return out
