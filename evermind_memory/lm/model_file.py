"""Model files: one backbone's config and weights in the checkpoint container (lm.checkpoint).

The header's meta is {"config": {...}} for an EvermindLM and {"backbone": "sequence", "config": {...}} for a
SequenceBackbone. This module knows that layout, not the models: each model module describes itself with a
`Backbone` (name, config type, shapes function) and passes it in, so lm/model.py and lm/sequence.py import
this module and it imports neither.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from evermind_memory.errors import CheckpointError, InvalidInput
from evermind_memory.lm.checkpoint import (
    DEFAULT_MAX_BYTES,
    MODEL_KIND,
    MODEL_MAGIC,
    TensorSpec,
    read_tensor_file,
    write_tensor_file,
)

__all__ = ["Backbone", "LM_BACKBONE", "SEQUENCE_BACKBONE", "save_model_file", "load_model_file"]

LM_BACKBONE = "evermind-lm"  # files without a meta["backbone"] key
SEQUENCE_BACKBONE = "sequence"  # meta["backbone"] of a SequenceBackbone file
# How to read each backbone, for the message when a file holds another one than the caller asked for.
_READ_WITH = {
    LM_BACKBONE: "load_model(), EvermindLM.load() or embedder.load_embedder()",
    SEQUENCE_BACKBONE: "load_sequence_model(), SequenceBackbone.load() or embedder.load_embedder()",
}


class Backbone(NamedTuple):
    """What the model-file layer needs to know about one kind of model."""

    name: str  # LM_BACKBONE or SEQUENCE_BACKBONE
    config_type: type  # with to_dict() and a from_dict(dict) classmethod that raises InvalidInput
    shapes: Callable[[Any], dict[str, tuple[int, ...]]]  # config -> {param name: shape}, canonical order


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


def save_model_file(
    path: str | os.PathLike[str], backbone: Backbone, config: Any, params: Mapping[str, np.ndarray], *,
    fp16: bool = False, what: str = "save_model",
) -> None:
    """Save one backbone's config and parameters atomically (temp file + fsync + rename).

    Args:
        path: destination file (conventionally *.evlm).
        backbone: the model kind.
        config: an instance of backbone.config_type.
        params: name -> array, exactly the names and shapes of backbone.shapes(config).
        fp16: store weights as float16 (half the size; loaded back as float32).
        what: the public function's name, for error messages.

    Raises:
        InvalidInput: params do not match the config, are not finite floats, or cannot be stored.
        CheckpointError: the file system refused the write (an existing file is left as it was).
    """
    if not isinstance(config, backbone.config_type):
        raise InvalidInput(f"{what} expected a {backbone.config_type.__name__}, got {type(config).__name__}.")
    shapes = backbone.shapes(config)
    _check_params_for_save(what, shapes, params)
    meta: dict[str, Any] = {"config": config.to_dict()}
    if backbone.name != LM_BACKBONE:
        meta = {"backbone": backbone.name, **meta}
    write_tensor_file(path, magic=MODEL_MAGIC, kind=MODEL_KIND, meta=meta,
                      tensors={name: params[name] for name in shapes}, fp16=fp16)


def _backbone_of(meta: dict[str, Any], label: str) -> str:
    """LM_BACKBONE or SEQUENCE_BACKBONE from a model header's meta; CheckpointError for anything else."""
    if "backbone" not in meta:
        if set(meta) != {"config"} or not isinstance(meta["config"], dict):
            raise CheckpointError(
                f"{label}: header meta should hold exactly a 'config' object, got keys {sorted(meta)}."
            )
        return LM_BACKBONE
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


def load_model_file(
    path: str | os.PathLike[str], backbones: Sequence[Backbone], *, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[Backbone, Any, dict[str, np.ndarray]]:
    """Read a model file of one of `backbones`; config type and every tensor shape checked before reading.

    Args:
        path: the checkpoint file.
        backbones: the kinds the caller accepts.
        max_bytes: refuse files larger than this.

    Returns:
        (backbone, config, params): the kind found, its config and name -> float32 array in shapes order.

    Raises:
        CheckpointError: missing, unreadable, corrupt, truncated, of another format or backbone, inconsistent
            with its config, or holding non-finite weights.
    """
    label = os.fspath(path)
    allowed = {b.name: b for b in backbones}
    found: dict[str, Any] = {}

    def check(meta: dict[str, Any], specs: dict[str, TensorSpec]) -> None:
        name = _backbone_of(meta, label)
        if name not in allowed:
            raise CheckpointError(
                f"{label}: holds a {name} backbone, not {' or '.join(allowed)}; read it with {_READ_WITH[name]}."
            )
        backbone = allowed[name]
        try:
            config = backbone.config_type.from_dict(meta["config"])
        except (InvalidInput, TypeError, ValueError, KeyError) as e:
            raise CheckpointError(f"{label}: invalid model config in header: {e}") from e
        shapes = backbone.shapes(config)
        missing = [n for n in shapes if n not in specs]
        extra = [n for n in specs if n not in shapes]
        if missing or extra:
            raise CheckpointError(
                f"{label}: tensors do not match the config: missing {missing}, unexpected {extra}. "
                "The file is damaged or was written for another architecture."
            )
        for tensor, shape in shapes.items():
            if specs[tensor][1] != tuple(shape):
                raise CheckpointError(
                    f"{label}: tensor {tensor!r} has shape {specs[tensor][1]}, the config needs {tuple(shape)}."
                )
        found.update(backbone=backbone, config=config, shapes=shapes)

    _, tensors = read_tensor_file(path, magic=MODEL_MAGIC, kind=MODEL_KIND, max_bytes=max_bytes, check=check)
    for name, arr in tensors.items():
        if not np.all(np.isfinite(arr)):
            raise CheckpointError(f"{label}: tensor {name!r} holds NaN or Inf; the checkpoint is broken.")
    return found["backbone"], found["config"], {name: tensors[name] for name in found["shapes"]}
