"""Checkpoint files: one validated binary tensor format for models, adapters and row deltas.

Layout (little-endian): magic (8 bytes) | format version (u32) | header length (u32) | JSON header |
zero padding to 64 bytes | tensor data (each tensor 64-byte aligned) | CRC-32 of everything before it (u32).
Files are written atomically (RELIABILITY R4) and checked, size first, before any tensor memory exists (R15).
A model file holds an EvermindLM (meta {"config"}) or a SequenceBackbone (meta {"backbone": "sequence",
"config"}); `load_backbone` reads either.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import stat
import struct
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

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
    "save_model",
    "load_model",
    "save_sequence_model",
    "load_sequence_model",
    "load_backbone",
    "export_delta",
    "apply_delta",
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


def _fsync(fd: int) -> None:
    # macOS's fsync does not flush the drive cache; F_FULLFSYNC does (SQLite's fullfsync).
    if sys.platform == "darwin":
        import fcntl

        if hasattr(fcntl, "F_FULLFSYNC"):
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
            return
    os.fsync(fd)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # Windows cannot open directories; its rename is already durable enough
        return
    try:
        _fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
        tensors: name -> float array (f32, or f16 with fp16=True) or non-negative int array (u32).
        fp16: store float tensors as float16 (read back as float32).

    Raises:
        InvalidInput: a tensor or the meta cannot be serialised.
        CheckpointError: the file system refused the write (an existing file is left as it was).
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write ({e.strerror or e}); check that the directory exists.") from e
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            crc = 0
            expected = 0
            for chunk in _encode_chunks(magic=magic, kind=kind, meta=meta, tensors=tensors, fp16=fp16):
                crc = zlib.crc32(chunk, crc)
                f.write(chunk)
                expected += len(chunk)
            f.write(_TRAILER.pack(crc))
            expected += _TRAILER.size
            f.flush()
            _fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        if size != expected:  # a short write that no layer reported
            raise OSError(f"wrote {size} bytes, expected {expected}; the disk may be full")
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise CheckpointError(f"{path}: cannot write ({e.strerror or e}); the old file is unchanged.") from e
        raise
    _fsync_dir(directory)


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
        dtypes: on-disk dtypes accepted ("f32", "f16", "u32").
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


# ----------------------------------------------------------------------------------------------
# models


def _model_api() -> tuple[Any, Callable[[Any], dict[str, tuple[int, ...]]]]:
    from evermind_memory.lm.model import LMConfig, param_shapes  # lazy: model imports this module

    return LMConfig, param_shapes


def save_model(
    path: str | os.PathLike[str], config: Any, params: Mapping[str, np.ndarray], *, fp16: bool = False
) -> None:
    """Save a model's config and parameters atomically (temp file + fsync + rename).

    Args:
        path: destination file (conventionally *.evlm).
        config: the LMConfig.
        params: name -> array, exactly the names and shapes of param_shapes(config).
        fp16: store weights as float16 (half the size; loaded back as float32).

    Raises:
        InvalidInput: params do not match the config, are not finite floats, or cannot be stored.
        CheckpointError: the file system refused the write (an existing file is left as it was).
    """
    LMConfig, param_shapes = _model_api()
    if not isinstance(config, LMConfig):
        raise InvalidInput(f"save_model expected an LMConfig, got {type(config).__name__}.")
    shapes = param_shapes(config)
    _check_params_for_save("save_model", shapes, params)
    ordered = {name: params[name] for name in shapes}
    write_tensor_file(path, magic=MODEL_MAGIC, kind=MODEL_KIND, meta={"config": config.to_dict()},
                      tensors=ordered, fp16=fp16)


def _sequence_api() -> tuple[Any, Callable[[Any], dict[str, tuple[int, ...]]]]:
    from evermind_memory.lm.sequence import SequenceModelConfig, sequence_param_shapes  # lazy, as _model_api

    return SequenceModelConfig, sequence_param_shapes


SEQUENCE_BACKBONE = "sequence"  # meta["backbone"] of a SequenceBackbone file; files without the key are EvermindLM


def _check_params_for_save(
    what: str, shapes: Mapping[str, tuple[int, ...]], params: Mapping[str, np.ndarray]
) -> None:
    missing = [n for n in shapes if n not in params]
    extra = [n for n in params if n not in shapes]
    if missing or extra:
        raise InvalidInput(f"{what}: params do not match the config: missing {missing}, unexpected {extra}.")
    for name, shape in shapes.items():
        if np.shape(params[name]) != tuple(shape):
            raise InvalidInput(
                f"{what}: params[{name!r}] has shape {np.shape(params[name])}, the config needs {tuple(shape)}."
            )
        arr = np.asarray(params[name])
        if arr.dtype.kind != "f":
            raise InvalidInput(f"{what}: params[{name!r}] has dtype {arr.dtype}; expected float.")
        if not np.all(np.isfinite(arr)):
            raise InvalidInput(f"{what}: params[{name!r}] holds NaN or Inf; refusing to save a broken model.")


def save_sequence_model(
    path: str | os.PathLike[str], config: Any, params: Mapping[str, np.ndarray], *, fp16: bool = False
) -> None:
    """Save a SequenceBackbone's config and parameters atomically, in the model file format.

    The header meta is {"backbone": "sequence", "config": SequenceModelConfig fields}; EvermindLM files
    have no "backbone" key.

    Args:
        path: destination file (conventionally *.evlm).
        config: the SequenceModelConfig.
        params: name -> array, exactly the names and shapes of sequence_param_shapes(config).
        fp16: store weights as float16 (half the size; loaded back as float32).

    Raises:
        InvalidInput: params do not match the config, are not finite floats, or cannot be stored.
        CheckpointError: the file system refused the write (an existing file is left as it was).
    """
    SequenceModelConfig, shapes_of = _sequence_api()
    if not isinstance(config, SequenceModelConfig):
        raise InvalidInput(f"save_sequence_model expected a SequenceModelConfig, got {type(config).__name__}.")
    shapes = shapes_of(config)
    _check_params_for_save("save_sequence_model", shapes, params)
    write_tensor_file(path, magic=MODEL_MAGIC, kind=MODEL_KIND,
                      meta={"backbone": SEQUENCE_BACKBONE, "config": config.to_dict()},
                      tensors={name: params[name] for name in shapes}, fp16=fp16)


def _backbone_of(meta: dict[str, Any], label: str) -> str:
    """"evermind-lm" or "sequence" from a model header's meta; CheckpointError for anything else."""
    if "backbone" not in meta:
        if set(meta) != {"config"} or not isinstance(meta["config"], dict):
            raise CheckpointError(
                f"{label}: header meta should hold exactly a 'config' object, got keys {sorted(meta)}."
            )
        return "evermind-lm"
    if set(meta) != {"backbone", "config"} or not isinstance(meta["config"], dict):
        raise CheckpointError(
            f"{label}: header meta should hold exactly 'backbone' and a 'config' object, got keys {sorted(meta)}."
        )
    if meta["backbone"] != SEQUENCE_BACKBONE:
        raise CheckpointError(
            f"{label}: unknown backbone {meta['backbone']!r:.60} (this version knows EvermindLM files, with no "
            f"'backbone' key, and {SEQUENCE_BACKBONE!r}); it was written by another version of evermind_memory."
        )
    return SEQUENCE_BACKBONE


