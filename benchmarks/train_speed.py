"""Training speed and memory: our numpy LMTrainer (plain, checkpointed, mixed precision, LoRA, QLoRA)
beside the same model and training step written in PyTorch (CPU), in one run.

Speed: tokens/s of the best of --steps full optimizer steps (forward, backward, clip, AdamW) on B=16 sequences of T=128
random tokens, after one warm-up step; beside it the step's process CPU time (all threads) and tokens per
CPU-second, which other load on a shared machine disturbs much less than wall time. PyTorch starts from the same weights
(the step-0 losses are printed side by side as a check) and runs with --threads threads, as does numpy's BLAS. Memory:
the tracemalloc peak of one step of plain, checkpointed and QLoRA-int8 training (numpy reports its buffers to
tracemalloc), its activation part, and the training state kept between steps. Indicative only on a shared machine.

    python benchmarks/train_speed.py [--configs small,medium] [--steps 2] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

_THREADS = "2"
for _i, _a in enumerate(sys.argv):  # BLAS reads its thread count when numpy is imported
    if _a == "--threads" and _i + 1 < len(sys.argv):
        _THREADS = sys.argv[_i + 1]
    elif _a.startswith("--threads="):
        _THREADS = _a.split("=", 1)[1]
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _THREADS)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402

from evermind_memory.lm.model import EvermindLM, LMConfig  # noqa: E402
from evermind_memory.training import LMTrainer, LoRAModel, TrainConfig  # noqa: E402

CONFIGS = {
    "small": LMConfig(vocab_size=8192, d_model=128, n_layers=4, conv_kernel=4, hidden_dim=256, n_experts=4, top_k=2),
    "medium": LMConfig(vocab_size=16384, d_model=256, n_layers=6, conv_kernel=4, hidden_dim=512, n_experts=8, top_k=2),
}
B, T = 16, 128
MB = 1024.0**2


def make_data(cfg: LMConfig, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, size=(B, T)).tolist()


def train_config(**kw) -> TrainConfig:
    base = dict(lr=3e-3, weight_decay=0.01, batch_size=B, max_len=T, clip=1.0, progress=False)
    base.update(kw)
    return TrainConfig(**base)


def time_numpy(cfg: LMConfig, mode: str, data: list[list[int]], steps: int) -> dict:
    """Tokens/s of `steps` optimizer steps after one warm-up step."""
    model = EvermindLM(cfg, seed=0)
    if mode in ("lora", "qlora-int8"):
        lora = LoRAModel(model, rank=8, alpha=16.0, base_quant="int8" if mode == "qlora-int8" else "none")
        trainer = LMTrainer(lora, train_config(weight_decay=0.0))
    else:
        trainer = LMTrainer(model, train_config(checkpoint=(mode == "checkpointed"),
                                                mixed_precision=(mode == "mixed-precision")))
    trainer.fit(data, steps=1)
    times, cpu = [], []
    for _ in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        history = trainer.fit(data, steps=1)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return _speed(times, cpu, history.losses[0])


def _speed(times: list[float], cpu: list[float], loss0: float) -> dict:
    """Best step of the timed ones: on a shared machine the fastest step is the least disturbed."""
    best, best_cpu = min(times), min(cpu)
    return {"tokens_per_s": B * T / best, "step_s": best, "mean_step_s": sum(times) / len(times),
            "cpu_s": best_cpu, "tokens_per_cpu_s": B * T / best_cpu, "loss0": loss0}


def peak_memory(cfg: LMConfig, mode: str, data: list[list[int]]) -> dict:
    """tracemalloc peak of one training step above the state held before it, and that state's size."""
    model = EvermindLM(cfg, seed=0)
    if mode == "qlora-int8":
        target: object = LoRAModel(model, rank=8, alpha=16.0, base_quant="int8")
        del model  # the LoRAModel holds its own int8 copy of the base; the fp32 model can go
        trainer = LMTrainer(target, train_config(weight_decay=0.0))
        fp = target.footprint()
        state = fp.base_bytes + 3 * fp.adapter_bytes  # base as held + adapter + its two moments
    else:
        trainer = LMTrainer(model, train_config(checkpoint=(mode == "checkpointed")))
        state = sum(p.nbytes for p in model.params.values()) + sum(trainer.optimizer_state_bytes())
    tokens = np.asarray(data, dtype=np.int64)  # (B, T)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    trainer.fit(data, steps=1)
    step_peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    _, grads = trainer.model.loss_and_grads(tokens, None, checkpoint=(mode == "checkpointed"))
    grad_bytes = sum(g.nbytes for g in grads.values())
    lg_peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del grads
    return {"step_peak_mb": step_peak / MB, "activation_peak_mb": (lg_peak - grad_bytes) / MB,
            "state_mb": state / MB}


