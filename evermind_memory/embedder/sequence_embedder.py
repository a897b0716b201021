"""SequenceEmbedder: text -> BPE tokens -> SequenceBackbone (Mamba / attention blocks) -> mean over the real
tokens -> L2-normalised float32 vector.

The fingerprint `evermind-seq/<architecture>/<crc32>` names the whole function: the CRC runs over the
config, every parameter tensor, the tokenizer's digest, the pooling and the truncation length. LoRA
adaptation is EvermindLM-only; this embedder has no adapter.
"""

from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING, Any, Sequence

from .._lazy import lazy_import
from ..errors import InvalidInput
from .base import DEFAULT_HYBRID_WEIGHT

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

if TYPE_CHECKING:  # the backbone's module is imported when an embedder is built, not with this package
    from ..lm.sequence import SequenceBackbone

FINGERPRINT_FORMAT = "evermind-seq-embedder 1"
POOLING = "mean-real-tokens-l2"
DEFAULT_BATCH = 16
_BUCKET_TOKENS = 2048  # at most this many padded positions per forward: the scans' chunk tensors grow with it
_PAD_ID = 0  # any id works: every block is causal, so right padding never reaches a real position


class SequenceEmbedder:
    """Embeds text with a SequenceBackbone and a BPETokenizer.

    Thread-safe for concurrent `embed`/`embed_many` calls (the backbone is only read).

    Args:
        backbone: a SequenceBackbone (`.config`, `.params`, `.forward(ids) -> (B, L, C)`).
        tokenizer: a BPETokenizer (`encode`, `digest`, `bos_id`).
        max_tokens: texts are truncated to this many tokens.
        hybrid_weight: weight of the cosine score against BM25 over the best BM25 in hybrid recall.
        batch_size: most texts per backbone forward in `embed_many`.
    Raises:
        InvalidInput: backbone is not a SequenceBackbone, its vocabulary is smaller than the tokenizer's, or
            max_tokens / batch_size out of range.

    Example:
        emb = SequenceEmbedder(SequenceBackbone.load("seq.evlm"), BPETokenizer.load("tokenizer.json"))
        store = MemoryStore("agent.db", embedder=emb)
    """

    def __init__(
        self,
        backbone: SequenceBackbone,
        tokenizer: Any,
        *,
        max_tokens: int = 128,
        hybrid_weight: float = DEFAULT_HYBRID_WEIGHT,
        batch_size: int = DEFAULT_BATCH,
    ) -> None:
        from ..lm.sequence import SequenceBackbone

        if not isinstance(backbone, SequenceBackbone):
            raise InvalidInput(f"SequenceEmbedder expected a SequenceBackbone, got {type(backbone).__name__}.")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= 65_536:
            raise InvalidInput(f"SequenceEmbedder expected 1 <= max_tokens <= 65536, got max_tokens={max_tokens!r}.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInput(f"SequenceEmbedder expected batch_size >= 1, got batch_size={batch_size!r}.")
        if len(tokenizer) > backbone.config.vocab_size:
            raise InvalidInput(
                f"SequenceEmbedder: the tokenizer has {len(tokenizer)} ids but the backbone's vocabulary is "
                f"{backbone.config.vocab_size}; pair the backbone with the tokenizer it was trained with."
            )
        self.model = backbone  # named as LMEmbedder's, so tools that print embedder.model.config work for both
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.hybrid_weight = float(hybrid_weight)
        self._dimensions = int(backbone.config.d_model)
        self.digest = f"{self._compute_crc():08x}"
        arch = backbone.config.architecture.removeprefix("seqmodel/")
        self._fingerprint = f"evermind-seq/{arch}/{self.digest}"

    def _compute_crc(self) -> int:
        config = self.model.config
        crc = zlib.crc32(FINGERPRINT_FORMAT.encode())
        crc = zlib.crc32(json.dumps(config.to_dict(), sort_keys=True).encode(), crc)
        for name, tensor in self.model.params.items():  # sequence_param_shapes order
            arr = np.ascontiguousarray(tensor, dtype="<f4")
            crc = zlib.crc32(f"\n{name}:{arr.shape}:".encode(), crc)
            crc = zlib.crc32(arr.reshape(-1).view(np.uint8).data, crc)  # .data: the bytes, no copy
        tail = f"\ntokenizer:{self.tokenizer.digest()}\npooling:{POOLING}\nmax_tokens:{self.max_tokens}"
        return zlib.crc32(tail.encode(), crc)

    @property
    def dimensions(self) -> int:
        """Length of every vector (the backbone's d_model)."""
        return self._dimensions

    @property
    def fingerprint(self) -> str:
        """`evermind-seq/<architecture>/<crc32 as 8 hex>`; computed once at construction."""
        return self._fingerprint

    def _tokens(self, text: str) -> list[int]:
        ids = list(self.tokenizer.encode(text))[: self.max_tokens]
        return ids if ids else [int(self.tokenizer.bos_id)]

    def _embed_bucket(self, token_lists: list[list[int]]) -> np.ndarray:
        """(b, C) unit vectors for texts of similar length: right-padded, one forward, mean over real tokens."""
        lengths = np.array([len(t) for t in token_lists])  # (b,)
        ids = np.full((len(token_lists), int(lengths.max())), _PAD_ID, dtype=np.int64)  # (b, L)
        real = np.arange(ids.shape[1])[None, :] < lengths[:, None]  # (b, L)
        ids[real] = np.concatenate(token_lists)
        h = self.model.forward(ids)  # (b, L, C)
        pooled = np.einsum("blc,bl->bc", h, real.astype(h.dtype)) / lengths[:, None].astype(h.dtype)  # (b, C)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)  # (b, 1)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)

    def embed(self, text: str) -> np.ndarray:
        """Embed one text.

        Args:
            text: any string (validated by the store, not here).
        Returns:
            (C,) float32, unit length.
        """
        return self._embed_bucket([self._tokens(text)])[0]

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """Embed many texts, batched by token length so padding stays small; row i equals embed(texts[i]).

        Args:
            texts: the strings.
        Returns:
            (N, C) float32, rows unit length, in the order of `texts`.
        """
        n = len(texts)
        out = np.zeros((n, self._dimensions), dtype=np.float32)  # (N, C)
        token_lists = [self._tokens(t) for t in texts]
        order = np.argsort(np.array([len(t) for t in token_lists], dtype=np.int64), kind="stable")  # (N,)
        start = 0
        while start < n:  # one bucket per forward: the shortest remaining texts, as many as the budget allows
            longest = len(token_lists[order[min(n, start + self.batch_size) - 1]])
            rows = max(1, min(self.batch_size, _BUCKET_TOKENS // longest))
            idx = order[start:start + rows]
            out[idx] = self._embed_bucket([token_lists[i] for i in idx])
            start += rows
        return out

    def __repr__(self) -> str:
        return f"SequenceEmbedder({self._fingerprint!r}, max_tokens={self.max_tokens})"
