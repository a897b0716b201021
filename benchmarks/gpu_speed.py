"""GPU speed: WGSL matmul beside PyTorch fp32 (TF32 off), and EvermindLM training and embedding on the GPU.

Section `matmul`: C = A @ B for square float32 matrices (default 4096^3 and 8192^3); operands stay on the
device, R products go into one submit, and the wall clock runs until the queue drains.
Section `lm`: EvermindLM (medium config of the foundation issue: V=16384, C=256, L=6, K=4, H=512, E=8,
top-2; B=16 sequences of T=128 random tokens) trained with forward, backward, clip and AdamW resident on the
GPU (gpu/trainer.py GpuTrainer), beside our numpy LMTrainer on --cpu-threads cores (BLAS pinned before numpy
loads) and the same architecture in PyTorch CUDA (dense experts, fused AdamW, TF32 off) when available;
training tokens/s = B*T per step, and embed docs/s (mean-pooled, L2-normalised; GpuLM.embed_batch). The
step-0 losses and the GPU-vs-numpy embedding difference are printed as a check. --quick runs tiny sizes (CI,
software Vulkan). Prints tables; --json writes the same numbers.
Usage: python benchmarks/gpu_speed.py [--sections matmul lm] [--quick] [--sizes 4096 8192] [--repeats 10]
       [--steps 20] [--cpu-steps 2] [--cpu-threads 2] [--embed-docs 256] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any


def _cpu_threads_from_argv() -> str:
    for i, arg in enumerate(sys.argv):
        if arg == "--cpu-threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith("--cpu-threads="):
            return arg.split("=", 1)[1]
    return "2"


for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # BLAS reads these at numpy import
    os.environ[_var] = _cpu_threads_from_argv()

import numpy as np  # noqa: E402

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


# ==== EvermindLM training and embedding ====================================================================

def lm_config(quick: bool) -> tuple[Any, int, int]:
    """(LMConfig, B, T): the medium config of the foundation issue, or a tiny one for --quick."""
    from evermind_memory.lm.model import LMConfig  # noqa: PLC0415

    if quick:
        return LMConfig(vocab_size=512, d_model=32, n_layers=2, conv_kernel=4, hidden_dim=64, n_experts=4,
                        top_k=2), 4, 32
    return LMConfig(vocab_size=16384, d_model=256, n_layers=6, conv_kernel=4, hidden_dim=512, n_experts=8,
                    top_k=2), 16, 128


def train_config(b: int, t: int) -> Any:
    from evermind_memory.training import TrainConfig  # noqa: PLC0415

    return TrainConfig(lr=3e-3, weight_decay=0.01, batch_size=b, max_len=t, clip=1.0, progress=False)


def bench_numpy_lm(cfg: Any, b: int, t: int, steps: int, docs: list[list[int]]) -> dict[str, Any]:
    """Our numpy CPU path: LMTrainer steps (best of `steps` after a warm-up) and embed_batch docs/s."""
    from evermind_memory.lm.model import EvermindLM  # noqa: PLC0415
    from evermind_memory.training import LMTrainer  # noqa: PLC0415

    model = EvermindLM(cfg, seed=0)
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t)).tolist()
    trainer = LMTrainer(model, train_config(b, t))
    trainer.fit(data, steps=1)
    loss0 = trainer.history.losses[0]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.fit(data, steps=1)
        times.append(time.perf_counter() - t0)
    model = EvermindLM(cfg, seed=0)
    model.embed_batch(docs[:4])
    t0 = time.perf_counter()
    model.embed_batch(docs)
    embed_s = time.perf_counter() - t0
    return {"tokens_per_s": b * t / min(times), "step_s": min(times), "loss0": loss0,
            "embed_docs_per_s": len(docs) / embed_s, "embed_docs": len(docs)}


def bench_gpu_lm(cfg: Any, b: int, t: int, steps: int, docs: list[list[int]]) -> dict[str, Any]:
    """GpuTrainer steps (one submit each, synchronous read of loss and norm) and GpuLM.embed_batch docs/s."""
    from evermind_memory.gpu.model import GpuLM  # noqa: PLC0415
    from evermind_memory.gpu.trainer import GpuTrainer  # noqa: PLC0415
    from evermind_memory.lm.model import EvermindLM  # noqa: PLC0415

    model = EvermindLM(cfg, seed=0)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t))  # (B, T)
    tc = train_config(b, t)
    t0 = time.perf_counter()
    trainer = GpuTrainer(model, tc)
    loss0 = trainer.step([(tokens, None)], tc.lr).loss  # builds the plan and every pipeline
    warm_s = time.perf_counter() - t0
    trainer.step([(tokens, None)], tc.lr)
    times = []
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.step([(tokens, None)], tc.lr)
        times.append(time.perf_counter() - t0)
    total = time.perf_counter() - start
    # Host cost of recording one step's commands (what the GPU does not overlap in a synchronous step).
    plan = trainer.gpu._plan("train", b, t)
    enc = trainer.gpu.dev.raw.create_command_encoder()
    t0 = time.perf_counter()
    plan.record(enc)
    trainer._opt.record(enc)
    record_s = time.perf_counter() - t0
    enc.finish()
    trainer.close()

    gpu = GpuLM.from_model(EvermindLM(cfg, seed=0))
    ref = EvermindLM(cfg, seed=0).embed_batch(docs[:8])
    got = gpu.embed_batch(docs)  # warm-up: plans and pipelines
    embed_diff = float(np.abs(got[:8] - ref).max())
    embed_times = []
    for _ in range(3):
        t0 = time.perf_counter()
        gpu.embed_batch(docs)
        embed_times.append(time.perf_counter() - t0)
    gpu.close()
    return {"tokens_per_s": b * t * steps / total, "step_s": total / steps, "best_step_s": min(times),
            "record_ms": record_s * 1e3, "warmup_s": warm_s, "loss0": loss0,
            "embed_docs_per_s": len(docs) / min(embed_times), "embed_docs": len(docs),
            "embed_max_abs_diff_vs_numpy": embed_diff}


def bench_torch_lm(cfg: Any, b: int, t: int, steps: int, docs: list[list[int]]) -> dict[str, Any]:
    """The same architecture in PyTorch CUDA (dense experts as on our GPU path, fused AdamW, TF32 off)."""
    try:
        import torch  # noqa: PLC0415
        import torch.nn.functional as F  # noqa: PLC0415, N812
    except ImportError:
        return {"skipped": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"skipped": "torch sees no CUDA device"}
    from evermind_memory.lm.model import EvermindLM  # noqa: PLC0415

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device("cuda")
    params = EvermindLM(cfg, seed=0).params
    e, k, h, g = cfg.n_experts, cfg.top_k, cfg.hidden_dim, cfg.n_experts + 1

    def leaf(arr: np.ndarray) -> Any:
        return torch.tensor(np.ascontiguousarray(arr), device=dev, requires_grad=True)

    w = {"emb": leaf(params["emb"])}
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        groups = [p + "shared"] + [f"{p}expert{i}" for i in range(e)]
        for name in ("conv_norm", "conv", "moe_norm", "router"):
            w[p + name] = leaf(params[p + name])
        w[p + "w1"] = leaf(np.concatenate([params[x + ".w1"] for x in groups], axis=1))  # (C, G*H)
        w[p + "b1"] = leaf(np.concatenate([params[x + ".b1"] for x in groups]))  # (G*H,)
        w[p + "w2"] = leaf(np.concatenate([params[x + ".w2"] for x in groups], axis=0))  # (G*H, C)
        w[p + "b2"] = leaf(np.stack([params[x + ".b2"] for x in groups]))  # (G, C)

    def rmsnorm(x: Any, gain: Any) -> Any:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gain

    def hidden(tokens: Any) -> Any:
        bb, tt = tokens.shape
        x = w["emb"][tokens]  # (B, T, C)
        for layer in range(cfg.n_layers):
            p = f"layers.{layer}."
            nx = rmsnorm(x, w[p + "conv_norm"])
            taps = w[p + "conv"]
            mixed = nx * taps[0]
            for j in range(1, min(cfg.conv_kernel, tt)):
                mixed = mixed + F.pad(nx[:, : tt - j], (0, 0, j, 0)) * taps[j]
            x = x + mixed
            nx = rmsnorm(x, w[p + "moe_norm"])
            top, idx = torch.topk(nx @ w[p + "router"], k, dim=-1)  # (B, T, k)
            gm = torch.zeros(bb, tt, g, device=dev).scatter(-1, idx + 1, torch.softmax(top, dim=-1))
            gm = gm + F.one_hot(torch.zeros_like(idx[..., 0]), g).to(gm.dtype)  # shared expert: gate 1
            hid = torch.relu(nx @ w[p + "w1"] + w[p + "b1"]).view(bb, tt, g, h) * gm[..., None]
            x = x + hid.view(bb, tt, g * h) @ w[p + "w2"] + gm @ w[p + "b2"]
        return x

    tc = train_config(b, t)
    decay = [x for x in w.values() if x.ndim >= 2]
    rest = [x for x in w.values() if x.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=tc.lr, betas=tc.betas, eps=tc.eps, fused=True)
    tokens = torch.tensor(np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t)), device=dev)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        hh = hidden(tokens)[:, :-1]
        loss = F.cross_entropy((hh.reshape(-1, cfg.d_model) @ w["emb"].T), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), tc.clip)
        opt.step()
        return loss.detach()

    loss0 = float(step())
    step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    total = time.perf_counter() - start

    doc_tokens = [torch.tensor(d, device=dev)[None] for d in docs]

    def embed_all() -> None:
        with torch.inference_mode():
            lens = torch.tensor([len(d) for d in docs], device=dev)
            batch = torch.nn.utils.rnn.pad_sequence([d[0] for d in doc_tokens], batch_first=True)
            for i in range(0, len(docs), 64):
                hh = hidden(batch[i:i + 64])
                real = (torch.arange(hh.shape[1], device=dev)[None, :] < lens[i:i + 64, None]).to(hh.dtype)
                pooled = (hh * real[..., None]).sum(1) / lens[i:i + 64, None]
                F.normalize(pooled, dim=-1, eps=1e-12)
        torch.cuda.synchronize()

    embed_all()
    embed_times = []
    for _ in range(3):
        t0 = time.perf_counter()
        embed_all()
        embed_times.append(time.perf_counter() - t0)
    return {"tokens_per_s": b * t * steps / total, "step_s": total / steps, "loss0": loss0,
            "embed_docs_per_s": len(docs) / min(embed_times), "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__}


def run_lm(args: argparse.Namespace) -> dict[str, Any]:
    """The lm section: numpy CPU, our GPU path and PyTorch CUDA on one config; prints a table."""
    cfg, b, t = lm_config(args.quick)
    rng = np.random.default_rng(1)
    docs = rng.integers(0, cfg.vocab_size, (args.embed_docs, t)).tolist()
    cpu_docs = docs[: max(4, min(len(docs), 64))]  # the numpy path is slow: fewer documents
    rows: dict[str, Any] = {}
    print(f"\nEvermindLM {cfg.to_dict()}  B={b} T={t}")
    rows["gpu_wgsl"] = bench_gpu_lm(cfg, b, t, args.steps, docs)
    rows["numpy_cpu"] = bench_numpy_lm(cfg, b, t, args.cpu_steps, cpu_docs)
    rows["torch_cuda"] = {"skipped": "--no-torch"} if args.no_torch else bench_torch_lm(cfg, b, t, args.steps, docs)
    rows["numpy_cpu"]["threads"] = int(os.environ["OPENBLAS_NUM_THREADS"])
    cpu = rows["numpy_cpu"]
    print(f"{'path':>12} {'train tok/s':>12} {'step ms':>9} {'vs numpy':>9} {'embed docs/s':>13} {'vs numpy':>9} "
          f"{'loss0':>8}")
    for name, r in rows.items():
        if "skipped" in r:
            print(f"{name:>12}  skipped: {r['skipped']}")
            continue
        r["train_vs_numpy"] = r["tokens_per_s"] / cpu["tokens_per_s"]
        r["embed_vs_numpy"] = r["embed_docs_per_s"] / cpu["embed_docs_per_s"]
        print(f"{name:>12} {r['tokens_per_s']:12.0f} {r['step_s'] * 1e3:9.2f} {r['train_vs_numpy']:8.1f}x "
              f"{r['embed_docs_per_s']:13.1f} {r['embed_vs_numpy']:8.1f}x {r['loss0']:8.4f}")
    g = rows["gpu_wgsl"]
    print(f"gpu: warm-up {g['warmup_s']:.2f} s, host recording {g['record_ms']:.2f} ms/step, "
          f"embedding max |gpu - numpy| {g['embed_max_abs_diff_vs_numpy']:.2e}; numpy on {cpu['threads']} threads")
    sys.stdout.flush()
    return {"config": cfg.to_dict(), "batch": b, "seq_len": t, **rows}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (and optionally save) the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", nargs="+", default=["matmul", "lm"], choices=["matmul", "lm"])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CI / software Vulkan)")
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="matmul sizes (default 4096 8192)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--kernels", nargs="+", default=["torch", "vec4", "general"],
                    choices=["torch", "vec4", "general"], help="matmul: what to time (default: all three)")
    ap.add_argument("--steps", type=int, default=None, help="lm: timed GPU / torch steps (default 20)")
    ap.add_argument("--cpu-steps", type=int, default=2, help="lm: timed numpy steps (best is kept)")
    ap.add_argument("--cpu-threads", type=int, default=2, help="lm: BLAS threads of the numpy path")
    ap.add_argument("--embed-docs", type=int, default=None, help="lm: documents embedded (default 256)")
    ap.add_argument("--no-torch", action="store_true", help="lm: leave out PyTorch CUDA")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    if args.sizes is None:
        args.sizes = [128] if args.quick else [4096, 8192]
    if args.steps is None:
        args.steps = 3 if args.quick else 20
    if args.embed_docs is None:
        args.embed_docs = 16 if args.quick else 256

    rng = np.random.default_rng(0)
    info = adapter_info()
    results: dict[str, Any] = {"adapter": info, "host": platform.node(), "python": platform.python_version(),
                               "quick": args.quick}
    print(f"adapter: {info.get('device')} ({info.get('backend')})")
    if "matmul" in args.sections:
        results["sizes"] = {}
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
    if "lm" in args.sections:
        results["lm"] = run_lm(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
