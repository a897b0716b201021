"""Checkpoint files: one validated binary tensor format for models, adapters and row deltas.

Layout (little-endian): magic (8 bytes) | format version (u32) | header length (u32) | JSON header |
zero padding to 64 bytes | tensor data (each tensor 64-byte aligned) | CRC-32 of everything before it (u32).
Files are written atomically (docs/reliability.md R4) and checked, size first, before any tensor memory exists (R15).
This module is the container only: it imports no model. Model files (lm.model_file), LoRA adapters
(lm.adapter) and row deltas (lm.delta) are laid out on top of it, each with its own magic.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import stat
import struct
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from evermind_memory._atomic import atomic_write
from evermind_memory.errors import CheckpointError, InvalidInput

__all__ = [
    "FORMAT_VERSION",
    "MODEL_MAGIC",
    "MODEL_KIND",
    "DELTA_MAGIC",
    "DELTA_KIND",
    "DEFAULT_MAX_BYTES",
    "MAX_HEADER_BYTES",
    "TensorSpec",
    "write_tensor_file",
    "read_tensor_file",
    "encode_tensor_bytes",
    "decode_tensor_bytes",
    "file_sha256",
]

FORMAT_VERSION = 1
# PNG-style magics: the high first byte catches 7-bit channels, "\r\n" catches newline translation.
MODEL_MAGIC = b"\x89EVMLM\r\n"
MODEL_KIND = "evermind-lm 1"
DELTA_MAGIC = b"\x89EVDLT\r\n"
DELTA_KIND = "evermind-delta 1"
_KNOWN_MAGICS = {
    MODEL_MAGIC: "an evermind-lm model checkpoint",
    b"\x89EVLRA\r\n": "an evermind LoRA adapter",
    DELTA_MAGIC: "an evermind row delta",
}

DEFAULT_MAX_BYTES = 4 * 1024**3  # refuse bigger files unless the caller raises the cap
MAX_HEADER_BYTES = 16 * 1024**2
_MAX_NDIM = 8
_MAX_NAME_CHARS = 1024
_ALIGN = 64
_PREFIX = struct.Struct("<8sII")  # magic, version, header length
_TRAILER = struct.Struct("<I")  # CRC-32
_CHUNK = 1 << 20

# on-disk dtype name -> (little-endian numpy dtype, dtype handed back to the caller)
_DTYPES: dict[str, tuple[np.dtype, np.dtype]] = {
    "f32": (np.dtype("<f4"), np.dtype(np.float32)),
    "f16": (np.dtype("<f2"), np.dtype(np.float32)),
    "u32": (np.dtype("<u4"), np.dtype(np.uint32)),
    "i8": (np.dtype("i1"), np.dtype(np.int8)),  # quantised tables (lm.lexicon); readers opt in through `dtypes`
}
_FLOAT_DTYPES = ("f32", "f16")

# (dtype name, shape) of one tensor, as declared by a header; handed to `check` callbacks.
TensorSpec = tuple[str, tuple[int, ...]]


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


# ----------------------------------------------------------------------------------------------
# writing


def _prepare_tensor(name: Any, value: Any, fp16: bool) -> tuple[str, np.ndarray]:
    """Convert one tensor to its on-disk dtype (little-endian, C order); InvalidInput if impossible."""
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME_CHARS:
        raise InvalidInput(f"tensor names must be non-empty strings of <= {_MAX_NAME_CHARS} chars, got {name!r}.")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise InvalidInput(f"tensor {name!r} cannot be made into an array: {e}") from e
    if arr.ndim > _MAX_NDIM:
        raise InvalidInput(f"tensor {name!r} has {arr.ndim} dims; at most {_MAX_NDIM} are supported.")
    if arr.dtype == np.int8:
        return "i8", np.ascontiguousarray(arr)
    if arr.dtype.kind in "iu":
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 0xFFFFFFFF):
            raise InvalidInput(f"integer tensor {name!r} must hold values in [0, 2**32); got outside that range.")
        return "u32", np.asarray(arr, dtype=_DTYPES["u32"][0], order="C")
    if arr.dtype.kind != "f":
        raise InvalidInput(
            f"tensor {name!r} has dtype {arr.dtype}; expected a float array (stored as f32/f16) "
            "or a non-negative integer array (stored as u32)."
        )
    if not fp16:
        return "f32", np.asarray(arr, dtype=_DTYPES["f32"][0], order="C")
    with np.errstate(over="ignore"):
        half = np.asarray(arr, dtype=_DTYPES["f16"][0], order="C")
    if np.any(np.isinf(half) & np.isfinite(arr)):
        raise InvalidInput(
            f"tensor {name!r} has finite values beyond the fp16 range (|x| > 65504); save it with fp16=False."
        )
    return "f16", half


def _encode_chunks(
    *, magic: bytes, kind: str, meta: Mapping[str, Any], tensors: Mapping[str, Any], fp16: bool
) -> Iterator[bytes | memoryview]:
    """Yield the file's bytes in order (trailer excluded). A generator: errors surface on first next()."""
    if not isinstance(magic, bytes) or len(magic) != 8:
        raise InvalidInput(f"magic must be 8 bytes, got {magic!r}.")
    if not isinstance(kind, str) or not kind:
        raise InvalidInput(f"kind must be a non-empty format string such as {MODEL_KIND!r}, got {kind!r}.")
    if not isinstance(meta, Mapping):
        raise InvalidInput(f"meta must be a dict, got {type(meta).__name__}.")
    if not isinstance(tensors, Mapping):
        raise InvalidInput(f"tensors must be a dict of name -> array, got {type(tensors).__name__}.")
    arrays = [(name, *_prepare_tensor(name, value, fp16)) for name, value in tensors.items()]
    table = []
    offset = 0
    for name, dtype_name, arr in arrays:
        offset = _align(offset)
        table.append({"name": name, "dtype": dtype_name, "shape": list(arr.shape), "offset": offset,
                      "nbytes": arr.nbytes})
        offset += arr.nbytes
    data_nbytes = _align(offset)
    header = {"format": kind, "meta": dict(meta), "tensors": table, "data_nbytes": data_nbytes}
    try:
        header_bytes = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise InvalidInput(f"checkpoint meta must be JSON-serialisable (no NaN/Inf): {e}") from e
    if len(header_bytes) > MAX_HEADER_BYTES:
        raise InvalidInput(f"checkpoint header is {len(header_bytes)} bytes; the cap is {MAX_HEADER_BYTES}.")
    head = _PREFIX.pack(magic, FORMAT_VERSION, len(header_bytes)) + header_bytes
    yield head + bytes(_align(len(head)) - len(head))
    written = 0
    for entry, (_, _, arr) in zip(table, arrays):
        yield bytes(entry["offset"] - written)
        yield memoryview(arr.reshape(-1).view(np.uint8))
        written = entry["offset"] + arr.nbytes
    yield bytes(data_nbytes - written)


