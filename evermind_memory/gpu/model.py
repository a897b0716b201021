"""EvermindLM resident on the GPU: loss, exact gradients, AdamW steps, logits and pooled embeddings in WGSL.

Weights, moments and activations stay on the device; a batch shape's commands are recorded once into a plan
and replayed, so a training step is one submit and one 48-byte read back. Routed experts run densely beside
the shared one (an unchosen expert has gate 0: it adds and receives nothing, as lm/model.py's sparse dispatch)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import GpuBuffer, GpuDevice, get_device
from evermind_memory.lm.layers import RMS_EPS
from evermind_memory.lm.model import EvermindLM, LMConfig, param_shapes

__all__ = ["GpuLM", "GpuTrainer", "StepResult"]

_MAX_EXPERTS = 64  # moe_route.wgsl keeps a 64-bit "chosen" mask per row
_POOL_MAX_T = 1024  # pool_attention.wgsl keeps one query's scores in workgroup memory
_SUMSQ_CHUNK = 4096  # elements per workgroup of sum_squares.partial
_HEAD_CHUNK_BYTES = 256 * 1024 * 1024  # logits of one head chunk (rows x V float32), at most
_EMBED_SEQS = 64  # sequences per embed_batch forward, at most
_EMBED_TOKENS = 16384  # padded positions per embed_batch forward, at most
_PLAN_CACHE = 4  # batch shapes whose plans (and activation buffers) are kept per kind


# ==== the device layout of the parameters =================================================================

@dataclass(frozen=True)
class _Tensor:
    """One device tensor: canonical parameters packed side by side (AdamW is elementwise, so packing is free)."""

    name: str
    shape: tuple[int, ...]
    members: tuple[str, ...]  # canonical names in packing order
    how: str  # "same" (one member), "cols" (concatenated columns), "rows" (concatenated rows), "stack"
    decay: bool  # 2-D weights decay; norm gains and biases do not (as LMTrainer's no_decay)


def _layout(config: LMConfig) -> list[_Tensor]:
    """Device tensors in a fixed order. Per layer the shared expert is group 0 and expert e is group 1 + e."""
    shapes = param_shapes(config)
    c, h, g = config.d_model, config.hidden_dim, config.n_experts + 1
    out = [_Tensor("emb", shapes["emb"], ("emb",), "same", True)]
    for layer in range(config.n_layers):
        p = f"layers.{layer}."
        groups = [p + "shared"] + [f"{p}expert{e}" for e in range(config.n_experts)]
        for local in ("conv_norm", "conv", "moe_norm", "router"):
            out.append(_Tensor(p + local, shapes[p + local], (p + local,), "same", len(shapes[p + local]) >= 2))
        out.append(_Tensor(p + "w1", (c, g * h), tuple(x + ".w1" for x in groups), "cols", True))
        out.append(_Tensor(p + "b1", (g * h,), tuple(x + ".b1" for x in groups), "rows", False))
        out.append(_Tensor(p + "w2", (g * h, c), tuple(x + ".w2" for x in groups), "rows", True))
        out.append(_Tensor(p + "b2", (g, c), tuple(x + ".b2" for x in groups), "stack", False))
    for local in ("attn_norm", "wqkv", "wo", "out_norm"):
        name = "pool." + local
        if name in shapes:
            out.append(_Tensor(name, shapes[name], (name,), "same", len(shapes[name]) >= 2))
    return out


def _pack(t: _Tensor, params: Mapping[str, np.ndarray]) -> np.ndarray:
    parts = [np.asarray(params[m], dtype=np.float32) for m in t.members]
    if t.how == "same":
        return np.ascontiguousarray(parts[0])  # (shape)
    if t.how == "cols":
        return np.concatenate(parts, axis=1)  # (C, G*H)
    if t.how == "rows":
        return np.concatenate(parts, axis=0)  # (G*H,) or (G*H, C)
    return np.stack(parts, axis=0)  # (G, C)


def _unpack(t: _Tensor, arr: np.ndarray) -> dict[str, np.ndarray]:
    if t.how == "same":
        return {t.members[0]: arr}
    if t.how == "cols":
        parts = np.split(arr, len(t.members), axis=1)  # G x (C, H)
    elif t.how == "rows":
        parts = np.split(arr, len(t.members), axis=0)  # G x (H,) or (H, C)
    else:
        parts = list(arr)  # G x (C,)
    return {m: np.ascontiguousarray(p) for m, p in zip(t.members, parts)}


# ==== a replayable command list ===========================================================================

class _Plan:
    """Dispatches, clears and copies with their bind groups made once; `record` replays them into an encoder.

    Buffers made through the plan are owned by it and go back to the device pool on `release`.
    """

    def __init__(self, dev: GpuDevice) -> None:
        self.dev = dev
        self.cmds: list[tuple] = []
        self.owned: list[GpuBuffer] = []
        self.inputs: dict[str, GpuBuffer] = {}  # buffers the host writes before each replay

    # -- buffers
    def buffer(self, nbytes: int, name: str | None = None) -> GpuBuffer:
        buf = self.dev.storage(max(int(nbytes), 4))
        self.owned.append(buf)
        if name is not None:
            self.inputs[name] = buf
        return buf

    def uniform(self, values: Sequence[tuple[str, float | int]]) -> GpuBuffer:
        raw = _uniform_bytes(values)
        wgpu = self.dev.wgpu
        buf = self.dev.acquire(len(raw), wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self.dev.raw.queue.write_buffer(buf.raw, 0, raw)
        self.owned.append(buf)
        return buf

    def release(self) -> None:
        for buf in self.owned:
            self.dev.release(buf)
        self.owned.clear()
        self.cmds.clear()

    # -- commands
    def dispatch(self, kernel: str, entry: str, bindings: Mapping[int, Any], groups: Sequence[int],
                 constants: Mapping[str, float | int | bool] | None = None) -> None:
        dev = self.dev
        g = [int(x) for x in groups] + [1] * (3 - len(groups))
        if min(g) <= 0:
            return
        if max(g) > dev.max_groups_per_dim:
            raise InvalidInput(f"{kernel}.{entry} asks for {g} workgroups; the device allows "
                               f"{dev.max_groups_per_dim} per dimension; use smaller batches")
        pipeline = dev.pipeline(kernel, entry, constants)
        entries = []
        for idx, spec in sorted(bindings.items()):
            buf, offset, size = spec if isinstance(spec, tuple) else (spec, 0, max(spec.nbytes, 4))
            size = -(-int(size) // 4) * 4
            if size > dev.max_binding_bytes and not (buf.usage & dev.wgpu.BufferUsage.UNIFORM):
                raise InvalidInput(
                    f"binding {idx} of {kernel}.{entry} covers {size} bytes but the device allows "
                    f"{dev.max_binding_bytes} per storage binding; use smaller batches (B * T) for this model"
                )
            entries.append({"binding": idx, "resource": {"buffer": buf.raw, "offset": int(offset), "size": size}})
        group = dev.raw.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
        self.cmds.append(("d", pipeline, group, tuple(g)))

    def fold(self, n_groups: int) -> tuple[int, int]:
        lim = self.dev.max_groups_per_dim
        return (n_groups, 1) if n_groups <= lim else (lim, -(-n_groups // lim))

    def clear(self, buf: GpuBuffer, offset: int = 0, size: int | None = None) -> None:
        size = buf.nbytes - offset if size is None else size
        self.cmds.append(("c", buf.raw, int(offset), -(-int(size) // 4) * 4))

    def copy(self, src: GpuBuffer, dst: GpuBuffer, nbytes: int, src_offset: int = 0, dst_offset: int = 0) -> None:
        self.cmds.append(("p", src.raw, int(src_offset), dst.raw, int(dst_offset), -(-int(nbytes) // 4) * 4))

    def record(self, encoder: Any) -> None:
        cpass = None
        for cmd in self.cmds:
            if cmd[0] == "d":
                if cpass is None:
                    cpass = encoder.begin_compute_pass()
                cpass.set_pipeline(cmd[1])
                cpass.set_bind_group(0, cmd[2])
                cpass.dispatch_workgroups(*cmd[3])
                continue
            if cpass is not None:
                cpass.end()
                cpass = None
            if cmd[0] == "c":
                if cmd[3] > 0:
                    encoder.clear_buffer(cmd[1], cmd[2], cmd[3])
            elif cmd[5] > 0:
                encoder.copy_buffer_to_buffer(cmd[1], cmd[2], cmd[3], cmd[4], cmd[5])
        if cpass is not None:
            cpass.end()

    # -- kernels (sizes go into static uniforms; every buffer is a GpuBuffer or (buffer, offset, size))
    def matmul(self, a: Any, b: Any, c: Any, m: int, n: int, k: int, *, trans_a: bool = False,
               trans_b: bool = False, bias: Any = None, accumulate: bool = False, zero: Any = None) -> None:
        vec4 = m % 4 == 0 and n % 4 == 0 and k % 4 == 0
        tile = 128 if vec4 else 64
        consts = {"TRANS_A": trans_a, "TRANS_B": trans_b, "HAS_BIAS": bias is not None, "ACCUMULATE": accumulate}
        dims = self.uniform([("u", m), ("u", n), ("u", k), ("u", 0)])
        self.dispatch("matmul_vec4" if vec4 else "matmul", "main",
                      {0: dims, 1: a, 2: b, 3: bias if bias is not None else zero, 4: c},
                      (-(-n // tile), -(-m // tile), 1), consts)

    def elementwise(self, kernel: str, entry: str, bindings: Mapping[int, Any], n: int,
                    constants: Mapping[str, Any] | None = None) -> None:
        self.dispatch(kernel, entry, bindings, self.fold(-(-n // 256)), constants)


def _uniform_bytes(values: Sequence[tuple[str, float | int]]) -> bytes:
    codes = {"u": "<u4", "i": "<i4", "f": "<f4"}
    raw = b"".join(np.array([v], dtype=codes[kind]).tobytes() for kind, v in values)
    return raw + b"\0" * (-len(raw) % 16)


def _view(buf: GpuBuffer, offset_elems: int, n_elems: int) -> tuple[GpuBuffer, int, int]:
    return (buf, 4 * int(offset_elems), 4 * max(int(n_elems), 1))


class _Layer(NamedTuple):
    """Device tensors of one layer, by local name."""

    conv_norm: GpuBuffer
    conv: GpuBuffer
    moe_norm: GpuBuffer
    router: GpuBuffer
    w1: GpuBuffer
    b1: GpuBuffer
    w2: GpuBuffer
    b2: GpuBuffer


class _Acts(NamedTuple):
    """Activation buffers of one layer's forward (shared by all layers in inference plans)."""

    xn1: GpuBuffer  # (N, C) conv input (normalised x)
    x2: GpuBuffer  # (N, C) after the conv residual
    xn2: GpuBuffer  # (N, C) MoE input
    logits: GpuBuffer  # (N, E) router logits
    idx: GpuBuffer  # (N, k) i32 chosen experts
    gates: GpuBuffer  # (N, k) their gates
    gmat: GpuBuffer  # (N, G) dense gates, G = E + 1
    h: GpuBuffer  # (N, G*H) relu of the stacked first layer
    hs: GpuBuffer  # (N, G*H) h times its gate


