"""The PostgreSQL store beside the SQLite store: nodes writing at once, recall while they write, catch-up.

Part 1 (store_speed.bench_writers, run on both backends in this one process): for each count N of nodes, N
writer processes each remember --per-node facts one at a time (background embedding, timed until every
node's flush() returns) into a store already holding --seed-facts facts, while this process (one more node)
recalls (vector mode, query embedding and catch-up with the others' commits included) as fast as it can.
Reported: total remembered facts/s over all nodes, recall p50/p99 with no writer and during the writes. On
SQLite the nodes are processes sharing one file; on PostgreSQL nothing but the server joins them.

Part 2 (catch-up): a store of --seed-facts facts; node A opens it and answers once; then --changes facts are
written by another node (remember_many in batches, vectors computed beforehand so the writer's model time is
not counted). Reported per backend: (a) A stayed open throughout: the first recall after the burst (on
PostgreSQL A's follower thread has been catching up in the background, woken by NOTIFY; on SQLite the call
replays the change feed itself), and on PostgreSQL how long after the writer's last commit A's index had
every change; (b) a node that was away opens the store after the burst and answers once (SQLite: its saved
index and the change feed since; PostgreSQL: no index files on a node, the index is built from the database).

Part 3 (--lexical, quality): recall_quality.py's held-out eval pairs (corpus/eval/<source>.jsonl, each query
with one relevant doc), lexical recall only, on an SQLite store (FTS5 BM25) and a PostgreSQL store with each
ranking it has (BM25 over tsvector with FTS5's formula, the default; ts_rank_cd): ndcg@10, recall@1,
recall@10, MRR@10, and the share of queries whose top 10 is the same list as FTS5's.

The model is store_speed's untrained "small" EvermindLM (speed does not depend on training). PostgreSQL is a
throwaway server from Debian's binaries (tests/pg_server.py: Unix socket, fsync=off, as in the tests), or the
server of --url (each run makes a schema of its own there, and drops it). Indicative only on a shared machine.

    python benchmarks/pg_speed.py [--nodes 1,2,4] [--per-node 300] [--seed-facts 2000] [--changes 100000]
                                  [--queries 100] [--url postgresql://...] [--json out.json]
                                  [--lexical [--corpus corpus] [--sources debian,pyapi,foldoc] [--limit 1000]]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests")]

import numpy as np  # noqa: E402

import store_speed  # noqa: E402
from evermind_memory import MemoryStore  # noqa: E402
from evermind_memory.embedder import LMEmbedder  # noqa: E402
from evermind_memory.lm.model import EvermindLM  # noqa: E402
from evermind_memory.lm.tokenizer import BPETokenizer  # noqa: E402

BATCH = 5000


class Places:
    """New, empty stores: files in a temp directory, or schemas on the PostgreSQL server."""

    def __init__(self, workdir: Path, url: str | None) -> None:
        self.workdir = workdir
        self.server = None
        self.schemas: list[str] = []
        if url is None:
            from pg_server import PgServer

            self.server = PgServer.start()
            url = self.server.url()
        self.url = url

    def sqlite(self, name: str) -> Path:
        return self.workdir / f"{name}-{uuid.uuid4().hex[:6]}.db"

    def postgres(self, name: str) -> str:
        import psycopg

        schema = f"evbench_{name}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')  # (our own generated name)
        self.schemas.append(schema)
        glue = "&" if "?" in self.url else "?"
        return f"{self.url}{glue}options={quote(f'-csearch_path={schema}', safe='')}"

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            return
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            for schema in self.schemas:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def wait_indexed(store: MemoryStore, timeout: float = 600.0) -> float:
    """Seconds until `store`'s index holds every committed change, without a call that catches it up."""
    t0 = time.perf_counter()
    head = store.info()["max_seq"]
    while store.info()["index_watermark"] < head:
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError("the node's index did not catch up")
        time.sleep(0.005)
    return time.perf_counter() - t0


