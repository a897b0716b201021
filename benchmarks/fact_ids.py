"""Fact ids that sort by time against random ones: what an insert costs once the id indexes outgrow SQLite's cache.

A fact's id is the key of two indexes: the facts table's (`facts_id`) and the change log's (`changes_fact`, on the
id then the sequence). With random ids (uuid4) every insert lands on a random page of both, and once they outgrow
SQLite's page cache (2 MB by default, the store's setting) each insert reads a page back and dirties it; ids whose
first digits are the time (store/backend/base.py `new_id`, as UUIDv7) land at the end of the indexes. This inserts
--facts rows in batches of --batch into a table shaped like the store's (a 516-byte vector blob, a short text, both
indexes, WAL, synchronous NORMAL) once with each kind of id, in one process, and prints the total time, the time of
the last tenth of the inserts and the indexes' sizes.

    python benchmarks/fact_ids.py [--facts 1000000] [--batch 1000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evermind_memory.store.backend.base import new_id  # noqa: E402

KINDS = {"uuid4 (random)": lambda: uuid.uuid4().hex, "new_id (time first)": new_id}


def run(path: Path, make_id, facts: int, batch: int) -> dict:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE facts (rid INTEGER PRIMARY KEY, id TEXT NOT NULL, text TEXT NOT NULL, vector BLOB)")
    conn.execute("CREATE UNIQUE INDEX facts_id ON facts (id)")
    conn.execute("CREATE TABLE changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, fact_id TEXT NOT NULL, op TEXT)")
    conn.execute("CREATE INDEX changes_fact ON changes (fact_id, seq)")
    blob = os.urandom(516)
    rounds = facts // batch
    tenth = max(1, rounds // 10)
    t0 = time.perf_counter()
    t_last = t0
    for r in range(rounds):
        if r == rounds - tenth:
            t_last = time.perf_counter()
        ids = [make_id() for _ in range(batch)]
        with conn:
            conn.executemany("INSERT INTO facts (id, text, vector) VALUES (?, ?, ?)",
                             [(i, "Uma Walsh flies to Oslo on Thursday for a conference", blob) for i in ids])
            conn.executemany("INSERT INTO changes (fact_id, op) VALUES (?, 'remember')", [(i,) for i in ids])
    end = time.perf_counter()
    try:
        sizes = dict(conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall())
    except sqlite3.OperationalError:  # an SQLite built without dbstat
        sizes = {}
    conn.close()
    return {"total_s": end - t0, "last_tenth_s": end - t_last,
            "last_tenth_us_per_fact": (end - t_last) / (tenth * batch) * 1e6,
            "facts_id_mb": sizes.get("facts_id", 0) / 1e6, "changes_fact_mb": sizes.get("changes_fact", 0) / 1e6}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--facts", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.facts < args.batch or args.batch < 1:
        raise SystemExit("--facts must be at least --batch, and --batch at least 1")
    rows = {}
    with tempfile.TemporaryDirectory(prefix="fact_ids_") as tmp:
        for n, (name, make_id) in enumerate(KINDS.items()):
            rows[name] = run(Path(tmp) / f"ids{n}.db", make_id, args.facts, args.batch)
    print(f"{args.facts:,} inserts in batches of {args.batch:,} (facts row with a 516-byte vector, its change row; "
          "WAL, synchronous NORMAL, SQLite's default cache)")
    print("| ids | total s | last tenth s (µs a fact) | facts_id MB | changes_fact MB |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['total_s']:.1f} | {r['last_tenth_s']:.1f} ({r['last_tenth_us_per_fact']:.0f}) | "
              f"{r['facts_id_mb']:.1f} | {r['changes_fact_mb']:.1f} |")
    out = {"facts": args.facts, "batch": args.batch, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