def encode_tensor_bytes(
    *, magic: bytes, kind: str, meta: Mapping[str, Any], tensors: Mapping[str, Any], fp16: bool = False
) -> bytes:
    """Serialise tensors to the checkpoint format in memory (what write_tensor_file puts on disk).

    Args:
        magic: 8-byte file magic identifying the file family.
        kind: format string stored in the header, e.g. "evermind-lm 1".
        meta: JSON-serialisable dict stored in the header.
        tensors: name -> float array (f32, or f16 with fp16=True) or non-negative int array (u32).
        fp16: store float tensors as float16.

    Returns:
        The file's bytes, CRC trailer included.

    Raises:
        InvalidInput: a tensor or the meta cannot be serialised.
    """
    out = bytearray()
    crc = 0
    for chunk in _encode_chunks(magic=magic, kind=kind, meta=meta, tensors=tensors, fp16=fp16):
        crc = zlib.crc32(chunk, crc)
        out += chunk
    out += _TRAILER.pack(crc)
    return bytes(out)


def write_tensor_file(
    path: str | os.PathLike[str],
    *,
    magic: bytes,
    kind: str,
    meta: Mapping[str, Any],
    tensors: Mapping[str, Any],
    fp16: bool = False,
) -> None:
    """Write tensors atomically: temp file in the same directory, fsync, rename, fsync the directory.

    If anything fails the temp file is removed and an existing file at `path` is left untouched.

    Args:
        path: destination file.
        magic: 8-byte file magic identifying the file family.
        kind: format string stored in the header, e.g. "evermind-lm 1".
        meta: JSON-serialisable dict stored in the header.
        tensors: name -> float array (f32, or f16 with fp16=True), int8 array (i8) or non-negative int array (u32).
        fp16: store float tensors as float16 (read back as float32).

    Raises:
        InvalidInput: a tensor or the meta cannot be serialised.
        CheckpointError: the file system refused the write (an existing file is left as it was).
    """
    path = Path(path)
    try:
        with atomic_write(path) as f:
            crc = 0
            expected = 0
            for chunk in _encode_chunks(magic=magic, kind=kind, meta=meta, tensors=tensors, fp16=fp16):
                crc = zlib.crc32(chunk, crc)
                f.write(chunk)
                expected += len(chunk)
            f.write(_TRAILER.pack(crc))
            expected += _TRAILER.size
            f.flush()
            size = os.fstat(f.fileno()).st_size
            if size != expected:  # a short write that no layer reported
                raise OSError(f"wrote {size} bytes, expected {expected}; the disk may be full")
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write ({e.strerror or e}); the old file, if any, is unchanged. "
                              "Check that the directory exists and has free space.") from e


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes, for pinning adapters or checkpoints that come from elsewhere.

    Args:
        path: the file.

    Returns:
        64 hex characters.

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# reading


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_header(raw: bytes, label: str, kind: str) -> dict[str, Any]:
    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{label}: corrupt header: {problem}. The file is damaged; use another copy.")

    try:
        header = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise bad(f"not valid JSON ({e})") from e
    if not isinstance(header, dict):
        raise bad(f"expected a JSON object, got {type(header).__name__}")
    expected = {"format": str, "meta": dict, "tensors": list, "data_nbytes": int}
    missing = sorted(set(expected) - set(header))
    extra = sorted(set(header) - set(expected))
    if missing or extra:
        raise bad(f"expected keys {sorted(expected)}, missing {missing}, unexpected {extra}")
    for key, typ in expected.items():
        if not isinstance(header[key], typ) or (typ is int and not _is_int(header[key])):
            raise bad(f"{key!r} should be {typ.__name__}, got {type(header[key]).__name__}")
    if header["format"] != kind:
        raise CheckpointError(
            f"{label}: unknown format {header['format']!r} (expected {kind!r}); "
            "it was written by another version of evermind_memory or is another kind of file."
        )
    if header["data_nbytes"] < 0:
        raise bad(f"negative data size {header['data_nbytes']}")
    return header


