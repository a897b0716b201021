"""A real embedder that fails on purpose: texts containing "poison" get a NaN vector (for error-path tests)."""

from __future__ import annotations


class PoisonedEmbedder:
    """Wraps a real embedder (same dimensions and fingerprint); texts containing "poison" get a NaN vector."""

    def __init__(self, inner) -> None:
        self.inner, self.dimensions, self.fingerprint = inner, inner.dimensions, inner.fingerprint

    def embed(self, text):
        return self.embed_many([text])[0]

    def embed_many(self, texts):
        out = self.inner.embed_many(texts)
        out[["poison" in t for t in texts]] = float("nan")
        return out
