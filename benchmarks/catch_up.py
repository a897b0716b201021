"""How long a node that stayed open while another process wrote N changes takes to answer its first recall.

Node A (this process) opens a store holding --seed-facts facts and recalls once; node B (another process,
spawned) then writes N changes in rounds: a remember_many of N/10 texts (100..1000), updates of an eighth of them
(update() with a new text, one commit each), and every 4th round a forget_where of an earlier round (one
transaction): about 70% remembers, 10% updates, 20% forgets.
Reported per N: A's first vector recall afterwards (the catch-up of its HNSW cache from the change feed, plus
one query), how A caught up (info()["index_status"]), a freshly opened store's open + first recall, and
rebuild_index() on A, for comparison. Every row also checks that A answers like the freshly opened store (same
ids for the stored vectors of 50 facts as queries). The model is an untrained tiny EvermindLM (speed does not
depend on training). Indicative only on a shared machine.

    python benchmarks/catch_up.py [--changes 1000,10000,100000] [--seed-facts 10000] [--json out.json]

Run the same file from a `git archive` copy of another commit to compare (it imports the package beside it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from evermind_memory import MemoryStore  # noqa: E402
from evermind_memory.embedder import LMEmbedder  # noqa: E402
from evermind_memory.lm.model import EvermindLM, LMConfig  # noqa: E402
from evermind_memory.lm.tokenizer import BPETokenizer  # noqa: E402

CONFIG = LMConfig(vocab_size=1024, d_model=32, n_layers=2, conv_kernel=3, hidden_dim=64, n_experts=4, top_k=2)
WORDS = (
    "ada bob carol tea coffee water cat dog bird paris london tokyo project meeting deadline report budget "
    "python sqlite vector memory agent user prefers likes drinks reads writes visits morning evening monday "
    "friday green black small large quick lazy river mountain city office home garden book music film"
).split()
BATCH = 1000


def texts(rng: np.random.Generator, n: int, tag: str) -> list[str]:
    lengths = rng.integers(6, 13, size=n)
    return [" ".join(rng.choice(WORDS, size=int(k))) + f" {tag}#{i}" for i, k in enumerate(lengths)]


def load_embedder(workdir: Path) -> LMEmbedder:
    return LMEmbedder(EvermindLM.load(workdir / "model.evl"), BPETokenizer.load(workdir / "tokenizer.json"))


def writer(db: str, workdir: str, changes: int, seed: int, out) -> None:
    """Node B: write `changes` changes (remembers, forgets, updates mixed), then close."""
    rng = np.random.default_rng(seed)
    embedder = load_embedder(Path(workdir))
    done = updates = forgets = 0
    size = max(100, min(BATCH, changes // 10))  # remembers per round; then size // 8 updates; every 4th round a forget
    rounds: list[list[str]] = []
    t0 = time.perf_counter()
    with MemoryStore(db, embedder, background_embedding=False) as store:
        while done < changes:
            n = min(size, changes - done)
            tag = f"{seed}x{len(rounds)}"
            rounds.append(store.remember_many(texts(rng, n, f"b{tag}"), tags={"batch": tag}))
            done += n
            for fid in rounds[-1][: min(size // 8, changes - done)]:  # updates, one commit each
                store.update(fid, text=f"updated {fid} " + " ".join(rng.choice(WORDS, size=6)))
                updates += 1
                done += 1
            if len(rounds) % 4 == 0 and done + size <= changes:  # a whole earlier round forgotten: one transaction
                n = store.forget_where(tags={"batch": f"{seed}x{len(rounds) - 3}"})
                forgets += n
                done += n
    out.put({"written": done, "updates": updates, "forgets": forgets, "write_s": time.perf_counter() - t0})


def query_vectors(store: MemoryStore, rng: np.random.Generator, count: int) -> list[str]:
    facts = store.list(limit=100_000)
    return [facts[int(i)].text for i in rng.choice(len(facts), size=min(count, len(facts)), replace=False)]


def bench(changes: int, args: argparse.Namespace, workdir: Path, embedder: LMEmbedder) -> dict:
    db = workdir / f"store_{changes}.db"
    rng = np.random.default_rng(changes)
    with MemoryStore(db, embedder, background_embedding=False) as seed:
        for start in range(0, args.seed_facts, BATCH):
            seed.remember_many(texts(rng, min(BATCH, args.seed_facts - start), f"seed{start}"))
    node_a = MemoryStore(db, embedder)
    node_a.recall("tea in the morning", k=10, mode="vector")  # open, caught up and idle
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=writer, args=(str(db), str(workdir), changes, changes, out))
    proc.start()
    wrote = out.get()
    proc.join()
    t0 = time.perf_counter()
    node_a.recall("tea in the morning", k=10, mode="vector")
    first = time.perf_counter() - t0
    status = node_a.info()["index_status"]
    t0 = time.perf_counter()
    fresh = MemoryStore(db, embedder)
    fresh.recall("tea in the morning", k=10, mode="vector")
    fresh_s = time.perf_counter() - t0
    queries = query_vectors(fresh, rng, 50)
    same = sum([h.id for h in node_a.recall(q, k=5, mode="vector")]
               == [h.id for h in fresh.recall(q, k=5, mode="vector")] for q in queries)
    live = len(fresh)
    fresh.close()
    t0 = time.perf_counter()
    node_a.rebuild_index()
    rebuild_s = time.perf_counter() - t0
    node_a.close()
    return {"changes": changes, **wrote, "live_facts": live, "first_recall_s": first, "caught_up_by": status,
            "fresh_open_recall_s": fresh_s, "rebuild_index_s": rebuild_s, "same_answers": same,
            "queries": len(queries)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", default="1000,10000,100000", help="comma-separated change counts")
    parser.add_argument("--seed-facts", type=int, default=10_000, help="facts in the store before node B writes")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--label", default="", help="a name for this run (e.g. the commit), kept in the JSON")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    embedder = LMEmbedder(EvermindLM(CONFIG, seed=0), BPETokenizer.train(texts(rng, 3000, "tok"), 1024))
    rows = []
    with tempfile.TemporaryDirectory(prefix="evermind-catchup-") as tmp:
        embedder.model.save(Path(tmp) / "model.evl")
        embedder.tokenizer.save(Path(tmp) / "tokenizer.json")
        embedder = load_embedder(Path(tmp))
        for n in (int(s) for s in args.changes.split(",") if s):
            rows.append(bench(n, args, Path(tmp), embedder))
            r = rows[-1]
            print(f"changes {n:>7,}: written {r['written']:,} ({r['updates']:,} updates, {r['forgets']:,} forgets) "
                  f"in {r['write_s']:.1f}s", flush=True)
    import evermind_memory

    print(f"\npackage: {Path(evermind_memory.__file__).parent}")
    print(f"Catch-up of an idle node after another process wrote N changes ({args.seed_facts:,} facts before; "
          f"{args.label or 'this tree'})")
    print(f"{'changes':>8} {'live':>7} {'first recall s':>15} {'fresh open+recall s':>20} {'rebuild_index s':>16} "
          f"{'same':>6}  caught up by")
    for r in rows:
        print(f"{r['written']:>8,} {r['live_facts']:>7,} {r['first_recall_s']:>15.2f} "
              f"{r['fresh_open_recall_s']:>20.2f} {r['rebuild_index_s']:>16.2f} "
              f"{r['same_answers']:>3}/{r['queries']:<3} {r['caught_up_by']}")
    if args.json:
        import evermind_memory

        meta = {"label": args.label, "package": str(Path(evermind_memory.__file__).parent),
                "seed_facts": args.seed_facts, "python": platform.python_version(), "numpy": np.__version__,
                "cpu_count": os.cpu_count(), "load_avg": os.getloadavg()}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