def _check_table(
    table: list[Any], data_nbytes: int, label: str, dtypes: tuple[str, ...]
) -> list[tuple[str, str, tuple[int, ...], int, int]]:
    """Validate the tensor table against itself and the data region; no arrays are made here."""

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{label}: corrupt tensor table: {problem}. The file is damaged; use another copy.")

    entries = []
    names: set[str] = set()
    keys = {"name", "dtype", "shape", "offset", "nbytes"}
    for i, t in enumerate(table):
        if not isinstance(t, dict) or set(t) != keys:
            raise bad(f"entry {i} should be an object with keys {sorted(keys)}")
        name = t["name"]
        if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME_CHARS:
            raise bad(f"entry {i} has an invalid name {name!r}")
        if name in names:
            raise bad(f"tensor {name!r} appears twice")
        names.add(name)
        if t["dtype"] not in dtypes:
            raise bad(f"tensor {name!r} has unknown dtype {t['dtype']!r} (expected one of {list(dtypes)})")
        shape = t["shape"]
        if not isinstance(shape, list) or len(shape) > _MAX_NDIM:
            raise bad(f"tensor {name!r} shape should be a list of at most {_MAX_NDIM} ints, got {shape!r}")
        if not all(_is_int(d) and d >= 0 for d in shape):
            raise bad(f"tensor {name!r} has a shape {shape!r} with negative or non-integer dims")
        offset, nbytes = t["offset"], t["nbytes"]
        if not (_is_int(offset) and _is_int(nbytes) and offset >= 0 and nbytes >= 0):
            raise bad(f"tensor {name!r} has offset {offset!r} / nbytes {nbytes!r}; expected non-negative ints")
        itemsize = _DTYPES[t["dtype"]][0].itemsize
        if nbytes != math.prod(shape) * itemsize:
            raise bad(f"tensor {name!r} declares {nbytes} bytes but shape {shape} of {t['dtype']} needs "
                      f"{math.prod(shape) * itemsize}")
        if offset % itemsize:
            raise bad(f"tensor {name!r} offset {offset} is not aligned to its {itemsize}-byte items")
        if offset + nbytes > data_nbytes:
            raise bad(f"tensor {name!r} spans bytes [{offset}, {offset + nbytes}) beyond the "
                      f"{data_nbytes}-byte data region")
        entries.append((name, t["dtype"], tuple(shape), offset, nbytes))
    spans = sorted((off, off + n, name) for name, _, _, off, n in entries if n > 0)
    for (_, end_a, name_a), (start_b, _, name_b) in zip(spans, spans[1:]):
        if start_b < end_a:
            raise bad(f"tensors {name_a!r} and {name_b!r} overlap")
    return entries


