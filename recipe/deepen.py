"""Deepen a trained EvermindLM checkpoint (more layers) without changing what it computes, so that a deeper student
starts from the trained one instead of from scratch: the depth half of the capacity curve (`widen.py` is the width).

    python recipe/deepen.py MODEL.evlm OUT.evlm --layers 6 [--check TOKENIZER]

A layer is x + conv(RMSNorm(x)), then + MoE(RMSNorm(.)): two residual branches, and the only things that write into
the residual stream are the conv's taps and the experts' output weights (`w2`, `b2`). A new layer is a copy of the
trained layer before it with those writers set to zero, so it adds nothing until training moves them, and what
reads the stream in it (norm gains, router, the experts' `w1`, `b1`) starts as trained features rather than noise.
The gradient reaches the writers at the first step: the conv taps' gradient is the normalised input times the
upstream gradient, `w2`'s the experts' hidden activations times it. The new layers are spread evenly among the old
ones (4 -> 6 puts one after the second old layer and one after the third); `--check` embeds a few texts with both
models and prints the largest difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evermind_memory.lm.config import LMConfig, param_shapes  # noqa: E402
from evermind_memory.lm.model import load_model, save_model  # noqa: E402

WRITERS = ("conv", "w2", "b2")


def plan(old_layers: int, new_layers: int) -> list[int | None]:
    """For each layer of the deeper model, the old layer it is, or None for a new one; new layers spread evenly
    (each follows the old layer it copies)."""
    if new_layers < old_layers:
        raise SystemExit(f"deepen only grows: {old_layers} -> {new_layers} layers")
    extra = new_layers - old_layers
    # new layer j (0..extra-1) follows old layer floor((j + 1) * old / (extra + 1)) (0-based): 4 -> 6 puts them after
    # old layers 1 and 2, so the first and last trained layers stay first and last
    after = [min(old_layers - 1, (j + 1) * old_layers // (extra + 1)) for j in range(extra)]
    out: list[int | None] = []
    for i in range(old_layers):
        out.append(i)
        out.extend([None] * after.count(i))
    return out


def deepen(cfg: LMConfig, params: dict[str, np.ndarray], n_layers: int) -> tuple[LMConfig, dict[str, np.ndarray]]:
    """The deepened (config, params); see the module docstring."""
    new = LMConfig(**{**cfg.to_dict(), "n_layers": n_layers})
    order = plan(cfg.n_layers, n_layers)
    out: dict[str, np.ndarray] = {}
    source = 0
    for layer, old in enumerate(order):
        fresh = old is None
        source = source if fresh else old
        for name in param_shapes(new):
            prefix = f"layers.{layer}."
            if not name.startswith(prefix):
                continue
            w = params[f"layers.{source}." + name[len(prefix):]].astype(np.float32, copy=True)
            if fresh and name.rsplit(".", 1)[-1] in WRITERS:
                w[...] = 0.0
            out[name] = w
    for name in param_shapes(new):
        if not name.startswith("layers."):
            out[name] = params[name].astype(np.float32, copy=True)
    shapes = param_shapes(new)
    assert {k: v.shape for k, v in out.items()} == shapes
    return new, {k: out[k] for k in shapes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--check", default=None, metavar="TOKENIZER",
                    help="embed a few texts with both models (numpy, CPU) and print the largest difference")
    args = ap.parse_args()
    cfg, params = load_model(args.model)
    new_cfg, new_params = deepen(cfg, params, args.layers)
    save_model(args.out, new_cfg, new_params, fp16=True)
    print(f"{cfg.n_layers} -> {new_cfg.n_layers} layers (new after old {plan(cfg.n_layers, args.layers)}): {args.out}")
    if args.check:
        from widen import embed_both  # (its neighbour in recipe/, on the path as the script's own folder)

        a, b = embed_both(args.model, args.out, args.check)
        print(f"max |diff| {np.abs(a - b).max():.2e}")


if __name__ == "__main__":
    main()