def torch_model(cfg: LMConfig, params: dict[str, np.ndarray]):
    """The same architecture in PyTorch, initialised from `params`; returns (module, step function)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    class TorchLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = torch.nn.ParameterDict(
                {name.replace(".", "_"): torch.nn.Parameter(torch.from_numpy(value.copy()))
                 for name, value in params.items()}
            )

        def w(self, name: str):
            return self.p[name.replace(".", "_")]

        @staticmethod
        def rmsnorm(x, gain):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gain

        def ffn(self, x, prefix: str):
            h = torch.relu(x @ self.w(prefix + ".w1") + self.w(prefix + ".b1"))
            return h @ self.w(prefix + ".w2") + self.w(prefix + ".b2")

        def layer(self, x, layer: int):
            p = f"layers.{layer}."
            n = self.rmsnorm(x, self.w(p + "conv_norm"))  # (B, T, C)
            ker = self.w(p + "conv")  # (K, C)
            y = n * ker[0]
            for k in range(1, min(cfg.conv_kernel, x.shape[1])):
                y = y + F.pad(n[:, :-k], (0, 0, k, 0)) * ker[k]
            x = x + y
            rows = self.rmsnorm(x, self.w(p + "moe_norm")).reshape(-1, x.shape[-1])  # (N, C)
            top_val, top_idx = (rows @ self.w(p + "router")).topk(cfg.top_k, dim=1)  # (N, k)
            gates = torch.softmax(top_val, dim=1).reshape(-1)  # (N*k,)
            out = self.ffn(rows, p + "shared")  # (N, C)
            flat = top_idx.reshape(-1)
            order = torch.argsort(flat, stable=True)
            counts = torch.bincount(flat, minlength=cfg.n_experts).tolist()
            start = 0
            for e, n_e in enumerate(counts):
                if n_e == 0:
                    continue
                slots = order[start:start + n_e]
                start += n_e
                sel = slots // cfg.top_k
                out = out.index_add(0, sel, self.ffn(rows[sel], p + f"expert{e}") * gates[slots, None])
            return x + out.reshape(x.shape)

        def forward(self, tokens, use_checkpoint: bool = False):
            emb = self.w("emb")
            x = emb[tokens]  # (B, T, C)
            for layer in range(cfg.n_layers):
                if use_checkpoint:
                    x = torch_checkpoint(self.layer, x, layer, use_reentrant=False)
                else:
                    x = self.layer(x, layer)
            logits = x[:, :-1].reshape(-1, x.shape[-1]) @ emb.T  # (B*(T-1), V)
            return F.cross_entropy(logits, tokens[:, 1:].reshape(-1))

    model = TorchLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)

    def step(tokens, use_checkpoint: bool = False) -> float:
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, use_checkpoint)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    return model, step


def time_torch(cfg: LMConfig, data: list[list[int]], steps: int, threads: int, use_checkpoint: bool) -> dict:
    import torch

    torch.set_num_threads(threads)
    _, step = torch_model(cfg, EvermindLM(cfg, seed=0).params)
    tokens = torch.tensor(data, dtype=torch.long)
    loss0 = step(tokens, use_checkpoint)
    times, cpu = [], []
    for _ in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        step(tokens, use_checkpoint)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return _speed(times, cpu, loss0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="small,medium")
    parser.add_argument("--steps", type=int, default=2, help="timed optimizer steps per mode (after 1 warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    results: dict = {"B": B, "T": T, "threads": args.threads, "numpy": np.__version__,
                     "python": platform.python_version(), "machine": platform.machine(), "speed": [], "memory": []}
    try:
        import torch

        results["torch"] = None if args.no_torch else torch.__version__
    except ImportError:
        results["torch"] = None
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        data = make_data(cfg)
        rows = [(f"numpy {mode}", time_numpy(cfg, mode, data, args.steps))
                for mode in ("plain", "checkpointed", "mixed-precision", "lora", "qlora-int8")]
        if results["torch"]:
            rows += [(f"torch {mode}", time_torch(cfg, data, args.steps, args.threads, mode == "checkpointed"))
                     for mode in ("plain", "checkpointed")]
        for label, r in rows:
            results["speed"].append({"config": name, "mode": label, **r})
        if not args.no_memory:
            for mode in ("plain", "checkpointed", "qlora-int8"):
                results["memory"].append({"config": name, "mode": mode, **peak_memory(cfg, mode, data)})

    print(f"B={B} T={T} threads={args.threads} numpy {results['numpy']} torch {results['torch']}")
    print(f"{'config':<8}{'mode':<22}{'tokens/s':>10}{'best s':>9}{'mean s':>9}{'cpu s':>8}{'tok/cpu-s':>11}"
          f"{'loss@0':>9}")
    for r in results["speed"]:
        print(f"{r['config']:<8}{r['mode']:<22}{r['tokens_per_s']:>10.0f}{r['step_s']:>9.3f}{r['mean_step_s']:>9.3f}"
              f"{r['cpu_s']:>8.3f}{r['tokens_per_cpu_s']:>11.0f}{r['loss0']:>9.4f}")
    if results["memory"]:
        print(f"\n{'config':<8}{'mode':<14}{'step peak MB':>13}{'activations MB':>16}{'state MB':>10}")
        for r in results["memory"]:
            print(f"{r['config']:<8}{r['mode']:<14}{r['step_peak_mb']:>13.1f}{r['activation_peak_mb']:>16.1f}"
                  f"{r['state_mb']:>10.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
