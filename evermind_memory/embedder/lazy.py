"""LazyEmbedder: an embedder whose identity is known before its weights are read.

`default_embedder()` returns one built from the shipped model's card: `fingerprint`, `dimensions`,
`max_tokens` and `hybrid_weight` come from model.json, and the weights and tokenizer are read on the first
`embed`/`embed_many` (or the first use of `model`/`tokenizer`), once, whichever thread gets there first. So
opening a store or running a command that needs no vectors never loads the model.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .._lazy import lazy_import
from ..errors import CheckpointError
from .base import query_method

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)


class LazyEmbedder:
    """An embedder that loads on first use and checks that what it loaded is what it announced.

    Thread-safe: concurrent first calls load once (the others wait), and the loaded embedder is only read.

    Args:
        fingerprint: the fingerprint the loaded embedder must have.
        dimensions: its vector length.
        load: a function returning the real embedder (e.g. an LMEmbedder); called at most once unless it
            raises, in which case the next call tries again.
        max_tokens: its truncation length, or window length when max_chunks > 1 (known without loading).
        max_chunks: windows of max_tokens it reads per text (known without loading).
        first_chunk_weight: the first window's weight in a pooled vector (known without loading).
        hybrid_weight: its fusion weight (known without loading).
        source: how error messages name what is loaded.
        model_dimensions: with a lexicon, the model's part of the vector (known without loading); else None.
    """

    def __init__(self, *, fingerprint: str, dimensions: int, load: Callable[[], Any], max_tokens: int,
                 hybrid_weight: float, source: str = "the shipped model", max_chunks: int = 1,
                 first_chunk_weight: float = 1.0, model_dimensions: int | None = None) -> None:
        self._fingerprint = fingerprint
        self._dimensions = int(dimensions)
        self._load = load
        self.max_tokens = int(max_tokens)
        self.max_chunks = int(max_chunks)
        self.first_chunk_weight = float(first_chunk_weight)
        self.hybrid_weight = float(hybrid_weight)
        self._source = source
        self._model_dimensions = model_dimensions
        self._lock = threading.Lock()
        self._inner: Any = None

    @property
    def fingerprint(self) -> str:
        """The announced fingerprint (equal to the loaded embedder's; checked when it loads)."""
        return self._fingerprint

    @property
    def dimensions(self) -> int:
        """Length of every vector."""
        return self._dimensions

    @property
    def loaded(self) -> bool:
        """Whether the weights have been read yet."""
        return self._inner is not None

    def load(self) -> Any:
        """Read the weights now (if not yet) and return the real embedder.

        Raises:
            CheckpointError: the files are damaged, or they give another fingerprint or dimension than
                announced (the card does not describe these files).
        """
        inner = self._inner
        if inner is not None:
            return inner
        with self._lock:
            if self._inner is None:
                inner = self._load()
                got = (getattr(inner, "fingerprint", None), getattr(inner, "dimensions", None),
                       getattr(inner, "model_dimensions", None))
                if got != (self._fingerprint, self._dimensions, self._model_dimensions):
                    raise CheckpointError(
                        f"{self._source} was announced as {self._fingerprint} (dim {self._dimensions}, model part "
                        f"{self._model_dimensions}) but its files give {got[0]} (dim {got[1]}, model part {got[2]}); "
                        "the card and the weights do not match. Reinstall evermind_memory (for a model you trained, "
                        "write the loaded fingerprint into its card)."
                    )
                self._inner = inner
        return self._inner

    def embed(self, text: str) -> np.ndarray:
        """Embed one text (loads the model on first use). Returns (C,) float32, unit length."""
        return self.load().embed(text)

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """Embed many texts (loads the model on first use). Returns (N, C) float32, rows unit length."""
        return self.load().embed_many(texts)

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one recall query (through the model's query map, if it has one; loads the model)."""
        return query_method(self.load())[1](text)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Embed many recall queries (as embed_query; loads the model). Returns (N, C) float32."""
        return query_method(self.load(), many=True)[1](texts)

    @property
    def query_map(self) -> Any:
        """The query map of the loaded model, or None (loads the model)."""
        return getattr(self.load(), "query_map", None)

    @property
    def model(self) -> Any:
        """The loaded model (loads it)."""
        return self.load().model

    @property
    def tokenizer(self) -> Any:
        """The loaded tokenizer (loads it)."""
        return self.load().tokenizer

    @property
    def batch_size(self) -> int:
        """Rows per forward in embed_many (loads the model)."""
        return self.load().batch_size

    @property
    def model_dimensions(self) -> int | None:
        """With a lexicon: the length of the model's part of the vector (known without loading); else None."""
        return self._model_dimensions

    @property
    def lexicon(self) -> Any:
        """The lexicon whose vector follows the model's, or None (loads the model)."""
        return getattr(self.load(), "lexicon", None)

    @property
    def lexicon_weight(self) -> float:
        """The lexicon vector's weight against the model's (loads the model)."""
        return float(getattr(self.load(), "lexicon_weight", 1.0))

    @property
    def adapter_digest(self) -> str | None:
        """Digest of an adapter merged into the model, if any (loads the model)."""
        return getattr(self.load(), "adapter_digest", None)

    def __repr__(self) -> str:
        state = "loaded" if self.loaded else "not loaded yet"
        return f"LazyEmbedder({self._fingerprint!r}, max_tokens={self.max_tokens}, {state})"
