"""Two or more pg_speed.py --json results side by side (part 1: remember throughput and recall with N nodes).

Runs are given as LABEL=FILE; the table shows, per node count and backend, each run's remember facts/s and
recall p50 / p99 while the nodes write, then each run's load average at start and end (the machine is shared:
compare runs made one after the other, alternating, as in benchmarks/results/pg_speed_before_after.txt).

    git archive main | tar -x -C /tmp/base    # the code before the change
    (cd /tmp/base && python benchmarks/pg_speed.py --changes 0 --json /tmp/before.json)
    python benchmarks/pg_speed.py --changes 0 --json /tmp/after.json
    python benchmarks/pg_speed_compare.py before=/tmp/before.json after=/tmp/after.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(spec: str) -> tuple[str, dict]:
    """(label, the JSON of one pg_speed.py run) from LABEL=FILE."""
    label, _, path = spec.partition("=")
    if not path:
        raise SystemExit(f"expected LABEL=FILE, got {spec!r}")
    return label, json.loads(Path(path).read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=FILE, a pg_speed.py --json output")
    runs = [load(spec) for spec in ap.parse_args(argv).runs]
    width = max(12, *(len(label) + 2 for label, _ in runs))
    print("remember facts/s (all nodes) | vector recall on another node while they write, ms p50 / p99")
    print(f"{'nodes':>5} {'backend':>11} " + " ".join(f"{label:>{width}}" for label, _ in runs) + "   "
          + " ".join(f"{label:>{width + 6}}" for label, _ in runs))
    rows = [(w["writers"], backend) for backend, ws in runs[0][1]["writers"].items() for w in ws]
    for nodes, backend in sorted(rows, key=lambda r: (r[0], r[1] != "sqlite")):
        got = [next((w for w in run["writers"].get(backend, []) if w["writers"] == nodes), None) for _, run in runs]
        speed = " ".join(f"{w['items_per_s']:>{width}.0f}" if w else f"{'-':>{width}}" for w in got)
        recall = " ".join(f"{'%.1f / %.1f' % tuple(w['recall_during_writes_ms']):>{width + 6}}" if w
                          else f"{'-':>{width + 6}}" for w in got)
        print(f"{nodes:>5} {backend:>11} {speed}   {recall}")
    for label, run in runs:
        meta = run["meta"]
        print(f"{label}: load average {meta['load_avg_start'][0]:.2f} -> {meta['load_avg_end'][0]:.2f} on "
              f"{meta['cpu_count']} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
