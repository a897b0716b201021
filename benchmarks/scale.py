"""A store at scale (issue 34): write rate, recall latency, cold start, memory and bytes at 1k to 100k facts.

For each size N: a store of N short personal facts (~60 characters: "Ada Okafor drinks green tea most mornings")
is built by remember_many in batches of 1000 with the shipped model (background embedding off, so the rate
includes the embedding); the build's own embedding rate is reported beside it. Then a fresh process (the way
every CLI call, hook or MCP server starts) opens the store and reports: the open, the first vector recall after
it (loading the saved HNSW snapshot), then p50/p99 of --queries recalls of each mode (k=10, the query's
embedding included), its peak RSS and, after the queries, its RSS and PSS (its share of pages it shares with other
processes: the mapped graph file), and the store's bytes on disk (database, WAL and index files) per fact; then
--procs such processes at once, the sum of their peak RSS and of their PSS (what they take together: each holds
its own model, and processes that only recall share one mapped copy of the graph).

    python benchmarks/scale.py [--sizes 1000,10000,100000] [--queries 200] [--procs 2,4] [--dir DIR] [--reuse]
                               [--cold-opens N] [--first-write] [--json out.json]

--dir keeps the stores (default: a temp directory, deleted afterwards); with --reuse a store already in --dir
is opened instead of built again (its write rate is then not measured), so the same stores can be opened by
another commit's code: run this file from a `git archive` copy of that commit with the same --dir. A store is
used at the sizes it was built for only. Indicative only on a shared machine: one run, wall-clock times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # read once, at numpy's import
    os.environ.setdefault(_var, "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

FIRST = ("Ada", "Bob", "Carol", "Dmitri", "Esther", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kemi", "Lars",
         "Maya", "Nils", "Olga", "Pedro", "Quinn", "Rosa", "Sami", "Tara", "Uma", "Viktor", "Wen", "Yara", "Zane")
LAST = ("Okafor", "Lindqvist", "Moreau", "Tanaka", "Novak", "Silva", "Becker", "Haddad", "Rossi", "Kowalski",
        "Nguyen", "Duarte", "Fischer", "Ivanova", "Mensah", "Park", "Costa", "Walsh", "Sato", "Khan")
TEMPLATES = (
    "{n} drinks {drink} most mornings before work",
    "{n} is allergic to {food} and avoids it",
    "{n} moved to {city} last {month} with family",
    "{n} prefers {drink} over coffee in the afternoon",
    "{n}'s favourite dish is {food} from a place in {city}",
    "{n} has a {pet} called {pet_name} at home",
    "{n} flies to {city} on {day} for a conference",
    "{n} plays {sport} every {day} evening with friends",
    "{n} is learning {language} for a trip in {month}",
    "{n} works as a {job} at a firm in {city}",
    "{n}'s birthday is in {month}; likes {food} cake",
    "{n} reads books about {topic} before bed",
)
SLOTS = {
    "drink": ("green tea", "black tea", "oat latte", "espresso", "mint tea", "hot chocolate", "kombucha", "water"),
    "food": ("peanuts", "sesame", "shellfish", "gluten", "dairy", "ramen", "paella", "dumplings", "curry", "tacos"),
    "city": ("Porto", "Lisbon", "Oslo", "Kyoto", "Lagos", "Austin", "Lyon", "Krakow", "Seoul", "Quito", "Cairo"),
    "month": ("January", "March", "May", "July", "September", "November"),
    "day": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"),
    "pet": ("cat", "dog", "parrot", "rabbit", "tortoise"),
    "pet_name": ("Miso", "Pepper", "Biscuit", "Luna", "Ziggy", "Olive", "Mango"),
    "sport": ("tennis", "chess", "football", "badminton", "squash", "volleyball"),
    "language": ("Japanese", "Portuguese", "Swahili", "Korean", "Italian", "Polish"),
    "job": ("nurse", "architect", "data analyst", "teacher", "pilot", "chef", "lawyer"),
    "topic": ("astronomy", "gardening", "history", "sailing", "economics", "birds"),
}
QUESTIONS = (
    "what does {first} drink in the morning?", "what is {first} allergic to?", "where does {first} live now?",
    "does {first} have a pet?", "when is {first} flying to {city}?", "which sport does {first} play?",
    "what language is {first} learning?", "where does {first} {last} work?", "tea", "{first} {city}",
)


def facts(n: int, seed: int) -> list[str]:
    """`n` short personal facts, seeded (names repeat: a common name matches thousands of facts at 100k)."""
    rng = np.random.default_rng(seed)
    out = []
    idx = {key: rng.integers(0, len(values), size=n) for key, values in SLOTS.items()}
    first, last, tmpl = (rng.integers(0, len(FIRST), n), rng.integers(0, len(LAST), n),
                         rng.integers(0, len(TEMPLATES), n))
    for i in range(n):
        values = {key: SLOTS[key][int(idx[key][i])] for key in SLOTS}
        out.append(TEMPLATES[int(tmpl[i])].format(n=f"{FIRST[int(first[i])]} {LAST[int(last[i])]}", **values))
    return out


def questions(q: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed + 1)
    return [QUESTIONS[int(rng.integers(len(QUESTIONS)))].format(
        first=FIRST[int(rng.integers(len(FIRST)))], last=LAST[int(rng.integers(len(LAST)))],
        city=SLOTS["city"][int(rng.integers(len(SLOTS["city"])))]) for _ in range(q)]


def store_files(db: Path) -> list[Path]:
    """The database, its WAL and every index file beside it (not the lock file)."""
    return [p for p in db.parent.glob(db.name + "*") if p.is_file() and not p.name.endswith(".lock")]


def store_bytes(db: Path) -> int:
    """The bytes of store_files(db)."""
    return sum(p.stat().st_size for p in store_files(db))


def build(db: Path, n: int) -> dict:
    """Build a store of `n` facts by remember_many (1000 a call); the write rate and the embedding rate alone."""
    from evermind_memory import MemoryStore

    corpus = facts(n, seed=n)
    with MemoryStore(db, background_embedding=False) as store:
        t0 = time.perf_counter()
        for start in range(0, n, 1000):
            store.remember_many(corpus[start:start + 1000])
        rate = n / (time.perf_counter() - t0)
        sample = corpus[: min(n, 2000)]
        t0 = time.perf_counter()
        store.embedder.embed_many(sample)
        embed_rate = len(sample) / (time.perf_counter() - t0)
    return {"remember_many_per_s": rate, "embed_per_s": embed_rate}


def child(db: str, n_queries: int, seed: int) -> dict:
    """In a fresh process: open, the first vector recall, then each mode's latency; peak RSS (this process)."""
    import resource

    from evermind_memory import MemoryStore

    qs = questions(n_queries, seed)
    out: dict = {}
    t0 = time.perf_counter()
    store = MemoryStore(db)
    t1 = time.perf_counter()
    store.recall(qs[0], k=10, mode="vector")
    t2 = time.perf_counter()
    out.update(open_s=t1 - t0, first_vector_s=t2 - t1, index_status=store.info().get("index_status"))
    # hybrid as recall gives it (short facts: reranked, store/rerank.py) and without the rerank ("hybrid_plain")
    ways = {"lexical": {"mode": "lexical"}, "vector": {"mode": "vector"}, "hybrid": {"mode": "hybrid"},
            "hybrid_plain": {"mode": "hybrid", "rerank": False}}
    for mode, kw in ways.items():
        store.recall(qs[1], k=10, **kw)  # warm: the first of a mode pays its imports
        times = []
        for q in qs:
            s = time.perf_counter()
            store.recall(q, k=10, **kw)
            times.append(time.perf_counter() - s)
        ms = np.array(times) * 1000.0
        out[f"{mode}_p50_ms"], out[f"{mode}_p99_ms"] = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    out.update(memory_now())
    store.close()
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return out


