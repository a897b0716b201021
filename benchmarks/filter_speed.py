"""Where-filters compiled to SQL (store/backend/filter_sql.py) against the exact-tag SQL the store used before
them, on one scratch database with the store's real schema (schema 4; facts with 256-float vectors, spread
over 100 user scopes).

Each query fetches (label, vector) of the matching facts with the store's fingerprint, as vector recall does
before an exact search. Systems, side by side on the same file:
  legacy tags       the old tagged_from_sql: the FROM clause starts at fact_tags (exact str tags only)
  compiled          f.fingerprint_id = ? AND <to_sqlite(filter)>: SQLite (no ANALYZE statistics, as in a store)
                    drives from the fingerprint index and probes every fact with that fingerprint
  compiled +fp      +f.fingerprint_id = ? AND <to_sqlite(filter)>: the unary + keeps the fingerprint a row test,
                    so SQLite drives from the filter's own index (tag subquery -> facts_id, facts_created)
  store             what the store runs: +f.fingerprint_id = ? AND <selection_sql(...)>, the filter plus the
                    expiry condition (the whole store's handle)
  store, 1 user     the same in one user's scope view (the scope condition too; 1% of the facts)
  python filter     every row read, Filter.matches in Python (the in-memory evaluator, for scale)

    python benchmarks/filter_speed.py [--facts 50000] [--repeat 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from evermind_memory.store.backend import Selection, open_backend  # noqa: E402
from evermind_memory.store.backend.session import FINGERPRINT_ID  # noqa: E402
from evermind_memory.store.backend.filter_sql import INSERT_TAG_SQL, selection_sql, tag_rows, to_sqlite  # noqa: E402
from evermind_memory.store.filters import parse_where  # noqa: E402
from evermind_memory.store.timing import time_text  # noqa: E402

DIM = 256
FP = "bench-fp"
FP_ID = 1  # its row in `fingerprints` (schema 6: facts reference it by id)
T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def tagged_from_sql(tags: dict[str, str]) -> tuple[str, list[str]]:
    """The baseline: the FROM clause the store used for exact str tags before where-filters (driven by fact_tags)."""
    items = sorted(tags.items())
    sql = "fact_tags t0 CROSS JOIN facts f ON f.id = t0.fact_id AND t0.key = ? AND t0.value = ?"
    sql += "".join(f" JOIN fact_tags t{i} ON t{i}.fact_id = f.id AND t{i}.key = ? AND t{i}.value = ?"
                   for i in range(1, len(items)))
    return sql, [p for kv in items for p in kv]


def build(path: Path, n: int, rng: np.random.Generator) -> list[dict]:
    """A store file with the real schema (the SQLite backend creates it) holding n facts with typed tags."""
    open_backend(str(path), read_only=False, durability="normal", busy_timeout=5.0).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO fingerprints (id, fingerprint) VALUES (?, ?)", (FP_ID, FP))
    users, teams = rng.integers(0, 1000, n), rng.integers(0, 10, n)
    nums, flags = rng.integers(0, 1000, n), rng.random(n) < 0.5
    vecs = rng.standard_normal((n, DIM)).astype("<f4")  # (N, D)
    facts = []
    for i in range(n):
        tags = {"owner": f"u{users[i]}", "team": f"t{teams[i]}", "n": int(nums[i]), "flag": bool(flags[i])}
        created = T0 + timedelta(minutes=int(i))
        facts.append({"tags": tags, "source": "chat" if i % 3 else "mail", "created_at": created,
                      "updated_at": created})
        conn.execute(
            "INSERT INTO facts (id, text, tags, source, created_at, updated_at, vector, fingerprint_id, label, seq, "
            "scope) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (f"f{i}", f"fact {i}", json.dumps(tags), facts[-1]["source"], time_text(created), time_text(created),
             vecs[i].tobytes(), FP_ID, i, i, f"user=s{i % 100}"),
        )
        conn.executemany(INSERT_TAG_SQL, tag_rows(f"f{i}", tags))
    conn.execute("COMMIT")
    conn.close()
    return facts


def timed(fn, repeat: int) -> tuple[float, int]:
    """(median seconds, rows) of fn() over `repeat` runs."""
    times, rows = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        rows = len(fn())
        times.append(time.perf_counter() - t)
    return float(np.median(times)), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--facts", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.db"
        t = time.perf_counter()
        facts = build(path, args.facts, rng)
        print(f"{args.facts:,} facts built in {time.perf_counter() - t:.1f} s; SQLite {sqlite3.sqlite_version}")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        queries = [
            ("owner = u7 (0.1%)", {"owner": "u7"}, {"owner": "u7"}),
            ("team = t3 (10%)", {"team": "t3"}, {"team": "t3"}),
            ("owner AND team", {"owner": "u7", "team": "t3"}, {"owner": "u7", "team": "t3"}),
            ("owner in 2 ($or)", {"$or": [{"owner": "u7"}, {"owner": "u8"}]}, None),
            ("n < 10 (1%)", {"n": {"$lt": 10}}, None),
            ("team AND n < 100", {"team": "t3", "n": {"$lt": 100}}, None),
            ("created_at last 1%", {"created_at": {"$gte": time_text(T0 + timedelta(minutes=int(args.facts * 0.99)))}},
             None),
            ("source = mail (33%)", {"source": "mail"}, None),
        ]
        results = []
        now = datetime.now(timezone.utc)
        print(f"\n{'query':22s} {'rows':>6s} {'legacy tags':>12s} {'compiled':>12s} {'compiled +fp':>13s} "
              f"{'store':>12s} {'store, 1 user':>14s} {'python filter':>14s}")
        for name, where, legacy in queries:
            f = parse_where(where)
            sql, params = to_sqlite(f)
            compiled = lambda: conn.execute(  # noqa: E731
                f"SELECT f.label, f.vector FROM facts f WHERE f.fingerprint_id = {FINGERPRINT_ID} AND {sql}",
                                            [FP, *params]).fetchall()
            t_new, rows = timed(compiled, args.repeat)
            plus = lambda: conn.execute(  # noqa: E731
                f"SELECT f.label, f.vector FROM facts f WHERE +f.fingerprint_id = {FINGERPRINT_ID} AND {sql}",
                                        [FP, *params]).fetchall()
            t_plus, plus_rows = timed(plus, args.repeat)
            assert plus_rows == rows, (name, plus_rows, rows)
            times_store = []
            for scope in ("", "user=s7"):
                ssql, sparams = selection_sql(Selection(f, scope, now))
                store_q = lambda: conn.execute(  # noqa: E731
                    f"SELECT f.label, f.vector FROM facts f WHERE +f.fingerprint_id = {FINGERPRINT_ID} AND {ssql}",
                                               [FP, *sparams]).fetchall()
                t_s, s_rows = timed(store_q, args.repeat)
                assert scope or s_rows == rows, (name, s_rows, rows)
                times_store.append(t_s)
            t_old = None
            if legacy is not None:
                src, lp = tagged_from_sql(legacy)
                old = lambda: conn.execute(  # noqa: E731
                    f"SELECT f.label, f.vector FROM {src} WHERE f.fingerprint_id = {FINGERPRINT_ID}",
                                           [*lp, FP]).fetchall()
                t_old, old_rows = timed(old, args.repeat)
                assert old_rows == rows, (name, old_rows, rows)
            t_py, py_rows = timed(lambda: [x for x in facts if f.matches(x)], max(1, args.repeat // 2))
            assert py_rows == rows, (name, py_rows, rows)
            results.append({"query": name, "where": where, "rows": rows, "legacy_s": t_old, "compiled_s": t_new,
                            "compiled_plus_fp_s": t_plus, "store_s": times_store[0], "store_one_user_s": times_store[1],
                            "python_s": t_py})
            old_text = "-" if t_old is None else f"{t_old * 1e3:9.2f} ms"
            print(f"{name:22s} {rows:6d} {old_text:>12s} {t_new * 1e3:9.2f} ms {t_plus * 1e3:10.2f} ms "
                  f"{times_store[0] * 1e3:9.2f} ms {times_store[1] * 1e3:11.2f} ms {t_py * 1e3:11.2f} ms")
        conn.close()
    if args.json:
        args.json.write_text(json.dumps({"facts": args.facts, "sqlite": sqlite3.sqlite_version, "results": results},
                                        indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
