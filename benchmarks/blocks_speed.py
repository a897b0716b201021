"""Tokens/s of each sequence block (Mamba-1, Mamba-2, Mamba-3, attention) forward on our WGSL path beside a
PyTorch implementation of the same block with the same weights (reference scans written in torch ops, chunk
by chunk; naive masked attention; no fused kernels), at several sequence lengths.

WGSL times are wall clock from recording the block's command batch to the queue draining, inputs and
weights already on the device. Prints a table; --json writes the numbers. --quick runs tiny sizes (CPU ok).
Default lengths: 1k, 4k and 16k on a hardware adapter, 128 and 512 on a software one (lavapipe).
Usage: python benchmarks/blocks_speed.py [--lengths 1024,4096,16384] [--blocks attention]
       [--flash-variants 256x8,256x4,128x4] [--d-model 256] [--json out.json] [--quick]
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

from evermind_memory.gpu.blocks import sequence_ops as so  # noqa: E402
from evermind_memory.gpu.blocks.model import SequenceModelConfig, build_block  # noqa: E402
from evermind_memory.gpu.blocks.sequence_layer import RMS_EPS, SequenceLayer  # noqa: E402
from evermind_memory.gpu.device import adapter_info, get_device  # noqa: E402

KINDS = ("mamba1", "mamba2", "mamba3", "attention")


# ==== the same blocks in torch ===========================================================================

def torch_block(kind: str, block: SequenceLayer, device: str):
    """A torch forward x (B, L, C) -> (B, L, C) of `block` with its weights, or raises ImportError."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415, N812

    p = {k: torch.from_numpy(v).to(device) for k, v in block.parameters().items()}
    cfg = block.config

    def rms(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + RMS_EPS) * w

    def conv(x, w, b):  # x (B, L, D), w (K, D): tap k multiplies x[t - k]
        k = w.shape[0]
        xp = F.pad(x.transpose(1, 2), (k - 1, 0))  # (B, D, L + K - 1)
        return F.conv1d(xp, w.flip(0).T.unsqueeze(1), b, groups=x.shape[-1]).transpose(1, 2)

    def expm1_over(z):
        small = z.abs() < 0.1
        zs = torch.where(small, z, torch.zeros_like(z))
        series = 1 + zs * (1 / 2 + zs * (1 / 6 + zs * (1 / 24 + zs * (1 / 120 + zs / 720))))
        zl = torch.where(small, torch.ones_like(z), z)
        return torch.where(small, series, torch.expm1(zl) / zl)

    def chunk_scan(log_a, src, readout, q):
        """h_t = exp(log_a_t) h_{t-1} + src_t, chunk by chunk (closed form inside); returns readout(h, t0, t1)."""
        length = src.shape[1]
        h = torch.zeros((src.shape[0],) + src.shape[2:], dtype=src.dtype, device=src.device)
        outs = []
        for c0 in range(0, length, q):
            c1 = min(length, c0 + q)
            cum = torch.cumsum(log_a[:, c0:c1], dim=1)
            seg = cum[:, :, None] - cum[:, None, :]
            n = c1 - c0
            mask = torch.tril(torch.ones(n, n, dtype=torch.bool, device=src.device))
            mask = mask.reshape((1, n, n) + (1,) * (seg.ndim - 3))
            w = torch.exp(torch.where(mask, seg, torch.full_like(seg, float("-inf"))))
            hs = (w * src[:, None, c0:c1]).sum(2) + torch.exp(cum) * h[:, None]
            outs.append(readout(hs, c0, c1))
            h = hs[:, -1]
        return torch.cat(outs, dim=1)

    def softplus(x):
        return F.softplus(x)

    if kind == "mamba1":
        d, n, r = cfg.d_inner, cfg.d_state, cfg.rank

        def fwd(x):
            b, length, c = x.shape
            xz = rms(x, p["norm"]) @ p["w_in"] + p["b_in"]
            xs, z = xz[..., :d], xz[..., d:]
            u = F.silu(conv(xs, p["w_conv"], p["b_conv"]))
            dbc = u @ p["w_x"] + p["b_x"]
            delta = dbc[..., :r] @ p["w_dt"] + p["b_dt"]
            bm, cm = dbc[..., r:r + n], dbc[..., r + n:]
            dt = softplus(delta)
            a = -torch.exp(p["a_log"].clamp(-10, 5))
            za = dt[..., None] * a
            src = dt[..., None] * expm1_over(za) * bm[:, :, None, :] * u[..., None]
            y = chunk_scan(za, src, lambda hs, t0, t1: torch.einsum("bldn,bln->bld", hs, cm[:, t0:t1]), 16)
            y = (y + p["d"] * u) * F.silu(z)
            return x + y @ p["w_out"] + p["b_out"]
        return fwd

    if kind in ("mamba2", "mamba3"):
        d, h_, g, n, pdim = cfg.d_inner, cfg.n_heads, cfg.n_groups, cfg.d_state, cfg.d_head
        width = 2 if kind == "mamba3" else 1
        bcw = g * n * width
        grp = torch.arange(h_, device=device) * g // h_

        def fwd(x):
            b, length, c = x.shape
            proj = rms(x, p["pre_norm"]) @ p["w_in"]
            conv_d = d + 2 * bcw
            xbc, dt = proj[..., :conv_d], proj[..., conv_d:]
            cv = conv(xbc, p["w_conv"], p["b_conv"])
            xs, bm, cm = cv[..., :d], cv[..., d:d + bcw], cv[..., d + bcw:]
            xh = xs.reshape(b, length, h_, pdim)
            step = softplus(dt + p["dt_bias"])
            if kind == "mamba2":
                log_a = -softplus(p["a_log"]) * step
                bh = bm.reshape(b, length, g, n)[:, :, grp]
                ch = cm.reshape(b, length, g, n)[:, :, grp]
                src = bh[..., None] * xh[..., None, :]
            else:
                big_a = torch.complex(p["a_log"][:, 0], p["a_log"][:, 1])
                log_a = step.to(big_a.dtype) * big_a
                f = step.to(big_a.dtype) * expm1_over(log_a)
                bb = bm.reshape(b, length, g, n, 2)
                cc = cm.reshape(b, length, g, n, 2)
                bh = torch.complex(bb[..., 0], bb[..., 1])[:, :, grp]
                ch = torch.complex(cc[..., 0], cc[..., 1])[:, :, grp]
                src = (f[..., None] * bh)[..., None] * xh[..., None, :].to(big_a.dtype)
            y = chunk_scan(log_a[..., None, None], src,
                           lambda hs, t0, t1: torch.einsum("blhnp,blhn->blhp", hs, ch[:, t0:t1]), 32)
            y = y.real if torch.is_complex(y) else y
            y = (y + p["d"][:, None] * xh).reshape(b, length, d)
            return x + rms(y, p["norm"]) @ p["w_out"]
        return fwd

    heads = cfg.n_heads

    def fwd(x):
        b, length, c = x.shape
        qkv = rms(x, p["norm"]) @ p["w_qkv"] + p["b_qkv"]
        q, k, v = (qkv[..., i * c:(i + 1) * c].reshape(b, length, heads, -1).transpose(1, 2) for i in range(3))
        future = torch.triu(torch.ones(length, length, dtype=torch.bool, device=x.device), 1)
        per = _heads_per_chunk(b, length, heads, x.device)  # all heads at once unless L x L scores would not fit
        outs = []
        for h0 in range(0, heads, per):
            s = q[:, h0:h0 + per] @ k[:, h0:h0 + per].transpose(-1, -2) / (c // heads) ** 0.5
            s = s.masked_fill(future, float("-inf"))
            outs.append(torch.softmax(s, -1) @ v[:, h0:h0 + per])
        o = torch.cat(outs, 1).transpose(1, 2).reshape(b, length, c)
        cur = x + o @ p["w_o"] + p["b_o"]
        if cfg.ffn_mult:
            cur = cur + F.silu(cur @ p["w_ffn1"] + p["b_ffn1"]) @ p["w_ffn2"] + p["b_ffn2"]
        return cur
    return fwd


def _heads_per_chunk(b: int, length: int, heads: int, device) -> int:
    """Heads whose naive (B, heads, L, L) scores (about three live copies) fit half the free device memory."""
    import torch  # noqa: PLC0415

    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 8 << 30
    per_head = 3 * b * length * length * 4
    return max(1, min(heads, free // 2 // per_head))


# ==== timing =============================================================================================

def time_wgsl(block: SequenceLayer, x: np.ndarray, repeats: int) -> tuple[float, np.ndarray]:
    """Best seconds of one forward (record + submit + drain) with x already on the device; and the output."""
    dev = get_device()
    b, length, _ = x.shape
    x_buf, y_buf = dev.upload(x), dev.storage(x.nbytes)
    try:
        def once() -> None:
            batch = dev.batch()
            block.record_forward(batch, x_buf, y_buf, b, length)
            batch.submit()
            dev.wait()

        once()  # warm-up: pipelines, weight upload, pooled buffers
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            once()
            times.append(time.perf_counter() - t0)
        return min(times), dev.read(y_buf, np.float32, x.shape)
    finally:
        dev.release(x_buf)
        dev.release(y_buf)


def time_torch(fwd, x: np.ndarray, device: str, repeats: int) -> tuple[float, np.ndarray]:
    import torch  # noqa: PLC0415

    xt = torch.from_numpy(x).to(device)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    with torch.no_grad():
        out = fwd(xt)  # warm-up
        sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fwd(xt)
            sync()
            times.append(time.perf_counter() - t0)
    return min(times), out.float().cpu().numpy()


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    try:
        import torch  # noqa: PLC0415
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch_device = args.torch_device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_version = torch.__version__
    except ImportError:
        torch_device, torch_version = None, None
    cfg = SequenceModelConfig(vocab_size=2, d_model=args.d_model, n_layers=1, d_state=args.d_state,
                              n_heads=args.n_heads, chunk_len=args.chunk_len)
    rows = []
    for kind in args.blocks:
        block = build_block(kind, cfg, rng)
        # Weights away from their near-zero start, so every part of the block does work.
        block.load_parameters({n: a + (rng.standard_normal(a.shape) * 0.2).astype(np.float32)
                               for n, a in block.parameters().items()})
        fwd = torch_block(kind, block, torch_device) if torch_device else None
        # Flash-attention kernel variants (threads, lanes) to compare; None is the shipped default.
        variants = args.flash_variants if kind == "attention" and args.flash_variants else [None]
        for length in args.lengths:
            x = rng.standard_normal((args.batch, length, args.d_model)).astype(np.float32)
            torch_row: dict[str, Any] = {}
            if fwd is not None:
                try:
                    tsecs, tout = time_torch(fwd, x, torch_device, args.repeats)
                    torch_row = {"torch_seconds": tsecs, "torch_tokens_per_s": args.batch * length / tsecs}
                except Exception as exc:
                    torch_row, tout = {"torch_error": f"{type(exc).__name__}: {exc}"}, None
            for variant in variants:
                row: dict[str, Any] = {"block": kind, "seq_len": length, "batch": args.batch}
                if variant is not None:
                    row["flash_threads"], row["flash_lanes"] = variant
                so.FLASH_THREADS, so.FLASH_LANES = variant or (None, None)
                try:
                    secs, out = time_wgsl(block, x, args.repeats)
                    row["wgsl_seconds"] = secs
                    row["wgsl_tokens_per_s"] = args.batch * length / secs
                except Exception as exc:  # report and go on (e.g. a size over the device's limits)
                    row["wgsl_error"] = f"{type(exc).__name__}: {exc}"
                    out = None
                finally:
                    so.FLASH_THREADS, so.FLASH_LANES = None, None
                row.update(torch_row)
                if out is not None and "torch_tokens_per_s" in row:
                    row["max_abs_diff"] = float(np.abs(out - tout).max())
                    row["wgsl_over_torch"] = row["wgsl_tokens_per_s"] / row["torch_tokens_per_s"]
                rows.append(row)
                print_row(row)
        block.release()
    return {
        "benchmark": "blocks_speed",
        "config": {"lengths": args.lengths, "d_model": args.d_model, "d_state": args.d_state,
                   "n_heads": args.n_heads, "chunk_len": args.chunk_len, "batch": args.batch,
                   "repeats": args.repeats, "quick": args.quick,
                   "flash_variants": args.flash_variants},
        "adapter": adapter_info(),
        "torch": {"version": torch_version, "device": torch_device},
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "rows": rows,
    }


def print_row(row: dict[str, Any]) -> None:
    def fmt(key: str) -> str:
        v = row.get(key)
        return f"{v:>12.0f}" if isinstance(v, float) else f"{'-':>12}"

    ratio = row.get("wgsl_over_torch")
    diff = row.get("max_abs_diff")
    label = row["block"] + (f"/{row['flash_threads']}x{row['flash_lanes']}" if "flash_lanes" in row else "")
    print(f"{label:<16} {row['seq_len']:>7} {fmt('wgsl_tokens_per_s')} {fmt('torch_tokens_per_s')} "
          f"{(f'{ratio:.2f}' if ratio is not None else '-'):>8} {(f'{diff:.1e}' if diff is not None else '-'):>9}"
          f"  {row.get('wgsl_error', '')}{row.get('torch_error', '')}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", "--lens", nargs="+", default=None, metavar="L",
                    help="sequence lengths, space- or comma-separated (default: 1024,4096,16384 on a hardware "
                         "adapter, 128,512 on a software one)")
    ap.add_argument("--blocks", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--d-state", type=int, default=16)
    ap.add_argument("--n-heads", type=int, default=8)
    ap.add_argument("--chunk-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch-device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    ap.add_argument("--flash-variants", nargs="+", default=None, metavar="TxN",
                    help="time the attention block once per flash-kernel variant: THREADSxLANES (threads per "
                         "workgroup 64/128/256, lanes per query row), space- or comma-separated, e.g. "
                         "256x8,256x4,128x4; rows print as attention/TxN")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (L = 32, 64; d_model 16; one repeat)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.lengths is not None:
        args.lengths = [int(t) for item in args.lengths for t in item.split(",") if t.strip()]
    if args.flash_variants is not None:
        args.flash_variants = [tuple(int(n) for n in t.lower().split("x")) for item in args.flash_variants
                               for t in item.split(",") if t.strip()]
        if any(len(v) != 2 for v in args.flash_variants):
            ap.error("--flash-variants takes THREADSxLANES entries, e.g. 256x8")
    if args.quick:
        args.lengths = args.lengths or [32, 64]
        args.d_model, args.d_state, args.n_heads, args.repeats = 16, 4, 2, 1
    elif args.lengths is None:
        args.lengths = [128, 512] if adapter_info().get("software", True) else [1024, 4096, 16384]
    print(f"adapter: {adapter_info().get('description') or adapter_info()}")
    print(f"{'block':<16} {'L':>7} {'wgsl tok/s':>12} {'torch tok/s':>12} {'ratio':>8} {'max|diff|':>9}")
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
