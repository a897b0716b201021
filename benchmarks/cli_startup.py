"""Start-up time of `evermind` commands, side by side with a bare interpreter (the floor no command can beat).

Each command runs `--runs` times as a fresh `python -m evermind_memory ...` process on a store of 100 facts
(and a few on a store of `--big` facts, default 20,000: the "open, big" rows, where loading the vector index
at open used to cost 0.4-0.6 s);
after one warm-up run that caches the bytecode (as `pip install` does), the table gives the median and best wall
time and the median CPU time (steadier on a shared machine). With
`--baseline DIR` (another checkout of the repository, e.g. `git archive <commit> | tar -x -C DIR`) every
command also runs on that code, alternating run by run with this checkout so both see the same machine load.
A second table lists the costliest imports of one command (`python -X importtime`, cumulative), to show where
the time goes. Commands that need no model (get, list, history, info, count, stats, check, export) should start
in under 0.3 s: they open the store without reading the model's weights (the "open" rows), and those that read
rows only (get, list, history, count, stats, export, a lexical recall) without numpy, hnswlib or the index.

The big store's vectors are seeded random unit vectors under the shipped model's fingerprint and dimensions
(embedding 20,000 texts with the model would take minutes; opening the store costs the same either way), built
once per run, with the index snapshot a writer leaves, by this checkout's code.

    python benchmarks/cli_startup.py [--runs 7] [--big 20000] [--profile list] [--baseline DIR] [--json results.json]
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

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def env_for(code: Path) -> dict[str, str]:
    """The environment that makes `python -m evermind_memory` run the package of the checkout `code`.

    Bytecode is cached (PYTHONDONTWRITEBYTECODE dropped), as after `pip install`: otherwise every run compiles
    every module from source, which costs more than importing them.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(code), "OPENBLAS_NUM_THREADS": "1"}


def timed_run(argv: list[str], code: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one fresh process running the checkout `code` (it must
    exit 0). It runs in that folder: `python -m` and `-c` put the working directory ahead of PYTHONPATH.

    CPU time is the steadier figure on a shared machine: other processes stretch wall time, not CPU time.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env_for(code), cwd=code)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def summary(runs: list[tuple[float, float]]) -> dict[str, float]:
    walls, cpus = [w for w, _ in runs], [c for _, c in runs]
    return {"median_s": statistics.median(walls), "best_s": min(walls), "cpu_median_s": statistics.median(cpus)}


def import_profile(argv: list[str], top: int = 10) -> list[tuple[str, float]]:
    """The `top` modules with the largest cumulative import time (seconds) while running argv."""
    p = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], capture_output=True, text=True,
                       env=env_for(REPO), cwd=REPO)
    rows = []
    for line in p.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line[len("import time:"):].split("|")
            rows.append((name.rstrip(), int(cumulative) / 1e6))
    roots = [(n.strip(), t) for n, t in rows if n.startswith(" ") and not n.startswith("  ")]  # top-level imports
    return sorted(roots or rows, key=lambda r: -r[1])[:top]


class PresetVectors:
    """An embedder that announces the shipped model's fingerprint and dimensions and returns seeded random unit
    vectors: it fills the big store quickly (opening a store reads the fingerprint, never the vectors' meaning)."""

    def __init__(self, seed: int = 0) -> None:
        from evermind_memory.embedder import default_embedder

        shipped = default_embedder()  # (the card only: no weights are read)
        self.fingerprint, self.dimensions = shipped.fingerprint, shipped.dimensions
        self._rng = np.random.default_rng(seed)

    def embed_many(self, texts):
        v = self._rng.standard_normal((len(texts), self.dimensions)).astype(np.float32)  # (N, D)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def embed(self, text):
        return self.embed_many([text])[0]  # (D,)


