"""Start-up time of `evermind` commands, side by side with a bare interpreter (the floor no command can beat).

Each command runs `--runs` times as a fresh `python -m evermind_memory ...` process on a store of 100 facts;
the table gives the median and best wall time. A second table lists the costliest imports of one command
(`python -X importtime`, cumulative), to show where the time goes. Commands that need no model should start
in under 0.3 s; today MemoryStore() loads and probes the model when it opens, so those that open a store do
not yet (see the "open" rows).

    python benchmarks/cli_startup.py [--runs 7] [--profile list] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1"}


def wall(argv: list[str], runs: int) -> list[float]:
    """Wall seconds of `runs` fresh processes (each must exit 0)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        p = subprocess.run(argv, capture_output=True, text=True, env=ENV)
        times.append(time.perf_counter() - start)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return times


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
        print(f"{'command':<34} {'loads':<13} {'median s':>9} {'best s':>8}")
        for name, argv, loads in cases:
            times = wall(argv, args.runs)
            row = {"command": name, "loads": loads, "median_s": statistics.median(times), "best_s": min(times)}
            results.append(row)
            print(f"{name:<34} {loads:<13} {row['median_s']:>9.3f} {row['best_s']:>8.3f}")
        profiled = [*ev, *{"list": ["list"], "get": ["get", ids[0]], "help": ["--help"]}.get(args.profile, [args.profile])]
        profile = import_profile(profiled)
    print(f"\nlargest imports of `evermind {args.profile}` (cumulative s, python -X importtime):")
    for name, seconds in profile:
        print(f"  {name:<40} {seconds:>7.3f}")
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "python": sys.version.split()[0], "results": results,
                                         "imports": dict(profile)}, indent=2))


if __name__ == "__main__":
    main()
