"""What a second stage that reads the question and each memory together would cost on the CPU (issue 36), by shape.

A reranker of our kind runs EvermindLM over "question [SEP] memory" for each of the top N candidates of hybrid
recall and scores the pooled vector. Its cost does not depend on the weights, so this times random-weight models
(seeded) of several shapes on real inputs: the personal-memory dev set's questions, each paired with N of its facts
(benchmarks/personal_data.py), tokenised by the shipped tokenizer. For each shape and N it reports the p50 and p99
milliseconds of scoring one question's N candidates (one batched forward, as recall would run it) and how many
tokens a pair holds. The issue's budget: 30 candidates in <= 25 ms p50 and <= 40 ms p99 on 2 cores.

    python benchmarks/rerank_speed.py [--n 10,20,30,50] [--queries 200] [--shapes C,L,H;...] [--json out.json]

Like embed_speed.py, numbers from a shared machine: the shapes run in turn, so load hits them alike; the load average
is recorded.
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "2")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from evermind_memory.lm.model import EvermindLM, LMConfig  # noqa: E402
from evermind_memory.lm.tokenizer import BPETokenizer  # noqa: E402
from personal_data import personal_set  # noqa: E402

SEP = " [SEP] "
MAX_PAIR_TOKENS = 96
DEFAULT_SHAPES = "128,2,128;128,4,256;256,2,256;256,4,256"  # C, layers, expert hidden (the last: the embedder's)


def pair_batches(tok: BPETokenizer, n: int, queries: int, seed: int = 0) -> list[list[list[int]]]:
    """`queries` batches of n token lists "question [SEP] fact": each question with its own fact and n - 1 others
    (its person's first, then any), truncated to MAX_PAIR_TOKENS."""
    ps = personal_set()
    rng = np.random.default_rng(seed)
    facts = [f.text for f in ps.facts]
    asked = [q for q in ps.questions if q.fact is not None]
    out = []
    for qi in rng.choice(len(asked), size=min(queries, len(asked)), replace=False):
        q = asked[int(qi)]
        same = [i for i, f in enumerate(ps.facts) if f.user == q.user and i != q.fact]
        rest = [int(i) for i in rng.permutation(len(facts)) if int(i) != q.fact and int(i) not in same]
        cands = ([q.fact] + same + rest)[:n]
        out.append([tok.encode(q.text + SEP + facts[i])[:MAX_PAIR_TOKENS] for i in cands])
    return out


def time_shape(cfg: LMConfig, batches: list[list[list[int]]]) -> tuple[float, float]:
    """(p50, p99) ms of one batched forward + a linear score per batch, after a warm-up."""
    engine = EvermindLM(cfg, seed=0).frozen()
    head = np.random.default_rng(1).normal(size=(cfg.d_model,)).astype(np.float32)
    for b in batches[:5]:
        engine.embed_batch(b) @ head
    ms = []
    for b in batches:
        t0 = time.perf_counter()
        scores = engine.embed_batch(b) @ head  # (N,)
        ms.append((time.perf_counter() - t0) * 1000.0)
        assert scores.shape == (len(b),)
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="10,20,30,50", help="candidates per question")
    ap.add_argument("--queries", type=int, default=200, help="questions timed per shape and N")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="C,layers,hidden;... (V=16384, K=4, E=4, top-2, 4 heads)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    tok = BPETokenizer.load(REPO / "evermind_memory" / "models" / "tokenizer.json")
    shapes = {}
    for spec in args.shapes.split(";"):
        c, layers, hidden = (int(x) for x in spec.split(","))
        shapes[f"C={c} L={layers} H={hidden}"] = LMConfig(vocab_size=len(tok), d_model=c, n_layers=layers,
                                                          conv_kernel=4, hidden_dim=hidden, n_experts=4, top_k=2,
                                                          attn_heads=4)
    load0 = os.getloadavg()[0]
    rows: dict[str, dict] = {}
    ns = [int(x) for x in args.n.split(",")]
    tokens = {}
    for n in ns:
        batches = pair_batches(tok, n, args.queries)
        tokens[n] = float(np.mean([len(t) for b in batches for t in b]))
        for name, cfg in shapes.items():
            p50, p99 = time_shape(cfg, batches)
            rows.setdefault(name, {})[str(n)] = {"p50_ms": round(p50, 2), "p99_ms": round(p99, 2)}
    load1 = os.getloadavg()[0]
    print(f"Reranking cost: one question's N candidates as 'question [SEP] memory' pairs (mean "
          f"{np.mean(list(tokens.values())):.1f} tokens), one batched forward, random weights; "
          f"{args.queries} questions; load avg {load0:.2f} -> {load1:.2f}")
    print(f"{'shape':<22}" + "".join(f"{f'N={n} p50 / p99 ms':>22}" for n in ns))
    for name, r in rows.items():
        print(f"{name:<22}" + "".join(f"{r[str(n)]['p50_ms']:>12.1f} / {r[str(n)]['p99_ms']:<7.1f}" for n in ns))
    out = {"rows": rows, "mean_pair_tokens": tokens, "queries": args.queries, "load_avg": [load0, load1],
           "budget": "N=30: <= 25 ms p50, <= 40 ms p99 on 2 cores (issue 36)"}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