def _load_any(
    path: str | os.PathLike[str], max_bytes: int, allowed: tuple[str, ...]
) -> tuple[Any, dict[str, np.ndarray]]:
    """Read a model file of one of the `allowed` backbones; config type and tensors checked before reading."""
    label = os.fspath(path)
    found: dict[str, Any] = {}

    def check(meta: dict[str, Any], specs: dict[str, TensorSpec]) -> None:
        backbone = _backbone_of(meta, label)
        if backbone not in allowed:
            how = ("load_sequence_model(), SequenceBackbone.load() or embedder.load_embedder()"
                   if backbone == SEQUENCE_BACKBONE else "load_model(), EvermindLM.load() or embedder.load_embedder()")
            raise CheckpointError(
                f"{label}: holds a {backbone} backbone, not {' or '.join(allowed)}; read it with {how}."
            )
        config_cls, shapes_of = _model_api() if backbone == "evermind-lm" else _sequence_api()
        try:
            config = config_cls.from_dict(meta["config"])
        except (InvalidInput, TypeError, ValueError, KeyError) as e:
            raise CheckpointError(f"{label}: invalid model config in header: {e}") from e
        shapes = shapes_of(config)
        missing = [n for n in shapes if n not in specs]
        extra = [n for n in specs if n not in shapes]
        if missing or extra:
            raise CheckpointError(
                f"{label}: tensors do not match the config: missing {missing}, unexpected {extra}. "
                "The file is damaged or was written for another architecture."
            )
        for name, shape in shapes.items():
            if specs[name][1] != tuple(shape):
                raise CheckpointError(
                    f"{label}: tensor {name!r} has shape {specs[name][1]}, the config needs {tuple(shape)}."
                )
        found["config"], found["shapes"] = config, shapes

    _, tensors = read_tensor_file(path, magic=MODEL_MAGIC, kind=MODEL_KIND, max_bytes=max_bytes, check=check)
    for name, arr in tensors.items():
        if not np.all(np.isfinite(arr)):
            raise CheckpointError(f"{label}: tensor {name!r} holds NaN or Inf; the checkpoint is broken.")
    return found["config"], {name: tensors[name] for name in found["shapes"]}


