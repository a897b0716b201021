"""Speed of our numpy EvermindLM against the same architecture in PyTorch (CPU), with the same weights.

For each config: forward tokens/s (logits for every position), forward+backward tokens/s (mean next-token
loss and all parameter gradients; PyTorch through autograd) and embed docs/s (mean-pooled, L2-normalised
final hidden states). Both sides get the same number of threads (OpenBLAS for numpy, torch.set_num_threads).
The best of --repeats timed runs is reported, after one warm-up; numpy and torch runs alternate, so load from
other processes hits both alike. Indicative only on a shared machine (--threads 1 --clock cpu is steadiest).

    pip install torch==2.13.0
    python benchmarks/lm_speed.py [--configs small,medium] [--repeats 3] [--threads 2] [--clock wall|cpu]
                                  [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path


def _threads_from_argv() -> str:
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "2"


# BLAS reads these once, at numpy's import.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _threads_from_argv())
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from evermind_memory.lm.model import EvermindLM, LMConfig  # noqa: E402

CONFIGS = {
    "small": LMConfig(vocab_size=8192, d_model=128, n_layers=4, conv_kernel=4, hidden_dim=256, n_experts=4, top_k=2),
    "medium": LMConfig(vocab_size=16384, d_model=256, n_layers=6, conv_kernel=4, hidden_dim=512, n_experts=8, top_k=2),
}


def build_torch_model(torch, model: EvermindLM):
    """The same architecture in PyTorch, holding copies of `model`'s weights as leaf tensors."""
    cfg = model.config
    params = {n: torch.tensor(p, requires_grad=True) for n, p in model.params.items()}
    ffn_names = ("w1", "b1", "w2", "b2")

    def rmsnorm(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g

    def ffn(x, prefix):
        w1, b1, w2, b2 = (params[f"{prefix}.{n}"] for n in ffn_names)
        return torch.relu(x @ w1 + b1) @ w2 + b2

    def hidden(tokens):
        b, t = tokens.shape
        x = params["emb"][tokens]  # (B, T, C)
        for layer in range(cfg.n_layers):
            p = f"layers.{layer}."
            n = rmsnorm(x, params[p + "conv_norm"])
            w = params[p + "conv"]
            mixed = n * w[0]
            for k in range(1, min(cfg.conv_kernel, t)):
                mixed = mixed + torch.nn.functional.pad(n[:, : t - k], (0, 0, k, 0)) * w[k]
            x = x + mixed
            flat = x.reshape(b * t, -1)
            n = rmsnorm(flat, params[p + "moe_norm"])
            top_logits, top_experts = torch.topk(n @ params[p + "router"], cfg.top_k, dim=1)
            gates = torch.softmax(top_logits, dim=1).reshape(-1)
            flat_experts = top_experts.reshape(-1)
            order = torch.argsort(flat_experts, stable=True)
            counts = torch.bincount(flat_experts, minlength=cfg.n_experts).tolist()
            out = ffn(n, p + "shared")
            start = 0
            for e, count in enumerate(counts):
                if count == 0:
                    continue
                slots = order[start : start + count]
                rows = slots // cfg.top_k
                ye = ffn(n[rows], f"{p}expert{e}") * gates[slots, None]
                out = out.index_add(0, rows, ye)
                start += count
            x = (flat + out).reshape(b, t, -1)
        return x

    def logits(tokens):
        return hidden(tokens) @ params["emb"].T

    def loss_and_backward(tokens):
        for p in params.values():
            p.grad = None
        h = hidden(tokens)[:, :-1]
        lg = h.reshape(-1, h.shape[-1]) @ params["emb"].T
        loss = torch.nn.functional.cross_entropy(lg, tokens[:, 1:].reshape(-1))
        loss.backward()
        return float(loss.detach())

    def embed(tokens):
        return torch.nn.functional.normalize(hidden(tokens).mean(dim=1), dim=1)

    return logits, loss_and_backward, embed


def best_times(fns: dict, repeats: int, clock) -> dict:
    """Best of `repeats` timings of each function, interleaved so that load on a shared machine hits all alike."""
    for fn in fns.values():
        fn()  # warm-up: allocator, BLAS buffers, lazy init
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = clock()
            fn()
            best[name] = min(best[name], clock() - start)
    return best


def run_config(cfg: LMConfig, torch, batch: int, seq_len: int, repeats: int, clock) -> dict:
    model = EvermindLM(cfg, seed=0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (batch, seq_len))  # (B, T)
    docs = [row.tolist() for row in tokens]
    n_tok = batch * seq_len
    t_logits, t_loss_backward, t_embed = build_torch_model(torch, model)
    t_tokens = torch.from_numpy(tokens)

    with torch.inference_mode():
        parity = float(np.max(np.abs(t_logits(t_tokens).numpy() - model.forward(tokens))))
        embed_parity = float(np.max(np.abs(t_embed(t_tokens).numpy() - model.embed_batch(docs))))
    loss_np = model.loss_and_grads(tokens)[0]
    loss_torch = t_loss_backward(t_tokens)

    def torch_forward():
        with torch.inference_mode():
            t_logits(t_tokens)

    def torch_embed():
        with torch.inference_mode():
            t_embed(t_tokens)

    times = {"numpy": {}, "torch": {}}
    for task, np_fn, torch_fn in [
        ("forward", lambda: model.forward(tokens), torch_forward),
        ("forward_backward", lambda: model.loss_and_grads(tokens), lambda: t_loss_backward(t_tokens)),
        ("embed", lambda: model.embed_batch(docs), torch_embed),
    ]:
        best = best_times({"numpy": np_fn, "torch": torch_fn}, repeats, clock)
        times["numpy"][task], times["torch"][task] = best["numpy"], best["torch"]
    result = {
        "config": cfg.to_dict(),
        "batch": batch,
        "seq_len": seq_len,
        "parameters": model.num_parameters(),
        "max_abs_logit_diff": parity,
        "max_abs_embedding_diff": embed_parity,
        "loss": {"numpy": loss_np, "torch": loss_torch},
    }
    for impl, t in times.items():
        result[impl] = {
            "forward_tokens_per_s": n_tok / t["forward"],
            "forward_backward_tokens_per_s": n_tok / t["forward_backward"],
            "embed_docs_per_s": batch / t["embed"],
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="small,medium", help="comma-separated names from: " + ", ".join(CONFIGS))
    parser.add_argument("--batch", type=int, default=16, help="sequences per batch (B)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (T)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (best is kept)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both numpy's BLAS and torch")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: elapsed time; cpu: this process's CPU time, steadier on a busy machine but meaningful "
        "only with --threads 1 (idle BLAS threads spin and count)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()

    try:
        import torch
    except ImportError:
        sys.exit("lm_speed.py compares against PyTorch: pip install torch==2.13.0")
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time

    results = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            "threads": args.threads,
            "clock": args.clock,
            "repeats": args.repeats,
        },
        "configs": {},
    }
    header = f"{'config':<8} {'impl':<6} {'fwd tok/s':>11} {'fwd+bwd tok/s':>14} {'embed docs/s':>13}"
    print(header)
    print("-" * len(header))
    for name in args.configs.split(","):
        res = run_config(CONFIGS[name], torch, args.batch, args.seq_len, args.repeats, clock)
        results["configs"][name] = res
        for impl in ("numpy", "torch"):
            r = res[impl]
            print(
                f"{name:<8} {impl:<6} {r['forward_tokens_per_s']:>11,.0f} "
                f"{r['forward_backward_tokens_per_s']:>14,.0f} {r['embed_docs_per_s']:>13,.1f}"
            )
        ratio = {k: res["numpy"][k] / res["torch"][k] for k in res["numpy"]}
        print(
            f"{name:<8} {'np/pt':<6} {ratio['forward_tokens_per_s']:>10.2f}x "
            f"{ratio['forward_backward_tokens_per_s']:>13.2f}x {ratio['embed_docs_per_s']:>12.2f}x"
            f"   (max |logit diff| {res['max_abs_logit_diff']:.1e}, loss {res['loss']['numpy']:.4f} vs "
            f"{res['loss']['torch']:.4f})"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
