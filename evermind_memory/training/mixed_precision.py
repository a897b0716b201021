"""Mixed precision on the CPU: fp16 rounding over fp32 master weights, and the dynamic loss scaler.

numpy computes in float32 here, so this models the *numerics* of fp16 training (what the WGSL path
inherits): values and gradients rounded to half precision, subnormals flushed to zero as WGSL allows,
and a loss scale that lifts small gradients into range. It does not save memory on the CPU.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import InvalidInput

FP16_MIN_NORMAL = 2.0**-14  # smallest normal float16; below it WGSL may flush to zero, so we always do
FP16_MAX = 65504.0  # largest finite float16; beyond it the cast gives inf (an overflow)
_SCALER_FORMAT = "evermind-loss-scaler 1"


def round_fp16(x: np.ndarray, *, flush_subnormals: bool = True) -> np.ndarray:
    """A float32 copy of `x` rounded to the nearest float16 (overflow becomes +-inf).

    Args:
        x: array of any float dtype.
        flush_subnormals: set magnitudes below the smallest normal float16 (6.1e-5) to zero, as fp16
            hardware that flushes denormals does (WGSL permits it); False keeps numpy's subnormals.

    Returns:
        float32 array of the same shape.
    """
    with np.errstate(over="ignore"):
        y = np.asarray(x).astype(np.float16).astype(np.float32)  # (same as x)
    if flush_subnormals:
        y[np.abs(y) < FP16_MIN_NORMAL] = 0.0
    return y


def round_fp16_(arrays: Mapping[str, np.ndarray], *, flush_subnormals: bool = True) -> None:
    """Round every float32 array of `arrays` to float16 precision in place (see `round_fp16`).

    Args:
        arrays: name -> float32 array, modified in place.
        flush_subnormals: as in `round_fp16`.
    """
    for a in arrays.values():
        with np.errstate(over="ignore"):
            np.copyto(a, a.astype(np.float16))
        if flush_subnormals:
            a[np.abs(a) < FP16_MIN_NORMAL] = 0.0


def has_overflow(arrays: Mapping[str, np.ndarray]) -> bool:
    """True if any element of any array is inf or nan (an fp16 overflow: the step must be skipped)."""
    with np.errstate(over="ignore", invalid="ignore"):
        for a in arrays.values():
            flat = a.reshape(-1)  # (N,)
            if not np.isfinite(np.dot(flat, flat)) and not np.isfinite(flat).all():
                return True
    return False


class DynamicLossScaler:
    """The AMP loss-scale controller: grow after `growth_interval` clean steps, back off and skip on overflow.

    Use: scale the loss (or, equivalently, the gradients) by `scale`, round to fp16, `update(has_overflow(g))`;
    if it returns True, unscale by the same factor and step, otherwise skip the step. Keep the factor
    fixed over one accumulation window: read `scale` at the window's start and use that value for every
    micro-batch and for the unscale. Not thread-safe.
    """

    def __init__(
        self,
        *,
        init_scale: float = 2.0**15,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
    ) -> None:
        """Create the controller.

        Args:
            init_scale: starting scale (> 0).
            growth_factor: multiplier after `growth_interval` consecutive clean steps (> 1).
            backoff_factor: multiplier on overflow (in (0, 1)).
            growth_interval: clean steps between growths (>= 1).
            min_scale: floor the scale never goes below (> 0).
            max_scale: ceiling the scale never grows above (>= init_scale).

        Raises:
            InvalidInput: any argument out of range.
        """
        if not (
            init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1
            and 0 < min_scale <= init_scale <= max_scale
        ):
            raise InvalidInput(
                "DynamicLossScaler expected init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, "
                "growth_interval >= 1 and 0 < min_scale <= init_scale <= max_scale; got "
                f"init_scale={init_scale}, growth_factor={growth_factor}, backoff_factor={backoff_factor}, "
                f"growth_interval={growth_interval}, min_scale={min_scale}, max_scale={max_scale}."
            )
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.max_scale = float(max_scale)
        self.clean_streak = 0  # consecutive clean steps since the last growth or overflow
        self.overflows = 0  # overflowing (skipped) steps so far

    def update(self, overflow: bool) -> bool:
        """Advance the controller after one step's overflow check.

        Args:
            overflow: whether this step's scaled gradients held an inf/nan.

        Returns:
            True if the optimizer step should proceed, False if it must be skipped.
        """
        if overflow:
            self.overflows += 1
            self.scale = max(self.min_scale, self.scale * self.backoff_factor)
            self.clean_streak = 0
            return False
        self.clean_streak += 1
        if self.clean_streak >= self.growth_interval:
            self.scale = min(self.max_scale, self.scale * self.growth_factor)
            self.clean_streak = 0
        return True

    def state_dict(self) -> dict[str, Any]:
        """The controller's state as JSON-able scalars."""
        return {
            "format": _SCALER_FORMAT,
            "scale": self.scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "min_scale": self.min_scale,
            "max_scale": self.max_scale,
            "clean_streak": self.clean_streak,
            "overflows": self.overflows,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the state written by `state_dict`.

        Raises:
            InvalidInput: the format is not the one this class writes.
        """
        if state.get("format") != _SCALER_FORMAT:
            raise InvalidInput(f"DynamicLossScaler expected state format {_SCALER_FORMAT!r}, got "
                               f"{state.get('format')!r}.")
        self.scale = float(state["scale"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self.min_scale = float(state["min_scale"])
        self.max_scale = float(state["max_scale"])
        self.clean_streak = int(state["clean_streak"])
        self.overflows = int(state["overflows"])


__all__ = ["FP16_MIN_NORMAL", "FP16_MAX", "round_fp16", "round_fp16_", "has_overflow", "DynamicLossScaler"]
