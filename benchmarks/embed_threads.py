"""Embedding workers in bulk writes: EVERMIND_EMBED_THREADS=1 against 2 (the default on 2 cores), in one run.

For each worker count, alternating, --rounds times (the best of the rounds is kept, so load from other processes
hits every row alike), with the shipped model:
- embed_many of --embed short personal facts (benchmarks/scale.py's generator), texts a second;
- remember_many in calls of 1000 into a fresh store (background embedding off), or into a copy of --db (a store
  benchmarks/scale.py built: adding to a large graph costs more), facts a second: the first half of --facts with
  nothing beside it;
- the second half with a second thread of the same process recalling (hybrid, k=10) from another store of 1000
  facts all the while: the write's rate then, and the recalls' p50 against their p50 with nothing running.
The library's own background threads (the store's vector thread, adaptation) keep one worker whatever the
default (evermind_memory/lm/inference.py embed_threads); this measures the calls a user waits for.

    python benchmarks/embed_threads.py [--threads 1,2] [--facts 10000] [--embed 2000] [--rounds 2]
                                       [--db STORE.db] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from evermind_memory import MemoryStore  # noqa: E402
from evermind_memory.lm.inference import EMBED_THREADS_ENV  # noqa: E402
from scale import facts, questions, store_files  # noqa: E402

BATCH = 1000
SIDE_FACTS = 1000


def copy_store(db: Path, into: Path) -> Path:
    """A copy of the store `db` and every file beside it (index snapshots) in `into`."""
    for p in store_files(db):
        shutil.copy2(p, into / p.name)
    return into / db.name


def recalls_beside(side: MemoryStore, qs: list[str], stop: threading.Event, out: list[float]) -> None:
    """Hybrid recalls into `side` until `stop`, each one's seconds appended to `out`."""
    i = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        side.recall(qs[i % len(qs)], k=10)
        out.append(time.perf_counter() - t0)
        i += 1


def one_row(threads: str, args: argparse.Namespace, texts: list[str], sample: list[str], side: MemoryStore,
            qs: list[str], tmp: Path) -> dict:
    os.environ[EMBED_THREADS_ENV] = threads
    t0 = time.perf_counter()
    side.embedder.embed_many(sample)
    embed_rate = len(sample) / (time.perf_counter() - t0)
    work = tmp / f"w{threads}"
    work.mkdir()
    db = copy_store(Path(args.db), work) if args.db else work / "s.db"
    beside: list[float] = []
    stop = threading.Event()
    half = len(texts) // 2 // BATCH * BATCH
    with MemoryStore(db, background_embedding=False) as store:
        store.remember_many(texts[:BATCH])  # opens the model and the index before the clock starts
        t0 = time.perf_counter()
        for start in range(BATCH, half, BATCH):
            store.remember_many(texts[start:start + BATCH])
        rate = (half - BATCH) / (time.perf_counter() - t0)
        helper = threading.Thread(target=recalls_beside, args=(side, qs, stop, beside))
        helper.start()
        t0 = time.perf_counter()
        for start in range(half, len(texts), BATCH):
            store.remember_many(texts[start:start + BATCH])
        rate_beside = (len(texts) - half) / (time.perf_counter() - t0)
        stop.set()
        helper.join()
    shutil.rmtree(work)
    return {"embed_per_s": embed_rate, "remember_many_per_s": rate, "remember_many_beside_per_s": rate_beside,
            "recall_beside_p50_ms": float(np.median(beside)) * 1e3 if beside else None, "recalls_beside": len(beside)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2", help="EVERMIND_EMBED_THREADS values, comma-separated")
    ap.add_argument("--facts", type=int, default=10000, help="facts remember_many adds (after a first call of 1000)")
    ap.add_argument("--embed", type=int, default=2000, help="texts of the embed_many rate")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--db", help="add into a copy of this store instead of a fresh one")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.facts < 4 * BATCH or args.facts % (2 * BATCH):
        ap.error(f"--facts must be a multiple of {2 * BATCH}, at least {4 * BATCH}")
    counts = [t.strip() for t in args.threads.split(",") if t.strip()]
    texts = facts(args.facts, seed=4242)
    sample = facts(args.embed, seed=4343)
    qs = questions(200, seed=4444)
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="embed_threads_") as tmp_name:
        tmp = Path(tmp_name)
        with MemoryStore(tmp / "side.db", background_embedding=False) as side:
            side.remember_many(facts(SIDE_FACTS, seed=4545))
            os.environ[EMBED_THREADS_ENV] = "1"
            quiet = []
            for q in qs:
                t0 = time.perf_counter()
                side.recall(q, k=10)
                quiet.append(time.perf_counter() - t0)
            for _ in range(args.rounds):
                for threads in counts:
                    row = one_row(threads, args, texts, sample, side, qs, tmp)
                    print(f"  threads {threads}: {row}", flush=True)
                    keep = best.setdefault(threads, row)
                    for key in ("embed_per_s", "remember_many_per_s", "remember_many_beside_per_s"):
                        keep[key] = max(keep[key], row[key])
                    if row["recall_beside_p50_ms"] is not None:
                        keep["recall_beside_p50_ms"] = min(keep["recall_beside_p50_ms"] or 1e9,
                                                           row["recall_beside_p50_ms"])
    quiet_ms = float(np.median(quiet)) * 1e3
    where = f"into a copy of {args.db}" if args.db else "into a fresh store"
    print(f"\nremember_many {where}, calls of {BATCH}, best of {args.rounds} rounds; hybrid recall p50 with nothing "
          f"beside it {quiet_ms:.1f} ms")
    print("| EVERMIND_EMBED_THREADS | embed_many texts/s | remember_many facts/s "
          "| with recalls beside it: remember_many / recall p50 |")
    print("|---|---|---|---|")
    for threads, r in best.items():
        beside = f"{r['recall_beside_p50_ms']:.1f} ms" if r["recall_beside_p50_ms"] is not None else "-"
        print(f"| {threads} | {r['embed_per_s']:,.0f} | {r['remember_many_per_s']:,.0f} | "
              f"{r['remember_many_beside_per_s']:,.0f}/s / {beside} |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "machine": platform.platform(), "cores": os.cpu_count(),
            "load": os.getloadavg(), "recall_quiet_p50_ms": quiet_ms, "rows": best}, indent=1))


if __name__ == "__main__":
    main()
