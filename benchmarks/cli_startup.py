"""Start-up time of `evermind` commands, side by side with a bare interpreter (the floor no command can beat).

Each command runs `--runs` times as a fresh `python -m evermind_memory ...` process on a store of 100 facts;
the table gives the median and best wall time and the median CPU time (steadier on a shared machine). A second table lists the costliest imports of one command
(`python -X importtime`, cumulative), to show where the time goes. Commands that need no model should start
in under 0.3 s; today MemoryStore() loads and probes the model when it opens, so those that open a store do
not yet (see the "open" rows).

    python benchmarks/cli_startup.py [--runs 7] [--profile list] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1"}


def timed_runs(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system) of `runs` fresh processes (each must exit 0).

    CPU time is the steadier figure on a shared machine: other processes stretch wall time, not CPU time.
    """
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        p = subprocess.run(argv, capture_output=True, text=True, env=ENV)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return walls, cpus


def import_profile(argv: list[str], top: int = 10) -> list[tuple[str, float]]:
    """The `top` modules with the largest cumulative import time (seconds) while running argv."""
    p = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], capture_output=True, text=True, env=ENV)
    rows = []
    for line in p.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line[len("import time:"):].split("|")
            rows.append((name.rstrip(), int(cumulative) / 1e6))
    roots = [(n.strip(), t) for n, t in rows if n.startswith(" ") and not n.startswith("  ")]  # top-level imports
    return sorted(roots or rows, key=lambda r: -r[1])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="processes per command (median reported)")
    parser.add_argument("--profile", default="list", help="command whose imports are broken down")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()

    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "bench.db")
        from evermind_memory import MemoryStore

        with MemoryStore(db) as store:
            ids = store.remember_many([f"benchmark fact {i} about topic {i % 7}" for i in range(100)])
        ev = [py, "-m", "evermind_memory", "--db", db]
        cases = [
            ("python -c pass (floor)", [py, "-c", "pass"], "none"),
            ("import evermind_memory", [py, "-c", "import evermind_memory"], "none"),
            ("evermind --version", [*ev, "--version"], "none"),
            ("evermind --help", [*ev, "--help"], "none"),
            ("evermind mcp --help", [*ev, "mcp", "--help"], "none"),
            ("import evermind_memory.store", [py, "-c", "import evermind_memory.store"], "store code"),
            ("load the shipped model", [py, "-c", "from evermind_memory.embedder import default_embedder as d; d()"],
             "model"),
            ("evermind get ID", [*ev, "get", ids[0]], "open"),
            ("evermind list", [*ev, "list"], "open"),
            ("evermind history ID", [*ev, "history", ids[0]], "open"),
            ("evermind info", [*ev, "info"], "open"),
            ("evermind recall --mode lexical", [*ev, "recall", "topic", "--mode", "lexical"], "open"),
            ("evermind recall (hybrid)", [*ev, "recall", "topic"], "open + embed"),
        ]
        results = []
        print(f"{'command':<34} {'loads':<13} {'wall median s':>13} {'wall best s':>11} {'cpu median s':>12}")
        for name, argv, loads in cases:
            walls, cpus = timed_runs(argv, args.runs)
            row = {"command": name, "loads": loads, "median_s": statistics.median(walls), "best_s": min(walls),
                   "cpu_median_s": statistics.median(cpus)}
            results.append(row)
            print(f"{name:<34} {loads:<13} {row['median_s']:>13.3f} {row['best_s']:>11.3f} {row['cpu_median_s']:>12.3f}")
        profiled = [*ev, *{"list": ["list"], "get": ["get", ids[0]], "help": ["--help"]}.get(args.profile, [args.profile])]
        profile = import_profile(profiled)
    load = os.getloadavg()[0]
    print(f"\n1-minute load average at the end: {load:.1f} on {os.cpu_count()} CPUs (wall times grow with it)")
    print(f"\nlargest imports of `evermind {args.profile}` (cumulative s, python -X importtime):")
    for name, seconds in profile:
        print(f"  {name:<40} {seconds:>7.3f}")
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "python": sys.version.split()[0], "load_average": load, "results": results,
                                         "imports": dict(profile)}, indent=2))


if __name__ == "__main__":
    main()