def catch_up(backend: str, place, embedder, seed: list[str], burst: list[str], query: str) -> dict:
    """Part 2 for one backend (see the module docstring)."""
    with MemoryStore(place, embedder) as writer:
        writer.remember_many(seed)
    with MemoryStore(place, embedder) as away:
        away.recall(query, k=10, mode="vector")  # (SQLite: its index is saved at close)
    out: dict = {"backend": backend, "changes": len(burst)}
    with MemoryStore(place, embedder) as node, MemoryStore(place, embedder) as writer:
        node.recall(query, k=10, mode="vector")
        head0 = node.info()["max_seq"]
        t0 = time.perf_counter()
        for i in range(0, len(burst), BATCH):
            writer.remember_many(burst[i:i + BATCH])
        writer.flush()
        out["write_s"] = time.perf_counter() - t0
        out["change_rows"] = writer.info()["max_seq"] - head0
        if backend == "postgresql":
            out["follower_lag_s"] = wait_indexed(node)
        t0 = time.perf_counter()
        node.recall(query, k=10, mode="vector")
        out["open_node_first_recall_s"] = time.perf_counter() - t0
        assert node.info()["indexed"] == len(seed) + len(burst)
    t0 = time.perf_counter()
    with MemoryStore(place, embedder) as back:
        back.recall(query, k=10, mode="vector")
        out["away_node_open_and_recall_s"] = time.perf_counter() - t0
        assert back.info()["indexed"] == len(seed) + len(burst) and back.check().ok
    return out


