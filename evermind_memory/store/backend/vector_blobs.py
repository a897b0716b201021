"""How a vector is stored in a database row, for both engines: little-endian float16 (2 bytes a component; schema
5, issue 34), read back as float32, in which every score is computed.

A model's unit vector loses at most 2**-11 of each component to float16 (4.9e-4 below 1.0), and is scaled back to
unit length when read. The vectors a process embeds are rounded by `as_stored` before anything sees them, so its
own index holds the very values any other process reads from the database. Stores of schema 4 and earlier held float32
(4 bytes a component): `compact_rows` rewrites them at migration, and a float32 row met later (a process of the previous
version still writing) is read as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..._lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

STORED = "<f2"  # what a row holds
LEGACY = "<f4"  # what rows held before schema 5
FORMAT = "float16"  # named in an index manifest: a snapshot of float32 rows is not this store's
# a stored vector's squared norm is 1 within float16 rounding (~1e-3); one damaged value moves it more
UNIT_TOLERANCE = 0.02


def blob_lengths(dim: int) -> tuple[int, int]:
    """The byte lengths a readable vector of `dim` components has: (stored, legacy)."""
    return 2 * dim, 4 * dim


def encode(vector: np.ndarray) -> bytes:
    """One (D,) vector as the bytes of its row."""
    return np.asarray(vector, dtype=np.float32).astype(STORED).tobytes()


def as_stored(vectors: np.ndarray) -> np.ndarray:
    """(N, D) float32 unit vectors as a read of their rows gives them back: rounded to float16, then scaled back
    to unit length in float32 (bit for bit what decode() returns for encode()'s bytes)."""
    return _unit(np.asarray(vectors, dtype=np.float32).astype(STORED).astype(np.float32))  # (N, D)


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
    """(N, D) float32 from N row vectors, each of a readable length (stored or legacy); unit rows (see _unit)."""
    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)  # (0, D)
    small = 2 * dim
    if all(len(b) == small for b in blobs):  # (every row of a store of schema 5)
        return _unit(np.frombuffer(b"".join(blobs), dtype=STORED).reshape(len(blobs), dim).astype(np.float32))  # (N, D)
    out = np.zeros((len(blobs), dim), dtype=np.float32)  # (N, D)
    short = [i for i, b in enumerate(blobs) if len(b) == small]
    wide = [i for i, b in enumerate(blobs) if len(b) != small]
    if short:
        out[short] = np.frombuffer(b"".join(blobs[i] for i in short), dtype=STORED).reshape(len(short), dim)
    out[wide] = np.frombuffer(b"".join(blobs[i] for i in wide), dtype=LEGACY).reshape(len(wide), dim)
    return _unit(out)


def compact_rows(rows: Sequence[tuple[object, bytes]]) -> list[tuple[bytes, object]]:
    """(key, vector) rows of a store before schema 5 -> (float16 vector, key) for the rows to rewrite.

    A row is rewritten when its bytes read as float32 make a unit vector: what every earlier version stored. A
    damaged one stays as it was (read as legacy float32 and found damaged, as before), and so does a row that
    is float16 already (read as float32 its values are ~1e-14: no unit vector), so the step can run twice.
    """
    out: list[tuple[bytes, object]] = []
    by_length: dict[int, list[tuple[object, bytes]]] = {}
    for key, blob in rows:
        if isinstance(blob, (bytes, bytearray, memoryview)) and len(blob) and len(blob) % 4 == 0:
            by_length.setdefault(len(blob), []).append((key, bytes(blob)))
    for length, group in by_length.items():
        wide = np.frombuffer(b"".join(b for _, b in group), dtype=LEGACY).reshape(len(group), length // 4)  # (n, d)
        with np.errstate(over="ignore", invalid="ignore"):
            sq = np.einsum("nd,nd->n", wide, wide, dtype=np.float64)  # (n,)
        unit = np.isfinite(sq) & (np.abs(sq - 1.0) < UNIT_TOLERANCE)  # (n,)
        packed = wide[unit].astype(STORED)  # (u, d)
        keys = [key for (key, _), ok in zip(group, unit.tolist()) if ok]
        out.extend((row.tobytes(), key) for key, row in zip(keys, packed))
    return out
