"""What the store's WAL-reset-safe checkpoints cost, beside SQLite's default automatic checkpoints.

The store (backend/sqlite.py) turns automatic checkpoints off on every connection and checkpoints PASSIVE from
a second connection while its writing connection holds the writer lock (`BEGIN IMMEDIATE`), every
CHECKPOINT_EVERY changes; so no checkpoint ever overlaps a commit (the WAL-reset bug of SQLite < 3.51.3).
This script measures, on plain SQLite with rows shaped like the store's (a text row, its FTS5 row, a change
row, one transaction each): commits/s and WAL size under SQLite's default (wal_autocheckpoint=1000 pages,
PASSIVE, after the commit, writer lock released) and under the store's rule, and how long each locked
checkpoint holds writers off. Both run in one process, one after the other, on the same disk.

    python benchmarks/wal_checkpoint.py [--commits 20000] [--every 500] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

WORDS = "ada bob tea coffee cat dog paris london python sqlite vector memory agent river city garden book".split()


def open_db(path: Path, autocheckpoint: int) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(f"PRAGMA wal_autocheckpoint = {autocheckpoint}")
    conn.execute("CREATE TABLE IF NOT EXISTS facts (rid INTEGER PRIMARY KEY, text TEXT, vector BLOB)")
    conn.execute("CREATE TABLE IF NOT EXISTS changes (seq INTEGER PRIMARY KEY, rid INTEGER, at REAL)")
    conn.execute("CREATE VIRTUAL TABLE IF NOT EXISTS facts_fts USING fts5(text, content='facts', content_rowid='rid')")
    return conn


def run(path: Path, commits: int, every: int | None) -> dict:
    """Commit `commits` facts one per transaction; every=None: SQLite's automatic checkpoints, else the store's."""
    rng = np.random.default_rng(0)
    conn = open_db(path, 1000 if every is None else 0)
    ckpt = None if every is None else open_db(path, 0)
    vector = rng.standard_normal(128).astype(np.float32).tobytes()
    held: list[float] = []
    wal_max = 0
    t0 = time.perf_counter()
    for i in range(commits):
        text = " ".join(rng.choice(WORDS, 8)) + f" #{i}"
        conn.execute("BEGIN IMMEDIATE")
        rid = conn.execute("INSERT INTO facts (text, vector) VALUES (?, ?)", (text, vector)).lastrowid
        conn.execute("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", (rid, text))
        conn.execute("INSERT INTO changes (rid, at) VALUES (?, ?)", (rid, time.time()))
        conn.execute("COMMIT")
        if every is not None and (i + 1) % every == 0:
            t1 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")  # the writer lock: no commit, anywhere, until the checkpoint ends
            ckpt.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            conn.execute("ROLLBACK")
            held.append(time.perf_counter() - t1)
        if i % 100 == 0:
            wal_max = max(wal_max, os.path.getsize(str(path) + "-wal"))
    seconds = time.perf_counter() - t0
    out = {"commits_per_s": commits / seconds, "wal_max_bytes": wal_max, "checkpoints": len(held)}
    if held:
        ms = np.array(held) * 1000
        out["writer_lock_held_ms"] = [float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), float(ms.max())]
    conn.close()
    if ckpt is not None:
        ckpt.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=20000)
    parser.add_argument("--every", type=int, default=200, help="commits between the store's checkpoints")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="evermind-wal-") as tmp:
        default = run(Path(tmp) / "default.db", args.commits, None)
        ours = run(Path(tmp) / "ours.db", args.commits, args.every)
        default_again = run(Path(tmp) / "default2.db", args.commits, None)  # a second run shows the noise
    print(f"WAL checkpoints, {args.commits:,} one-fact commits (SQLite {sqlite3.sqlite_version}, synchronous=NORMAL, "
          f"load avg {load:.2f} on {os.cpu_count()} CPUs)")
    print(f"{'':44}{'commits/s':>12}{'WAL max MB':>12}{'checkpoints':>13}  writer lock held ms p50/p99/max")
    for name, r in (("SQLite default (autocheckpoint 1000 pages)", default),
                    (f"store rule (locked PASSIVE every {args.every})", ours),
                    ("SQLite default, again", default_again)):
        held = r.get("writer_lock_held_ms")
        held_text = "-" if held is None else f"{held[0]:.2f} / {held[1]:.2f} / {held[2]:.2f}"
        print(f"{name:<44}{r['commits_per_s']:>12,.0f}{r['wal_max_bytes'] / 2**20:>12.2f}{r['checkpoints']:>13}  "
              f"{held_text}")
    if args.json:
        args.json.write_text(json.dumps({"sqlite": sqlite3.sqlite_version, "commits": args.commits,
                                         "every": args.every, "load_avg": load, "default": default, "store": ours,
                                         "default_again": default_again}, indent=2))


if __name__ == "__main__":
    main()