def lexical_quality(places: Places, embedder, corpus: Path, sources: list[str], limit: int) -> list[dict]:
    """Part 3 (see the module docstring): one row per source and system."""
    import recall_quality as rq
    from evermind_memory.store.backend import postgres_session

    rows = []
    for name in sources:
        es = rq.load_eval_set(corpus / "eval" / f"{name}.jsonl", limit)
        ranked = {}
        store, ids = rq.build_store(places.sqlite(f"lex_{name}"), embedder, es.docs)
        with store:
            ranked["sqlite FTS5 BM25"] = rq.store_rankings(store, ids, es.queries, mode="lexical")
        store, ids = rq.build_store(places.postgres(f"lex_{name}"), embedder, es.docs)
        with store:
            for ranking in ("bm25", "ts_rank_cd"):
                postgres_session.RANKING = ranking
                try:
                    ranked[f"postgresql {ranking}"] = rq.store_rankings(store, ids, es.queries, mode="lexical")
                finally:
                    postgres_session.RANKING = "bm25"
        base = ranked["sqlite FTS5 BM25"]
        for system, ranking in ranked.items():
            same = float(np.mean([a[:10] == b[:10] for a, b in zip(ranking, base)]))
            rows.append({"source": name, "queries": len(es.queries), "docs": len(es.docs), "system": system,
                         **rq.rank_metrics(ranking, es.gold), "same_top10_as_fts5": same})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,2,4", help="writer node counts (comma-separated)")
    ap.add_argument("--per-node", type=int, default=300, help="facts each writer node remembers one at a time")
    ap.add_argument("--seed-facts", type=int, default=2000, help="facts in the store before the nodes start")
    ap.add_argument("--changes", type=int, default=100_000, help="facts written while a node is open / away")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--url", default=None, help="a PostgreSQL server to use (default: a throwaway one)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--lexical", action="store_true", help="also compare lexical recall quality with FTS5 (part 3)")
    ap.add_argument("--corpus", type=Path, default=ROOT / "corpus", help="holds eval/<source>.jsonl")
    ap.add_argument("--sources", default="debian,pyapi,foldoc")
    ap.add_argument("--limit", type=int, default=1000, help="eval pairs per source (0: all)")
    args = ap.parse_args(argv)
    nodes = [int(x) for x in args.nodes.split(",") if x]

    rng = np.random.default_rng(0)
    tok = BPETokenizer.train(store_speed.texts(rng, 3000), 1024)
    embedder = LMEmbedder(EvermindLM(store_speed.CONFIGS["small"], seed=0), tok)
    load_start = os.getloadavg()
    writers: dict[str, list[dict]] = {}
    catchups: list[dict] = []
    lexical: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="evermind-pgbench-") as tmp:
        places = Places(Path(tmp), args.url)
        try:
            if args.lexical:
                lexical = lexical_quality(places, embedder, args.corpus, args.sources.split(","), args.limit)
            wargs = argparse.Namespace(writers=nodes, per_writer=args.per_node, seed_facts=args.seed_facts,
                                       queries=args.queries, precomputed=False)
            writers["sqlite"] = store_speed.bench_writers(embedder, wargs, Path(tmp), places.sqlite)
            writers["postgresql"] = store_speed.bench_writers(embedder, wargs, Path(tmp), places.postgres)
            if args.changes:
                seed = store_speed.texts(rng, args.seed_facts)
                burst = [f"{t} b{i}" for i, t in enumerate(store_speed.texts(rng, args.changes))]
                pre = store_speed.PrecomputedEmbedder(embedder, seed + burst + ["ada prefers green tea"])
                for backend, new in (("sqlite", places.sqlite), ("postgresql", places.postgres)):
                    catchups.append(catch_up(backend, new("catchup"), pre, seed, burst, "ada prefers green tea"))
        finally:
            places.close()
    meta = {"python": platform.python_version(), "cpu_count": os.cpu_count(), "load_avg_start": load_start,
            "load_avg_end": os.getloadavg(), "server": "throwaway (fsync=off)" if args.url is None else "--url"}

    print(f"PostgreSQL store beside the SQLite store (small untrained model; load avg {load_start[0]:.2f} -> "
          f"{meta['load_avg_end'][0]:.2f} on {os.cpu_count()} CPUs)")
    if nodes:
        print(f"N writer nodes each remember {args.per_node} facts one at a time into a store of {args.seed_facts:,}; "
              "one more node recalls meanwhile (vector, ms p50 / p99)")
        print(f"{'nodes':>6} {'backend':>11} {'remember items/s':>17} {'recall idle':>19} {'recall during writes':>21}")
    for i, n in enumerate(nodes):
        for backend in ("sqlite", "postgresql"):
            r = writers[backend][i]
            idle, busy = r["recall_idle_ms"], r["recall_during_writes_ms"]
            print(f"{n:>6} {backend:>11} {r['items_per_s']:>17,.0f} {idle[0]:>9.2f} / {idle[1]:<7.2f} "
                  f"{busy[0]:>9.2f} / {busy[1]:<9.2f}")
    if catchups:
        print(f"catch-up after {args.changes:,} facts written by another node (store of {args.seed_facts:,} before)")
        print(f"{'backend':>11} {'change rows':>12} {'write s':>8} {'follower lag s':>15} "
              f"{'open node 1st recall s':>23} {'away node open+recall s':>24}")
        for c in catchups:
            lag = f"{c['follower_lag_s']:.3f}" if "follower_lag_s" in c else "-"
            print(f"{c['backend']:>11} {c['change_rows']:>12,} {c['write_s']:>8.1f} {lag:>15} "
                  f"{c['open_node_first_recall_s']:>23.3f} {c['away_node_open_and_recall_s']:>24.3f}")
    if lexical:
        print("lexical recall on held-out eval pairs (one relevant doc per query); last column: queries whose top 10 "
              "is FTS5's list")
        print(f"{'source':>8} {'system':>22} {'ndcg@10':>8} {'recall@1':>9} {'recall@10':>10} {'mrr@10':>7} "
              f"{'same top 10':>12}")
        for r in lexical:
            print(f"{r['source']:>8} {r['system']:>22} {r['ndcg@10']:>8.4f} {r['recall@1']:>9.4f} "
                  f"{r['recall@10']:>10.4f} {r['mrr@10']:>7.4f} {r['same_top10_as_fts5']:>12.3f}")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "writers": writers, "catch_up": catchups,
                                         "lexical": lexical}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
