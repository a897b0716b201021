"""The interface every sequence block implements (Mamba-1/2/3, attention), as the reference's `SequenceLayer`.

A block maps (B, L, C) to (B, L, C) with its own residual: `forward` on the GPU, `forward_numpy` as the
reference, `parameters()` by name. The numpy maths (shapes, initial weights, reference forward) is
`evermind_memory.lm.sequence`; a block here adds the device side. Weights are uploaded once and kept on the
device until they change. Training (backward through whole blocks) is not here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import Batch, GpuBuffer, get_device
from evermind_memory.lm.sequence import (
    LAYER_TYPES,
    RMS_EPS,
    block_forward,
    block_kind,
    block_param_shapes,
    init_block_params,
)

__all__ = ["SequenceLayer", "RMS_EPS", "LAYER_TYPES"]


class SequenceLayer(ABC):
    """A (B, L, C) -> (B, L, C) sequence block with named parameters, a GPU forward and a numpy reference.

    Subclasses set `layer_type` and define `record_forward()`; shapes, initial weights and `forward_numpy()`
    come from `lm.sequence` through the block's config.
    """

    layer_type: ClassVar[str]

    def __init__(self, config: Any, params: Mapping[str, np.ndarray] | None = None,
                 rng: np.random.Generator | None = None) -> None:
        """Build a block from parameters, or initialise them as the reference does.

        Args:
            config: the block's shape.
            params: name -> array for every name of `param_shapes()`; None initialises from `rng`.
            rng: the generator for initial weights (a seed-0 generator when None).

        Raises:
            InvalidInput: parameters of the wrong names or shapes.
        """
        if block_kind(config) != self.layer_type:
            raise InvalidInput(
                f"{type(self).__name__} needs a {self.layer_type} block config, got {type(config).__name__}"
            )
        self.config = config
        self._params: dict[str, np.ndarray] = {}
        self._gpu: dict[str, GpuBuffer] | None = None
        self.load_parameters(params if params is not None else self._init(rng or np.random.default_rng(0)))

    def _init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Initial parameters drawn from rng, as the reference initialises them."""
        return init_block_params(self.config, rng)

    # ---- parameters ------------------------------------------------------------------------------
    @property
    def d_model(self) -> int:
        """C, the width of the block's input and output."""
        return int(self.config.d_model)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every parameter, in a fixed order."""
        return block_param_shapes(self.config)

    def parameters(self) -> dict[str, np.ndarray]:
        """The block's float32 parameters by name (the arrays themselves: call `load_parameters` after editing).

        Returns:
            Name -> array, in `param_shapes()` order.
        """
        return dict(self._params)

    def load_parameters(self, params: Mapping[str, np.ndarray]) -> None:
        """Replace every parameter (copied as float32); the device copies are refreshed on the next forward.

        Args:
            params: name -> array for exactly the names of `param_shapes()`, with those shapes.

        Raises:
            InvalidInput: a name is missing or unknown, or a shape differs.
        """
        shapes = self.param_shapes()
        missing, extra = set(shapes) - set(params), set(params) - set(shapes)
        if missing or extra:
            raise InvalidInput(
                f"{type(self).__name__} parameters must be exactly {sorted(shapes)}; "
                f"missing {sorted(missing)}, unknown {sorted(extra)}"
            )
        new = {}
        for name, shape in shapes.items():
            arr = np.asarray(params[name])
            if arr.shape != shape:
                raise InvalidInput(f"parameter {name!r} must have shape {shape}, got {arr.shape}")
            new[name] = np.ascontiguousarray(arr, dtype=np.float32)
        self._params = new
        self.release()

    def gpu_weights(self) -> dict[str, GpuBuffer]:
        """The parameters as device buffers (uploaded on first use, kept until they change).

        Raises:
            GpuUnavailable: no GPU device.
        """
        if self._gpu is None:
            dev = get_device()
            self._gpu = {name: dev.upload(arr) for name, arr in self._params.items()}
        return self._gpu

    def release(self) -> None:
        """Give the device copies of the parameters back to the buffer pool (they re-upload when needed)."""
        if self._gpu is not None:
            dev = get_device()
            for buf in self._gpu.values():
                dev.release(buf)
            self._gpu = None

    # ---- forward ---------------------------------------------------------------------------------
    def check_input(self, x: Any) -> tuple[int, int]:
        """Check x is float32 C-contiguous (B, L, C) with C = d_model; return (B, L).

        Raises:
            InvalidInput: otherwise.
        """
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 3 or x.shape[2] != self.d_model:
            got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
            raise InvalidInput(f"{type(self).__name__} expects float32 (B, L, {self.d_model}), got {got}")
        if not x.flags.c_contiguous:
            raise InvalidInput("x must be C-contiguous; pass np.ascontiguousarray(x)")
        return x.shape[0], x.shape[1]

    def reference_dims(self, x: Any) -> tuple[int, int]:
        """Check x is a floating (B, L, C) array with C = d_model (any float dtype); return (B, L).

        Raises:
            InvalidInput: otherwise.
        """
        if not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.floating) or x.ndim != 3 \
                or x.shape[2] != self.d_model:
            got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
            raise InvalidInput(f"{type(self).__name__} expects a float (B, L, {self.d_model}) array, got {got}")
        return x.shape[0], x.shape[1]

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The block on the GPU: every step recorded into one command batch, one read back.

        Args:
            x: float32 (B, L, C).

        Returns:
            (B, L, C) float32, the input plus the block's update.

        Raises:
            InvalidInput: x is not float32 (B, L, C).
            GpuUnavailable: no GPU device.
        """
        b, length = self.check_input(x)
        if x.size == 0:
            return x.copy()
        dev = get_device()
        x_buf, y_buf = dev.upload(x), dev.storage(x.nbytes)
        try:
            batch = dev.batch()
            self.record_forward(batch, x_buf, y_buf, b, length)
            batch.submit()
            return dev.read(y_buf, np.float32, x.shape)
        finally:
            dev.release(x_buf)
            dev.release(y_buf)

    @abstractmethod
    def record_forward(self, batch: Batch, x: GpuBuffer, y: GpuBuffer, b: int, length: int) -> None:
        """Record the block's forward from x (B, L, C) into y (B, L, C) on device buffers (y != x)."""

    def forward_numpy(self, x: np.ndarray) -> np.ndarray:
        """The numpy reference of `forward` (lm.sequence.block_forward): x (B, L, C) -> (B, L, C).

        Raises:
            InvalidInput: x is not a float (B, L, C) array.
        """
        self.reference_dims(x)
        return block_forward(self.config, self._params, x)
