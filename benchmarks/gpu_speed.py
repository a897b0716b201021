"""Matmul speed of our WGSL kernels (through wgpu) beside PyTorch fp32 with TF32 off, on one GPU.

Times C = A @ B for square float32 matrices (default 4096^3 and 8192^3): operands stay on the device, R
products go into one submit, and the wall clock runs until the queue drains. Prints a table; --json
writes the same numbers. EvermindLM training/embedding throughput on the GPU is not measured here yet.
Usage: python benchmarks/gpu_speed.py [--sizes 4096 8192] [--repeats 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evermind_memory.gpu import ops  # noqa: E402
from evermind_memory.gpu.device import adapter_info, get_device  # noqa: E402


def bench_wgsl(n: int, repeats: int, vec4: bool, rng: np.random.Generator) -> dict[str, Any]:
    """TFLOP/s of one WGSL matmul kernel at n^3, plus a spot check of a few rows against numpy."""
    dev = get_device()
    a = rng.standard_normal((n, n), dtype=np.float32)  # (n, n)
    b = rng.standard_normal((n, n), dtype=np.float32)  # (n, n)
    if a.nbytes > dev.max_binding_bytes:
        return {"skipped": f"{a.nbytes} bytes per operand exceed the binding limit {dev.max_binding_bytes}"}
    a_buf, b_buf, c_buf = dev.upload(a), dev.upload(b), dev.storage(n * n * 4)
    try:
        batch = dev.batch()
        ops.record_matmul(batch, a_buf, b_buf, c_buf, n, n, n, vec4=vec4)  # warm-up (and pipeline build)
        batch.submit()
        dev.wait()
        times = []
        for _ in range(3):
            batch = dev.batch()
            for _ in range(repeats):
                ops.record_matmul(batch, a_buf, b_buf, c_buf, n, n, n, vec4=vec4)
            t0 = time.perf_counter()
            batch.submit()
            dev.wait()
            times.append((time.perf_counter() - t0) / repeats)
        rows = np.array([0, n // 3, n - 1])  # (3,)
        got = dev.read(c_buf, np.float32, (n, n))[rows]  # (3, n)
        ref = a[rows].astype(np.float64) @ b.astype(np.float64)  # (3, n)
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
    finally:
        for buf in (a_buf, b_buf, c_buf):
            dev.release(buf)
        dev.clear_pool()
    best = min(times)
    return {"seconds": best, "tflops": 2 * n ** 3 / best / 1e12, "max_rel_err": err}


def bench_torch(n: int, repeats: int) -> dict[str, Any]:
    """TFLOP/s of torch.matmul in fp32 with TF32 disabled (cuBLAS SGEMM), or why it was skipped."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return {"skipped": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"skipped": "torch sees no CUDA device"}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.float32, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=torch.float32, generator=g)
    c = torch.matmul(a, b)
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            torch.matmul(a, b, out=c)
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3 / repeats)
    best = min(times)
    return {"seconds": best, "tflops": 2 * n ** 3 / best / 1e12, "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (and optionally save) the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--kernels", nargs="+", default=["torch", "vec4", "general"],
                    choices=["torch", "vec4", "general"], help="what to time (default: all three)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    info = adapter_info()
    results: dict[str, Any] = {"adapter": info, "host": platform.node(), "python": platform.python_version(),
                               "sizes": {}}
    print(f"adapter: {info.get('device')} ({info.get('backend')})")
    print(f"{'n':>6} {'kernel':>22} {'ms':>9} {'TFLOP/s':>8} {'vs torch':>9}")
    for n in args.sizes:
        row: dict[str, Any] = {}
        if "torch" in args.kernels:
            row["torch_fp32_no_tf32"] = bench_torch(n, args.repeats)
        if "vec4" in args.kernels:
            row["wgsl_matmul_vec4"] = bench_wgsl(n, args.repeats, True, rng)
        if "general" in args.kernels:
            row["wgsl_matmul_general"] = bench_wgsl(n, args.repeats, False, rng)
        ref = row.get("torch_fp32_no_tf32", {}).get("tflops")
        for name, r in row.items():
            if "skipped" in r:
                print(f"{n:>6} {name:>22}  skipped: {r['skipped']}")
                continue
            ratio = f"{r['tflops'] / ref:8.1%}" if ref else "       -"
            print(f"{n:>6} {name:>22} {r['seconds'] * 1e3:9.2f} {r['tflops']:8.2f} {ratio:>9}")
            if ref and name != "torch_fp32_no_tf32":
                r["fraction_of_torch"] = r["tflops"] / ref
        results["sizes"][str(n)] = row
        sys.stdout.flush()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
