"""The GPU model's building blocks: how EvermindLM's parameters are laid out on the device (stacked expert
weights, so the routed experts run densely beside the shared one) and `Plan`, a replayable command list
whose bind groups are made once. Public to gpu/: the resident model (model.py) and its trainer (trainer.py) build
on these names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import GpuBuffer, GpuDevice
from evermind_memory.lm.model import LMConfig, param_shapes


# ==== the device layout of the parameters =================================================================

@dataclass(frozen=True)
class DeviceTensor:
    """One device tensor: canonical parameters packed side by side (AdamW is elementwise, so packing is free)."""

    name: str
    shape: tuple[int, ...]
    members: tuple[str, ...]  # canonical names in packing order
    how: str  # "same" (one member), "cols" (concatenated columns), "rows" (concatenated rows), "stack"
    decay: bool  # 2-D weights decay; norm gains and biases do not (as LMTrainer's no_decay)


def device_layout(config: LMConfig) -> list[DeviceTensor]:
    """Device tensors in a fixed order. Per layer the shared expert is group 0 and expert e is group 1 + e."""
    shapes = param_shapes(config)
    c, h, g = config.d_model, config.hidden_dim, config.n_experts + 1
    out = [DeviceTensor("emb", shapes["emb"], ("emb",), "same", True)]
    for layer in range(config.n_layers):
        p = f"layers.{layer}."
        groups = [p + "shared"] + [f"{p}expert{e}" for e in range(config.n_experts)]
        for local in ("conv_norm", "conv", "moe_norm", "router"):
            out.append(DeviceTensor(p + local, shapes[p + local], (p + local,), "same", len(shapes[p + local]) >= 2))
        out.append(DeviceTensor(p + "w1", (c, g * h), tuple(x + ".w1" for x in groups), "cols", True))
        out.append(DeviceTensor(p + "b1", (g * h,), tuple(x + ".b1" for x in groups), "rows", False))
        out.append(DeviceTensor(p + "w2", (g * h, c), tuple(x + ".w2" for x in groups), "rows", True))
        out.append(DeviceTensor(p + "b2", (g, c), tuple(x + ".b2" for x in groups), "stack", False))
    for local in ("attn_norm", "wqkv", "wo", "out_norm"):
        name = "pool." + local
        if name in shapes:
            out.append(DeviceTensor(name, shapes[name], (name,), "same", len(shapes[name]) >= 2))
    return out


def pack_tensor(t: DeviceTensor, params: Mapping[str, np.ndarray]) -> np.ndarray:
    parts = [np.asarray(params[m], dtype=np.float32) for m in t.members]
    if t.how == "same":
        return np.ascontiguousarray(parts[0])  # (shape)
    if t.how == "cols":
        return np.concatenate(parts, axis=1)  # (C, G*H)
    if t.how == "rows":
        return np.concatenate(parts, axis=0)  # (G*H,) or (G*H, C)
    return np.stack(parts, axis=0)  # (G, C)


def unpack_tensor(t: DeviceTensor, arr: np.ndarray) -> dict[str, np.ndarray]:
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

class Plan:
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


def buffer_view(buf: GpuBuffer, offset_elems: int, n_elems: int) -> tuple[GpuBuffer, int, int]:
    return (buf, 4 * int(offset_elems), 4 * max(int(n_elems), 1))