def memory_now() -> dict:
    """This process's resident memory now, from /proc/self/smaps_rollup (Linux; {} elsewhere): RSS, and PSS, which
    splits each page shared with other processes among them (a mapped index file read by four processes counts a
    quarter in each), so the PSS of processes running at once adds up to what they take together."""
    try:
        text = Path("/proc/self/smaps_rollup").read_text()
    except OSError:
        return {}
    kb = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:] if line.endswith("kB")}
    return {"rss_now_mb": kb.get("Rss", 0) / 1024.0, "pss_now_mb": kb.get("Pss", 0) / 1024.0,
            "shared_now_mb": (kb.get("Shared_Clean", 0) + kb.get("Shared_Dirty", 0)) / 1024.0}


def cold_open(db: str) -> dict:
    """In a fresh process: open, then one vector recall (the model and the index both read by it)."""
    from evermind_memory import MemoryStore

    t0 = time.perf_counter()
    store = MemoryStore(db)
    t1 = time.perf_counter()
    store.recall(questions(1, seed=7)[0], k=10, mode="vector")
    out = {"open_s": t1 - t0, "first_vector_s": time.perf_counter() - t1}
    store.close()
    return out


def first_write(db: str) -> dict:
    """In a fresh process: open, one vector recall, then one remember (timed; what a first change after an open
    costs), forgotten again so that the store keeps its facts."""
    from evermind_memory import MemoryStore

    with MemoryStore(db) as store:
        store.recall(questions(1, seed=7)[0], k=10, mode="vector")
        t0 = time.perf_counter()
        fact = store.remember(f"Zed Quinn keeps a scratch note {time.time()}")
        store.flush()
        took = time.perf_counter() - t0
        store.forget(fact)
    return {"first_remember_s": took}


