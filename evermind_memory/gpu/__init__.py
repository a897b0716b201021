"""The GPU path: WGSL kernels run through wgpu (Vulkan/Metal/DX12, or Mesa's software Vulkan in CI).

`device` opens the adapter lazily (EVERMIND_GPU=0 disables it) and owns pipelines and buffers; `ops` puts
each kernel behind a numpy-in, numpy-out function with a numpy twin. Importing this package does not
import wgpu or open a device.
"""

from __future__ import annotations

from evermind_memory.gpu.device import adapter_info, get_device, is_available

__all__ = ["adapter_info", "get_device", "is_available"]
