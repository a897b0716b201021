"""How a vector is stored in a database row, for both engines: int8 components with one little-endian float32 scale
(D + 4 bytes; schema 7, issue 34), read back as float32, in which every score is computed.

A row is the scale s = max |x_i| / 127 of the unit vector x, then round(x_i / s) for each component: each component
loses at most s / 2 (6e-4 for the shipped model's rows, whose largest component is 0.12 to 0.30; cosine to the
float32 vector at least 0.9998), and the vector is scaled back to unit length when read. The vectors a process embeds
are rounded by `as_stored` before anything sees them, so its own index holds the very values any other process reads
from the database. Rows of earlier schemas are read as well: float16 (2 bytes a component, schemas 5 and 6) and
float32 (4 bytes, schema 4 and earlier); `compact_rows` rewrites both at migration. The three lengths differ for
every D >= 5, so a row's length says how to read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..._lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

SCALE = "<f4"  # a row's first 4 bytes: the scale of its int8 components
HALF = "<f2"  # what rows held in schemas 5 and 6
LEGACY = "<f4"  # what rows held before schema 5
FORMAT = "int8"  # named in an index manifest (a snapshot of float32 rows, before schema 5, is rebuilt once)
# snapshots whose nodes are within NEAR_TOL (index_nodes.py) of this format's rows: kept across the migration
COMPATIBLE_FORMATS = (FORMAT, "float16")
LEVELS = 127  # int8 steps on each side of 0
# a stored vector's squared norm is 1 within int8 rounding (~1e-4); one damaged value or scale moves it more
UNIT_TOLERANCE = 0.02


def blob_lengths(dim: int) -> tuple[int, int, int]:
    """The byte lengths a readable vector of `dim` components has: (stored int8, float16, float32)."""
    return dim + 4, 2 * dim, 4 * dim


def _quantize(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, D) float32 -> (scales (N,) float32, components (N, D) int8): per row, its largest magnitude / LEVELS,
    rounded to float16's precision. The rounding costs nothing (a row's scale only sets its length, which the read
    normalises away) and makes the row repeatable: the same text embedded in two batches differs by ~1e-7, which a
    full-precision scale carries into every component, so the two rows would never be bit-identical (index_nodes.py
    then finds their shared node by a search instead of by its key)."""
    x = np.asarray(vectors, dtype=np.float32)  # (N, D)
    top = np.abs(x).max(axis=1, initial=0.0)  # (N,)
    scale = np.where(top > 0, top / LEVELS, 1.0).astype(np.float16).astype(np.float32)  # (N,) (zero row: 1, zeros)
    q = np.clip(np.rint(x / scale[:, None]), -LEVELS, LEVELS).astype(np.int8)  # (N, D)
    return scale, q


def steps_of(vectors: np.ndarray) -> np.ndarray:
    """(N, D) float32 -> (N, D) int8: the components a row stores (the vector index's graph holds exactly these).
    A vector read back from its row gives the same steps again (its scale is within float16's precision of the
    row's, so no component moves by half a step)."""
    return _quantize(vectors)[1]


def unit_steps(steps: np.ndarray) -> np.ndarray:
    """(N, D) int8 steps -> (N, D) float32 unit rows (an all-zero row stays zero): a row's vector as the graph
    holds it, within 1e-6 of what a read of the row gives (the same steps, scaled in another order)."""
    x = steps.astype(np.float32)  # (N, D)
    norm = np.sqrt(np.einsum("nd,nd->n", x, x))  # (N,)
    return x * np.where(norm > 0, 1.0 / np.where(norm > 0, norm, 1.0), 0.0).astype(np.float32)[:, None]


def encode(vector: np.ndarray) -> bytes:
    """One (D,) vector as the bytes of its row: its float32 scale, then its D int8 components."""
    return encode_many(np.asarray(vector, dtype=np.float32)[None, :])[0]


def encode_many(vectors: np.ndarray) -> list[bytes]:
    """(N, D) vectors as the bytes of their N rows (encode's, row by row)."""
    scale, q = _quantize(vectors)
    packed = np.empty((len(q), q.shape[1] + 4), dtype=np.uint8)  # (N, D + 4)
    packed[:, :4] = scale.astype(SCALE).view(np.uint8).reshape(len(q), 4)
    packed[:, 4:] = q.view(np.uint8)
    return [row.tobytes() for row in packed]


def as_stored(vectors: np.ndarray) -> np.ndarray:
    """(N, D) float32 unit vectors as a read of their rows gives them back: rounded to int8 steps of their scale,
    then scaled back to unit length in float32 (bit for bit what decode() returns for encode()'s bytes)."""
    scale, q = _quantize(vectors)
    return _unit(_expand(scale, q))  # (N, D)


