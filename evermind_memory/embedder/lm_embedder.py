"""LMEmbedder: text -> BPE tokens -> EvermindLM -> mean-pooled, L2-normalised float32 vector.

A text longer than `max_tokens` is either truncated there (max_chunks=1) or read in up to `max_chunks`
windows of `max_tokens` tokens, each embedded alone, the text's one vector being the L2-normalised mean of the
window vectors weighted by their token counts (a short tail window counts less), the first window's weight
times `first_chunk_weight` (the head of a fact usually says what it is about).

With a lexicon (lm.lexicon: word vectors distilled from a sentence encoder), the vector is the model's unit
vector followed by `lexicon_weight` times the text's unit lexicon vector, L2-normalised as a whole: the cosine of
two texts is then (model cosine + lexicon_weight**2 * lexicon cosine) / (1 + lexicon_weight**2). The lexicon reads
every word of the text, also past the model's truncation.

With a query map (lm.query_map: a D x D matrix fitted on question / answer pairs), `embed_query` returns a query's
vector times the map, L2-normalised; `embed` and `embed_many`, which make what a store keeps, are unchanged by it.

The fingerprint `evermind-lm/<arch>/<digest8>` (`<arch>+lex<D>` with a lexicon) names the whole function: its
digest is a sha256 over every parameter tensor (so a merged adapter on any tensor changes it), an optional adapter
digest, the tokenizer's digest, the lexicon's digest and weight, the query map's digest, the pooling, the
truncation length and a format version (docs/reliability.md R11).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

from .._blas import single_blas
from .._lazy import lazy_import
from ..errors import InvalidInput
from .base import DEFAULT_HYBRID_WEIGHT

if TYPE_CHECKING:
    import numpy as np

    from ..lm.config import LMConfig
    from ..lm.lexicon import Lexicon
    from ..lm.query_map import QueryMap
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

FINGERPRINT_FORMAT = "evermind-embedder 1"
POOLING = "mean-l2"
DEFAULT_BATCH = 64
MAX_CHUNKS_LIMIT = 64


class LanguageModel(Protocol):
    """What LMEmbedder reads of its model: an EvermindLM, a SequenceBackbone, a LoRA wrapper or the GPU model."""

    @property
    def config(self) -> LMConfig: ...

    @property
    def params(self) -> Mapping[str, np.ndarray]: ...

    def embed_batch(self, token_lists: Sequence[Sequence[int]], /) -> np.ndarray: ...


class Tokenizer(Protocol):
    """What LMEmbedder reads of its tokenizer (a BPETokenizer)."""

    @property
    def bos_id(self) -> int: ...

    def encode(self, text: str, /) -> Sequence[int]: ...

    def digest(self) -> str: ...


_ARCH_FIELDS = ("vocab_size", "d_model", "n_layers", "conv_kernel", "hidden_dim", "n_experts", "top_k")


def _arch(config: object) -> str:
    """The seed's readable architecture string V-C-L-K-H-E-k, plus any other config field that is set
    (e.g. `-attn_heads4` for a longer-range block), from an LMConfig."""
    base = "-".join(str(getattr(config, name, "?")) for name in _ARCH_FIELDS)
    extra = "".join(
        f"-{key}{value}" for key, value in _config_dict(config).items()
        if key not in _ARCH_FIELDS and value not in (0, None, False, "")
    )
    return base + extra


def _config_dict(config: object) -> dict:
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    return {k: v for k, v in vars(config).items() if not k.startswith("_")}


class LMEmbedder:
    """Embeds text with an EvermindLM and a BPETokenizer.

    Thread-safe for concurrent `embed`/`embed_many` calls as long as nobody mutates the model's params
    (the model is only read).

    Args:
        model: an EvermindLM (anything with `.config`, `.params` and `embed_batch(list[list[int]])`).
        tokenizer: a BPETokenizer (`encode`, `digest`, `bos_id`).
        max_tokens: tokens per window (texts are truncated to max_tokens * max_chunks tokens).
        max_chunks: windows per text; 1 truncates at max_tokens.
        first_chunk_weight: the first window's weight relative to a later window of the same length.
        adapter_digest: digest of a LoRA adapter merged into `model`, recorded in the fingerprint.
        hybrid_weight: weight of the cosine score against BM25 over the best BM25 in hybrid recall.
        batch_size: rows per `embed_batch` call in `embed_many`.
        lexicon: an lm.lexicon.Lexicon whose vector follows the model's, or None (the model's vector alone).
        lexicon_weight: the lexicon vector's weight against the model's (> 0; used only with a lexicon).
        query_map: an lm.query_map.QueryMap of this embedder's dimensions for `embed_query`, or None.
    Raises:
        InvalidInput: max_tokens, max_chunks, first_chunk_weight, batch_size or lexicon_weight out of range, or a
            query map of other dimensions.
    """

    def __init__(
        self,
        model: LanguageModel,
        tokenizer: Tokenizer,
        *,
        max_tokens: int = 128,
        max_chunks: int = 1,
        first_chunk_weight: float = 1.0,
        adapter_digest: str | None = None,
        hybrid_weight: float = DEFAULT_HYBRID_WEIGHT,
        batch_size: int = DEFAULT_BATCH,
        lexicon: Lexicon | None = None,
        lexicon_weight: float = 1.0,
        query_map: QueryMap | None = None,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= 65_536:
            raise InvalidInput(f"LMEmbedder expected 1 <= max_tokens <= 65536, got max_tokens={max_tokens!r}.")
        if isinstance(max_chunks, bool) or not isinstance(max_chunks, int) or not 1 <= max_chunks <= MAX_CHUNKS_LIMIT:
            raise InvalidInput(f"LMEmbedder expected 1 <= max_chunks <= {MAX_CHUNKS_LIMIT}, got "
                               f"max_chunks={max_chunks!r}.")
        if isinstance(first_chunk_weight, bool) or not isinstance(first_chunk_weight, (int, float)) \
                or not 0 < first_chunk_weight <= 1e6:
            raise InvalidInput(f"LMEmbedder expected 0 < first_chunk_weight <= 1e6, got {first_chunk_weight!r}.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInput(f"LMEmbedder expected batch_size >= 1, got batch_size={batch_size!r}.")
        if isinstance(lexicon_weight, bool) or not isinstance(lexicon_weight, (int, float)) \
                or not 0 < lexicon_weight <= 1e3:
            raise InvalidInput(f"LMEmbedder expected 0 < lexicon_weight <= 1000, got {lexicon_weight!r}.")
        if lexicon is not None and not all(hasattr(lexicon, a) for a in ("embed_many", "dims", "digest")):
            raise InvalidInput(f"LMEmbedder expected an lm.lexicon.Lexicon or None, got {type(lexicon).__name__}.")
        self.model = model
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.max_chunks = max_chunks
        self.first_chunk_weight = float(first_chunk_weight)
        self.batch_size = batch_size
        self.hybrid_weight = float(hybrid_weight)
        self.adapter_digest = adapter_digest
        self.lexicon = lexicon
        self.lexicon_weight = float(lexicon_weight)
        self._model_dims = int(model.config.d_model)
        self._dimensions = self._model_dims + (lexicon.dims if lexicon is not None else 0)
        if query_map is not None and (not all(hasattr(query_map, a) for a in ("apply", "dims", "digest"))
                                      or query_map.dims != self._dimensions):
            raise InvalidInput(f"LMEmbedder expected an lm.query_map.QueryMap of {self._dimensions} dimensions or "
                               f"None, got {query_map!r:.80}.")
        self.query_map = query_map
        self.digest = self._compute_digest()
        # A frozen snapshot (EvermindLM.frozen) embeds faster and holds exactly the weights the digest names,
        # so later changes to `model` cannot change vectors under this fingerprint. Other models (a LoRA
        # wrapper, the GPU model) are called directly.
        frozen = getattr(model, "frozen", None)
        self._engine = frozen() if callable(frozen) else model
        self._one = getattr(self._engine, "embed", None) if callable(frozen) else None
        lex = f"+lex{lexicon.dims}" if lexicon is not None else ""
        self._fingerprint = f"evermind-lm/{_arch(model.config)}{lex}/{self.digest[:8]}"

    def _compute_digest(self) -> str:
        h = hashlib.sha256()
        h.update(FINGERPRINT_FORMAT.encode())
        h.update(json.dumps(_config_dict(self.model.config), sort_keys=True, default=str).encode())
        for name in sorted(self.model.params):
            tensor = np.ascontiguousarray(self.model.params[name], dtype="<f4")
            h.update(f"\n{name}:{tensor.shape}:".encode())
            h.update(tensor.reshape(-1).view(np.uint8).data)  # its bytes, hashed in place (no copy)
        h.update(f"\ntokenizer:{self.tokenizer.digest()}".encode())
        h.update(f"\npooling:{POOLING}\nmax_tokens:{self.max_tokens}".encode())
        if self.max_chunks > 1:  # absent for one window, so truncating embedders keep their fingerprints
            h.update(f"\nchunks:{self.max_chunks} length-weighted mean, first x{self.first_chunk_weight!r}".encode())
        h.update(f"\nadapter:{self.adapter_digest or ''}".encode())
        if self.lexicon is not None:  # absent without one, so plain embedders keep their fingerprints
            h.update(f"\nlexicon:{self.lexicon.digest()} weight {self.lexicon_weight!r}".encode())
        if self.query_map is not None:  # likewise
            h.update(f"\nquery map:{self.query_map.digest()}".encode())
        return h.hexdigest()

    @property
    def dimensions(self) -> int:
        """Length of every vector (the model's d_model, plus the lexicon's dims with a lexicon)."""
        return self._dimensions

    @property
    def model_dimensions(self) -> int | None:
        """With a lexicon: the length of the model's part, the vector's first dimensions (hybrid recall reads its
        cosine on its own); None without one."""
        return self._model_dims if self.lexicon is not None else None

    @property
    def fingerprint(self) -> str:
        """`evermind-lm/<arch>/<first 8 hex of the sha256 digest>`; computed once at construction."""
        return self._fingerprint

    def _tokens(self, text: str) -> list[int]:
        ids = list(self.tokenizer.encode(text))[: self.max_tokens * self.max_chunks]
        return ids if ids else [int(self.tokenizer.bos_id)]

    def _windows(self, ids: list[int]) -> list[list[int]]:
        w = self.max_tokens
        return [ids[i : i + w] for i in range(0, len(ids), w)]

    @single_blas
    def embed(self, text: str) -> np.ndarray:
        """Embed one text.

        Args:
            text: any string (validated by the store, not here).
        Returns:
            (C,) float32, unit length.
        """
        if self._one is not None:  # the frozen model's single-sequence path: no batching bookkeeping
            ids = self._tokens(text)
            if len(ids) <= self.max_tokens:
                vec = self._one(ids)
                return vec if self.lexicon is None else self._with_lexicon(self.lexicon, vec[None, :], [text])[0]
        return self.embed_many([text])[0]

    @single_blas
    def embed_query(self, text: str) -> np.ndarray:
        """Embed one recall query: `embed(text)`, then through the query map if there is one.

        Returns:
            (C,) float32, unit length.
        """
        vec = self.embed(text)
        return vec if self.query_map is None else self.query_map.apply(vec[None, :])[0]

    @single_blas
    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Embed many recall queries at once (the rows `embed_query` gives each). Returns (N, C) float32."""
        vecs = self.embed_many(texts)
        return vecs if self.query_map is None else self.query_map.apply(vecs)

    @single_blas
    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """Embed many texts, batched by token length so padding stays small.

        Args:
            texts: the strings.
        Returns:
            (N, C) float32, rows unit length, in the order of `texts`.
        """
        n = len(texts)
        token_lists = [self._tokens(t) for t in texts]
        if n == 1 and self._one is not None and len(token_lists[0]) <= self.max_tokens:
            vecs = self._one(token_lists[0])[None, :]  # (1, C)
        elif self.max_chunks > 1 and any(len(t) > self.max_tokens for t in token_lists):
            vecs = self._pooled_chunks(token_lists)
        else:
            vecs = self._embed_lists(token_lists)
        return vecs if self.lexicon is None else self._with_lexicon(self.lexicon, vecs, texts)

    def _with_lexicon(self, lexicon: Lexicon, vecs: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        """(N, C + D) unit rows: the model's unit rows (N, C), then lexicon_weight x the lexicon's (N, D)."""
        lex = lexicon.embed_many(texts)  # (N, D) unit or zero rows
        lex *= np.float32(self.lexicon_weight)
        out = np.concatenate([np.asarray(vecs, dtype=np.float32), lex], axis=1)  # (N, C + D)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)

    def _embed_lists(self, token_lists: list[list[int]]) -> np.ndarray:
        """(N, C) unit rows of token lists of at most max_tokens each, in length-sorted batches."""
        n = len(token_lists)
        out = np.zeros((n, self._model_dims), dtype=np.float32)  # (N, C)
        if n == 0:
            return out
        order = np.argsort(np.array([len(t) for t in token_lists]), kind="stable")  # (N,)
        for start in range(0, n, self.batch_size):
            idx = order[start : start + self.batch_size]
            vecs = np.asarray(self._engine.embed_batch([token_lists[i] for i in idx]), dtype=np.float32)  # (b, C)
            out[idx] = vecs
        norms = np.linalg.norm(out, axis=1, keepdims=True)  # (N, 1)
        return out / np.maximum(norms, 1e-12)

    def _pooled_chunks(self, token_lists: list[list[int]]) -> np.ndarray:
        """(N, C) unit rows: each text's window vectors, averaged with weights = window lengths (the first
        window's times first_chunk_weight)."""
        windows = [self._windows(ids) for ids in token_lists]
        owner = np.repeat(np.arange(len(windows)), [len(w) for w in windows])  # (W,) text of each window
        flat = [w for ws in windows for w in ws]
        vecs = self._embed_lists(flat)  # (W, C)
        weight = np.array([len(w) for w in flat], dtype=np.float32)  # (W,)
        first = np.cumsum([0] + [len(w) for w in windows[:-1]])  # (N,) index of each text's first window
        weight[first] *= np.float32(self.first_chunk_weight)
        vecs *= weight[:, None]
        out = np.zeros((len(windows), self._model_dims), dtype=np.float32)  # (N, C)
        np.add.at(out, owner, vecs)
        norms = np.linalg.norm(out, axis=1, keepdims=True)  # (N, 1)
        return out / np.maximum(norms, 1e-12)

    def __repr__(self) -> str:
        chunks = (f", max_chunks={self.max_chunks}, first_chunk_weight={self.first_chunk_weight:g}"
                  if self.max_chunks > 1 else "")
        lex = f", lexicon={self.lexicon!r}, lexicon_weight={self.lexicon_weight:g}" if self.lexicon is not None else ""
        return f"LMEmbedder({self._fingerprint!r}, max_tokens={self.max_tokens}{chunks}{lex})"