def load_model(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[Any, dict[str, np.ndarray]]:
    """Load and validate an EvermindLM checkpoint written by save_model.

    The tensor set and every shape are checked against param_shapes(config) before any weights are read.

    Args:
        path: the checkpoint file.
        max_bytes: refuse files larger than this.

    Returns:
        (config, params): the LMConfig and name -> float32 array in param_shapes order.

    Raises:
        CheckpointError: missing, unreadable, corrupt, truncated, of another format or backbone, inconsistent
            with its config, or holding non-finite weights.
    """
    return _load_any(path, max_bytes, ("evermind-lm",))


def load_sequence_model(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[Any, dict[str, np.ndarray]]:
    """Load and validate a SequenceBackbone checkpoint written by save_sequence_model.

    Args:
        path: the checkpoint file.
        max_bytes: refuse files larger than this.

    Returns:
        (config, params): the SequenceModelConfig and name -> float32 array in sequence_param_shapes order.

    Raises:
        CheckpointError: as load_model, or the file holds an EvermindLM.
    """
    return _load_any(path, max_bytes, (SEQUENCE_BACKBONE,))


def load_backbone(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[Any, dict[str, np.ndarray]]:
    """Load a model file of either backbone; the header's meta says which.

    Args:
        path: the checkpoint file.
        max_bytes: refuse files larger than this.

    Returns:
        (config, params): an LMConfig (EvermindLM) or a SequenceModelConfig, and its float32 params.

    Raises:
        CheckpointError: as load_model.
    """
    return _load_any(path, max_bytes, ("evermind-lm", SEQUENCE_BACKBONE))


# ----------------------------------------------------------------------------------------------
# row deltas


def _as_rows(arr: np.ndarray) -> np.ndarray:
    """A tensor as (rows, cols): 2-D as is, 0-/1-D as one row, N-D split on the first axis."""
    return arr.reshape(1, arr.size) if arr.ndim <= 1 else arr.reshape(arr.shape[0], math.prod(arr.shape[1:]))


def _params_digest(params: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in params:
        arr = np.asarray(params[name], dtype="<f4", order="C")
        h.update(json.dumps([name, list(arr.shape)]).encode("utf-8"))
        h.update(memoryview(arr.reshape(-1).view(np.uint8)))
    return h.hexdigest()


def _as_float32_params(params: Any, what: str) -> dict[str, np.ndarray]:
    if not isinstance(params, Mapping):
        raise InvalidInput(f"{what} must be a dict of name -> array, got {type(params).__name__}.")
    out = {}
    for name, value in params.items():
        arr = np.asarray(value)
        if arr.dtype.kind != "f":
            raise InvalidInput(f"{what}[{name!r}] has dtype {arr.dtype}; expected a float array.")
        out[name] = np.asarray(arr, dtype=np.float32, order="C")
    return out


def export_delta(
    base_params: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray], *, eps: float = 0.0
) -> bytes:
    """Record the rows of `params` that differ from `base_params`, as validated bytes.

    A row (of a 2-D tensor; a 1-D tensor is one row) is recorded when its max abs change exceeds eps;
    with eps=0 any bit difference counts, so apply_delta(base, export_delta(base, p)) == p bit for bit.

    Args:
        base_params: the base weights, name -> float array.
        params: the current weights, same names and shapes.
        eps: change threshold (>= 0).

    Returns:
        The delta (own magic, header, CRC trailer).

    Raises:
        InvalidInput: the two param sets do not have the same names and shapes, or eps is invalid.
    """
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not (eps >= 0 and math.isfinite(eps)):
        raise InvalidInput(f"export_delta expected a finite eps >= 0, got {eps!r}.")
    base = _as_float32_params(base_params, "base_params")
    cur = _as_float32_params(params, "params")
    if list(base) != list(cur):
        raise InvalidInput(
            f"export_delta: params and base_params must have the same names in the same order; "
            f"missing {[n for n in base if n not in cur]}, unexpected {[n for n in cur if n not in base]}."
        )
    tensors: dict[str, np.ndarray] = {}
    for i, name in enumerate(base):
        if base[name].shape != cur[name].shape:
            raise InvalidInput(
                f"export_delta: params[{name!r}] has shape {cur[name].shape}, base has {base[name].shape}."
            )
        b, c = _as_rows(base[name]), _as_rows(cur[name])  # (rows, cols)
        if eps == 0:  # bitwise, so -0.0 vs 0.0 and NaN payloads survive the round trip
            changed = np.any(b.view(np.uint32) != c.view(np.uint32), axis=1)  # (rows,)
        else:  # NaN counts as changed
            changed = ~np.all(np.abs(c - b) <= eps, axis=1)  # (rows,)
        rows = np.flatnonzero(changed).astype(np.uint32)  # (n,)
        tensors[f"rows.{i}"] = rows
        tensors[f"data.{i}"] = c[rows]  # (n, cols)
    meta = {
        "names": list(base),
        "shapes": [list(base[n].shape) for n in base],
        "base_sha256": _params_digest(base),
    }
    return encode_tensor_bytes(magic=DELTA_MAGIC, kind=DELTA_KIND, meta=meta, tensors=tensors)


def apply_delta(base_params: Mapping[str, np.ndarray], delta: bytes) -> dict[str, np.ndarray]:
    """Rebuild the weights a delta was exported from, on a copy of its base.

    Args:
        base_params: the same base weights given to export_delta (not mutated).
        delta: bytes from export_delta.

    Returns:
        New name -> float32 array dict.

    Raises:
        CheckpointError: the delta is corrupt, or does not fit these base weights (names, shapes, rows,
            base digest).
        InvalidInput: base_params is not a dict of float arrays.
    """
    label = "row delta"
    base = _as_float32_params(base_params, "base_params")

    def check(meta: dict[str, Any], specs: dict[str, TensorSpec]) -> None:
        names, shapes = meta.get("names"), meta.get("shapes")
        if (
            set(meta) != {"names", "shapes", "base_sha256"}
            or not isinstance(names, list)
            or not isinstance(shapes, list)
            or len(names) != len(shapes)
            or not all(isinstance(n, str) for n in names)
            or not all(isinstance(s, list) and all(_is_int(d) and d >= 0 for d in s) for s in shapes)
            or not isinstance(meta["base_sha256"], str)
        ):
            raise CheckpointError(f"{label}: corrupt header meta; expected names, shapes and base_sha256.")
        if names != list(base):
            raise CheckpointError(
                f"{label}: made for tensors {names}, the base has {list(base)}; apply it to the base it was "
                "exported from."
            )
        expected_names = {f"{kind}.{i}" for i in range(len(names)) for kind in ("rows", "data")}
        if set(specs) != expected_names:
            raise CheckpointError(f"{label}: corrupt tensor set {sorted(specs)}.")
        for i, (name, shape) in enumerate(zip(names, shapes)):
            if tuple(shape) != base[name].shape:
                raise CheckpointError(
                    f"{label}: tensor {name!r} has shape {tuple(shape)} in the delta, {base[name].shape} in the base."
                )
            n_rows, n_cols = _as_rows(base[name]).shape
            rows_dtype, rows_shape = specs[f"rows.{i}"]
            data_dtype, data_shape = specs[f"data.{i}"]
            if rows_dtype != "u32" or len(rows_shape) != 1 or rows_shape[0] > n_rows:
                raise CheckpointError(f"{label}: row index table of {name!r} is malformed.")
            if data_dtype != "f32" or data_shape != (rows_shape[0], n_cols):
                raise CheckpointError(
                    f"{label}: rows of {name!r} have shape {data_shape}, expected ({rows_shape[0]}, {n_cols})."
                )

    meta, tensors = decode_tensor_bytes(
        delta, magic=DELTA_MAGIC, kind=DELTA_KIND, label=label, dtypes=("f32", "u32"), check=check
    )
    # Checked after the CRC, so a damaged delta reports damage rather than a wrong base.
    if meta["base_sha256"] != _params_digest(base):
        raise CheckpointError(
            f"{label}: was exported against other base weights (base sha256 {meta['base_sha256'][:12]}..., "
            f"these are {_params_digest(base)[:12]}...); apply it to the base it was exported from."
        )
    meta_names = list(base)
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(meta_names):
        rows = tensors[f"rows.{i}"].astype(np.int64)  # (n,)
        n_rows = _as_rows(base[name]).shape[0]
        if rows.size and (np.any(rows >= n_rows) or np.any(np.diff(rows) <= 0)):
            raise CheckpointError(
                f"{label}: row indices of {name!r} must be strictly increasing and < {n_rows}."
            )
        new = base[name].copy()  # base shape
        _as_rows(new)[rows] = tensors[f"data.{i}"]  # view assignment into the copy
        out[name] = new
    return out
