"""A recall query's embedding on the shipped model: the single-text path padded to 4k positions against unpadded.

A query of T tokens runs T rows through every matrix product of the model (the MoE's experts, the pooling block).
OpenBLAS's sgemm (the Haswell kernels numpy's wheels pick on x86 without AVX-512) handles rows in steps of 4 and
the rest through slower edge code, so 10 rows can cost more than 12. `plan_embed_one` now pads a single text to a
multiple of 4 positions after its last token (the causal convolutions never read them; the pooling masks them as it
does a bucket's padding). This runs, alternately in one process with one BLAS thread (as the library does):
- unpadded: the model's forward on the T positions, the way plan_embed_one ran before;
- padded: plan_embed_one as shipped;
on every token count from 1 to 16 (a text of that many tokens) and on recall questions (benchmarks/scale.py's
generator), reporting the median call (the two
paths in turns on the same input), and the largest difference between the two paths' vectors.
Also the router's gates, old (np.partition, then the maximum) against new (one np.sort gives both), on 12 rows.

    python benchmarks/query_speed.py [--rounds 3] [--calls 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from evermind_memory.embedder.loader import default_embedder  # noqa: E402
from evermind_memory.lm import inference, moe  # noqa: E402
from scale import questions  # noqa: E402


def unpadded(plan, seq: np.ndarray) -> np.ndarray:
    """The single-text path before padding: the forward over exactly the text's positions."""
    h = inference._plan_hidden(plan, seq[None, :])  # (T, C)
    return inference._normalise_rows(inference._plan_pool(plan, h, 1, None))[0]


def gate_partition(x: np.ndarray, router: np.ndarray, top_k: int) -> np.ndarray:
    """The gates as computed before: np.partition for the k-th logit, then a separate maximum."""
    logits = x @ router  # (N, E)
    n, n_experts = logits.shape
    kth = np.partition(logits, n_experts - top_k, axis=1)[:, n_experts - top_k, None]  # (N, 1)
    chosen = logits >= kth  # (N, E)
    if np.count_nonzero(chosen) != n * top_k:  # (a tie: the product falls back to the exact route)
        raise AssertionError("a tie in the benchmark's random logits")
    g = logits - logits.max(axis=1, keepdims=True)  # (N, E)
    np.exp(g, out=g)
    g *= chosen
    g /= g.sum(axis=1, keepdims=True)
    return g


def interleaved_us(fns: dict, inputs: list, calls: int) -> dict[str, list[float]]:
    """Microseconds of each of fns on each call, the variants back to back on the same input (in turns, so drift
    on a shared machine hits them alike)."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for i in range(calls):
        arg = inputs[i % len(inputs)]
        for name in (names if i % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            fns[name](arg)
            out[name].append((time.perf_counter() - t0) * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every case")
    parser.add_argument("--calls", type=int, default=200, help="calls per variant, case and round")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    emb = default_embedder()
    model, tok = emb.model, emb.tokenizer
    plan = inference.build_plan(model.config, model.params, fused=True)
    rng = np.random.default_rng(0)
    vocab = model.config.vocab_size
    cases: dict[str, list[np.ndarray]] = {
        f"{t} tokens": [rng.integers(1, vocab, size=t).astype(np.intp) for _ in range(8)] for t in range(1, 17)}
    qs = questions(400, seed=11)
    cases["recall questions"] = [np.asarray(tok.encode(q), dtype=np.intp) for q in qs]
    variants = {"unpadded": lambda s: unpadded(plan, s), "padded": lambda s: inference.plan_embed_one(plan, s)}

    worst = 0.0
    for seqs in cases.values():
        for s in seqs:
            worst = max(worst, float(np.abs(unpadded(plan, s) - inference.plan_embed_one(plan, s)).max()))

    times: dict[str, dict[str, list[float]]] = {case: {v: [] for v in variants} for case in cases}
    x = rng.standard_normal((12, model.config.d_model)).astype(np.float32)
    router = np.ascontiguousarray(plan.moe[0].router)
    gates = {"partition": lambda _: gate_partition(x, router, plan.top_k),
             "sort": lambda _: moe._gate_matrix(x, router, plan.top_k)}
    gate_times: dict[str, list[float]] = {g: [] for g in gates}
    for _ in range(args.rounds):
        for case, seqs in cases.items():
            for name, got in interleaved_us(variants, seqs, args.calls).items():
                times[case][name] += got
        for name, got in interleaved_us(gates, [None], 10 * args.calls).items():
            gate_times[name] += got
    best = {case: {v: float(np.median(t)) for v, t in row.items()} for case, row in times.items()}
    gate_best = {g: float(np.median(t)) for g, t in gate_times.items()}

    lengths = [len(s) for s in cases["recall questions"]]
    print(f"Single-text embedding (model part, no lexicon), one BLAS thread, median of {args.rounds} x {args.calls} "
          f"calls, the variants in turns on the same input; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores")
    print(f"recall questions: {len(lengths)}, {min(lengths)}-{max(lengths)} tokens (median {np.median(lengths):.0f})")
    print(f"largest |padded - unpadded| in any vector component: {worst:.2e}")
    print("| text | unpadded us | padded us | change |")
    print("|---|---|---|---|")
    for case, row in best.items():
        print(f"| {case} | {row['unpadded']:.0f} | {row['padded']:.0f} | "
              f"{(row['padded'] / row['unpadded'] - 1) * 100:+.0f}% |")
    print(f"router gates of 12 rows: partition + max {gate_best['partition']:.1f} us, one sort "
          f"{gate_best['sort']:.1f} us (x {len(plan.moe)} layers a query)")
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "calls": args.calls, "max_abs_diff": worst,
                                         "median_us": best, "gates_us": gate_best,
                                         "fingerprint": emb.fingerprint}, indent=1) + "\n")


if __name__ == "__main__":
    main()
