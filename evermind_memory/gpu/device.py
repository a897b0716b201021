"""The one wgpu device the GPU path uses: lazy adapter choice, pipelines, buffers and command batches.

Picks a high-performance adapter first and falls back to any adapter wgpu finds (Mesa's software Vulkan
included); `EVERMIND_GPU=0` turns the GPU path off. Kernel maths lives in `kernels/*.wgsl` and `ops/`;
this file only owns resources: a pipeline cache, a small buffer pool and the binding-size limit.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evermind_memory.errors import GpuUnavailable, InvalidInput

__all__ = [
    "GpuBuffer",
    "GpuDevice",
    "Batch",
    "get_device",
    "is_available",
    "adapter_info",
    "load_wgsl",
    "reset_device",
]

_ENV_SWITCH = "EVERMIND_GPU"
_DISABLED_VALUES = {"0", "false", "no", "off"}
_POOL_MAX_FREE_BYTES = 256 * 1024 * 1024  # free buffers kept for reuse, all sizes together
_MIN_BUFFER_BYTES = 16


def _wgpu() -> Any:
    """Import wgpu lazily (importing it is slow and needs its native library)."""
    try:
        import wgpu  # noqa: PLC0415
    except Exception as exc:  # ImportError, or OSError from the native library
        import shlex
        import sys

        raise GpuUnavailable(
            f"the wgpu package could not be imported ({exc}); install it with "
            f"`{shlex.quote(sys.executable or 'python3')} -m pip install wgpu`, or set EVERMIND_GPU=0 to use the "
            "CPU path"
        ) from exc
    return wgpu


@dataclass(eq=False)
class GpuBuffer:
    """A device buffer plus the byte count its contents occupy (the pool may hand out larger ones).

    Attributes:
        raw: the underlying `wgpu.GPUBuffer`.
        nbytes: how many bytes of it hold data (what a binding covers).
        usage: the wgpu usage flags it was created with (the pool's key).
    """

    raw: Any
    nbytes: int
    usage: int

    @property
    def capacity(self) -> int:
        """Bytes actually allocated on the device."""
        return int(self.raw.size)


def _bucket(nbytes: int) -> int:
    """Round a size up to one of 8 buckets per power of two (at most 12.5% waste), multiple of 16."""
    n = max(_MIN_BUFFER_BYTES, int(nbytes))
    step = max(16, 1 << max(0, n.bit_length() - 4))
    return -(-n // step) * step


def load_wgsl(name: str) -> str:
    """Read the source of `gpu/kernels/<name>.wgsl` from package data.

    Args:
        name: kernel file name without the `.wgsl` suffix (e.g. "matmul").

    Returns:
        The WGSL source text.

    Raises:
        InvalidInput: no such kernel file ships with the package.
    """
    ref = importlib.resources.files("evermind_memory.gpu").joinpath("kernels", f"{name}.wgsl")
    try:
        return ref.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InvalidInput(
            f"no WGSL kernel named {name!r} in evermind_memory/gpu/kernels/; "
            "expected one of the shipped kernel files (see that folder)"
        ) from exc


class Batch:
    """Dispatches recorded into one command encoder and submitted together (one queue submit)."""

    def __init__(self, device: "GpuDevice") -> None:
        self._dev = device
        self._encoder = device.raw.create_command_encoder()
        self._pass: Any = None
        self._keep: list[GpuBuffer] = []  # pooled buffers to release after submit
        self.dispatches = 0

    @property
    def device(self) -> "GpuDevice":
        """The device this batch records for (ops size their workgroups by its limits)."""
        return self._dev

    def _compute_pass(self) -> Any:
        if self._pass is None:
            self._pass = self._encoder.begin_compute_pass()
        return self._pass

    def _end_pass(self) -> None:
        if self._pass is not None:
            self._pass.end()
            self._pass = None

    def dispatch(
        self,
        kernel: str,
        entry: str,
        bindings: Mapping[int, GpuBuffer | tuple[GpuBuffer, int, int]],
        groups: Sequence[int],
        constants: Mapping[str, float | int | bool] | None = None,
    ) -> None:
        """Record one compute dispatch.

        Args:
            kernel: kernel file name (without `.wgsl`).
            entry: entry point inside it.
            bindings: binding index -> buffer (bound over its `nbytes`) or (buffer, byte offset, byte size).
            groups: workgroup counts (x[, y[, z]]), each at most the device's per-dimension limit.
            constants: values for the kernel's `override` constants.

        Raises:
            InvalidInput: a workgroup count is over the device limit, or a binding is over the size limit.
        """
        dev = self._dev
        pipeline = dev.pipeline(kernel, entry, constants)
        entries = []
        for idx, spec in sorted(bindings.items()):
            if isinstance(spec, tuple):
                buf, offset, size = spec
            else:
                buf, offset, size = spec, 0, max(spec.nbytes, 4)
            size = -(-size // 4) * 4
            if size > dev.max_binding_bytes and not (buf.usage & dev.wgpu.BufferUsage.UNIFORM):
                raise InvalidInput(
                    f"binding {idx} of {kernel}.{entry} covers {size} bytes but the device allows "
                    f"{dev.max_binding_bytes} per storage binding; the op must tile this work"
                )
            entries.append({"binding": idx, "resource": {"buffer": buf.raw, "offset": offset, "size": size}})
        bind_group = dev.raw.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
        g = list(groups) + [1] * (3 - len(groups))
        if min(g) <= 0:
            return  # nothing to do (an empty dimension)
        if max(g) > dev.max_groups_per_dim:
            raise InvalidInput(
                f"dispatch of {kernel}.{entry} asks for {g} workgroups; the device allows "
                f"{dev.max_groups_per_dim} per dimension; the op must split this grid"
            )
        cpass = self._compute_pass()
        cpass.set_pipeline(pipeline)
        cpass.set_bind_group(0, bind_group)
        cpass.dispatch_workgroups(*g)
        self.dispatches += 1

    def uniform(self, values: Sequence[tuple[str, float | int]]) -> GpuBuffer:
        """A uniform buffer holding the given ("u"|"i"|"f", value) fields in order, padded to 16 bytes.

        Args:
            values: (kind, value) pairs: "u" u32, "i" i32, "f" f32.

        Returns:
            A pooled uniform buffer, released back to the pool when this batch is submitted.
        """
        codes = {"u": "<u4", "i": "<i4", "f": "<f4"}
        raw = bytearray()
        for kind, val in values:
            raw += np.array([val], dtype=codes[kind]).tobytes()
        while len(raw) % 16:
            raw += b"\0"
        wgpu = self._dev.wgpu
        buf = self._dev.acquire(len(raw), wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self._dev.raw.queue.write_buffer(buf.raw, 0, bytes(raw))
        self._keep.append(buf)
        return buf

    def scratch(self, nbytes: int) -> GpuBuffer:
        """A pooled storage buffer for intermediate results, released when this batch is submitted."""
        buf = self._dev.storage(nbytes)
        self._keep.append(buf)
        return buf

    def clear(self, buf: GpuBuffer, offset: int = 0, size: int | None = None) -> None:
        """Record zero-filling of `buf` (whole data range by default)."""
        self._end_pass()
        size = buf.nbytes - offset if size is None else size
        size = -(-size // 4) * 4
        if size > 0:
            self._encoder.clear_buffer(buf.raw, offset, size)

    def copy(self, src: GpuBuffer, src_offset: int, dst: GpuBuffer, dst_offset: int, size: int) -> None:
        """Record a buffer-to-buffer copy of `size` bytes (multiples of 4)."""
        self._end_pass()
        if size > 0:
            self._encoder.copy_buffer_to_buffer(src.raw, src_offset, dst.raw, dst_offset, size)

    def submit(self) -> None:
        """Submit everything recorded so far and return the batch's pooled buffers to the pool."""
        self._end_pass()
        self._dev.raw.queue.submit([self._encoder.finish()])
        for buf in self._keep:
            self._dev.release(buf)
        self._keep.clear()
        self._encoder = self._dev.raw.create_command_encoder()


@dataclass(eq=False)
class GpuDevice:
    """An opened wgpu device with a pipeline cache, a buffer pool and its binding limits.

    Use `get_device()` rather than building one: it is opened once per process.
    """

    wgpu: Any
    adapter: Any
    raw: Any
    max_binding_bytes: int
    max_buffer_bytes: int
    max_groups_per_dim: int
    _pipelines: dict = field(default_factory=dict)
    _modules: dict = field(default_factory=dict)
    _free: dict = field(default_factory=dict)
    _free_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- pipelines -------------------------------------------------------------------------------
    def pipeline(self, kernel: str, entry: str, constants: Mapping[str, float | int | bool] | None = None) -> Any:
        """The compute pipeline for kernel file + entry point + override constants (built once, cached).

        Args:
            kernel: kernel file name without `.wgsl`.
            entry: entry point name.
            constants: override-constant values (bools become 0/1).

        Returns:
            A `wgpu.GPUComputePipeline` with an automatic layout.
        """
        consts = tuple(sorted((k, float(v)) for k, v in (constants or {}).items()))
        key = (kernel, entry, consts)
        with self._lock:
            pipe = self._pipelines.get(key)
            if pipe is None:
                module = self._modules.get(kernel)
                if module is None:
                    module = self.raw.create_shader_module(label=kernel, code=load_wgsl(kernel))
                    self._modules[kernel] = module
                stage: dict[str, Any] = {"module": module, "entry_point": entry}
                if consts:
                    stage["constants"] = dict(consts)
                pipe = self.raw.create_compute_pipeline(label=f"{kernel}.{entry}", layout="auto", compute=stage)
                self._pipelines[key] = pipe
        return pipe

    @property
    def pipeline_count(self) -> int:
        """Number of cached pipelines."""
        return len(self._pipelines)

    # ---- buffers ---------------------------------------------------------------------------------
    def acquire(self, nbytes: int, usage: int) -> GpuBuffer:
        """A buffer of at least `nbytes` with exactly `usage`, reused from the pool when one is free.

        Raises:
            InvalidInput: `nbytes` is over the device's maximum buffer size.
        """
        cap = _bucket(nbytes)
        if cap > self.max_buffer_bytes:
            raise InvalidInput(
                f"a GPU buffer of {nbytes} bytes was asked for; the device allows {self.max_buffer_bytes}; "
                "split the work into smaller pieces"
            )
        with self._lock:
            free = self._free.get((cap, usage))
            if free:
                raw = free.pop()
                self._free_bytes -= cap
                return GpuBuffer(raw, int(nbytes), usage)
        raw = self.raw.create_buffer(size=cap, usage=usage)
        return GpuBuffer(raw, int(nbytes), usage)

    def release(self, buf: GpuBuffer) -> None:
        """Give a buffer back to the pool (it is destroyed instead when the pool is full)."""
        cap = buf.capacity
        with self._lock:
            if self._free_bytes + cap <= _POOL_MAX_FREE_BYTES:
                self._free.setdefault((cap, buf.usage), []).append(buf.raw)
                self._free_bytes += cap
                return
        buf.raw.destroy()

    @property
    def pooled_buffers(self) -> int:
        """Number of free buffers held for reuse."""
        return sum(len(v) for v in self._free.values())

    def clear_pool(self) -> None:
        """Destroy every free pooled buffer."""
        with self._lock:
            for lst in self._free.values():
                for raw in lst:
                    raw.destroy()
            self._free.clear()
            self._free_bytes = 0

    def storage(self, nbytes: int) -> GpuBuffer:
        """A pooled storage buffer that can be written, copied and read back."""
        u = self.wgpu.BufferUsage
        return self.acquire(nbytes, u.STORAGE | u.COPY_DST | u.COPY_SRC)

    def upload(self, array: np.ndarray) -> GpuBuffer:
        """Copy a C-contiguous numpy array into a pooled storage buffer.

        Args:
            array: any C-contiguous array of 4-byte elements (float32, int32, uint32).

        Returns:
            The buffer; `nbytes` equals `array.nbytes`.
        """
        buf = self.storage(array.nbytes)
        if array.nbytes:
            self.raw.queue.write_buffer(buf.raw, 0, np.ascontiguousarray(array))
        return buf

    def write(self, buf: GpuBuffer, array: np.ndarray, offset: int = 0) -> None:
        """Overwrite part of a buffer with a numpy array's bytes."""
        if array.nbytes:
            self.raw.queue.write_buffer(buf.raw, offset, np.ascontiguousarray(array))

    def read(self, buf: GpuBuffer, dtype: Any, shape: Sequence[int], offset: int = 0) -> np.ndarray:
        """Copy `prod(shape)` elements back from the device (waits for submitted work).

        Args:
            buf: the buffer to read (must have COPY_SRC usage, as `storage()` buffers do).
            dtype: numpy dtype of the elements (4 bytes each).
            shape: shape of the returned array.
            offset: byte offset into the buffer.

        Returns:
            A new numpy array that owns its data.
        """
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * np.dtype(dtype).itemsize
        if nbytes == 0:
            return np.zeros(shape, dtype=dtype)
        u = self.wgpu.BufferUsage
        staging = self.acquire(nbytes, u.MAP_READ | u.COPY_DST)
        enc = self.raw.create_command_encoder()
        enc.copy_buffer_to_buffer(buf.raw, offset, staging.raw, 0, -(-nbytes // 4) * 4)
        self.raw.queue.submit([enc.finish()])
        staging.raw.map_sync(self.wgpu.MapMode.READ, 0, staging.capacity)
        try:
            data = staging.raw.read_mapped(0, nbytes)
            out = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
        finally:
            staging.raw.unmap()
            self.release(staging)
        return out

    def batch(self) -> Batch:
        """A new command batch (record dispatches, then `submit()`)."""
        return Batch(self)

    def wait(self) -> None:
        """Block until all submitted work is done (by reading back 4 bytes: the map waits for the queue)."""
        # queue.on_submitted_work_done_sync() is broken in wgpu-py 0.32 (a callback type mismatch).
        probe = self.storage(4)
        try:
            self.read(probe, np.uint32, (1,))
        finally:
            self.release(probe)

    @contextlib.contextmanager
    def binding_limit(self, nbytes: int) -> Iterator[None]:
        """Temporarily lower the per-binding byte limit (to exercise tiling on small data).

        Args:
            nbytes: the limit to use inside the block; it can only be lowered, and must be >= 256.

        Raises:
            InvalidInput: `nbytes` is below 256.
        """
        if nbytes < 256:
            raise InvalidInput(f"binding limit must be at least 256 bytes, got {nbytes}")
        old = self.max_binding_bytes
        self.max_binding_bytes = min(old, int(nbytes))
        try:
            yield
        finally:
            self.max_binding_bytes = old

    def info(self) -> dict[str, Any]:
        """Adapter description and the limits this device was opened with."""
        ai = self.adapter.info
        return {
            "available": True,
            "device": ai.get("device", ""),
            "vendor": ai.get("vendor", ""),
            "adapter_type": ai.get("adapter_type", ""),
            "backend": ai.get("backend_type", ""),
            "description": ai.get("description", ""),
            "software": str(ai.get("adapter_type", "")).upper() == "CPU",
            "max_storage_binding_bytes": self.max_binding_bytes,
            "max_buffer_bytes": self.max_buffer_bytes,
            "max_workgroups_per_dimension": self.max_groups_per_dim,
        }


_DEVICE: GpuDevice | None = None
_DEVICE_ERROR: GpuUnavailable | None = None
_OPEN_LOCK = threading.Lock()


def _gpu_disabled() -> bool:
    return os.environ.get(_ENV_SWITCH, "").strip().lower() in _DISABLED_VALUES


def _open() -> GpuDevice:
    wgpu = _wgpu()
    adapter = None
    errors: list[str] = []
    for pref in ("high-performance", "low-power"):
        try:
            adapter = wgpu.gpu.request_adapter_sync(power_preference=pref)
        except Exception as exc:  # wgpu raises plain RuntimeError-like errors here
            errors.append(f"{pref}: {exc}")
            adapter = None
        if adapter is not None:
            break
    if adapter is None:
        try:
            found = list(wgpu.gpu.enumerate_adapters_sync())
        except Exception as exc:
            errors.append(f"enumerate: {exc}")
            found = []
        # Prefer Vulkan/Metal/DX12 over OpenGL, discrete over integrated over software.
        rank = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
        found.sort(key=lambda a: (a.info.get("backend_type") == "OpenGL", rank.get(a.info.get("adapter_type"), 4)))
        adapter = found[0] if found else None
    if adapter is None:
        detail = "; ".join(errors) or "no adapters were listed"
        raise GpuUnavailable(
            f"no GPU adapter found by wgpu ({detail}); install a Vulkan driver (on Debian/Ubuntu: "
            "`apt-get install mesa-vulkan-drivers` gives a software one) or set EVERMIND_GPU=0 to use the CPU path"
        )
    lim = adapter.limits
    want = {
        "max-storage-buffer-binding-size": int(lim["max-storage-buffer-binding-size"]),
        "max-buffer-size": int(lim["max-buffer-size"]),
        "max-compute-workgroup-storage-size": int(lim["max-compute-workgroup-storage-size"]),
        "max-compute-invocations-per-workgroup": int(lim["max-compute-invocations-per-workgroup"]),
        "max-storage-buffers-per-shader-stage": int(lim["max-storage-buffers-per-shader-stage"]),
    }
    try:
        device = adapter.request_device_sync(required_limits=want)
    except Exception as exc:
        raise GpuUnavailable(
            f"the adapter {adapter.summary!r} would not open a device ({exc}); "
            "update the GPU driver or set EVERMIND_GPU=0 to use the CPU path"
        ) from exc
    dl = device.limits
    return GpuDevice(
        wgpu=wgpu,
        adapter=adapter,
        raw=device,
        max_binding_bytes=int(dl["max-storage-buffer-binding-size"]),
        max_buffer_bytes=int(dl["max-buffer-size"]),
        max_groups_per_dim=int(dl["max-compute-workgroups-per-dimension"]),
    )


def get_device() -> GpuDevice:
    """The process-wide GPU device, opened on first use.

    Returns:
        The shared `GpuDevice`.

    Raises:
        GpuUnavailable: EVERMIND_GPU=0 is set, wgpu is missing, or no adapter/device could be opened.
    """
    global _DEVICE, _DEVICE_ERROR
    if _gpu_disabled():
        raise GpuUnavailable(
            f"the GPU path is disabled by {_ENV_SWITCH}={os.environ.get(_ENV_SWITCH)!r}; "
            f"unset it (or set {_ENV_SWITCH}=1) to use the GPU, or use the CPU path"
        )
    if _DEVICE is not None:
        return _DEVICE
    with _OPEN_LOCK:
        if _DEVICE is None:
            if _DEVICE_ERROR is not None:
                raise _DEVICE_ERROR
            try:
                _DEVICE = _open()
            except GpuUnavailable as exc:
                _DEVICE_ERROR = exc
                raise
    return _DEVICE


def reset_device() -> None:
    """Forget the opened device (and any remembered failure) so the next `get_device()` opens anew."""
    global _DEVICE, _DEVICE_ERROR
    with _OPEN_LOCK:
        if _DEVICE is not None:
            _DEVICE.clear_pool()
        _DEVICE = None
        _DEVICE_ERROR = None


def is_available() -> bool:
    """Whether a GPU device can be opened (False when disabled or none exists); never raises."""
    try:
        get_device()
    except GpuUnavailable:
        return False
    return True


def adapter_info() -> dict[str, Any]:
    """What `evermind info` prints about the GPU; never raises.

    Returns:
        {"available": True, "device", "vendor", "adapter_type", "backend", "description", "software",
        limits...} when a device opens, else {"available": False, "reason": <message>}.
    """
    try:
        return get_device().info()
    except GpuUnavailable as exc:
        return {"available": False, "reason": str(exc)}
