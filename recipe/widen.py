"""Widen a trained EvermindLM checkpoint (more channels, more pooling heads, wider experts) without changing what it
computes, so that a larger student starts from the trained one instead of from scratch.

    python recipe/widen.py MODEL.evlm OUT.evlm --d-model 384 [--attn-heads 6] [--hidden 256] [--seed 0]

Every new channel starts at zero and stays zero until training moves it: whatever *writes* into the residual
stream (the embedding's new columns, the experts' and the pooling block's output columns, their biases) starts at
zero in the new places, while whatever *reads* the new channels or new hidden units (router and expert input rows,
the pooling block's q/k/v rows and new heads) starts small and random, so the gradient reaches the new writers at
the first step. RMSNorm averages over the channels, so with C old channels among C' the root-mean-square falls by
sqrt(C / C'); every norm's old gains are scaled by that factor to give the same normalised values. New pooling
heads keep the head width (C / heads unchanged, so the softmax scale is the same) and their output rows of `wo`
start at zero. The result's embeddings equal the old model's in the old channels (up to fp16 rounding of the saved
weights) and are zero in the new ones; `--check` embeds a few texts with both and prints the largest difference.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evermind_memory.lm.config import LMConfig, param_shapes  # noqa: E402
from evermind_memory.lm.model import load_model, save_model  # noqa: E402

NORMS = ("conv_norm", "moe_norm", "attn_norm", "out_norm")


def widen(cfg: LMConfig, params: dict[str, np.ndarray], d_model: int, attn_heads: int | None = None,
          hidden: int | None = None, seed: int = 0) -> tuple[LMConfig, dict[str, np.ndarray]]:
    """The widened (config, params); see the module docstring for why each part starts where it does."""
    c0, h0, n0 = cfg.d_model, cfg.hidden_dim, cfg.attn_heads
    c1, h1 = d_model, hidden or h0
    if c1 < c0 or h1 < h0:
        raise SystemExit(f"widen only grows: d_model {c0} -> {c1}, hidden {h0} -> {h1}")
    if n0:
        head = c0 // n0
        n1 = attn_heads or c1 // head
        if c1 % n1 or c1 // n1 != head:
            raise SystemExit(f"new pooling heads must keep the head width {head}: d_model {c1} / heads {n1}")
    else:
        n1 = 0
    new = LMConfig(**{**cfg.to_dict(), "d_model": c1, "hidden_dim": h1, "attn_heads": n1})
    rng = np.random.default_rng(seed)
    shrink = math.sqrt(c0 / c1)  # rms over c1 channels of which c0 are non-zero

    def small(shape, like: np.ndarray) -> np.ndarray:  # a reader's new entries: the old entries' spread, halved
        std = float(like.std()) if like.size else 0.02
        return rng.normal(0.0, 0.5 * std, size=shape).astype(np.float32)

    out: dict[str, np.ndarray] = {}
    for name, shape in param_shapes(new).items():
        old = params[name]
        leaf = name.rsplit(".", 1)[-1]
        if name == "emb":  # writer: new channels zero
            w = np.zeros(shape, np.float32)
            w[:, :c0] = old
        elif leaf in NORMS:
            w = np.full(shape, float(np.mean(old)) * shrink, np.float32)
            w[:c0] = old * shrink
        elif leaf == "conv":  # depthwise: a new channel reads and writes only itself; start as the identity tap
            w = np.zeros(shape, np.float32)
            w[0, c0:] = 1.0
            w[:, :c0] = old
        elif leaf == "router":  # reader
            w = np.concatenate([old, small((c1 - c0, old.shape[1]), old)])
        elif leaf == "w1":  # reads channels, writes hidden units: new rows and new columns both read-side
            w = small(shape, old)
            w[:c0, :h0] = old
        elif leaf == "b1":
            w = np.zeros(shape, np.float32)
            w[:h0] = old
        elif leaf == "w2":  # writer: new hidden units' rows and new channels' columns zero
            w = np.zeros(shape, np.float32)
            w[:h0, :c0] = old
        elif leaf == "b2":
            w = np.zeros(shape, np.float32)
            w[:c0] = old
        elif name == "pool.wqkv":  # (C, 3C): [q | k | v], each C as heads of equal width; new heads appended
            w = small(shape, old)
            for part in range(3):
                w[:c0, part * c1: part * c1 + c0] = old[:, part * c0: (part + 1) * c0]
        elif name == "pool.wo":  # writer: rows are head outputs, columns channels; only the old block kept
            w = np.zeros(shape, np.float32)
            w[:c0, :c0] = old
        else:
            raise SystemExit(f"widen does not know how to grow {name}")
        assert w.shape == tuple(shape), (name, w.shape, shape)
        out[name] = w.astype(np.float32)
    return new, out


CHECK_TEXTS = ["Ada takes her tea with lemon.", "what does Ada drink?", "The quick brown fox jumps over the dog.",
               "sqlite3.connect(database, timeout=5.0) opens a connection to the SQLite database file."]


def embed_both(old: str, new: str, tokenizer: str) -> tuple[np.ndarray, np.ndarray]:
    """CHECK_TEXTS embedded by two checkpoints with one tokenizer (numpy, CPU): `--check` of widen.py and deepen.py."""
    from evermind_memory.embedder import LMEmbedder
    from evermind_memory.lm.model import EvermindLM
    from evermind_memory.lm.tokenizer import BPETokenizer

    tok = BPETokenizer.load(tokenizer)
    return (LMEmbedder(EvermindLM.load(old), tok).embed_many(CHECK_TEXTS),
            LMEmbedder(EvermindLM.load(new), tok).embed_many(CHECK_TEXTS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--d-model", type=int, required=True)
    ap.add_argument("--attn-heads", type=int, default=None, help="default: d-model / the old head width")
    ap.add_argument("--hidden", type=int, default=None, help="expert hidden width (default: unchanged)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", default=None, metavar="TOKENIZER",
                    help="embed a few texts with both models (numpy, CPU) and print the largest difference")
    args = ap.parse_args()
    cfg, params = load_model(args.model)
    new_cfg, new_params = widen(cfg, params, args.d_model, args.attn_heads, args.hidden, args.seed)
    save_model(args.out, new_cfg, new_params, fp16=True)
    print(f"{cfg.to_dict()} -> {new_cfg.to_dict()}: {args.out}")
    if args.check:
        a, b = embed_both(args.model, args.out, args.check)
        print(f"old channels: max |diff| {np.abs(a - b[:, : a.shape[1]]).max():.2e}; "
              f"new channels: max |value| {np.abs(b[:, a.shape[1]:]).max():.2e}")


if __name__ == "__main__":
    main()