def build_big(path: Path, facts: int) -> list[str]:
    """A store of `facts` facts with vectors (PresetVectors) and its index snapshot; returns the ids."""
    from evermind_memory import MemoryStore

    ids: list[str] = []
    with MemoryStore(path, PresetVectors()) as store:
        for start in range(0, facts, 5000):
            ids += store.remember_many([f"stored fact {i} about subject {i % 97} in area {i % 13}"
                                        for i in range(start, min(facts, start + 5000))])
        store.flush()
        assert store.info()["indexed"] == facts  # (loads the index and leaves its snapshot on disk at close)
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="processes per command (median reported)")
    parser.add_argument("--big", type=int, default=20_000, help="facts in the big store (0: no big-store rows)")
    parser.add_argument("--profile", default="list", help="command whose imports are broken down")
    parser.add_argument("--baseline", type=Path, help="another checkout to time side by side (alternating runs)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()

    py = sys.executable
    codes = {"this": REPO, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "bench.db")
        from evermind_memory import MemoryStore

        with MemoryStore(db) as store:
            ids = store.remember_many([f"benchmark fact {i} about topic {i % 7}" for i in range(100)])
        ev = [py, "-m", "evermind_memory", "--db", db]
        big_db = str(Path(tmp) / "big.db")
        big_ids = build_big(Path(big_db), args.big) if args.big else []
        big = [py, "-m", "evermind_memory", "--db", big_db]
        n = f"{args.big // 1000}k" if args.big >= 1000 else str(args.big)
        cases = [
            ("python -c pass (floor)", [py, "-c", "pass"], "none"),
            ("import evermind_memory", [py, "-c", "import evermind_memory"], "none"),
            ("evermind --version", [*ev, "--version"], "none"),
            ("evermind --help", [*ev, "--help"], "none"),
            ("evermind mcp --help", [*ev, "mcp", "--help"], "none"),
            ("import evermind_memory.store", [py, "-c", "import evermind_memory.store"], "store code"),
            ("load the shipped model", [py, "-c", "from evermind_memory.embedder import default_embedder as d; "
                                        "getattr(d(), 'load', lambda: None)()"], "model"),
            ("evermind get ID", [*ev, "get", ids[0]], "open"),
            ("evermind list", [*ev, "list"], "open"),
            ("evermind history ID", [*ev, "history", ids[0]], "open"),
            ("evermind info", [*ev, "info"], "open"),
            ("evermind count", [*ev, "count"], "open"),
            ("evermind stats", [*ev, "stats"], "open"),
            ("evermind check", [*ev, "check"], "open"),
            ("evermind export", [*ev, "export", str(Path(tmp) / "export.jsonl")], "open"),
            ("evermind recall --mode lexical", [*ev, "recall", "topic", "--mode", "lexical"], "open"),
            ("evermind recall (hybrid)", [*ev, "recall", "topic"], "open + embed"),
        ] + ([
            (f"evermind get ID ({n} facts)", [*big, "get", big_ids[0]], "open, big"),
            (f"evermind count ({n} facts)", [*big, "count"], "open, big"),
            (f"evermind list ({n} facts)", [*big, "list", "--limit", "20"], "open, big"),
            (f"evermind recall --mode lexical ({n})", [*big, "recall", "subject", "--mode", "lexical"], "open, big"),
        ] if args.big else [])
        results = []
        head = "".join(f" {name + ' wall median s':>22} {name + ' cpu median s':>22}" for name in codes)
        print(f"{'command':<34} {'loads':<13}{head}")
        for name, argv, loads in cases:
            runs: dict[str, list[tuple[float, float]]] = {code: [] for code in codes}
            for path in codes.values():
                timed_run(argv, path)  # warm-up: writes the bytecode caches, fills the page cache
            for _ in range(args.runs):
                for code, path in codes.items():  # alternating, so both see the same load
                    runs[code].append(timed_run(argv, path))
            row = {"command": name, "loads": loads, **summary(runs["this"])}
            if "baseline" in runs:
                row["baseline"] = summary(runs["baseline"])
            results.append(row)
            cells = "".join(f" {s['median_s']:>22.3f} {s['cpu_median_s']:>22.3f}"
                            for s in [row, *([row["baseline"]] if "baseline" in row else [])])
            print(f"{name:<34} {loads:<13}{cells}")
        profiled = [*ev,
                    *{"list": ["list"], "get": ["get", ids[0]], "help": ["--help"]}.get(args.profile, [args.profile])]
        profile = import_profile(profiled)
    load = os.getloadavg()[0]
    print(f"\n1-minute load average at the end: {load:.1f} on {os.cpu_count()} CPUs (wall times grow with it)")
    print(f"\nlargest imports of `evermind {args.profile}` (cumulative s, python -X importtime):")
    for name, seconds in profile:
        print(f"  {name:<40} {seconds:>7.3f}")
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "big_facts": args.big, "python": sys.version.split()[0],
                                         "load_average": load,
                                         "baseline": str(args.baseline) if args.baseline else None,
                                         "results": results, "imports": dict(profile)}, indent=2))


if __name__ == "__main__":
    main()
