"""The optimizer's kernels: AdamW with its NaN guard, and the global-norm gradient clip. The numpy twins
are training/optim.py's own functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from evermind_memory.gpu.device import get_device
from evermind_memory.gpu.ops.support import (
    SUMSQ_CHUNK,
    BufferScope,
    dispatch_1d,
    check_f32,
    check_fits,
    fold_groups,
    check_shape,
    binding_tiles,
)

if TYPE_CHECKING:
    from evermind_memory.training.optim import AdamWStep

__all__ = ["adamw_update_numpy", "adamw_update_", "clip_grads_numpy", "clip_grads"]


def adamw_update_numpy(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, hp: "AdamWStep") -> bool:
    """Numpy twin of `adamw_update_`: `evermind_memory.training.optim.adamw_update_` itself."""
    from evermind_memory.training.optim import adamw_update_ as _twin  # noqa: PLC0415

    return _twin(param, grad, m, v, hp)


def adamw_update_(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, hp: "AdamWStep") -> bool:
    """One AdamW step on the GPU, written back into param, m and v in place (the training twin's maths).

    Trust region (|step| <= hp.max_delta when > 0), decoupled weight decay, a global grad scale, and the
    NaN guard: when any second moment or step element is not finite, the whole step is dropped and
    param, m and v stay unchanged.

    Args:
        param: float32 weights (any shape), updated in place.
        grad: float32 gradient, param's shape; read only.
        m: float32 first moment, param's shape, updated in place.
        v: float32 second moment, param's shape, updated in place.
        hp: `evermind_memory.training.optim.AdamWStep` (lr, betas, eps, weight_decay, beta^t, max_delta,
            grad_scale).

    Returns:
        True if the step was applied, False if it was dropped as non-finite.

    Raises:
        InvalidInput: wrong dtype, contiguity or shapes.
        GpuUnavailable: no GPU device.
    """
    check_f32("param", param)
    for name, arr in (("grad", grad), ("m", m), ("v", v)):
        check_f32(name, arr)
        check_shape(name, arr, param.shape)
    dev = get_device()
    views = [a.reshape(-1) for a in (param, grad, m, v)]  # (n,) each
    tiles = list(binding_tiles(param.size, 4, dev, "element"))
    with BufferScope(dev) as s:
        flag = s.empty(16)
        batch = dev.batch()
        batch.clear(flag)
        staged = []
        for i0, i1 in tiles:
            n = i1 - i0
            bufs = [s.up(a[i0:i1]) for a in views]
            uni = batch.uniform([
                ("u", n), ("f", hp.lr), ("f", hp.beta1), ("f", hp.beta2), ("f", hp.eps), ("f", hp.weight_decay),
                ("f", hp.beta1_t), ("f", hp.beta2_t), ("f", hp.max_delta), ("f", hp.grad_scale),
                ("f", 0.0), ("f", 0.0),
            ])
            staged.append((i0, i1, bufs, uni))
            dispatch_1d(batch, "adamw_update", "check",
                            {0: uni, 2: bufs[1], 3: bufs[2], 4: bufs[3], 5: flag}, n)
        for i0, i1, bufs, uni in staged:
            dispatch_1d(batch, "adamw_update", "apply",
                            {0: uni, 1: bufs[0], 2: bufs[1], 3: bufs[2], 4: bufs[3], 5: flag}, i1 - i0)
        # Uniforms go back to the pool only after submit; reading waits for the work.
        batch.submit()
        if int(dev.read(flag, np.uint32, (1,))[0]):
            return False
        for i0, i1, bufs, _ in staged:
            n = i1 - i0
            views[0][i0:i1] = dev.read(bufs[0], np.float32, (n,))
            views[2][i0:i1] = dev.read(bufs[2], np.float32, (n,))
            views[3][i0:i1] = dev.read(bufs[3], np.float32, (n,))
    return True

def clip_grads_numpy(grads: list[np.ndarray], clip: float,
                     unscale: float = 1.0) -> tuple[list[np.ndarray], float, bool]:
    """Numpy twin of `clip_grads`: (grads * scale, norm, finite) with training/optim.py's clip_factor."""
    from evermind_memory.training.optim import clip_factor  # noqa: PLC0415

    total = sum(float(np.dot(g.reshape(-1), g.reshape(-1))) for g in grads)
    norm = float(np.sqrt(total)) * unscale
    ok = bool(np.isfinite(norm))
    scale = unscale * clip_factor(norm, clip)
    return [g * g.dtype.type(scale) for g in grads], norm, ok


def clip_grads(grads: list[np.ndarray], clip: float,
               unscale: float = 1.0) -> tuple[list[np.ndarray], float, bool]:
    """Global gradient norm and clipping on the GPU (kernel sum_squares: partial, finish, scale).

    norm = sqrt(sum of every squared element) * unscale; scale = unscale * clip / (norm + 1e-6) when
    clip > 0 and the norm is finite and above clip, else unscale.

    Args:
        grads: float32 arrays (any shapes), e.g. every parameter's gradient.
        clip: the largest allowed norm; <= 0 disables clipping.
        unscale: multiplies the norm and the scale (averaging or loss-scale undo).

    Returns:
        (each gradient times scale, norm, whether the norm is finite).

    Raises:
        InvalidInput: wrong dtype or contiguity, or a gradient over one binding.
        GpuUnavailable: no GPU device.
    """
    for i, g in enumerate(grads):
        check_f32(f"grads[{i}]", g)
    dev = get_device()
    sizes = [int(g.size) for g in grads]
    n_part = [-(-n // SUMSQ_CHUNK) for n in sizes]
    slots = np.concatenate([[0], np.cumsum(n_part)]).astype(int)  # (len + 1,)
    with BufferScope(dev) as s:
        batch = dev.batch()
        part = s.empty(max(int(slots[-1]), 1) * 4)
        batch.clear(part)
        ctl, flag = s.empty(16), s.empty(16)
        bufs = []
        for g, n, slot in zip(grads, sizes, slots):
            check_fits(dev, g.nbytes, "a gradient")
            buf = s.up(g) if n else None
            bufs.append(buf)
            if n:
                params = batch.uniform([("u", n), ("u", int(slot)), ("u", 0), ("u", 0),
                                        ("f", 0.0), ("f", 0.0), ("f", 0.0), ("f", 0.0)])
                batch.dispatch("sum_squares", "partial", {0: params, 1: buf, 2: part},
                               fold_groups(dev, -(-n // SUMSQ_CHUNK)))
        fin = batch.uniform([("u", 0), ("u", 0), ("u", int(slots[-1])), ("u", 0),
                             ("f", unscale), ("f", clip), ("f", 0.0), ("f", 0.0)])
        batch.dispatch("sum_squares", "finish", {0: fin, 2: part, 3: ctl, 4: flag}, (1, 1, 1))
        for buf, n in zip(bufs, sizes):
            if n:
                params = batch.uniform([("u", n), ("u", 0), ("u", 0), ("u", 0),
                                        ("f", 0.0), ("f", 0.0), ("f", 0.0), ("f", 0.0)])
                dispatch_1d(batch, "sum_squares", "scale", {0: params, 3: ctl, 5: buf}, n)
        batch.submit()
        out = [dev.read(buf, np.float32, g.shape) if n else g.copy() for buf, g, n in zip(bufs, grads, sizes)]
        norm = float(dev.read(ctl, np.float32, (4,))[1])
        ok = int(dev.read(flag, np.uint32, (4,))[0]) == 0
    return out, norm, ok
