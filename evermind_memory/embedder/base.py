"""The embedder seam: what a MemoryStore needs from a text -> vector function.

Any object with `embed`, `embed_many`, `dimensions` and `fingerprint` can be handed to a store (structural
typing, no base class to inherit). One that embeds a recall's question differently from what it stores (a query
map) also has `embed_query` / `embed_queries`; `query_method` picks the one to ask with. `check_embedder` and
`checked_vectors` enforce the contract at the store's boundary, so a misbehaving embedder gives an
`EmbedderOutputInvalid`, never a stored NaN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, TypeGuard, runtime_checkable

from .._lazy import is_numpy, lazy_import
from ..errors import EmbedderOutputInvalid, InvalidInput

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

MAX_DIMENSIONS = 65_536
DEFAULT_HYBRID_WEIGHT = 2.0  # hybrid recall's vector-side weight for a model with no calibrated one of its own
MAX_FINGERPRINT_CHARS = 512
MIN_NORM = 1e-6


@runtime_checkable
class Embedder(Protocol):
    """A deterministic function text -> vector, named by `fingerprint`.

    Two embedders with the same fingerprint must give the same vector for the same text; any change of
    weights, tokenizer or pooling must change the fingerprint.
    """

    @property
    def dimensions(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    def embed(self, text: str) -> np.ndarray: ...

    def embed_many(self, texts: Sequence[str]) -> np.ndarray: ...


class Adaptable(Embedder, Protocol):
    """An embedder adaptation can fit a LoRA adapter for (an LMEmbedder): an EvermindLM `model` with pooled
    forward/backward passes and a next-token loss, its `tokenizer`, and the `max_tokens` a text is cut to."""

    model: Any  # lm.model.EvermindLM (typed loosely: this seam must not import the model code)
    tokenizer: Any  # lm.tokenizer.BPETokenizer
    max_tokens: int


_ADAPTABLE_MODEL = ("params", "config", "pooled_forward", "pooled_backward", "loss_and_grads")


def is_adaptable(embedder: object) -> TypeGuard[Adaptable]:
    """Whether `embedder` is one adaptation can work with (see Adaptable): the one place this is asked."""
    model = getattr(embedder, "model", None)
    return (model is not None and all(hasattr(embedder, a) for a in ("tokenizer", "max_tokens", "fingerprint"))
            and all(hasattr(model, a) for a in _ADAPTABLE_MODEL))


def check_embedder(embedder: object) -> tuple[int, str]:
    """Check that `embedder` satisfies the Embedder protocol and has sane identity fields.

    Args:
        embedder: the object handed to a store.
    Returns:
        (dimensions, fingerprint).
    Raises:
        InvalidInput: a method or attribute is missing or of the wrong kind.
    """
    missing = [name for name in ("embed", "embed_many", "dimensions", "fingerprint") if not hasattr(embedder, name)]
    if missing:
        raise InvalidInput(
            f"expected an embedder with embed, embed_many, dimensions and fingerprint; "
            f"{type(embedder).__name__} lacks {', '.join(missing)}."
        )
    if not callable(getattr(embedder, "embed")) or not callable(getattr(embedder, "embed_many")):
        raise InvalidInput("expected embedder.embed and embedder.embed_many to be callable "
                           f"({type(embedder).__name__}).")
    dim = getattr(embedder, "dimensions")
    if isinstance(dim, bool) or not (isinstance(dim, int) or is_numpy(dim, "integer")) \
            or not 1 <= int(dim) <= MAX_DIMENSIONS:
        raise InvalidInput(f"expected embedder.dimensions to be an int in [1, {MAX_DIMENSIONS}], got {dim!r}.")
    fp = getattr(embedder, "fingerprint")
    if not isinstance(fp, str) or not fp or len(fp) > MAX_FINGERPRINT_CHARS or "\x00" in fp:
        raise InvalidInput(
            f"expected embedder.fingerprint to be a non-empty string of at most {MAX_FINGERPRINT_CHARS} "
            f"characters without NUL, got {fp!r:.80}."
        )
    try:
        fp.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"embedder.fingerprint is not valid UTF-8 ({exc.reason}).") from None
    return int(dim), fp


def query_method(embedder: object, *, many: bool = False) -> tuple[str, Callable[[Any], Any]]:
    """(its name, the method) an embedder embeds recall queries with: `embed_query` (`embed_queries` with many)
    where it has one, else `embed` (`embed_many`), for embedders that embed a question as they store a fact."""
    name = "embed_queries" if many else "embed_query"
    method = getattr(embedder, name, None)
    if callable(method):
        return name, method
    name = "embed_many" if many else "embed"
    return name, getattr(embedder, name)


def checked_vectors(raw: object, count: int, dim: int, *, what: str = "embed_many") -> np.ndarray:
    """Validate an embedder's output and return unit-length float32 rows.

    Args:
        raw: what the embedder returned.
        count: how many rows were asked for.
        dim: the embedder's declared dimensions.
        what: the method name, for the error message.
    Returns:
        (count, dim) float32 array, each row L2-normalised.
    Raises:
        EmbedderOutputInvalid: wrong shape, non-numeric, non-finite or (near) zero vectors.
    """
    try:
        arr = np.asarray(raw)
    except Exception as exc:  # noqa: BLE001 - anything an embedder returns is untrusted
        raise EmbedderOutputInvalid(f"embedder.{what} returned something that is not an array: {exc}") from None
    if arr.dtype.kind not in "fiu":
        raise EmbedderOutputInvalid(f"embedder.{what} expected a numeric array, got dtype {arr.dtype}.")
    if arr.ndim == 1 and count == 1:
        arr = arr[None, :]
    if arr.shape != (count, dim):
        raise EmbedderOutputInvalid(
            f"embedder.{what} expected shape ({count}, {dim}), got {arr.shape}. "
            "Check embedder.dimensions against what the model produces."
        )
    vecs = arr.astype(np.float64)  # (N, D) norms in float64 so huge finite values do not overflow
    finite = np.isfinite(vecs).all(axis=1)  # (N,)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        raise EmbedderOutputInvalid(f"embedder.{what} returned a non-finite vector (row {bad}).")
    norms = np.linalg.norm(vecs, axis=1)  # (N,)
    if (norms <= MIN_NORM).any():
        bad = int(np.flatnonzero(norms <= MIN_NORM)[0])
        raise EmbedderOutputInvalid(
            f"embedder.{what} returned a zero vector (row {bad}, norm {norms[bad]:.3g} <= {MIN_NORM})."
        )
    out = (vecs / norms[:, None]).astype(np.float32)  # (N, D)
    return np.ascontiguousarray(out)
