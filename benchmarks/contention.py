"""Store speed under CPU contention, with BLAS held to one thread inside our calls (the default) and without.

For each setting the script opens a fresh store with the shipped model, times `remember_many(N)` and the
p50/p90 of hybrid recalls, first on an idle machine and then with busy-loop processes on every core (what other
programs, or other engineers on a shared machine, do). The two BLAS settings alternate in one process:
EVERMIND_BLAS_THREADS=1 (ours: every library call that runs numpy products holds OpenBLAS at one thread) and
EVERMIND_BLAS_THREADS=0 (OpenBLAS as numpy starts it: one thread per core, spinning while it waits).

    python benchmarks/contention.py [--facts 2000] [--queries 50] [--busy N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _spin() -> None:
    while True:
        pass


def _run(facts: int, queries: int, setting: str, workdir: Path, embedder) -> dict:
    from evermind_memory import MemoryStore
    from evermind_memory._blas import blas_limited, blas_threads

    os.environ["EVERMIND_BLAS_THREADS"] = setting
    texts = [f"fact {i}: the meeting about project {i % 37} moved to room {i % 11} on day {i % 7}"
             for i in range(facts)]
    db = workdir / f"bench-{setting}-{time.monotonic_ns()}.db"
    with MemoryStore(db, embedder) as store:
        t0 = time.perf_counter()
        store.remember_many(texts)
        write = time.perf_counter() - t0
        lat = []
        for i in range(queries):
            t0 = time.perf_counter()
            store.recall(f"where is the meeting about project {i % 37}", k=5)
            lat.append(time.perf_counter() - t0)
        with blas_limited():
            threads = blas_threads()
    return {"remember_many_s": write, "recall_p50_ms": 1e3 * float(np.percentile(lat, 50)),
            "recall_p90_ms": 1e3 * float(np.percentile(lat, 90)), "blas_threads_in_calls": threads}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--facts", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy-loop processes for the contended runs")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from evermind_memory.embedder import default_embedder

    embedder = default_embedder()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for contention in (0, args.busy):
            spinners = [mp.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(contention)]
            for p in spinners:
                p.start()
            try:
                time.sleep(1.0 if contention else 0)
                for setting in ("1", "0"):
                    r = _run(args.facts, args.queries, setting, Path(tmp), embedder)
                    r.update(busy=contention, blas=("1 thread in our calls" if setting == "1" else "numpy default"))
                    rows.append(r)
                    print(f"busy={contention:<3} blas={r['blas']:<22} threads={r['blas_threads_in_calls']}  "
                          f"remember_many({args.facts}) {r['remember_many_s']:7.2f} s   hybrid recall p50 "
                          f"{r['recall_p50_ms']:7.1f} ms  p90 {r['recall_p90_ms']:7.1f} ms", flush=True)
            finally:
                for p in spinners:
                    p.kill()
                    p.join()
    print(f"\n| busy processes | BLAS | remember_many({args.facts}) s | hybrid p50 ms | hybrid p90 ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['busy']} | {r['blas']} | {r['remember_many_s']:.2f} | {r['recall_p50_ms']:.1f} | "
              f"{r['recall_p90_ms']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps({"cpu_count": os.cpu_count(), "facts": args.facts, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
