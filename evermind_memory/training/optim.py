"""AdamW over named parameters, optimizer-state sharding, gradient clipping and the LR schedule.

`adamw_update_` is the in-place numpy mirror of the WGSL weight-update kernel (gpu/kernels): the same
float32 maths, a global grad scale, a guard that drops a non-finite step and a per-element trust region.
`AdamW` drives it over a dict of tensors; a `ShardSpec` makes one instance own only some of them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Collection, Mapping

import numpy as np

from ..errors import InvalidInput

_STATE_FORMAT = "evermind-adamw 1"


@dataclass(frozen=True)
class AdamWStep:
    """Hyperparameters of one `adamw_update_` call (the kernel's uniform block)."""

    lr: float  # learning rate
    beta1: float  # first-moment decay
    beta2: float  # second-moment decay
    eps: float  # added to sqrt(v_hat) so a zero second moment cannot divide by zero
    weight_decay: float  # decoupled: p *= 1 - lr * weight_decay
    beta1_t: float  # beta1 ** t, the bias-correction term for step t (1-based)
    beta2_t: float  # beta2 ** t
    max_delta: float = 0.0  # trust region: largest |step| per element; 0 disables it
    grad_scale: float = 1.0  # multiplies every gradient element on the fly (clipping, unscaling, averaging)


def adamw_update_(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, hp: AdamWStep) -> bool:
    """Apply one AdamW step to `param`, `m` and `v` in place, as the WGSL kernel does.

    The step is computed in float32 exactly as the kernel computes it. If any moment or step element is
    not finite (a NaN/Inf gradient, an overflow), the whole step is dropped: `param`, `m` and `v` stay
    unchanged. The trust region clamps each element's step to [-max_delta, max_delta].

    Args:
        param: float32 weights, updated in place.
        grad: float32 gradient, same shape; read only.
        m: float32 first moment, same shape, updated in place.
        v: float32 second moment, same shape, updated in place.
        hp: the step's hyperparameters.

    Returns:
        True if the step was applied, False if it was dropped as non-finite.

    Raises:
        InvalidInput: shapes differ or an array is not float32.
    """
    for label, arr in (("param", param), ("grad", grad), ("m", m), ("v", v)):
        if arr.dtype != np.float32:
            raise InvalidInput(f"adamw_update_ expected float32 {label}, got {arr.dtype}. Cast with "
                               ".astype(np.float32).")
        if arr.shape != param.shape:
            raise InvalidInput(f"adamw_update_ expected {label} of shape {param.shape}, got {arr.shape}.")
    f32 = np.float32
    b1, b2 = f32(hp.beta1), f32(hp.beta2)
    lr = f32(hp.lr)
    # The kernel receives beta^t and forms 1 - beta^t in f32; do the same so the two agree bit for bit.
    bc1 = f32(1.0) - f32(hp.beta1_t)
    bc2 = f32(1.0) - f32(hp.beta2_t)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        g = grad * f32(hp.grad_scale) if hp.grad_scale != 1.0 else grad  # (N...)
        m_new = m * b1  # (N...)
        m_new += (f32(1.0) - b1) * g
        v_new = v * b2  # (N...)
        v_new += (f32(1.0) - b2) * g * g
        denom = np.sqrt(v_new / bc2)  # (N...)
        denom += f32(hp.eps)
        step = lr * (m_new / bc1)  # (N...)
        step /= denom
        # A non-finite g reaches v_new (g*g) or the step; a finite v_new bounds |g| so m_new is finite too.
        if not (np.isfinite(v_new).all() and np.isfinite(step).all()):
            return False
    if hp.max_delta > 0.0:
        md = f32(hp.max_delta)
        np.clip(step, -md, md, out=step)
    m[...] = m_new
    v[...] = v_new
    decay = f32(1.0) - lr * f32(hp.weight_decay)
    if decay != f32(1.0):
        param *= decay
    param -= step
    return True


@dataclass(frozen=True)
class ShardSpec:
    """Optimizer-state shard `index` of `count` (ZeRO-1): the shard owns only some tensors' moments."""

    index: int  # this shard, 0-based
    count: int  # number of shards

    def __post_init__(self) -> None:
        ok = isinstance(self.index, int) and isinstance(self.count, int) and not isinstance(self.index, bool)
        if not ok or self.count < 1 or not 0 <= self.index < self.count:
            raise InvalidInput(
                f"ShardSpec expected integers with count >= 1 and 0 <= index < count, got "
                f"index={self.index!r}, count={self.count!r}."
            )


def assign_shards(shapes: Mapping[str, tuple[int, ...]], count: int) -> dict[str, int]:
    """Assign each tensor to one of `count` shards, balancing element counts, deterministically.

    Largest tensors first (ties in name order), each to the shard that holds the fewest elements so far
    (ties to the lowest shard index). Depends only on the names and shapes.

    Args:
        shapes: tensor name -> shape.
        count: number of shards (>= 1).

    Returns:
        tensor name -> shard index.
    """
    sizes = {name: int(np.prod(shape, dtype=np.int64)) for name, shape in shapes.items()}
    load = [0] * count
    owner: dict[str, int] = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        shard = min(range(count), key=lambda s: (load[s], s))
        owner[name] = shard
        load[shard] += sizes[name]
    return owner


def grad_norm(grads: Mapping[str, np.ndarray]) -> float:
    """Global L2 norm over all gradient tensors (inf or nan if any element is).

    Args:
        grads: name -> gradient array.

    Returns:
        sqrt of the sum of squares of every element, as a Python float.
    """
    total = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for g in grads.values():
            flat = g.reshape(-1)  # (N,)
            total += float(np.dot(flat, flat))
    return math.sqrt(total) if total == total and total != math.inf else total


def clip_factor(norm: float, max_norm: float) -> float:
    """The factor that brings a gradient of global norm `norm` down to at most `max_norm` (1 if already within)."""
    if max_norm <= 0.0 or not math.isfinite(norm) or norm <= max_norm:
        return 1.0
    return max_norm / (norm + 1e-6)


def clip_grad_norm_(grads: Mapping[str, np.ndarray], max_norm: float) -> float:
    """Scale all gradients in place so their global L2 norm is at most `max_norm`.

    Args:
        grads: name -> gradient array (modified in place).
        max_norm: the largest allowed global norm; <= 0 disables clipping.

    Returns:
        The global norm before clipping.
    """
    norm = grad_norm(grads)
    factor = clip_factor(norm, max_norm)
    if factor != 1.0:
        for g in grads.values():
            g *= np.float32(factor)
    return norm


@dataclass(frozen=True)
class LRSchedule:
    """Linear warm-up to `base_lr` over `warmup` steps, then cosine decay to `min_lr` at `total_steps`."""

    base_lr: float  # peak learning rate
    warmup: int = 0  # optimizer steps of linear warm-up
    total_steps: int = 0  # step at which the cosine reaches min_lr; 0 keeps base_lr after warm-up
    min_lr: float = 0.0  # floor of the cosine

    def __call__(self, step: int) -> float:
        """Learning rate for optimizer step `step` (0-based)."""
        if self.warmup > 0 and step < self.warmup:
            return self.base_lr * (step + 1) / self.warmup
        if self.total_steps <= self.warmup:
            return self.base_lr
        progress = min(1.0, (step - self.warmup) / (self.total_steps - self.warmup))
        return self.min_lr + (self.base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


class AdamW:
    """AdamW over a dict of named float32 tensors, optionally owning only one shard of them.

    Not thread-safe: one thread steps one optimizer.
    """

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled: bool = True,
        no_decay: Collection[str] = (),
        max_delta: float = 0.0,
        shard: ShardSpec | None = None,
    ) -> None:
        """Create the optimizer; moments are allocated (zeros) only for the tensors this shard owns.

        Args:
            params: name -> float32 array, the tensors `step` updates in place (kept by reference).
            lr: learning rate (a schedule may pass another per step).
            betas: (beta1, beta2), each in [0, 1).
            eps: denominator epsilon.
            weight_decay: decay coefficient (>= 0).
            decoupled: True (default) decays the weights directly, p *= 1 - lr*wd (AdamW, and the kernel);
                False adds wd*p to the gradient before the moments (Adam with L2, the coupled form).
            no_decay: names exempt from weight decay (norm gains, biases).
            max_delta: trust region per element and step; 0 disables.
            shard: own only the tensors `assign_shards` gives this shard; None owns all.

        Raises:
            InvalidInput: a hyperparameter is out of range, a tensor is not float32, or a no_decay name
                is unknown.
        """
        b1, b2 = betas
        if not (lr >= 0 and 0 <= b1 < 1 and 0 <= b2 < 1 and eps > 0 and weight_decay >= 0 and max_delta >= 0):
            raise InvalidInput(
                "AdamW expected lr >= 0, 0 <= beta < 1, eps > 0, weight_decay >= 0, max_delta >= 0; got "
                f"lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}, max_delta={max_delta}."
            )
        for name, p in params.items():
            if not isinstance(p, np.ndarray) or p.dtype != np.float32:
                raise InvalidInput(f"AdamW expected float32 arrays, got {type(p).__name__} "
                                   f"{getattr(p, 'dtype', '')} for {name!r}.")
        unknown = set(no_decay) - set(params)
        if unknown:
            raise InvalidInput(f"AdamW got no_decay names that are not parameters: {sorted(unknown)}.")
        self.params = params
        self.lr = float(lr)
        self.beta1, self.beta2 = float(b1), float(b2)
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        self.decoupled = bool(decoupled)
        self.no_decay = frozenset(no_decay)
        self.max_delta = float(max_delta)
        self.shard = shard
        self.t = 0  # optimizer steps applied so far
        owner = assign_shards({n: p.shape for n, p in params.items()}, shard.count) if shard else None
        self.owned: tuple[str, ...] = tuple(n for n in params if owner is None or owner[n] == shard.index)
        self.m = {n: np.zeros_like(params[n]) for n in self.owned}  # (same as param)
        self.v = {n: np.zeros_like(params[n]) for n in self.owned}  # (same as param)

    def state_bytes(self) -> int:
        """Bytes of optimizer state (m and v) this instance holds."""
        return sum(a.nbytes for a in self.m.values()) + sum(a.nbytes for a in self.v.values())

    def step(self, grads: Mapping[str, np.ndarray], *, lr: float | None = None, grad_scale: float = 1.0) -> bool:
        """One AdamW step of the owned tensors from `grads` (which may hold more names than this shard owns).

        If any owned gradient (or `grad_scale`) is not finite, the whole step is dropped: no tensor,
        moment or step counter changes. A sharded caller that wants one decision for all shards checks
        the global gradient first (as LMTrainer does).

        Args:
            grads: name -> float32 gradient; must hold every owned name.
            lr: learning rate for this step (default: self.lr).
            grad_scale: multiplies every gradient element (clipping, unscaling, averaging), as the kernel's.

        Returns:
            True if the step was applied, False if dropped.

        Raises:
            InvalidInput: an owned gradient is missing or has the wrong shape.
        """
        for n in self.owned:
            g = grads.get(n)
            if g is None or g.shape != self.params[n].shape:
                raise InvalidInput(
                    f"AdamW.step expected a gradient of shape {self.params[n].shape} for {n!r}, got "
                    f"{None if g is None else g.shape}."
                )
        if not math.isfinite(grad_scale) or not all(math.isfinite(grad_norm({n: grads[n]})) for n in self.owned):
            return False  # checked before any write, so the whole step is dropped
        t = self.t + 1
        step_lr = self.lr if lr is None else float(lr)
        for n in self.owned:
            p = self.params[n]
            wd = 0.0 if n in self.no_decay else self.weight_decay
            g, gs = grads[n], grad_scale
            if not self.decoupled and wd != 0.0:
                g = g * np.float32(grad_scale) + np.float32(wd) * p  # (same as param) coupled L2 decay
                gs, wd = 1.0, 0.0
            hp = AdamWStep(step_lr, self.beta1, self.beta2, self.eps, wd, self.beta1**t, self.beta2**t,
                           self.max_delta, gs)
            # With finite gradients the kernel's own guard fires only if g*g overflows float32 (|g| > 1e19);
            # it then drops that tensor's update alone.
            adamw_update_(p, g, self.m[n], self.v[n], hp)
        self.t = t
        return True

    def state_dict(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The optimizer state as JSON-able scalars plus plain arrays (no pickling).

        Returns:
            (meta, tensors): meta holds the format, step counter and hyperparameters; tensors maps
            "m/<name>" and "v/<name>" to copies of the moments.
        """
        meta = {
            "format": _STATE_FORMAT,
            "t": self.t,
            "lr": self.lr,
            "betas": [self.beta1, self.beta2],
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "decoupled": self.decoupled,
            "max_delta": self.max_delta,
            "shard": None if self.shard is None else asdict(self.shard),
            "owned": list(self.owned),
        }
        tensors = {f"m/{n}": a.copy() for n, a in self.m.items()}
        tensors.update({f"v/{n}": a.copy() for n, a in self.v.items()})
        return meta, tensors

    def load_state_dict(self, meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> None:
        """Restore the state written by `state_dict` into this optimizer (same parameters and shard).

        Args:
            meta: the JSON-able part of `state_dict`.
            tensors: the arrays of `state_dict`.

        Raises:
            InvalidInput: the format, shard, owned names or a moment's shape/dtype do not match.
        """
        if meta.get("format") != _STATE_FORMAT:
            raise InvalidInput(f"AdamW.load_state_dict expected format {_STATE_FORMAT!r}, got {meta.get('format')!r}.")
        shard = None if self.shard is None else asdict(self.shard)
        if meta.get("shard") != shard or list(meta.get("owned", [])) != list(self.owned):
            raise InvalidInput(
                f"AdamW.load_state_dict: the state is for shard {meta.get('shard')} owning "
                f"{len(meta.get('owned', []))} tensors; this optimizer is shard {shard} owning {len(self.owned)}. "
                "Build the optimizer over the same parameters and ShardSpec."
            )
        for kind, store in (("m", self.m), ("v", self.v)):
            for n, dst in store.items():
                src = tensors.get(f"{kind}/{n}")
                if src is None or src.shape != dst.shape or src.dtype != np.float32:
                    raise InvalidInput(
                        f"AdamW.load_state_dict expected float32 {kind}/{n} of shape {dst.shape}, got "
                        f"{None if src is None else (src.dtype, src.shape)}."
                    )
        for kind, store in (("m", self.m), ("v", self.v)):
            for n, dst in store.items():
                dst[...] = tensors[f"{kind}/{n}"]
        self.t = int(meta["t"])
        self.lr = float(meta["lr"])
        self.beta1, self.beta2 = (float(b) for b in meta["betas"])
        self.eps = float(meta["eps"])
        self.weight_decay = float(meta["weight_decay"])
        self.decoupled = bool(meta["decoupled"])
        self.max_delta = float(meta["max_delta"])


__all__ = [
    "AdamWStep",
    "adamw_update_",
    "ShardSpec",
    "assign_shards",
    "grad_norm",
    "clip_factor",
    "clip_grad_norm_",
    "LRSchedule",
    "AdamW",
]
