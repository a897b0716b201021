"""The GPU device layer: the EVERMIND_GPU switch, adapter info, pipeline cache, buffer pool and limits."""

from __future__ import annotations

import importlib.resources

import numpy as np
import pytest

from evermind_memory.errors import GpuUnavailable, InvalidInput
from evermind_memory.gpu import device as gdev
from evermind_memory.gpu import ops


def test_evermind_gpu_0_disables_the_gpu_with_a_clear_error(monkeypatch):
    monkeypatch.setenv("EVERMIND_GPU", "0")
    with pytest.raises(GpuUnavailable, match="EVERMIND_GPU"):
        gdev.get_device()
    assert gdev.is_available() is False
    info = gdev.adapter_info()
    assert info["available"] is False and "EVERMIND_GPU" in info["reason"]
    with pytest.raises(GpuUnavailable):
        ops.relu(np.ones(3, np.float32))


def test_adapter_info_describes_the_adapter(gpu):
    info = gdev.adapter_info()
    assert info["available"] is True
    assert info["device"] and info["backend"]
    assert info["max_storage_binding_bytes"] >= 128 * 1024 * 1024
    assert isinstance(info["software"], bool)


def test_pipelines_are_cached_per_kernel_entry_and_constants(gpu):
    p1 = gpu.pipeline("activation", "forward", {"ACT": 1})
    p2 = gpu.pipeline("activation", "forward", {"ACT": 1})
    p3 = gpu.pipeline("activation", "forward", {"ACT": 2})
    assert p1 is p2
    assert p3 is not p1


def test_buffer_pool_reuses_released_buffers(gpu):
    u = gpu.wgpu.BufferUsage
    usage = u.STORAGE | u.COPY_DST
    a = gpu.acquire(1000, usage)
    raw = a.raw
    assert a.capacity >= 1000 and a.nbytes == 1000
    gpu.release(a)
    b = gpu.acquire(990, usage)  # same size bucket and usage
    assert b.raw is raw
    c = gpu.acquire(990, usage)  # the pooled one is taken: a fresh buffer
    assert c.raw is not raw
    gpu.release(b)
    gpu.release(c)


def test_upload_and_read_round_trip(gpu):
    arr = np.arange(37, dtype=np.float32).reshape(37)
    buf = gpu.upload(arr)
    np.testing.assert_array_equal(gpu.read(buf, np.float32, (37,)), arr)
    gpu.release(buf)


def test_unknown_kernel_is_invalid_input(gpu):
    with pytest.raises(InvalidInput, match="no WGSL kernel"):
        gdev.load_wgsl("no_such_kernel")


def test_every_kernel_file_compiles_and_has_no_format_placeholders(gpu):
    folder = importlib.resources.files("evermind_memory.gpu").joinpath("kernels")
    names = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".wgsl"))
    assert "matmul" in names and "adamw_update" in names
    for name in names:
        src = gdev.load_wgsl(name)
        assert "{}" not in src and "%s" not in src
        gpu.raw.create_shader_module(label=name, code=src)  # raises on a WGSL error


def test_binding_limit_is_enforced_and_restored(gpu):
    before = gpu.max_binding_bytes
    with pytest.raises(InvalidInput):
        with gpu.binding_limit(100):
            pass
    with gpu.binding_limit(4096):
        assert gpu.max_binding_bytes == 4096
        big = gpu.storage(8192)
        batch = gpu.batch()
        params = batch.uniform([("u", 2048), ("u", 0), ("u", 0), ("u", 0)])
        with pytest.raises(InvalidInput, match="tile"):
            batch.dispatch("activation", "forward", {0: params, 1: big, 3: big}, (8, 1, 1), {"ACT": 0})
        gpu.release(big)
        # Ops tile instead of failing.
        x = np.linspace(-1, 1, 3000, dtype=np.float32)
        np.testing.assert_array_equal(ops.relu(x), np.maximum(x, 0))
    assert gpu.max_binding_bytes == before
