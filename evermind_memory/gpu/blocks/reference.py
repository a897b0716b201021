"""Numpy twins of the sequence-mixing kernels (selective scan, SSD, complex SSD, causal attention).

They live in `evermind_memory.lm.sequence`, the CPU definition the WGSL is tested against; this module keeps
the names the GPU tests and benchmarks import.
"""

from __future__ import annotations

from evermind_memory.lm.sequence import (
    causal_attention_numpy,
    complex_ssd_numpy,
    linear_scan_numpy,
    selective_scan_backward_numpy,
    selective_scan_numpy,
    softplus_numpy,
    ssd_numpy,
)

__all__ = [
    "softplus_numpy",
    "linear_scan_numpy",
    "selective_scan_numpy",
    "selective_scan_backward_numpy",
    "ssd_numpy",
    "complex_ssd_numpy",
    "causal_attention_numpy",
]
