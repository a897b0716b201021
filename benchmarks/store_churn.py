"""Disk use of a store under remember/forget churn: does the file stay bounded?

A steady state of `--live` facts: each step remembers a new fact (about 120 characters, one tag) and forgets
the oldest, so `--ops` operations are half remembers, half forgets. The database file, its WAL and the index
snapshot are measured every `--every` operations (after a flush, so every vector is in). The WAL file is kept
by SQLite at its largest size up to the store's limit (backend/sqlite.py WAL_SIZE_LIMIT, 64 MB) and reused
after each checkpoint, so it levels off on its own; the database file is what the history grows. Variants, each on its
own file, one after another in one process:
  no compact          churn only: a forget keeps the fact's history (its text), so the changes table grows
  compact only        compact(keep_history=0, vacuum=False) every --every ops: the history of forgotten facts
                      goes; SQLite reuses the free pages, so the file stops growing (it does not shrink)
  compact + vacuum    compact(keep_history=0) every --every ops: the same, and VACUUM gives the pages back
  ttl + sweeper       no forget calls: each fact is remembered with --ttl seconds to live, the store's background
                      sweeper (its interval set to 1 s here) deletes expired facts through forget, and compact
                      runs as above; the live facts are however many were remembered in the last --ttl seconds
Vectors come from an untrained EvermindLM with the shipped model's width (256 floats a vector: the bytes on
disk are the same, the embedding is much faster); --model shipped uses the shipped model itself.

    python benchmarks/store_churn.py [--ops 100000] [--live 1000] [--every 10000] [--ttl 2] [--model tiny|shipped]
                                     [--json out.json]
    python benchmarks/store_churn.py --report benchmarks/results/store_churn.json   (the tables again)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evermind_memory import MemoryStore  # noqa: E402
from evermind_memory.store import maintenance  # noqa: E402

VARIANTS = ("no compact", "compact only", "compact + vacuum", "ttl + sweeper")


def embedder(kind: str):
    """The shipped model, or an untrained EvermindLM of the same width on the shipped tokenizer."""
    from evermind_memory import default_embedder

    shipped = default_embedder()
    if kind == "shipped":
        return shipped
    from evermind_memory.embedder import LMEmbedder
    from evermind_memory.lm.model import EvermindLM, LMConfig

    cfg = LMConfig(vocab_size=len(shipped.tokenizer), d_model=shipped.dimensions, n_layers=1, hidden_dim=256)
    return LMEmbedder(EvermindLM(cfg, seed=0), shipped.tokenizer)


def text(i: int) -> str:
    return (f"note {i}: the customer asked about invoice {i * 7919 % 100_000} and the follow-up call on day "
            f"{i % 28 + 1}; owner agent-{i % 13}.")


def sizes(path: Path) -> dict:
    """Bytes of the database, its WAL and the index files."""
    db = path.stat().st_size
    wal = Path(str(path) + "-wal").stat().st_size if Path(str(path) + "-wal").exists() else 0
    index = sum(p.stat().st_size for p in path.parent.glob(path.name + ".*.hnsw"))
    return {"db": db, "wal": wal, "index": index, "total": db + wal + index}


def churn(path: Path, emb, variant: str, ops: int, live: int, every: int, ttl_s: float) -> list[dict]:
    """Run one variant; returns a row per checkpoint."""
    rows = []
    ttl = variant == "ttl + sweeper"
    maintenance.SWEEP_INTERVAL = 1.0 if ttl else 60.0  # read when the sweeper thread starts
    with MemoryStore(path, emb) as store:
        queue: list[str] = []
        t0 = time.perf_counter()
        done = i = 0
        checkpoint = every
        while done < ops:
            if ttl:
                store.remember(text(i), tags={"kind": "note"}, ttl=ttl_s)
                done += 2  # a remember, and the forget the sweeper does for it later
            else:
                queue.append(store.remember(text(i), tags={"kind": "note"}))
                done += 1
                if len(queue) > live:
                    store.forget(queue.pop(0))
                    done += 1
            i += 1
            if done >= checkpoint:
                checkpoint += every
                store.flush()
                if variant != "no compact":
                    store.compact(keep_history=0, vacuum=variant != "compact only")
                stats = store.stats()
                rows.append({"ops": done, "facts": stats.facts, "changes": stats.changes, **sizes(path),
                             "seconds": round(time.perf_counter() - t0, 1)})
                print(f"  {variant:20s} {done:>8,} ops  {rows[-1]['total'] / 1e6:8.2f} MB  "
                      f"{stats.changes:>8,} history rows  {rows[-1]['seconds']:7.1f} s", flush=True)
    return rows


def print_tables(results: dict, chosen: list[str], live: int, model: str) -> None:
    """The database file alone, then with its WAL and the index, per checkpoint and variant (MB)."""
    checkpoints = sorted({r["ops"] for rows in results.values() for r in rows})
    for title, key in (("database file", "db"), ("database + WAL + index", "total")):
        print(f"\nMB on disk, {title}, under remember/forget churn ({live:,} live facts, model {model})")
        print(f"{'ops':>9s} " + " ".join(f"{v:>20s}" for v in chosen))
        for ops in checkpoints:
            cells = []
            for v in chosen:
                row = next((r for r in results[v] if r["ops"] == ops), None)
                cells.append(f"{row[key] / 1e6:17.2f} MB" if row else f"{'-':>20s}")
            print(f"{ops:>9,} " + " ".join(cells))
    print(f"{'live':>9s} " + " ".join(f"{results[v][-1]['facts']:>14,} facts" for v in chosen))
    print(f"{'history':>9s} " + " ".join(f"{results[v][-1]['changes']:>15,} rows" for v in chosen))
    print(f"{'time':>9s} " + " ".join(f"{results[v][-1]['seconds']:>18.0f} s" for v in chosen))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--live", type=int, default=1000)
    ap.add_argument("--every", type=int, default=10_000)
    ap.add_argument("--ttl", type=float, default=2.0, help="seconds a fact lives in the ttl variant")
    ap.add_argument("--model", choices=("tiny", "shipped"), default="tiny")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of: " + ", ".join(VARIANTS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--report", type=Path, help="print the tables of an earlier run's --json file and exit")
    args = ap.parse_args()
    if args.report:
        saved = json.loads(args.report.read_text(encoding="utf-8"))
        print_tables(saved["results"], list(saved["results"]), saved["live"], saved["model"])
        return
    if args.ttl <= 0:
        raise SystemExit("--ttl expects seconds > 0")
    emb = embedder(args.model)
    chosen = [v.strip() for v in args.variants.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for n, variant in enumerate(chosen):
            results[variant] = churn(Path(d) / f"churn{n}.db", emb, variant, args.ops, args.live, args.every, args.ttl)
    print_tables(results, chosen, args.live, args.model)
    if args.json:
        args.json.write_text(json.dumps({"ops": args.ops, "live": args.live, "every": args.every, "model": args.model,
                                         "results": results}, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
