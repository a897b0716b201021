"""The embedder's GPU training step, old and new side by side in one process: ms/step and tokens/s.

Each variant runs recipe/train_embedder.py's own step (`Embed` + `step_loss`: query->doc InfoNCE both ways, the
teacher-vector head, the passages' similarity matrix, in-batch ranking distillation, AdamW, gradient clipping) on
the same random batches at the shipped shape (C=256, 4 layers, 4 experts top-2, attention pooling; vocabulary
16,384): 512 queries, 512 docs and 512 passages per step, random token ids and random unit teacher vectors.

Variants (each from the same initial weights):
    old            float32 products (TF32), eager, every group padded to its longest text, the experts as the
                   previous recipe computed them (all four per token, (E, B, T, C), then a gather)
    bf16           bf16 autocast, experts as two products over all experts side by side (mirror._moe_grouped)
    bf16+buckets   the same, each group embedded as 3 length buckets
    new            bf16 + buckets + torch.compile (dynamic shapes): the recipe's default step
    new+fused      the same with the fused AdamW kernel
    static         bf16 + buckets + torch.compile per shape + fused AdamW
    graphs         the same, each shape's forward and backward and the loss replayed as CUDA graphs (mode
                   "reduce-overhead"): `--compile graphs`

Two length profiles: "fixed" (queries 32 tokens, docs and passages 128, as the issue measured) and "mixed"
(lengths drawn from the training corpus's shape: queries 4-32, docs and passages 16-128 tokens, uniform). Timing:
--warmup steps (compiles included) then --steps timed steps, synchronised; tokens/s counts real (unpadded) tokens.

    python benchmarks/train_step_gpu.py [--steps 50] [--warmup 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "recipe"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mirror import MirrorLM  # noqa: E402
from train_embedder import Embed, step_loss  # noqa: E402

from evermind_memory.lm.model import EvermindLM, LMConfig, param_shapes  # noqa: E402

VARIANTS = {
    "old": {"precision": "fp32", "compile": "off", "buckets": 1, "moe": "gather"},
    "bf16": {"precision": "bf16", "compile": "off", "buckets": 1, "moe": "grouped"},
    "bf16+buckets": {"precision": "bf16", "compile": "off", "buckets": 3, "moe": "grouped"},
    "new": {"precision": "bf16", "compile": "dynamic", "buckets": 3, "moe": "grouped"},
    "new+fused": {"precision": "bf16", "compile": "dynamic", "buckets": 3, "moe": "grouped", "fused": True},
    "static": {"precision": "bf16", "compile": "static", "buckets": 3, "moe": "grouped", "fused": True},
    "graphs": {"precision": "bf16", "compile": "graphs", "buckets": 3, "moe": "grouped", "fused": True},
}


def make_data(rng: np.random.Generator, n_texts: int, vocab: int, profile: str, max_tokens: int = 128):
    """Token matrix (N, max_tokens), lengths (N,), and which rows are queries (short) vs docs/passages (long)."""
    half = n_texts // 2
    if profile == "fixed":
        lengths = np.concatenate([np.full(half, 32), np.full(n_texts - half, max_tokens)])
    else:
        lengths = np.concatenate([rng.integers(4, 33, half), rng.integers(16, max_tokens + 1, n_texts - half)])
    mat = rng.integers(1, vocab, size=(n_texts, max_tokens)).astype(np.int64)
    mat[np.arange(max_tokens)[None, :] >= lengths[:, None]] = 0
    return mat, lengths.astype(np.int64), np.arange(half), np.arange(half, n_texts)


def time_variant(name: str, spec: dict, cfg: LMConfig, init: dict, data, args, dev) -> dict:
    mat, lengths, short, long = data
    MirrorLM.moe_impl = spec["moe"]
    torch.backends.cuda.matmul.allow_tf32 = True
    model = MirrorLM(cfg.to_dict(), param_shapes(cfg), init).to(dev).train()
    head = torch.nn.Linear(cfg.d_model, 384, bias=False).to(dev)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01, fused=spec.get("fused", False))
    teach = F.normalize(torch.randn(len(lengths), 384, device=dev), dim=-1)
    buckets = args.buckets if args.buckets and spec["buckets"] > 1 else spec["buckets"]
    step_args = SimpleNamespace(precision=spec["precision"], compile=spec["compile"], buckets=buckets,
                                tau=0.05, kd_weight=4.0, kd_tau=None, distill_weight=4.0, simmat_weight=1.0)
    embed = Embed(model, torch.as_tensor(mat, device=dev), torch.as_tensor(lengths, device=dev), lengths, step_args,
                  dev)
    rng = np.random.default_rng(args.seed)
    B = args.batch

    def one() -> tuple[torch.Tensor, int]:
        """One training step; its loss stays on the device (reading it would wait for the step, as the recipe's
        loop does only every 100 steps)."""
        q, d, p = rng.choice(short, B), rng.choice(long, B), rng.choice(long, B)
        loss, _ = step_loss(embed, head, teach, q, d, p, None, step_args)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.detach().clone(), int(lengths[q].sum() + lengths[d].sum() + lengths[p].sum())

    t0 = time.perf_counter()
    step1_loss = float(one()[0])  # the same first batch and weights in every variant: the same loss up to rounding
    first_loss = step1_loss
    for _ in range(args.warmup - 1):
        first_loss = float(one()[0])
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    tokens = 0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        _, n = one()
        tokens += n
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    if name in args.profile.split(","):
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                one()
            torch.cuda.synchronize()
        events = prof.key_averages()
        # kernels only: an operator's row and an annotation's (a compiled graph's call, the optimizer step) repeat
        # the device time of the kernels they launched, so the table's own total counts those kernels twice
        gpu_us = sum(e.self_device_time_total for e in events
                     if e.device_type == DeviceType.CUDA and not e.is_user_annotation) / 5
        print(f"  profile of {name}: kernels {gpu_us / 1000:.1f} ms a step (wall {1000 * dt / args.steps:.1f})")
        print(events.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=60))
    res = {"ms_per_step": 1000 * dt / args.steps, "tokens_per_s": tokens / dt, "warmup_s": warm_s,
           "loss_step1": step1_loss,
           "loss_after_warmup": first_loss, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    torch.cuda.reset_peak_memory_stats()
    return res


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--profiles", default="fixed,mixed")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--buckets", type=int, default=0, help="length buckets of the bucketed variants (0: 3)")
    ap.add_argument("--profile", default="",
                    help="also profile 5 steps of these variants (comma-separated): kernel time and top kernels")
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg = LMConfig(vocab_size=16384, d_model=256, n_layers=4, conv_kernel=4, hidden_dim=256, n_experts=4, top_k=2,
                   attn_heads=4)
    init = EvermindLM(cfg, seed=args.seed).params
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": args.batch,
           "steps": args.steps, "results": {}}
    print(f"{out['device']}, torch {out['torch']}, batch {args.batch} x (query + doc + passage), {args.steps} steps")
    print(f"  {'profile':<8}{'variant':<14}{'ms/step':>9}{'tokens/s':>12}{'warm-up s':>11}{'peak GiB':>10}"
          f"{'loss 1':>9}{'loss w':>9}")
    for profile in args.profiles.split(","):
        data = make_data(np.random.default_rng(args.seed), 20000, cfg.vocab_size, profile)
        for name in args.variants.split(","):
            r = time_variant(name, VARIANTS[name], cfg, init, data, args, dev)
            out["results"][f"{profile}/{name}"] = r
            print(f"  {profile:<8}{name:<14}{r['ms_per_step']:>9.1f}{r['tokens_per_s']:>12,.0f}{r['warmup_s']:>11.1f}"
                  f"{r['peak_gib']:>10.2f}{r['loss_step1']:>9.4f}{r['loss_after_warmup']:>9.4f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
