"""Row deltas: the rows of a model's weights that differ from a base, as a validated tensor file in memory.

`export_delta(base, params)` records each changed row (of a 2-D tensor; a 1-D tensor is one row) with its
index; `apply_delta(base, delta)` rebuilds the weights on a copy of the base. The bytes are a checkpoint
container (lm.checkpoint) with its own magic and a digest of the base it was exported against.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.checkpoint import (
    DELTA_KIND,
    DELTA_MAGIC,
    TensorSpec,
    decode_tensor_bytes,
    encode_tensor_bytes,
)

__all__ = ["export_delta", "apply_delta"]

def _is_dim(d: Any) -> bool:
    return isinstance(d, int) and not isinstance(d, bool) and d >= 0


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
            or not all(isinstance(s, list) and all(_is_dim(d) for d in s) for s in shapes)
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