class StepResult(NamedTuple):
    """What one training step did."""

    loss: float  # token-weighted mean next-token loss of the step's batches
    grad_norm: float  # global gradient norm before clipping (as LMTrainer records it)
    applied: bool  # False when the step was dropped (a non-finite gradient)
    tokens: int  # predicted positions trained on


# ==== the model ===========================================================================================

class GpuLM:
    """An EvermindLM whose weights live on the GPU: loss and gradients, logits and pooled embeddings.

    Build one with `GpuLM.from_model(model)`; `to_model()` brings the weights back. Not thread-safe.
    """

    def __init__(self, config: LMConfig, params: Mapping[str, np.ndarray], *, device: GpuDevice | None = None) -> None:
        """Upload a model's parameters to the device.

        Args:
            config: the model shape.
            params: {name: array} with exactly the names and shapes of `param_shapes(config)`.
            device: the GPU device; None opens the process-wide one.

        Raises:
            InvalidInput: wrong config, names or shapes, or more than 64 experts.
            GpuUnavailable: no GPU device.
        """
        if not isinstance(config, LMConfig):
            raise InvalidInput(f"GpuLM expected an LMConfig, got {type(config).__name__}.")
        if config.n_experts > _MAX_EXPERTS:
            raise InvalidInput(f"GpuLM supports at most {_MAX_EXPERTS} experts per layer, got {config.n_experts}.")
        checked = EvermindLM.from_params(config, params).params  # validates names, shapes, finiteness
        self.config = config
        self.dev = device if device is not None else get_device()
        self._layout = _layout(config)
        self._index = {t.name: i for i, t in enumerate(self._layout)}
        self._params = [self.dev.upload(_pack(t, checked)) for t in self._layout]
        self._grads: list[GpuBuffer] | None = None
        self._zero = self.dev.storage(16)
        self.dev.write(self._zero, np.zeros(4, dtype=np.float32))
        self._loss = self.dev.storage(16)
        self._plans: dict[str, OrderedDict] = {"train": OrderedDict(), "logits": OrderedDict(), "embed": OrderedDict()}
        self._closed = False

    @classmethod
    def from_model(cls, model: EvermindLM, *, device: GpuDevice | None = None) -> GpuLM:
        """A GpuLM holding a copy of `model`'s weights.

        Args:
            model: the numpy model (not modified).
            device: the GPU device; None opens the process-wide one.

        Returns:
            The resident model.

        Raises:
            InvalidInput: model is not an EvermindLM, or has more than 64 experts.
            GpuUnavailable: no GPU device.
        """
        if not isinstance(model, EvermindLM):
            raise InvalidInput(f"GpuLM.from_model expected an EvermindLM, got {type(model).__name__}.")
        return cls(model.config, model.params, device=device)

    # -- weights ----------------------------------------------------------------------------------------

    def _param(self, name: str) -> GpuBuffer:
        return self._params[self._index[name]]

    def _layer(self, layer: int) -> _Layer:
        p = f"layers.{layer}."
        return _Layer(*(self._param(p + f) for f in _Layer._fields))

    def to_params(self) -> dict[str, np.ndarray]:
        """Read the weights back under their canonical names (param_shapes order).

        Returns:
            {name: float32 array}, new arrays.
        """
        found: dict[str, np.ndarray] = {}
        for t, buf in zip(self._layout, self._params):
            found.update(_unpack(t, self.dev.read(buf, np.float32, t.shape)))
        return {name: found[name] for name in param_shapes(self.config)}

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Overwrite the device weights with `params` (names and shapes of param_shapes(config)).

        Raises:
            InvalidInput: wrong names, shapes or values.
        """
        checked = EvermindLM.from_params(self.config, params).params
        for t, buf in zip(self._layout, self._params):
            self.dev.write(buf, _pack(t, checked))

    def to_model(self) -> EvermindLM:
        """A numpy EvermindLM with the current device weights."""
        return EvermindLM.from_params(self.config, self.to_params())

    def num_parameters(self) -> int:
        """Total number of scalar parameters."""
        return int(sum(int(np.prod(t.shape)) for t in self._layout))

    def close(self) -> None:
        """Give every device buffer back to the pool; the object is unusable afterwards."""
        if self._closed:
            return
        for plans in self._plans.values():
            for plan in plans.values():
                plan.release()
            plans.clear()
        for buf in self._params + (self._grads or []) + [self._zero, self._loss]:
            self.dev.release(buf)
        self._closed = True

    # -- inputs -----------------------------------------------------------------------------------------

    def _prepare(self, tokens: Any, lengths: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
        """Validate a right-padded (B, T) batch; padded positions become id 0. Returns (tokens i32, lengths)."""
        try:
            arr = np.asarray(tokens)  # (B, T)
        except ValueError as exc:
            raise InvalidInput(f"{where} expected a rectangular (B, T) batch of token ids; pad the sequences "
                               "and pass lengths.") from exc
        if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1 or arr.dtype.kind not in "iu":
            raise InvalidInput(f"{where} expected integer tokens of shape (B, T) with B, T >= 1, got "
                               f"shape {arr.shape} dtype {arr.dtype}.")
        b, t = arr.shape
        lens = np.full(b, t, dtype=np.int64) if lengths is None else np.asarray(lengths)  # (B,)
        if lens.shape != (b,) or lens.dtype.kind not in "iu" or lens.min() < 1 or lens.max() > t:
            raise InvalidInput(f"{where} expected integer lengths of shape ({b},) in [1, {t}], got "
                               f"shape {lens.shape} dtype {lens.dtype}.")
        real = np.arange(t)[None, :] < lens[:, None]  # (B, T)
        ids = arr[real]  # (N_real,)
        v = self.config.vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= v):
            bad = np.argwhere(real & ((arr < 0) | (arr >= v)))[0]
            raise InvalidInput(f"{where} expected token ids in [0, {v}), got {int(arr[tuple(bad)])} at "
                               f"(batch {bad[0]}, position {bad[1]}). Check the tokenizer's vocab_size.")
        clean = np.where(real, arr, 0).astype(np.int32)  # (B, T)
        return clean, lens.astype(np.int64)

    def _write_train_inputs(self, plan: _Plan, tokens: np.ndarray, lengths: np.ndarray, weight: float) -> int:
        """Fill a train plan's input buffers; returns the number of predicted positions."""
        b, t = tokens.shape
        dev = self.dev
        pos = np.arange(t)  # (T,)
        predicted = pos[None, :] < (lengths - 1)[:, None]  # (B, T)
        targets = np.zeros((b, t), dtype=np.int32)  # (B, T)
        targets[:, :-1] = tokens[:, 1:]
        targets[~predicted] = 0
        cew = np.where(predicted, np.float32(weight), np.float32(0.0)).astype(np.float32)  # (B, T)
        flat = tokens.reshape(-1)  # (N,)
        real_rows = np.flatnonzero((pos[None, :] < lengths[:, None]).reshape(-1))  # (N_real,)
        order = real_rows[np.argsort(flat[real_rows], kind="stable")]  # (N_real,) grouped by id
        uniq, counts = np.unique(flat[order], return_counts=True)  # (U,)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)  # (U + 1,)
        dev.write(plan.inputs["ids"], flat)
        dev.write(plan.inputs["targets"], targets.reshape(-1))
        dev.write(plan.inputs["cew"], cew.reshape(-1))
        dev.write(plan.inputs["uniq"], uniq.astype(np.int32))
        dev.write(plan.inputs["offsets"], offsets)
        dev.write(plan.inputs["order"], order.astype(np.uint32))
        dev.write(plan.inputs["scatter_u"], np.array([uniq.size, self.config.d_model, 0, 0], dtype=np.int32))
        return int(predicted.sum())

    # -- plans --------------------------------------------------------------------------------------------

    def _plan(self, kind: str, b: int, t: int) -> _Plan:
        cache = self._plans[kind]
        key = (b, t)
        plan = cache.get(key)
        if plan is not None:
            cache.move_to_end(key)
            return plan
        if len(cache) >= _PLAN_CACHE:
            _, old = cache.popitem(last=False)
            old.release()
        plan = _Plan(self.dev)
        try:
            self._build(plan, kind, b, t)
        except Exception:
            plan.release()
            raise
        cache[key] = plan
        return plan

    def _acts(self, plan: _Plan, n: int) -> _Acts:
        cfg = self.config
        c, e, k, g = cfg.d_model, cfg.n_experts, cfg.top_k, cfg.n_experts + 1
        gh = g * cfg.hidden_dim
        return _Acts(plan.buffer(n * c * 4), plan.buffer(n * c * 4), plan.buffer(n * c * 4), plan.buffer(n * e * 4),
                     plan.buffer(n * k * 4), plan.buffer(n * k * 4), plan.buffer(n * g * 4), plan.buffer(n * gh * 4),
                     plan.buffer(n * gh * 4))

    def _build(self, plan: _Plan, kind: str, b: int, t: int) -> None:
        cfg = self.config
        n, c, v = b * t, cfg.d_model, cfg.vocab_size
        ids = plan.buffer(n * 4, "ids")
        rinv = plan.buffer(n * 4)
        train = kind == "train"
        xs = [plan.buffer(n * c * 4) for _ in range(cfg.n_layers + 1 if train else 2)]
        acts = [self._acts(plan, n) for _ in range(cfg.n_layers if train else 1)]
        emb = self._param("emb")
        plan.elementwise("gather_rows", "main",
                         {0: plan.uniform([("u", n), ("u", c), ("i", 0), ("i", v)]), 1: emb, 2: ids, 3: xs[0]}, n * c)
        for layer in range(cfg.n_layers):
            x_in = xs[layer] if train else xs[layer % 2]
            x_out = xs[layer + 1] if train else xs[(layer + 1) % 2]
            self._layer_forward(plan, layer, x_in, x_out, acts[layer if train else 0], rinv, b, t)
        x_final = xs[-1] if train else xs[cfg.n_layers % 2]
        if kind == "logits":
            out = plan.buffer(n * v * 4, "out")
            for r0, r1 in self._head_chunks(n):
                plan.matmul(_view(x_final, r0 * c, (r1 - r0) * c), emb, _view(out, r0 * v, (r1 - r0) * v),
                            r1 - r0, v, c, trans_b=True, zero=self._zero)
        elif kind == "embed":
            self._pool(plan, x_final, rinv, b, t)
        else:
            self._head_backward(plan, x_final, b, t, xs, acts, rinv)

    def _head_chunks(self, n: int) -> list[tuple[int, int]]:
        """Row ranges of the tied head: multiples of 64 rows (aligned binding offsets), bounded logits."""
        v = self.config.vocab_size
        limit = min(self.dev.max_binding_bytes, _HEAD_CHUNK_BYTES)
        rows = max(64, (limit // (v * 4)) // 64 * 64)
        return [(r0, min(n, r0 + rows)) for r0 in range(0, n, rows)]

    def _layer_forward(self, plan: _Plan, layer: int, x: GpuBuffer, out: GpuBuffer, a: _Acts, rinv: GpuBuffer,
                       b: int, t: int) -> None:
        """out = x2 + MoE(norm(x2)), x2 = x + conv(norm(x)); keeps the backward's activations in `a`."""
        cfg = self.config
        n, c, e, k, g = b * t, cfg.d_model, cfg.n_experts, cfg.top_k, cfg.n_experts + 1
        gh = g * cfg.hidden_dim
        w = self._layer(layer)
        norm_u = plan.uniform([("u", n), ("u", c), ("f", RMS_EPS), ("u", 0)])
        plan.dispatch("rmsnorm", "main", {0: norm_u, 1: x, 2: w.conv_norm, 3: a.xn1, 4: rinv}, plan.fold(n))
        conv_u = plan.uniform([("u", t), ("u", c), ("u", cfg.conv_kernel), ("u", b), ("u", 1)])
        plan.elementwise("conv1d_causal", "main", {0: conv_u, 1: a.xn1, 2: w.conv, 3: self._zero, 4: a.x2},
                         n * c, {"HAS_BIAS": False})
        plan.elementwise("axpy", "main", {0: plan.uniform([("u", n * c), ("f", 1.0), ("u", 0), ("u", 0)]),
                                          1: x, 2: a.x2}, n * c)
        plan.dispatch("rmsnorm", "main", {0: norm_u, 1: a.x2, 2: w.moe_norm, 3: a.xn2, 4: rinv}, plan.fold(n))
        plan.matmul(a.xn2, w.router, a.logits, n, e, c, zero=self._zero)
        route_u = plan.uniform([("u", n), ("u", e), ("u", k), ("u", 0)])
        plan.dispatch("moe_route", "main", {0: route_u, 1: a.logits, 2: a.idx, 3: a.gates}, plan.fold(-(-n // 64)))
        plan.dispatch("moe_gates", "dense", {0: route_u, 1: a.idx, 2: a.gates, 3: a.gmat}, plan.fold(-(-n // 64)))
        plan.matmul(a.xn2, w.w1, a.h, n, gh, c, bias=w.b1, zero=self._zero)
        plan.elementwise("moe_hidden", "forward",
                         {0: plan.uniform([("u", n), ("u", g), ("u", cfg.hidden_dim), ("u", 0)]), 1: a.h,
                          2: a.gmat, 3: a.hs}, n * gh)
        plan.copy(a.x2, out, n * c * 4)
        plan.matmul(a.hs, w.w2, out, n, c, gh, accumulate=True, zero=self._zero)
        plan.matmul(a.gmat, w.b2, out, n, c, g, accumulate=True, zero=self._zero)

    def _head_backward(self, plan: _Plan, x_final: GpuBuffer, b: int, t: int, xs: list[GpuBuffer],
                       acts: list[_Acts], rinv: GpuBuffer) -> None:
        """Loss, then the backward of the head, every layer and the lookup, accumulating into the grads."""
        cfg = self.config
        n, c, v, e, g = b * t, cfg.d_model, cfg.vocab_size, cfg.n_experts, cfg.n_experts + 1
        gh = g * cfg.hidden_dim
        grads = self._grad_buffers()
        d_emb = grads[self._index["emb"]]
        targets, cew = plan.buffer(n * 4, "targets"), plan.buffer(n * 4, "cew")
        loss_rows = plan.buffer(n * 4)
        dx_a, dx_b = plan.buffer(n * c * 4), plan.buffer(n * c * 4)
        chunks = self._head_chunks(n)
        rows = max(r1 - r0 for r0, r1 in chunks)
        logits, dlogits = plan.buffer(rows * v * 4), plan.buffer(rows * v * 4)
        emb = self._param("emb")
        for r0, r1 in chunks:
            m = r1 - r0
            x_rows = _view(x_final, r0 * c, m * c)
            plan.matmul(x_rows, emb, logits, m, v, c, trans_b=True, zero=self._zero)
            plan.dispatch("cross_entropy", "main",
                          {0: plan.uniform([("u", m), ("u", v), ("u", 0), ("u", 0)]), 1: _view(logits, 0, m * v),
                           2: _view(targets, r0, m), 3: _view(cew, r0, m), 4: _view(dlogits, 0, m * v),
                           5: _view(loss_rows, r0, m)}, plan.fold(m))
            plan.matmul(_view(dlogits, 0, m * v), emb, _view(dx_a, r0 * c, m * c), m, c, v, zero=self._zero)
            plan.matmul(_view(dlogits, 0, m * v), x_rows, d_emb, v, c, m, trans_a=True, accumulate=True,
                        zero=self._zero)
        plan.dispatch("column_sum", "main", {0: plan.uniform([("u", n), ("u", 1), ("u", 0), ("u", 0)]),
                                             1: loss_rows, 2: self._loss}, (1, 1, 1), {"ACCUMULATE": True})
        scratch = {"dx2": plan.buffer(n * c * 4), "dxn": plan.buffer(n * c * 4), "dhs": plan.buffer(n * gh * 4),
                   "dgmat": plan.buffer(n * g * 4), "dlog": plan.buffer(n * e * 4), "db": plan.buffer(c * 4)}
        dx_out, dx_in = dx_a, dx_b
        for layer in reversed(range(cfg.n_layers)):
            self._layer_backward(plan, layer, xs[layer], acts[layer], dx_out, dx_in, scratch, rinv, b, t)
            dx_out, dx_in = dx_in, dx_out
        scatter_u = self.dev.acquire(16, self.dev.wgpu.BufferUsage.UNIFORM | self.dev.wgpu.BufferUsage.COPY_DST)
        plan.owned.append(scatter_u)
        plan.inputs["scatter_u"] = scatter_u
        plan.elementwise("embedding_scatter_add", "main",
                         {0: scatter_u, 1: dx_out, 2: plan.buffer(n * 4, "uniq"),
                          3: plan.buffer((n + 1) * 4, "offsets"), 4: plan.buffer(n * 4, "order"), 5: d_emb},
                         n * c, {"ACCUMULATE": True})

    def _layer_backward(self, plan: _Plan, layer: int, x: GpuBuffer, a: _Acts, dout: GpuBuffer, dx: GpuBuffer,
                        s: dict[str, GpuBuffer], rinv: GpuBuffer, b: int, t: int) -> None:
        """dx = d(layer input) from dout = d(layer output); adds every weight gradient into the grads."""
        cfg = self.config
        n, c, e, k, g = b * t, cfg.d_model, cfg.n_experts, cfg.top_k, cfg.n_experts + 1
        gh = g * cfg.hidden_dim
        w = self._layer(layer)
        gr = self._grad_buffers()
        d = {f: gr[self._index[f"layers.{layer}.{f}"]] for f in _Layer._fields}
        z = self._zero
        # MoE: out = x2 + hs @ W2 + gmat @ B2, hs = gate * relu(xn2 @ W1 + B1), gates from xn2 @ router.
        plan.matmul(a.gmat, dout, d["b2"], g, c, n, trans_a=True, accumulate=True, zero=z)
        plan.matmul(dout, w.b2, s["dgmat"], n, g, c, trans_b=True, zero=z)
        plan.matmul(a.hs, dout, d["w2"], gh, c, n, trans_a=True, accumulate=True, zero=z)
        plan.matmul(dout, w.w2, s["dhs"], n, gh, c, trans_b=True, zero=z)
        plan.dispatch("moe_hidden", "backward",
                      {0: plan.uniform([("u", n), ("u", g), ("u", cfg.hidden_dim), ("u", 0)]), 2: a.gmat, 4: a.h,
                       5: s["dhs"], 6: s["dgmat"]}, plan.fold(n * g), {"ACCUMULATE": True})
        plan.matmul(a.xn2, s["dhs"], d["w1"], c, gh, n, trans_a=True, accumulate=True, zero=z)
        plan.dispatch("column_sum", "main", {0: plan.uniform([("u", n), ("u", gh), ("u", 0), ("u", 0)]),
                                             1: s["dhs"], 2: d["b1"]}, (-(-gh // 64), 1, 1), {"ACCUMULATE": True})
        plan.matmul(s["dhs"], w.w1, s["dxn"], n, c, gh, trans_b=True, zero=z)
        route_u = plan.uniform([("u", n), ("u", e), ("u", k), ("u", 0)])
        plan.dispatch("moe_gates", "backward", {0: route_u, 1: a.idx, 2: a.gates, 4: s["dgmat"], 5: s["dlog"]},
                      plan.fold(-(-n // 64)))
        plan.matmul(a.xn2, s["dlog"], d["router"], c, e, n, trans_a=True, accumulate=True, zero=z)
        plan.matmul(s["dlog"], w.router, s["dxn"], n, c, e, trans_b=True, accumulate=True, zero=z)
        norm_u = plan.uniform([("u", n), ("u", c), ("f", RMS_EPS), ("u", 0)])
        plan.dispatch("rmsnorm_backward", "dx_main", {0: norm_u, 1: a.x2, 2: w.moe_norm, 3: s["dxn"], 4: s["dx2"],
                                                      5: rinv}, plan.fold(n))
        plan.dispatch("rmsnorm_backward", "dw_main", {0: norm_u, 1: a.x2, 3: s["dxn"], 5: rinv, 6: d["moe_norm"]},
                      (-(-c // 64), 1, 1), {"ACCUMULATE": True})
        add_u = plan.uniform([("u", n * c), ("f", 1.0), ("u", 0), ("u", 0)])
        plan.elementwise("axpy", "main", {0: add_u, 1: dout, 2: s["dx2"]}, n * c)
        # Conv: x2 = x + conv(xn1), xn1 = norm(x).
        conv_u = plan.uniform([("u", t), ("u", c), ("u", cfg.conv_kernel), ("u", b), ("u", 1)])
        plan.elementwise("conv1d_causal_backward", "dx_main", {0: conv_u, 2: w.conv, 3: s["dx2"], 4: s["dxn"]}, n * c)
        plan.dispatch("conv1d_causal_backward", "dw_main", {0: conv_u, 1: a.xn1, 3: s["dx2"], 5: d["conv"], 6: s["db"]},
                      (-(-c // 64), cfg.conv_kernel, 1), {"ACCUMULATE": True})
        plan.dispatch("rmsnorm_backward", "dx_main", {0: norm_u, 1: x, 2: w.conv_norm, 3: s["dxn"], 4: dx, 5: rinv},
                      plan.fold(n))
        plan.dispatch("rmsnorm_backward", "dw_main", {0: norm_u, 1: x, 3: s["dxn"], 5: rinv, 6: d["conv_norm"]},
                      (-(-c // 64), 1, 1), {"ACCUMULATE": True})
        plan.elementwise("axpy", "main", {0: add_u, 1: s["dx2"], 2: dx}, n * c)

    def _pool(self, plan: _Plan, x: GpuBuffer, rinv: GpuBuffer, b: int, t: int) -> None:
        """The embedder's pooling: [x += attn(norm(x)); x = norm(x)] when attn_heads, then the normalised mean."""
        cfg = self.config
        n, c = b * t, cfg.d_model
        lengths = plan.buffer(b * 4, "lengths")
        out = plan.buffer(b * c * 4, "out")
        if cfg.attn_heads:
            a, qkv, o, zres = (plan.buffer(n * c * 4), plan.buffer(n * 3 * c * 4), plan.buffer(n * c * 4),
                               plan.buffer(n * c * 4))
            norm_u = plan.uniform([("u", n), ("u", c), ("f", RMS_EPS), ("u", 0)])
            plan.dispatch("rmsnorm", "main", {0: norm_u, 1: x, 2: self._param("pool.attn_norm"), 3: a, 4: rinv},
                          plan.fold(n))
            plan.matmul(a, self._param("pool.wqkv"), qkv, n, 3 * c, c, zero=self._zero)
            att_u = plan.uniform([("u", b), ("u", t), ("u", c), ("u", cfg.attn_heads),
                                  ("f", 1.0 / math.sqrt(c // cfg.attn_heads)), ("u", 0), ("u", 0), ("u", 0)])
            plan.dispatch("pool_attention", "main", {0: att_u, 1: qkv, 2: lengths, 3: o},
                          plan.fold(b * cfg.attn_heads * t))
            plan.copy(x, zres, n * c * 4)
            plan.matmul(o, self._param("pool.wo"), zres, n, c, c, accumulate=True, zero=self._zero)
            plan.dispatch("rmsnorm", "main", {0: norm_u, 1: zres, 2: self._param("pool.out_norm"), 3: a, 4: rinv},
                          plan.fold(n))
            x = a
        plan.dispatch("mean_pool", "main", {0: plan.uniform([("u", b), ("u", t), ("u", c), ("u", 0)]), 1: x,
                                            2: lengths, 3: out}, plan.fold(b))

    def _grad_buffers(self) -> list[GpuBuffer]:
        if self._grads is None:
            self._grads = [self.dev.storage(int(np.prod(t.shape)) * 4) for t in self._layout]
        return self._grads

    # -- running ----------------------------------------------------------------------------------------

    def _encoder(self, clear_grads: bool) -> Any:
        enc = self.dev.raw.create_command_encoder()
        if clear_grads:
            for buf in self._grad_buffers():
                enc.clear_buffer(buf.raw, 0, -(-buf.nbytes // 4) * 4)
            enc.clear_buffer(self._loss.raw, 0, 16)
        return enc

    def _record_batches(self, batches: Sequence[tuple[np.ndarray, np.ndarray]], where: str,
                        tail: Any = None) -> int:
        """Record and submit forward + backward of each batch (grads summed, CE weight 1 / total positions).

        One submit per batch (their inputs share buffers); `tail(encoder)` records into the last one.
        Returns the number of predicted positions.
        """
        prepared = [self._prepare(tok, lens, where) for tok, lens in batches]
        total = int(sum(int(np.maximum(lens - 1, 0).sum()) for _, lens in prepared))
        if total == 0:
            raise InvalidInput(f"{where} expected at least one sequence with >= 2 tokens; every sequence has 1.")
        for i, (tok, lens) in enumerate(prepared):
            plan = self._plan("train", *tok.shape)
            self._write_train_inputs(plan, tok, lens, 1.0 / total)
            enc = self._encoder(clear_grads=i == 0)
            plan.record(enc)
            if tail is not None and i == len(prepared) - 1:
                tail(enc)
            self.dev.raw.queue.submit([enc.finish()])
        return total

    def loss_and_grads(self, tokens: Any, lengths: Any = None) -> tuple[float, dict[str, np.ndarray]]:
        """Mean next-token cross-entropy over real predicted positions and its gradients (read back).

        Args:
            tokens: (B, T) integer ids; positions at or after lengths[b] are padding.
            lengths: (B,) real lengths; None means no padding.

        Returns:
            (loss, {name: float32 gradient} in param_shapes order), as EvermindLM.loss_and_grads.

        Raises:
            InvalidInput: bad inputs, or no sequence has two or more tokens.
        """
        self._record_batches([(tokens, lengths)], "loss_and_grads()")
        loss = float(self.dev.read(self._loss, np.float32, (1,))[0])
        return loss, self._read_grads()

    def _read_grads(self) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        for t, buf in zip(self._layout, self._grad_buffers()):
            found.update(_unpack(t, self.dev.read(buf, np.float32, t.shape)))
        return {name: found[name] for name in param_shapes(self.config)}

    def forward(self, tokens: Any, lengths: Any = None) -> np.ndarray:
        """Next-token logits for every position of a right-padded batch.

        Args:
            tokens: (B, T) integer ids; positions at or after lengths[b] are padding.
            lengths: (B,) real lengths; None means no padding.

        Returns:
            (B, T, V) float32 logits; rows at padded positions are zero.

        Raises:
            InvalidInput: bad shapes, dtypes, lengths or token ids, or a batch too large for the device.
        """
        tok, lens = self._prepare(tokens, lengths, "forward()")
        b, t = tok.shape
        plan = self._plan("logits", b, t)
        self.dev.write(plan.inputs["ids"], tok.reshape(-1))
        enc = self._encoder(clear_grads=False)
        plan.record(enc)
        self.dev.raw.queue.submit([enc.finish()])
        logits = self.dev.read(plan.inputs["out"], np.float32, (b, t, self.config.vocab_size))  # (B, T, V)
        logits[np.arange(t)[None, :] >= lens[:, None]] = 0.0
        return logits

    def embed_batch(self, token_lists: Sequence[Sequence[int]]) -> np.ndarray:
        """Embeddings of many token sequences (EvermindLM.embed_batch on the GPU, same vectors within 1e-4).

        Args:
            token_lists: sequence of non-empty token-id lists.

        Returns:
            (N, C) float32 unit rows, row i the embedding of token_lists[i]; (0, C) for an empty input.

        Raises:
            InvalidInput: an empty list or ids out of range (the message names the index).
        """
        seqs = [self._prepare_list(tokens, f"embed_batch() item {i}") for i, tokens in enumerate(token_lists)]
        c = self.config.d_model
        out = np.zeros((len(seqs), c), dtype=np.float32)  # (N, C)
        if not seqs:
            return out
        lens = np.array([s.size for s in seqs], dtype=np.int64)  # (N,)
        order = np.argsort(lens, kind="stable")  # (N,) short to long: a bucket pads little
        start = 0
        while start < order.size:
            t = _round_len(int(lens[order[start]]))
            cap = self._embed_rows(t)
            stop = start
            while stop < order.size and stop - start < cap and _round_len(int(lens[order[stop]])) == t:
                stop += 1
            ids = order[start:stop]  # (b,)
            out[ids] = self._embed_bucket([seqs[i] for i in ids], t, cap)
            start = stop
        return out

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """Embedding of one token sequence: (C,) float32 of unit norm (see embed_batch).

        Raises:
            InvalidInput: empty list or ids out of range.
        """
        return self.embed_batch([tokens])[0]

    def _prepare_list(self, tokens: Any, where: str) -> np.ndarray:
        if isinstance(tokens, (str, bytes)):
            raise InvalidInput(f"{where} expected a list of token ids, got {type(tokens).__name__}; encode text first.")
        arr = np.asarray(tokens)  # (T,)
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise InvalidInput(f"{where} expected a non-empty flat list of integer token ids, got shape "
                               f"{arr.shape} dtype {arr.dtype}.")
        v = self.config.vocab_size
        if arr.min() < 0 or arr.max() >= v:
            i = int(np.argmax((arr < 0) | (arr >= v)))
            raise InvalidInput(f"{where} expected token ids in [0, {v}), got {int(arr[i])} at position {i}. "
                               "Check that the tokenizer's vocab_size matches LMConfig.vocab_size.")
        return arr.astype(np.int32)

    def _embed_rows(self, t: int) -> int:
        """Sequences per embedding forward at padded length t (bounded by the widest activation's binding)."""
        cfg = self.config
        widest = max((cfg.n_experts + 1) * cfg.hidden_dim, 3 * cfg.d_model) * 4
        rows = min(_EMBED_TOKENS, self.dev.max_binding_bytes // widest)
        return max(1, min(_EMBED_SEQS, rows // t))

    def _embed_bucket(self, seqs: list[np.ndarray], t: int, b: int) -> np.ndarray:
        """Embed up to b sequences of length <= t in one plan (dummy one-token rows fill the bucket)."""
        lens = np.ones(b, dtype=np.int64)  # (b,)
        lens[: len(seqs)] = [s.size for s in seqs]
        tok = np.zeros((b, t), dtype=np.int32)  # (b, t)
        mask = np.arange(t)[None, :] < lens[:, None]  # (b, t)
        mask[len(seqs):] = False
        tok[mask] = np.concatenate(seqs)
        if self.config.attn_heads and t > _POOL_MAX_T:
            return self._embed_fallback(tok, lens)[: len(seqs)]
        plan = self._plan("embed", b, t)
        self.dev.write(plan.inputs["ids"], tok.reshape(-1))
        self.dev.write(plan.inputs["lengths"], lens.astype(np.uint32))
        enc = self._encoder(clear_grads=False)
        plan.record(enc)
        self.dev.raw.queue.submit([enc.finish()])
        return self.dev.read(plan.inputs["out"], np.float32, (b, self.config.d_model))[: len(seqs)]

    def _embed_fallback(self, tok: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """Buckets longer than pool_attention's 1024 positions: embedded by numpy from the device weights."""
        model = self.to_model()
        lists = [row[:n].tolist() for row, n in zip(tok, lens)]
        return model.embed_batch(lists)


def _round_len(t: int) -> int:
    """Padded length of an embedding bucket: about four plan shapes per doubling of the length."""
    q = 8 if t <= 64 else 1 << (t.bit_length() - 3)
    return -(-t // q) * q


# ==== training ============================================================================================

class GpuTrainer:
    """The device half of `LMTrainer(device="gpu")`: one optimizer step per call with weights, gradients and
    AdamW moments resident on the GPU (forward, backward, global-norm clip and AdamW in one submit).

    It mirrors `LMTrainer._train_step` for a plain EvermindLM: token-weighted accumulation over the window's
    micro-batches, clip to `config.clip`, decoupled decay on 2-D weights only, the trust region and the
    whole-step drop on a non-finite gradient. Mixed precision is not supported here (fp32 on the device);
    `checkpoint` and `shards` do not change the result, so they are accepted and ignored.

    LMTrainer integration (trainer.py, owner: training helper), with `self._gpu = None` by default:
        __init__:            if device == "gpu": self._gpu = GpuTrainer(model, config, self.optimizers)
        _train_step, first:  if self._gpu is not None: return self._gpu.trainer_step(self, batches, lr)
        fit (finally:), and before _eval_loss / save_training_checkpoint:  if self._gpu: self._gpu.pull()
        load_training_checkpoint, at the end:                              if self._gpu: self._gpu.push()
    Not thread-safe.
    """

    def __init__(self, model: EvermindLM, config: Any, optimizers: Sequence[Any] | None = None, *,
                 device: GpuDevice | None = None) -> None:
        """Upload the model (and the optimizers' moments, when given) to the device.

        Args:
            model: the EvermindLM trained in place (its params are written back by `pull`).
            config: a training.trainer.TrainConfig (lr schedule is passed per step; betas, eps,
                weight_decay, max_delta and clip are read here).
            optimizers: the trainer's AdamW instances (their moments and step count are the starting state,
                and `pull` writes back into them); None starts from zero moments.
            device: the GPU device; None opens the process-wide one.

        Raises:
            InvalidInput: a model other than an EvermindLM, or mixed precision asked for.
            GpuUnavailable: no GPU device.
        """
        if not isinstance(model, EvermindLM):
            raise InvalidInput(f"the GPU trainer needs an EvermindLM, got {type(model).__name__}; "
                               "train LoRA adapters on the CPU path (device='cpu').")
        if getattr(config, "mixed_precision", False):
            raise InvalidInput("the GPU trainer runs in float32; set TrainConfig(mixed_precision=False) "
                               "or train on the CPU path.")
        self.model = model
        self.config = config
        self.optimizers = list(optimizers or [])
        self.gpu = GpuLM.from_model(model, device=device)
        dev = self.gpu.dev
        sizes = [int(np.prod(t.shape)) for t in self.gpu._layout]
        self._m = [dev.storage(n * 4) for n in sizes]
        self._v = [dev.storage(n * 4) for n in sizes]
        self.t = 0
        align = int(dev.raw.limits.get("min-uniform-buffer-offset-alignment", 256))
        self._stride = -(-48 // align) * align
        u = dev.wgpu.BufferUsage
        self._hp = dev.acquire(self._stride * len(sizes), u.UNIFORM | u.COPY_DST)
        self._ctl, self._flag = dev.storage(16), dev.storage(16)  # [scale, norm], [drop flag]
        self._staging = dev.acquire(48, u.MAP_READ | u.COPY_DST)
        self._opt = self._build_optimizer(sizes)
        self.push()

    def _build_optimizer(self, sizes: list[int]) -> _Plan:
        """Global norm + clip scale, scale the grads, AdamW check then apply; stats copied for the read back."""
        gpu = self.gpu
        plan = _Plan(gpu.dev)
        grads = gpu._grad_buffers()
        n_part = [-(-n // _SUMSQ_CHUNK) for n in sizes]
        slots = np.concatenate([[0], np.cumsum(n_part)]).astype(int)  # (n_tensors + 1,)
        partials = plan.buffer(int(slots[-1]) * 4)
        ctl, flag = self._ctl, self._flag
        for g, n, slot in zip(grads, sizes, slots):
            u = plan.uniform([("u", n), ("u", int(slot)), ("u", 0), ("u", 0)] + [("f", 0.0)] * 4)
            plan.dispatch("sum_squares", "partial", {0: u, 1: g, 2: partials}, plan.fold(-(-n // _SUMSQ_CHUNK)))
        clip = float(getattr(self.config, "clip", 0.0))
        fin = plan.uniform([("u", 0), ("u", 0), ("u", int(slots[-1])), ("u", 0), ("f", 1.0), ("f", clip),
                            ("f", 0.0), ("f", 0.0)])
        plan.dispatch("sum_squares", "finish", {0: fin, 2: partials, 3: ctl, 4: flag}, (1, 1, 1))
        for g, n in zip(grads, sizes):
            u = plan.uniform([("u", n), ("u", 0), ("u", 0), ("u", 0)] + [("f", 0.0)] * 4)
            plan.elementwise("sum_squares", "scale", {0: u, 3: ctl, 5: g}, n)
        hp = [(self._hp, i * self._stride, 48) for i in range(len(sizes))]
        for i, n in enumerate(sizes):
            plan.elementwise("adamw_update", "check", {0: hp[i], 2: grads[i], 3: self._m[i], 4: self._v[i], 5: flag}, n)
        for i, n in enumerate(sizes):
            plan.elementwise("adamw_update", "apply", {0: hp[i], 1: gpu._params[i], 2: grads[i], 3: self._m[i],
                                                       4: self._v[i], 5: flag}, n)
        plan.copy(self._ctl, self._staging, 16)
        plan.copy(self._flag, self._staging, 16, dst_offset=16)
        plan.copy(gpu._loss, self._staging, 16, dst_offset=32)
        return plan

    def _write_hyper(self, lr: float, t: int) -> None:
        cfg = self.config
        b1, b2 = (float(x) for x in cfg.betas)
        rows = np.zeros((len(self.gpu._layout), self._stride // 4), dtype=np.float32)  # (n_tensors, stride/4)
        rows[:, 0] = np.array([int(np.prod(tt.shape)) for tt in self.gpu._layout], dtype=np.uint32).view(np.float32)
        rows[:, 1] = lr
        rows[:, 2], rows[:, 3], rows[:, 4] = b1, b2, float(cfg.eps)
        rows[:, 5] = [float(cfg.weight_decay) if tt.decay else 0.0 for tt in self.gpu._layout]
        rows[:, 6], rows[:, 7] = b1 ** t, b2 ** t
        rows[:, 8] = float(cfg.max_delta)
        rows[:, 9] = 1.0  # the clip scale is already applied to the gradients by sum_squares.scale
        self.gpu.dev.raw.queue.write_buffer(self._hp.raw, 0, rows)

    def step(self, batches: Sequence[tuple[Any, Any]], lr: float) -> StepResult:
        """One optimizer step over a window of micro-batches, resident on the device.

        Args:
            batches: (tokens (B, T), lengths (B,) or None) per micro-batch; their gradients are summed
                weighted by predicted positions (one batch of all of them).
            lr: learning rate of this step.

        Returns:
            StepResult(loss, grad_norm, applied, tokens).

        Raises:
            InvalidInput: bad batches, or no sequence with two or more tokens.
        """
        if not batches:
            raise InvalidInput("step() expected at least one (tokens, lengths) batch, got none.")
        self._write_hyper(float(lr), self.t + 1)
        total = self.gpu._record_batches(batches, "step()", tail=self._opt.record)
        st = self._staging.raw
        st.map_sync(self.gpu.dev.wgpu.MapMode.READ, 0, self._staging.capacity)
        try:
            raw = np.frombuffer(st.read_mapped(0, 48), dtype=np.uint8).copy()  # (48,)
        finally:
            st.unmap()
        ctl = raw.view(np.float32)  # (12,)
        applied = int(raw[16:20].view(np.uint32)[0]) == 0
        if applied:
            self.t += 1
        return StepResult(float(ctl[8]), float(ctl[1]), applied, total)

    def trainer_step(self, trainer: Any, batches: Sequence[tuple[np.ndarray, np.ndarray, int]], lr: float) -> float:
        """`LMTrainer._train_step` on the device: the step plus the trainer's history; returns the loss.

        Args:
            trainer: the LMTrainer whose history is updated.
            batches: its (tokens, lengths, n_pred) micro-batches.
            lr: learning rate of this step.

        Returns:
            The step's token-weighted mean loss.
        """
        res = self.step([(tok, lens) for tok, lens, _ in batches], lr)
        h = trainer.history
        h.losses.append(res.loss)
        h.lrs.append(lr)
        h.grad_norms.append(res.grad_norm)
        h.tokens += res.tokens
        if not res.applied:
            h.skipped += 1
        return res.loss

    def pull(self) -> None:
        """Copy the device weights into model.params (in place) and the moments and step count into the optimizers."""
        dev = self.gpu.dev
        params = self.gpu.to_params()
        for name, arr in params.items():
            self.model.params[name][...] = arr
        if not self.optimizers:
            return
        m: dict[str, np.ndarray] = {}
        v: dict[str, np.ndarray] = {}
        for t, mb, vb in zip(self.gpu._layout, self._m, self._v):
            m.update(_unpack(t, dev.read(mb, np.float32, t.shape)))
            v.update(_unpack(t, dev.read(vb, np.float32, t.shape)))
        for opt in self.optimizers:
            for name in opt.owned:
                opt.m[name][...] = m[name]
                opt.v[name][...] = v[name]
            opt.t = self.t

    def push(self) -> None:
        """Upload model.params and the optimizers' moments and step count (after a checkpoint load)."""
        dev = self.gpu.dev
        self.gpu.load_params(self.model.params)
        shapes = param_shapes(self.gpu.config)
        m = {n: np.zeros(s, dtype=np.float32) for n, s in shapes.items()}  # (per param)
        v = {n: np.zeros(s, dtype=np.float32) for n, s in shapes.items()}  # (per param)
        self.t = 0
        for opt in self.optimizers:
            for name in opt.owned:
                m[name], v[name] = opt.m[name], opt.v[name]
            self.t = int(opt.t)
        for t, mb, vb in zip(self.gpu._layout, self._m, self._v):
            dev.write(mb, _pack(t, m))
            dev.write(vb, _pack(t, v))

    def close(self) -> None:
        """Give the device buffers back (weights are not pulled first)."""
        dev = self.gpu.dev
        self._opt.release()
        for buf in self._m + self._v + [self._hp, self._ctl, self._flag, self._staging]:
            dev.release(buf)
        self.gpu.close()