def _read_exact(f: IO[bytes], n: int, label: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CheckpointError(f"{label}: file ended early (or changed while being read).")
    return data


def _read_stream(
    f: IO[bytes],
    size: int,
    label: str,
    *,
    magic: bytes,
    kind: str,
    max_bytes: int,
    dtypes: tuple[str, ...],
    check: Callable[[dict[str, Any], dict[str, TensorSpec]], None] | None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Validate and read one tensor container of `size` bytes from the start of `f`."""
    minimum = _PREFIX.size + _TRAILER.size
    if size > max_bytes:
        raise CheckpointError(
            f"{label}: file is {size} bytes, above the {max_bytes}-byte cap; pass a larger max_bytes if it is trusted."
        )
    if size < minimum:
        raise CheckpointError(f"{label}: file is {size} bytes, too small to be a checkpoint (truncated or empty).")
    file_magic, version, header_len = _PREFIX.unpack(_read_exact(f, _PREFIX.size, label))
    if file_magic != magic:
        what = _KNOWN_MAGICS.get(file_magic, "not an evermind file")
        raise CheckpointError(
            f"{label}: bad magic {file_magic!r}, expected {magic!r} ({kind}); this file is {what}."
        )
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{label}: unknown format version {version} (this build reads version {FORMAT_VERSION}); "
            "upgrade evermind_memory or re-save the file with this version."
        )
    if header_len > MAX_HEADER_BYTES:
        raise CheckpointError(f"{label}: header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte cap.")
    data_start = _align(_PREFIX.size + header_len)
    if data_start + _TRAILER.size > size:
        raise CheckpointError(
            f"{label}: header length {header_len} does not fit in a {size}-byte file (truncated or corrupt)."
        )
    header = _parse_header(_read_exact(f, header_len, label), label, kind)
    entries = _check_table(header["tensors"], header["data_nbytes"], label, dtypes)
    expected_size = data_start + header["data_nbytes"] + _TRAILER.size
    if expected_size != size:
        raise CheckpointError(
            f"{label}: header declares {expected_size} bytes but the file has {size} (truncated or corrupt)."
        )
    if check is not None:
        check(header["meta"], {name: (dtype, shape) for name, dtype, shape, _, _ in entries})
    # CRC over everything before the trailer, streamed, before any tensor memory is allocated.
    f.seek(0)
    crc = 0
    remaining = size - _TRAILER.size
    while remaining:
        chunk = _read_exact(f, min(_CHUNK, remaining), label)
        crc = zlib.crc32(chunk, crc)
        remaining -= len(chunk)
    (stored,) = _TRAILER.unpack(_read_exact(f, _TRAILER.size, label))
    if crc != stored:
        raise CheckpointError(
            f"{label}: CRC mismatch (stored {stored:08x}, computed {crc:08x}); the file is corrupt. Use another copy."
        )
    tensors: dict[str, np.ndarray] = {}
    for name, dtype, shape, offset, nbytes in entries:
        disk, out = _DTYPES[dtype]
        arr = np.empty(shape, dtype=disk)  # sizes were checked against the file above
        if nbytes:
            f.seek(data_start + offset)
            if f.readinto(arr.reshape(-1).view(np.uint8)) != nbytes:  # type: ignore[attr-defined]
                raise CheckpointError(f"{label}: file ended early (or changed while being read).")
        tensors[name] = arr.astype(out, copy=False)
    return header["meta"], tensors


def read_tensor_file(
    path: str | os.PathLike[str],
    *,
    magic: bytes,
    kind: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
    dtypes: tuple[str, ...] = _FLOAT_DTYPES,
    check: Callable[[dict[str, Any], dict[str, TensorSpec]], None] | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read and validate a tensor file written by write_tensor_file.

    Checks, in order and before allocating tensor memory: file size vs max_bytes, magic, version,
    header length, header JSON and keys, each tensor's dtype/shape/offset/size, overlaps, total size,
    `check(meta, {name: (dtype, shape)})` when given, then the CRC.

    Args:
        path: the file.
        magic: expected 8-byte magic.
        kind: expected header format string.
        max_bytes: refuse files larger than this.
        dtypes: on-disk dtypes accepted ("f32", "f16", "u32", "i8").
        check: optional callback that raises CheckpointError when the declared tensors do not fit the caller.

    Returns:
        (meta, tensors): the header's meta dict and name -> array (floats as float32, u32 as uint32),
        in file order.

    Raises:
        CheckpointError: the file is missing, unreadable, corrupt, truncated or of another format.
    """
    label = os.fspath(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(f"{label}: not a regular file; expected a checkpoint file.")
            return _read_stream(
                f, st.st_size, label, magic=magic, kind=kind, max_bytes=max_bytes, dtypes=dtypes, check=check
            )
    except IsADirectoryError as e:
        raise CheckpointError(f"{label}: is a directory; expected a checkpoint file.") from e
    except OSError as e:
        raise CheckpointError(f"{label}: cannot read the file ({e.strerror or e}).") from e


def decode_tensor_bytes(
    data: bytes,
    *,
    magic: bytes,
    kind: str,
    label: str = "<bytes>",
    max_bytes: int = DEFAULT_MAX_BYTES,
    dtypes: tuple[str, ...] = _FLOAT_DTYPES,
    check: Callable[[dict[str, Any], dict[str, TensorSpec]], None] | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Validate and decode bytes made by encode_tensor_bytes (same checks as read_tensor_file).

    Args:
        data: the serialised container.
        magic, kind, max_bytes, dtypes, check: as for read_tensor_file.
        label: how error messages name the data.

    Returns:
        (meta, tensors) as for read_tensor_file.

    Raises:
        CheckpointError: the bytes are corrupt, truncated or of another format.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CheckpointError(f"{label}: expected bytes, got {type(data).__name__}.")
    view = bytes(data)
    return _read_stream(
        io.BytesIO(view), len(view), label, magic=magic, kind=kind, max_bytes=max_bytes, dtypes=dtypes, check=check
    )
