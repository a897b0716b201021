"""GPU test fixtures: the shared device, or a skip that says why there is none."""

from __future__ import annotations

import pytest

from evermind_memory.gpu.device import adapter_info, get_device


@pytest.fixture(scope="session")
def gpu():
    """The process-wide GPU device; skips the test when wgpu finds no adapter (or EVERMIND_GPU=0)."""
    info = adapter_info()
    if not info["available"]:
        pytest.skip(f"no GPU adapter available to wgpu, so the WGSL kernels cannot run here: {info['reason']}")
    return get_device()