def in_fresh_process(flag: str, db: Path) -> dict:
    """This file run with `flag` on `db` in a fresh interpreter: the JSON it prints last."""
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), flag, str(db)], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def cold_opens(db: Path, n: int) -> dict:
    """`n` fresh processes one after another, each opening the store and recalling once: the first vector recall's
    median, min and max (one run of it varies by half on a shared machine)."""
    times = [in_fresh_process("--cold", db)["first_vector_s"] for _ in range(n)]
    return {"cold_first_vector_median_s": float(np.median(times)), "cold_first_vector_min_s": min(times),
            "cold_first_vector_max_s": max(times), "cold_opens": n}


def measure(db: Path, args: argparse.Namespace, procs: int = 1) -> list[dict]:
    """Run `child` in `procs` fresh interpreters at once (the code beside this file); their JSON answers."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(db), "--queries", str(args.queries)]
    running = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(procs)]
    out = []
    for proc in running:
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"child failed for {db}:\n{stderr[-3000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=None, help="keep the stores here")
    parser.add_argument("--reuse", action="store_true", help="open a store already in --dir instead of building it")
    parser.add_argument("--procs", default="2,4",
                        help="also run this many recalling processes at once (sum of peak RSS)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--cold-opens", type=int, default=0,
                        help="also open the store this many times in fresh processes, one vector recall each, and "
                             "report the first vector recall's median, min and max")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--first-write", action="store_true",
                        help="also time the first remember of a fresh process after one vector recall (the fact is "
                             "forgotten again)")
    parser.add_argument("--cold", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--write", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.queries, seed=7)))
        return
    if args.cold:
        print(json.dumps(cold_open(args.cold)))
        return
    if args.write:
        print(json.dumps(first_write(args.write)))
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]
    args.procs = [int(p) for p in args.procs.split(",") if p]
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory()
        workdir = Path(tmp.name)
    else:
        workdir = args.dir
        workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for n in sizes:
            db = workdir / f"scale_{n}.db"
            row: dict = {"facts": n}
            if not (args.reuse and db.exists()):
                for old in workdir.glob(db.name + "*"):
                    old.unlink()
                row.update(build(db, n))
            row.update(measure(db, args)[0])
            for procs in args.procs:  # several processes recalling at once: each holds its own index
                got = measure(db, args, procs)
                row[f"rss_{procs}_procs_mb"] = sum(r["peak_rss_mb"] for r in got)
                if all("pss_now_mb" in r for r in got):  # what they take together while all are running
                    row[f"pss_{procs}_procs_mb"] = sum(r["pss_now_mb"] for r in got)
            if args.cold_opens:
                row.update(cold_opens(db, args.cold_opens))
            if args.first_write:
                row.update(in_fresh_process("--write", db))
            row["file_bytes"] = store_bytes(db)
            row["bytes_per_fact"] = row["file_bytes"] / n
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(f"{'facts':>9} | {'remember_many':>13} | {'embed':>7} | {'lexical p50/p99':>15} | {'vector p50/p99':>14} | "
          f"{'hybrid p50/p99':>14} | {'open':>6} | {'1st vector':>10} | {'peak RSS':>8} | {'files':>8} | {'B/fact':>6}"
          + "".join(f" | {f'RSS x{p}':>8}" for p in args.procs))
    for r in rows:
        rate = f"{r['remember_many_per_s']:,.0f}/s" if "remember_many_per_s" in r else "-"
        embed = f"{r['embed_per_s']:,.0f}/s" if "embed_per_s" in r else "-"
        print(f"{r['facts']:>9,} | {rate:>13} | {embed:>7} | "
              f"{r['lexical_p50_ms']:6.1f} / {r['lexical_p99_ms']:5.1f} | {r['vector_p50_ms']:5.1f} / "
              f"{r['vector_p99_ms']:5.1f} | {r['hybrid_p50_ms']:5.1f} / {r['hybrid_p99_ms']:5.1f} | "
              f"{r['open_s']:5.2f}s | {r['first_vector_s']:9.2f}s | {r['peak_rss_mb']:5.0f} MB | "
              f"{r['file_bytes'] / 1e6:5.1f} MB | {r['bytes_per_fact']:6.0f}"
              + "".join(f" | {r[f'rss_{p}_procs_mb']:5.0f} MB" for p in args.procs))
    for r in rows:
        if "hybrid_plain_p50_ms" in r:
            print(f"{r['facts']:,} facts: hybrid p50 / p99 {r['hybrid_p50_ms']:.1f} / {r['hybrid_p99_ms']:.1f} ms as "
                  f"recall gives it, {r['hybrid_plain_p50_ms']:.1f} / {r['hybrid_plain_p99_ms']:.1f} ms with "
                  "rerank=False")
        if "first_remember_s" in r:
            print(f"{r['facts']:,} facts: the first remember of a fresh process, after one vector recall: "
                  f"{r['first_remember_s']:.2f} s")
        pss = [p for p in args.procs if f"pss_{p}_procs_mb" in r]
        if pss:
            print(f"{r['facts']:,} facts: PSS after the queries (shared pages split among the processes): 1 process "
                  f"{r['pss_now_mb']:.0f} MB (RSS {r['rss_now_mb']:.0f}, of it shared {r['shared_now_mb']:.0f}); "
                  + "; ".join(f"{p} at once {r[f'pss_{p}_procs_mb']:.0f} MB" for p in pss))
        if "cold_opens" in r:
            print(f"{r['facts']:,} facts: first vector recall in {r['cold_opens']} fresh processes: median "
                  f"{r['cold_first_vector_median_s']:.2f} s (min {r['cold_first_vector_min_s']:.2f}, max "
                  f"{r['cold_first_vector_max_s']:.2f})")
    if args.json:
        meta = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                "queries": args.queries, "k": 10}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
