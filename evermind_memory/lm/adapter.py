"""LoRA adapters, inference side: the adapter file, applying it to weights, merging it into a model.

On a weight W (rows, cols): W_eff = W + (alpha / R) * B @ A with A (R, cols) and B (rows, R), B zero at
init. Fitting adapters lives in training/lora.py; this module only stores, checks and applies them.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.checkpoint import (
    DEFAULT_MAX_BYTES,
    TensorSpec,
    file_sha256,
    read_tensor_file,
    write_tensor_file,
)
from evermind_memory.lm.model import EvermindLM

__all__ = [
    "ADAPTER_MAGIC",
    "ADAPTER_KIND",
    "LoRAWeights",
    "save_adapter",
    "load_adapter",
    "adapted_params",
    "merge_adapter",
    "adapter_digest",
]

ADAPTER_MAGIC = b"\x89EVLRA\r\n"
ADAPTER_KIND = "evermind-lora 1"
_A, _B = ".lora_A", ".lora_B"


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


@dataclass(eq=False)
class LoRAWeights:
    """A LoRA adapter: per target weight name, A (R, cols) and B (rows, R); delta = (alpha / R) * B @ A."""

    rank: int  # R, the bottleneck width shared by every target
    alpha: float  # scale numerator; the update is scaled by alpha / rank
    tensors: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # target -> (A, B)
    base_fingerprint: str | None = None  # the base model this adapter was fitted on, if known

    def __post_init__(self) -> None:
        _check_weights(self, InvalidInput, "LoRAWeights")

    @property
    def scale(self) -> float:
        """alpha / rank, the factor applied to B @ A."""
        return float(self.alpha) / int(self.rank)


def _check_weights(weights: Any, err: type[Exception], label: str) -> None:
    """Structural checks shared by construction, saving and merging; raises `err`."""
    if not _is_int(weights.rank) or weights.rank <= 0:
        raise err(f"{label}: rank must be an int >= 1, got {weights.rank!r}.")
    if not _is_real(weights.alpha) or not math.isfinite(weights.alpha):
        raise err(f"{label}: alpha must be a finite number, got {weights.alpha!r}.")
    if weights.base_fingerprint is not None and not isinstance(weights.base_fingerprint, str):
        raise err(f"{label}: base_fingerprint must be a str or None, got {type(weights.base_fingerprint).__name__}.")
    if not isinstance(weights.tensors, Mapping):
        raise err(f"{label}: tensors must be a dict of target -> (A, B), got {type(weights.tensors).__name__}.")
    for target, pair in weights.tensors.items():
        if not isinstance(target, str) or not target:
            raise err(f"{label}: target names must be non-empty strings, got {target!r}.")
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise err(f"{label}: tensors[{target!r}] must be a pair (A, B).")
        a, b = (np.asarray(x) for x in pair)
        if a.dtype.kind != "f" or b.dtype.kind != "f":
            raise err(f"{label}: tensors[{target!r}] must hold float arrays, got {a.dtype} and {b.dtype}.")
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != weights.rank or b.shape[1] != weights.rank:
            raise err(
                f"{label}: tensors[{target!r}] expected A (R={weights.rank}, cols) and B (rows, R={weights.rank}), "
                f"got A {a.shape} and B {b.shape}."
            )
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise err(f"{label}: tensors[{target!r}] holds NaN or Inf.")


def _check_targets(weights: LoRAWeights, params: Mapping[str, np.ndarray], err: type[Exception], label: str) -> None:
    """Every target must be a 2-D weight of the model with shape (B rows, A cols)."""
    for target, (a, b) in weights.tensors.items():
        if target not in params:
            raise err(f"{label}: adapter targets {target!r}, which the model does not have.")
        shape = np.shape(params[target])
        want = (np.shape(b)[0], np.shape(a)[1])
        if shape != want:
            raise err(
                f"{label}: adapter for {target!r} needs a weight of shape {want}, the model's is {shape}; "
                "the adapter was fitted on another model."
            )


def save_adapter(path: str | os.PathLike[str], weights: LoRAWeights, *, fp16: bool = False) -> None:
    """Save an adapter atomically (own magic, format "evermind-lora 1", CRC trailer).

    Args:
        path: destination file.
        weights: the adapter.
        fp16: store A and B as float16.

    Raises:
        InvalidInput: the adapter is malformed.
        CheckpointError: the file system refused the write (an existing file is left as it was).
    """
    if not isinstance(weights, LoRAWeights):
        raise InvalidInput(f"save_adapter expected LoRAWeights, got {type(weights).__name__}.")
    _check_weights(weights, InvalidInput, "save_adapter")
    tensors: dict[str, np.ndarray] = {}
    for target, (a, b) in weights.tensors.items():
        tensors[target + _A] = np.asarray(a, dtype=np.float32)  # (R, cols)
        tensors[target + _B] = np.asarray(b, dtype=np.float32)  # (rows, R)
    meta = {
        "rank": int(weights.rank),
        "alpha": float(weights.alpha),
        "targets": list(weights.tensors),
        "base_fingerprint": weights.base_fingerprint,
    }
    write_tensor_file(path, magic=ADAPTER_MAGIC, kind=ADAPTER_KIND, meta=meta, tensors=tensors, fp16=fp16)


def load_adapter(
    path: str | os.PathLike[str],
    *,
    model: Any = None,
    sha256: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> LoRAWeights:
    """Load and validate an adapter file written by save_adapter.

    Args:
        path: the adapter file.
        model: optional EvermindLM (anything with `.params`); its targets and shapes are checked.
        sha256: optional hex sha256 pin of the file bytes, for adapters that come from elsewhere.
        max_bytes: refuse files larger than this.

    Returns:
        The adapter, float32 tensors.

    Raises:
        CheckpointError: missing, corrupt, truncated, of another format, not matching the pin, or not
            fitting `model`.
    """
    label = os.fspath(path)
    if sha256 is not None:
        try:
            size = os.stat(path).st_size
            if size > max_bytes:
                raise CheckpointError(f"{label}: file is {size} bytes, above the {max_bytes}-byte cap.")
            actual = file_sha256(path)
        except OSError as e:
            raise CheckpointError(f"{label}: cannot read the file ({e.strerror or e}).") from e
        if not hmac.compare_digest(actual, str(sha256).lower()):
            raise CheckpointError(
                f"{label}: sha256 {actual[:16]}... does not match the pinned {str(sha256)[:16]}...; "
                "refusing an adapter that is not the one expected."
            )
    found: dict[str, Any] = {}

    def check(meta: dict[str, Any], specs: dict[str, TensorSpec]) -> None:
        keys = {"rank", "alpha", "targets", "base_fingerprint"}
        if set(meta) != keys:
            raise CheckpointError(f"{label}: adapter header should hold {sorted(keys)}, got {sorted(meta)}.")
        rank, alpha, targets, fp = meta["rank"], meta["alpha"], meta["targets"], meta["base_fingerprint"]
        if not _is_int(rank) or rank <= 0:
            raise CheckpointError(f"{label}: adapter rank must be an int >= 1, got {rank!r}.")
        if not _is_real(alpha) or not math.isfinite(alpha):
            raise CheckpointError(f"{label}: adapter alpha must be a finite number, got {alpha!r}.")
        if fp is not None and not isinstance(fp, str):
            raise CheckpointError(f"{label}: base_fingerprint must be a string or null.")
        if not isinstance(targets, list) or not all(isinstance(t, str) and t for t in targets):
            raise CheckpointError(f"{label}: adapter targets must be a list of names.")
        if len(set(targets)) != len(targets):
            raise CheckpointError(f"{label}: adapter lists a target twice.")
        expected = {t + s for t in targets for s in (_A, _B)}
        if set(specs) != expected:
            raise CheckpointError(
                f"{label}: adapter tensors {sorted(specs)} do not match its targets {targets}."
            )
        for t in targets:
            a_shape, b_shape = specs[t + _A][1], specs[t + _B][1]
            if len(a_shape) != 2 or len(b_shape) != 2 or a_shape[0] != rank or b_shape[1] != rank:
                raise CheckpointError(
                    f"{label}: adapter for {t!r} expected A (R={rank}, cols) and B (rows, R={rank}), "
                    f"got A {a_shape} and B {b_shape}."
                )
        if model is not None:
            for t in targets:
                if t not in model.params:
                    raise CheckpointError(f"{label}: adapter targets {t!r}, which the model does not have.")
                want = (specs[t + _B][1][0], specs[t + _A][1][1])
                if np.shape(model.params[t]) != want:
                    raise CheckpointError(
                        f"{label}: adapter for {t!r} needs a weight of shape {want}, the model's is "
                        f"{np.shape(model.params[t])}; the adapter was fitted on another model."
                    )
        found.update(rank=rank, alpha=float(alpha), targets=targets, fp=fp)

    _, tensors = read_tensor_file(path, magic=ADAPTER_MAGIC, kind=ADAPTER_KIND, max_bytes=max_bytes, check=check)
    pairs = {t: (tensors[t + _A], tensors[t + _B]) for t in found["targets"]}
    for t, (a, b) in pairs.items():
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise CheckpointError(f"{label}: adapter for {t!r} holds NaN or Inf.")
    return LoRAWeights(rank=found["rank"], alpha=found["alpha"], tensors=pairs, base_fingerprint=found["fp"])


def adapted_params(params: Mapping[str, np.ndarray], weights: LoRAWeights) -> dict[str, np.ndarray]:
    """Apply an adapter to a parameter dict: W + (alpha / R) * B @ A on each target, copies elsewhere.

    A and B are taken as float32 (as stored), the product is formed in float64 and rounded to float32
    once, so B = 0 gives W back bit for bit.

    Args:
        params: name -> float array (not mutated).
        weights: the adapter; its targets must be 2-D entries of params with matching shapes.

    Returns:
        New name -> float32 array dict, same order as params.

    Raises:
        InvalidInput: the adapter is malformed or does not fit params.
    """
    if not isinstance(weights, LoRAWeights):
        raise InvalidInput(f"expected LoRAWeights, got {type(weights).__name__}.")
    if not isinstance(params, Mapping):
        raise InvalidInput(f"params must be a dict of name -> array, got {type(params).__name__}.")
    _check_weights(weights, InvalidInput, "adapter")
    _check_targets(weights, params, InvalidInput, "adapter")
    out = {name: np.array(value, dtype=np.float32) for name, value in params.items()}  # copies
    for target, (a, b) in weights.tensors.items():
        # A and B are rounded to float32 first, as stored, so adapter_digest pins the result.
        a64 = np.asarray(a, dtype=np.float32).astype(np.float64)  # (R, cols)
        b64 = np.asarray(b, dtype=np.float32).astype(np.float64)  # (rows, R)
        delta = b64 @ a64  # (rows, cols)
        merged = np.asarray(params[target], dtype=np.float64) + weights.scale * delta  # (rows, cols)
        out[target] = merged.astype(np.float32)  # (rows, cols)
    return out


def merge_adapter(model: Any, weights: LoRAWeights) -> Any:
    """Bake an adapter into a new standalone EvermindLM; `model` is left untouched.

    Args:
        model: the base EvermindLM.
        weights: the adapter.

    Returns:
        A new EvermindLM with the same config and the adapted weights.

    Raises:
        InvalidInput: the adapter is malformed or does not fit the model.
    """
    if not isinstance(model, EvermindLM):
        raise InvalidInput(f"merge_adapter expected an EvermindLM, got {type(model).__name__}.")
    return EvermindLM.from_params(model.config, adapted_params(model.params, weights))


def adapter_digest(weights: LoRAWeights) -> str:
    """Hex sha256 of an adapter's content: rank, alpha, sorted targets, shapes and float32 bytes.

    Equal for an adapter and its save/load round trip; changes when any stored value changes.

    Args:
        weights: the adapter.

    Returns:
        64 hex characters.

    Raises:
        InvalidInput: the adapter is malformed.
    """
    if not isinstance(weights, LoRAWeights):
        raise InvalidInput(f"adapter_digest expected LoRAWeights, got {type(weights).__name__}.")
    _check_weights(weights, InvalidInput, "adapter_digest")
    h = hashlib.sha256()
    h.update(ADAPTER_KIND.encode("utf-8") + b"\0")
    h.update(struct.pack("<Qd", int(weights.rank), float(weights.alpha)))
    for target in sorted(weights.tensors):
        a, b = weights.tensors[target]
        name = target.encode("utf-8")
        h.update(struct.pack("<Q", len(name)) + name)
        for arr in (a, b):
            x = np.asarray(arr, dtype="<f4", order="C")
            h.update(struct.pack("<QQ", *x.shape))
            h.update(memoryview(x.reshape(-1).view(np.uint8)))
    return h.hexdigest()
