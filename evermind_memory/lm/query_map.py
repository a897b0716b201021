"""QueryMap: a linear map applied to a query's vector only, before the cosine with stored vectors.

A question and the fact that answers it are different kinds of text ("what sport does Ada play?" / "Ada plays
squash on Thursdays"), and an embedder embeds both the same way. A map W (D x D) fitted on training pairs (ridge
regression from a query's vector to its document's, pulled towards the identity: benchmarks/query_map.py) learns
that asymmetry; the embedder's `embed_query` returns the L2-normalised `vector @ W`, and every stored vector stays
what `embed` / `embed_many` make.

File layout: the checkpoint container (lm.checkpoint) with its own magic; meta {"dims"}; one tensor "map" (D, D)
float32. Size, shape and finiteness are checked before the map is used.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from ..errors import CheckpointError, InvalidInput
from .checkpoint import TensorSpec, read_tensor_file, write_tensor_file

__all__ = ["QueryMap", "QUERY_MAP_MAGIC", "QUERY_MAP_KIND"]

QUERY_MAP_MAGIC = b"\x89EVQMP\r\n"
QUERY_MAP_KIND = "evermind-query-map 1"
MAX_DIMS = 4096
MAX_FILE_BYTES = 4 * MAX_DIMS * MAX_DIMS + (1 << 20)


class QueryMap:
    """A (D, D) float32 map for query vectors.

    Args:
        matrix: (D, D) finite floats, 1 <= D <= MAX_DIMS.
    Raises:
        InvalidInput: another shape or a value that is not finite.
    """

    def __init__(self, matrix: Any) -> None:
        m = np.asarray(matrix)
        if m.ndim != 2 or m.shape[0] != m.shape[1] or not 1 <= m.shape[0] <= MAX_DIMS \
                or not np.issubdtype(m.dtype, np.number):
            raise InvalidInput(f"QueryMap expected a square numeric matrix of at most {MAX_DIMS} rows, got shape "
                               f"{m.shape} of {m.dtype}.")
        m = np.ascontiguousarray(m, dtype=np.float32)
        if not np.isfinite(m).all():
            raise InvalidInput("QueryMap expected finite values.")
        self.matrix = m
        self.matrix.setflags(write=False)
        self._digest: str | None = None

    @property
    def dims(self) -> int:
        """Length of the vectors it maps."""
        return int(self.matrix.shape[0])

    def digest(self) -> str:
        """sha256 over the format and the matrix (computed once)."""
        if self._digest is None:
            h = hashlib.sha256(f"{QUERY_MAP_KIND}\n{self.matrix.shape}:".encode())
            h.update(self.matrix.astype("<f4").reshape(-1).view(np.uint8).data)
            self._digest = h.hexdigest()
        return self._digest

    def apply(self, vectors: np.ndarray) -> np.ndarray:
        """(N, D) float32 unit rows: each row of `vectors` (N, D) times the map, L2-normalised (a row mapped to
        exactly zero stays zero)."""
        out = np.asarray(vectors, dtype=np.float32) @ self.matrix  # (N, D)
        norms = np.linalg.norm(out, axis=1, keepdims=True)  # (N, 1)
        np.divide(out, norms, out=out, where=norms > 0)
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the map atomically (lm.checkpoint container, QUERY_MAP_MAGIC)."""
        write_tensor_file(path, magic=QUERY_MAP_MAGIC, kind=QUERY_MAP_KIND, meta={"dims": self.dims},
                          tensors={"map": self.matrix})

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES) -> QueryMap:
        """Read and validate a query map file.

        Raises:
            CheckpointError: the file is missing, damaged, too large or not a query map.
        """
        label = os.fspath(path)

        def check(meta: dict[str, Any], specs: dict[str, TensorSpec]) -> None:
            d = meta.get("dims")
            if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= MAX_DIMS:
                raise CheckpointError(f"{label}: a query map of {d!r} dimensions; expected 1 to {MAX_DIMS}.")
            if specs != {"map": ("f32", (d, d))}:
                raise CheckpointError(f"{label}: query map tensors {specs} do not match {d} dims.")

        meta, tensors = read_tensor_file(path, magic=QUERY_MAP_MAGIC, kind=QUERY_MAP_KIND, max_bytes=max_bytes,
                                         dtypes=("f32",), check=check)
        try:
            return cls(tensors["map"])
        except InvalidInput as e:
            raise CheckpointError(f"{label}: {e} The file is damaged; use another copy.") from e

    def __repr__(self) -> str:
        return f"QueryMap({self.dims} x {self.dims}, {self.digest()[:8]})"
