"""EvermindLM resident on the GPU: loss, exact gradients, AdamW steps, logits and pooled embeddings in WGSL.

Weights, moments and activations stay on the device; a batch shape's commands are recorded once into a plan
and replayed (gpu/plan.py), so a training step is one submit and one 48-byte read back (gpu/trainer.py).
Routed experts run densely beside the shared one (an unchosen expert has gate 0: it adds and receives
nothing, as lm/model.py's sparse dispatch)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import GpuBuffer, GpuDevice, get_device
from evermind_memory.lm.layers import RMS_EPS
from evermind_memory.gpu.ops.support import MAX_EXPERTS
from evermind_memory.gpu.plan import DeviceTensor, Plan, buffer_view, device_layout, pack_tensor, unpack_tensor
from evermind_memory.lm.model import EvermindLM, LMConfig, param_shapes

__all__ = ["GpuLM", "TrainingView"]

_POOL_MAX_T = 1024  # pool_attention.wgsl keeps one query's scores in workgroup memory
_HEAD_CHUNK_BYTES = 256 * 1024 * 1024  # logits of one head chunk (rows x V float32), at most
_EMBED_SEQS = 64  # sequences per embed_batch forward, at most
_EMBED_TOKENS = 16384  # padded positions per embed_batch forward, at most
_PLAN_CACHE = 4  # batch shapes whose plans (and activation buffers) are kept per kind


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


class TrainingView(NamedTuple):
    """The resident model as a device optimizer sees it (gpu/trainer.py): its tensors in device order, and the
    model's own weight and gradient buffers and loss cell beside them (writes through them change the model).
    Valid until the model's `close()`."""

    layout: tuple[DeviceTensor, ...]
    params: tuple[GpuBuffer, ...]  # one per layout entry
    grads: tuple[GpuBuffer, ...]  # one per layout entry, summed over a window by `GpuLM.record_batches`
    loss: GpuBuffer  # the window's token-weighted mean loss, one float32 (16 bytes)


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
        if config.n_experts > MAX_EXPERTS:
            raise InvalidInput(f"GpuLM supports at most {MAX_EXPERTS} experts per layer, got {config.n_experts}.")
        checked = EvermindLM.from_params(config, params).params  # validates names, shapes, finiteness
        self.config = config
        self.dev = device if device is not None else get_device()
        self._layout = device_layout(config)
        self._index = {t.name: i for i, t in enumerate(self._layout)}
        self._params = [self.dev.upload(pack_tensor(t, checked)) for t in self._layout]
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
            found.update(unpack_tensor(t, self.dev.read(buf, np.float32, t.shape)))
        return {name: found[name] for name in param_shapes(self.config)}

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Overwrite the device weights with `params` (names and shapes of param_shapes(config)).

        Raises:
            InvalidInput: wrong names, shapes or values.
        """
        checked = EvermindLM.from_params(self.config, params).params
        for t, buf in zip(self._layout, self._params):
            self.dev.write(buf, pack_tensor(t, checked))

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

    def _write_train_inputs(self, plan: Plan, tokens: np.ndarray, lengths: np.ndarray, weight: float) -> int:
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

    def _plan(self, kind: str, b: int, t: int) -> Plan:
        cache = self._plans[kind]
        key = (b, t)
        plan = cache.get(key)
        if plan is not None:
            cache.move_to_end(key)
            return plan
        if len(cache) >= _PLAN_CACHE:
            _, old = cache.popitem(last=False)
            old.release()
        plan = Plan(self.dev)
        try:
            self._build(plan, kind, b, t)
        except Exception:
            plan.release()
            raise
        cache[key] = plan
        return plan

    def _acts(self, plan: Plan, n: int) -> _Acts:
        cfg = self.config
        c, e, k, g = cfg.d_model, cfg.n_experts, cfg.top_k, cfg.n_experts + 1
        gh = g * cfg.hidden_dim
        return _Acts(plan.buffer(n * c * 4), plan.buffer(n * c * 4), plan.buffer(n * c * 4), plan.buffer(n * e * 4),
                     plan.buffer(n * k * 4), plan.buffer(n * k * 4), plan.buffer(n * g * 4), plan.buffer(n * gh * 4),
                     plan.buffer(n * gh * 4))

    def _build(self, plan: Plan, kind: str, b: int, t: int) -> None:
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
                plan.matmul(buffer_view(x_final, r0 * c, (r1 - r0) * c), emb, buffer_view(out, r0 * v, (r1 - r0) * v),
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

    def _layer_forward(self, plan: Plan, layer: int, x: GpuBuffer, out: GpuBuffer, a: _Acts, rinv: GpuBuffer,
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

    def _head_backward(self, plan: Plan, x_final: GpuBuffer, b: int, t: int, xs: list[GpuBuffer],
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
            x_rows = buffer_view(x_final, r0 * c, m * c)
            plan.matmul(x_rows, emb, logits, m, v, c, trans_b=True, zero=self._zero)
            plan.dispatch("cross_entropy", "main",
                          {0: plan.uniform([("u", m), ("u", v), ("u", 0), ("u", 0)]), 1: buffer_view(logits, 0, m * v),
                           2: buffer_view(targets, r0, m), 3: buffer_view(cew, r0, m),
                           4: buffer_view(dlogits, 0, m * v), 5: buffer_view(loss_rows, r0, m)}, plan.fold(m))
            plan.matmul(buffer_view(dlogits, 0, m * v), emb, buffer_view(dx_a, r0 * c, m * c), m, c, v, zero=self._zero)
            plan.matmul(buffer_view(dlogits, 0, m * v), x_rows, d_emb, v, c, m, trans_a=True, accumulate=True,
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

    def _layer_backward(self, plan: Plan, layer: int, x: GpuBuffer, a: _Acts, dout: GpuBuffer, dx: GpuBuffer,
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

    def _pool(self, plan: Plan, x: GpuBuffer, rinv: GpuBuffer, b: int, t: int) -> None:
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

    def training_view(self) -> TrainingView:
        """The buffers a device optimizer steps (layout, weights, gradients, loss); see TrainingView."""
        return TrainingView(tuple(self._layout), tuple(self._params), tuple(self._grad_buffers()), self._loss)

    def record_batches(self, batches: Sequence[tuple[Any, Any]], where: str, tail: Any = None) -> int:
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
        self.record_batches([(tokens, lengths)], "loss_and_grads()")
        loss = float(self.dev.read(self._loss, np.float32, (1,))[0])
        return loss, self._read_grads()

    def _read_grads(self) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        for t, buf in zip(self._layout, self._grad_buffers()):
            found.update(unpack_tensor(t, self.dev.read(buf, np.float32, t.shape)))
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