def _expand(scale: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(N,) float32 scales and (N, D) int8 components -> (N, D) float32 (before the unit scaling)."""
    return q.astype(np.float32) * scale.astype(np.float32)[:, None]


def _unit(raw: np.ndarray) -> np.ndarray:
    """(N, D) float32 rows scaled to unit length where their squared norm is within UNIT_TOLERANCE of 1 (rounding
    moved it by ~1e-4); any other row is left as it is, so the caller's check still sees a damaged one."""
    with np.errstate(over="ignore", invalid="ignore"):
        sq = np.einsum("nd,nd->n", raw, raw, dtype=np.float64)  # (N,)
    fine = np.isfinite(sq) & (np.abs(sq - 1.0) < UNIT_TOLERANCE)  # (N,)
    scale = np.where(fine, 1.0 / np.sqrt(np.where(fine, sq, 1.0)), 1.0).astype(np.float32)  # (N,)
    return raw * scale[:, None]  # (N, D)


def readable(blob: object, dim: int) -> bool:
    """Whether a row's vector has a length a vector of `dim` components can have (NULL: no)."""
    return isinstance(blob, (bytes, bytearray, memoryview)) and len(blob) in blob_lengths(dim)


def usable(matrix: np.ndarray) -> np.ndarray:
    """(N,) bool: rows of an (N, D) float32 matrix that are vectors as the store writes them: finite and of unit
    length (R10; every vector is normalised before it is stored, so a damaged one shows in its norm)."""
    if not len(matrix):
        return np.zeros(0, dtype=bool)  # (0,)
    with np.errstate(over="ignore", invalid="ignore"):
        sq = np.einsum("nd,nd->n", matrix, matrix, dtype=np.float64)  # (N,) squared norms
    return np.isfinite(sq) & (np.abs(sq - 1.0) < UNIT_TOLERANCE)  # (N,)


def read(blobs: Sequence[Any], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """N raw vector columns as (ok (N,) bool, vectors (N, D) float32): a row is ok when it has a readable length
    and decodes to a usable vector; the other rows (NULL, wrong length, damaged) are zeros. What every read of
    stored vectors goes through, on both engines."""
    ok = np.array([readable(b, dim) for b in blobs], dtype=bool)  # (N,)
    if ok.all():  # (the usual case: decode straight into the answer)
        matrix = decode([bytes(b) for b in blobs], dim)  # (N, D)
    else:
        matrix = np.zeros((len(blobs), dim), dtype=np.float32)  # (N, D)
        if ok.any():
            matrix[ok] = decode([bytes(b) for b, fine in zip(blobs, ok.tolist()) if fine], dim)  # (H, D)
    ok &= usable(matrix)
    if not ok.all():
        matrix[~ok] = 0.0
    return ok, matrix


def intact(blob: object, dim: int) -> bool:
    """Whether one raw vector column holds a vector as the store writes it (repair's check of a row)."""
    return bool(read([blob], dim)[0][0])


def decode(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """(N, D) float32 from N row vectors, each of a readable length (blob_lengths); unit rows (see _unit)."""
    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)  # (0, D)
    packed = dim + 4
    if all(len(b) == packed for b in blobs):  # (every row of a store of schema 7)
        return _unit(_unpack(b"".join(blobs), len(blobs), dim))  # (N, D)
    out = np.zeros((len(blobs), dim), dtype=np.float32)  # (N, D)
    for length, dtype in ((packed, None), (2 * dim, HALF), (4 * dim, LEGACY)):
        rows = [i for i, b in enumerate(blobs) if len(b) == length]
        if not rows:
            continue
        raw = b"".join(blobs[i] for i in rows)
        out[rows] = (_unpack(raw, len(rows), dim) if dtype is None
                     else np.frombuffer(raw, dtype=dtype).reshape(len(rows), dim))
    return _unit(out)


def _unpack(raw: bytes, n: int, dim: int) -> np.ndarray:
    """(n, D) float32 from n int8 rows (scale, components) joined in `raw`, before the unit scaling."""
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(n, dim + 4)  # (n, D + 4)
    scale = np.ascontiguousarray(rows[:, :4]).view(SCALE)[:, 0]  # (n,)
    return _expand(scale, rows[:, 4:].view(np.int8))  # (n, D)


def compact_rows(rows: Sequence[tuple[object, bytes]]) -> list[tuple[bytes, object]]:
    """(key, vector) rows of a store before schema 7 -> (int8 row, key) for the rows to rewrite.

    A row is rewritten when its bytes read as float32 (what schema 4 and earlier stored), else as float16 (schemas 5
    and 6), make a unit vector. A damaged one stays as it was (read by its length and found damaged, as before), and
    so does a row that is int8 already (its scale and components read as floats make no unit vector), so the step
    can run twice. The generation table may hold another model's vectors, of another length: every length is tried.
    """
    out: list[tuple[bytes, object]] = []
    by_length: dict[int, list[tuple[object, bytes]]] = {}
    for key, blob in rows:
        if isinstance(blob, (bytes, bytearray, memoryview)) and len(blob) and len(blob) % 2 == 0:
            by_length.setdefault(len(blob), []).append((key, bytes(blob)))
    for length, group in by_length.items():
        raw = b"".join(b for _, b in group)
        todo = np.ones(len(group), dtype=bool)  # (n,) rows not rewritten yet
        for dtype, width in ((LEGACY, 4), (HALF, 2)):
            if length % width:
                continue
            wide = np.frombuffer(raw, dtype=dtype).reshape(len(group), length // width).astype(np.float32)  # (n, d)
            unit = todo & usable(wide)  # (n,)
            if unit.any():
                keys = [key for (key, _), ok in zip(group, unit.tolist()) if ok]
                out.extend(zip(encode_many(_unit(wide[unit])), keys))
                todo &= ~unit
    return out
