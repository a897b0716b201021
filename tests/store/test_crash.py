"""docs/reliability.md, tests A: kill -9 of writer child processes (one, or several writing at once, at random moments,
and at named crash points) never loses an acknowledged fact and leaves a store that opens, passes check() and recalls
like exact search.

The children use the default background embedding: acknowledged means remember() returned (the text is
committed); a fact whose vector was still waiting when the child died is embedded at the next open."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

from evermind_memory import MemoryStore
from store_helpers import CHILD_PRELUDE, PYTHON, child_env, recall_at_k

REMEMBER_LOOP = CHILD_PRELUDE + """
durability, name = sys.argv[4], sys.argv[5]
with MemoryStore(db, emb, durability=durability) as store:
    print("open", flush=True)
    i = 0
    while True:
        if i % 7 == 6:
            ids = store.remember_many([f"{name} batch fact {i} {j} about tea and cats" for j in range(5)],
                                      tags={"b": str(i)})
        else:
            ids = [store.remember(f"{name} fact number {i} about river foxes", tags={"n": str(i)})]
        if i % 11 == 10:
            store.forget(ids[0])
            print("forgot", ids[0], flush=True)
        for fid in ids:
            print("ok", fid, flush=True)
        i += 1
"""


def read_acks(proc: subprocess.Popen, until: int | None, acked: set[str], forgotten: set[str]) -> None:
    """Collect a loop child's acknowledged and forgotten ids until it acknowledged `until` (None: to the end)."""
    count = 0
    for line in proc.stdout:
        if not line.endswith("\n"):
            continue  # cut by the kill: its id is not one we can check
        kind, _, fid = line.strip().partition(" ")
        if kind == "ok":
            acked.add(fid)
            count += 1
        elif kind == "forgot":
            forgotten.add(fid)
        if until is not None and count >= until:
            return


def run_until_killed(model_files, db: Path, kill_after: list[int], durability: str) -> tuple[set[str], set[str]]:
    """Start one remember loop per entry of `kill_after`, all writing the store at once; SIGKILL each after its
    number of acknowledgements (the others keep writing meanwhile); return (acked, forgotten)."""
    procs = [subprocess.Popen(
        [PYTHON, "-c", REMEMBER_LOOP, str(model_files[0]), str(model_files[1]), str(db), durability, f"p{n}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
    ) for n in range(len(kill_after))]
    acked: set[str] = set()
    forgotten: set[str] = set()
    try:
        for proc, after in zip(procs, kill_after):
            read_acks(proc, after, acked, forgotten)
            proc.send_signal(signal.SIGKILL)
            read_acks(proc, None, acked, forgotten)  # whatever was acknowledged before the signal landed counts too
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
    for proc in procs:
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:]
    return acked, forgotten


def waiting_vectors(db: Path) -> int:
    """Facts committed without a vector yet (read straight from SQLite, without opening a store)."""
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COUNT(*) FROM facts WHERE vector IS NULL").fetchone()[0]


def assert_healthy(db: Path, embedder, acked: set[str], forgotten: set[str]) -> None:
    with MemoryStore(db, embedder) as store:
        present = {f.id for f in store.list(limit=100_000)}
        assert acked - forgotten <= present, f"lost {len(acked - forgotten - present)} acknowledged facts"
        assert not (forgotten & present)
        store.flush()  # the vectors still waiting at the kill were queued at open; none may fail
        assert all(f.fingerprint == store.fingerprint for f in store.list(limit=100_000))
        report = store.check()
        assert report.ok and report.waiting_vectors == 0 and report.indexed == len(present), report.problems
        assert recall_at_k(store, db, ["river foxes", "tea and cats", "fact number 3", "batch"]) >= 0.95


def kill_loop(model_files, embedder, db, runs: int, writers: int) -> None:
    """Each run: `writers` processes remember at once and each is killed -9 at a random moment; then every fact
    acknowledged so far must be there (the killed writers' waiting facts are adopted at the next open).
    `db`: a new SQLite file or PostgreSQL URL (there the processes are nodes)."""
    rng = np.random.default_rng(2024)
    all_acked: set[str] = set()
    all_forgotten: set[str] = set()
    for run in range(runs):
        kill_after = [int(k) for k in rng.integers(1, 40, size=writers)]
        acked, forgotten = run_until_killed(model_files, db, kill_after, ("normal", "full")[run % 2])
        all_acked |= acked
        all_forgotten |= forgotten
        assert_healthy(db, embedder, all_acked, all_forgotten)


def test_kill_during_remember_loop(model_files, embedder, tmp_path: Path):
    kill_loop(model_files, embedder, tmp_path / "crash.db", runs=2, writers=1)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])  # (PostgreSQL:
# a node killed mid-write runs by default in test_many_writers.py and the server's kill in test_postgres.py)
def test_kill_writers_during_concurrent_remember_loops(model_files, embedder, target):
    kill_loop(model_files, embedder, target, runs=2, writers=3)


@pytest.mark.slow
def test_kill_writers_during_concurrent_remember_loops_30_runs(model_files, embedder, target):
    kill_loop(model_files, embedder, target, runs=30, writers=3)


CRASH_SCRIPT = CHILD_PRELUDE + """
store = MemoryStore(db, emb)
print("open", flush=True)
for i in range(12):
    fid = store.remember(f"fact {i} about the river fox")
    print("ok", fid, flush=True)
store.close()
print("closed", flush=True)
"""


@pytest.mark.parametrize(
    "point, committed_unacked, least_waiting",
    [
        ("remember.before_commit:5", (0, 0), 0),  # the 5th remember dies before COMMIT: never acknowledged, not stored
        ("remember.after_commit:5", (1, 1), 1),  # dies after COMMIT, before its vector: embedded at the next open
        # the vector thread dies after a batch of vectors committed, before the index saw it; the main thread may
        # have committed one more remember that it had not yet acknowledged
        ("remember.vectors_committed:1", (0, 1), 0),
        ("index.save.written:1", (0, 0), 0),  # dies with a half-saved index temp file on close
        ("index.save.before_manifest:1", (0, 0), 0),  # new index renamed, manifest not yet: the old one stays valid
    ],
)
def test_named_crash_points(model_files, embedder, tmp_path: Path, point: str, committed_unacked: tuple[int, int],
                            least_waiting: int):
    db = tmp_path / "c.db"
    with MemoryStore(db, embedder) as store:  # an earlier generation of the index exists on disk
        before = set(store.remember_many(["an older fact", "another older fact"]))
    env = {**child_env(), "EVERMIND_CRASH_AT": point}
    proc = subprocess.run(
        [PYTHON, "-c", CRASH_SCRIPT, str(model_files[0]), str(model_files[1]), str(db)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    # the kill can cut the last line (it may come from the vector thread while the main thread prints): a cut
    # "ok" is a remember() that returned, whose id never fully reached us
    complete, _, cut = proc.stdout.rpartition("\n")
    acked = {line.split()[1] for line in complete.splitlines() if line.startswith("ok ")}
    cut_ack = int(cut.startswith("ok"))
    assert "closed" not in proc.stdout
    assert waiting_vectors(db) >= least_waiting
    assert_healthy(db, embedder, acked | before, set())
    with MemoryStore(db, embedder) as store:
        low, high = committed_unacked
        assert len(acked) + 2 + low + cut_ack <= len(store) <= len(acked) + 2 + high + cut_ack
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers


REEMBED_SCRIPT = CHILD_PRELUDE + """
store = MemoryStore(db, emb)  # another embedder: builds its generation in batches of 256, dies after the 2nd
print("never", flush=True)
"""


def test_kill_during_reembed_resumes(model_files, other_model_files, embedder, other_embedder, tmp_path: Path):
    db = tmp_path / "r.db"
    with MemoryStore(db, embedder) as store:
        ids = store.remember_many([f"fact {i} about tea" for i in range(600)])
    env = {**child_env(), "EVERMIND_CRASH_AT": "adapt.reembed.batch:2"}
    proc = subprocess.run(
        [PYTHON, "-c", REEMBED_SCRIPT, str(other_model_files[0]), str(other_model_files[1]), str(db)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    with sqlite3.connect(db) as conn:  # the serving generation is whole; two batches of the new one are built
        by_fp = dict(conn.execute("SELECT p.fingerprint, COUNT(*) FROM facts f LEFT JOIN fingerprints p ON p.id = "
                                  "f.fingerprint_id "
                                         "GROUP BY p.fingerprint").fetchall())
        built = conn.execute("SELECT fingerprint, COUNT(*) FROM adapt_vectors GROUP BY fingerprint").fetchall()
    assert by_fp == {embedder.fingerprint: 600}
    assert built == [(other_embedder.fingerprint, 512)]
    with MemoryStore(db, other_embedder) as store:  # resumes from the third batch and swaps
        assert all(f.fingerprint == other_embedder.fingerprint for f in store.list(limit=1000))
        hit = store.recall("fact 7 about tea", k=1, mode="vector")[0]
        assert hit.score == pytest.approx(1.0, abs=1e-3)
    assert_healthy(db, other_embedder, set(ids), set())
