"""docs/reliability.md, tests D: 8 reader threads + 1 writer thread in one process; two writer processes on one path,
opening and closing it over and over; a reader process following a writer process. No errors,
read-your-writes, nothing lost. (Many writers at once, kill -9 of writers: test_many_writers.py.)"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from evermind_memory import MemoryStore
from store_helpers import CHILD_PRELUDE, PYTHON, child_env, recall_at_k

WORDS = "tea coffee cat dog Paris France database agent memory river fox morning user meeting".split()


def readers_and_writer(store: MemoryStore, seconds: float, n_readers: int = 8) -> None:
    stable: list[str] = []  # ids the writer never forgets, published after remember() returned
    errors: list[BaseException] = []
    stop = threading.Event()
    counts = [0] * n_readers

    def writer() -> None:
        rng = np.random.default_rng(0)
        i = 0
        try:
            while not stop.is_set():
                text = " ".join(rng.choice(WORDS, 4)) + f" fact {i}"
                fid = store.remember(text, tags={"w": str(i % 3)})
                # read-your-writes: the writer finds its own fact at once, by id and by vector
                assert store.get(fid).text == text
                assert fid in {h.id for h in store.recall(text, k=5, mode="vector")}
                if i % 5 == 4:
                    store.forget(fid)
                    assert fid not in {h.id for h in store.recall(text, k=10, mode="vector")}
                else:
                    stable.append(fid)
                if i % 17 == 16:
                    store.update(stable[-1], text + " updated")
                i += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()

    def reader(n: int) -> None:
        rng = np.random.default_rng(n + 1)
        try:
            while not stop.is_set():
                q = " ".join(rng.choice(WORDS, 3))
                mode = ("hybrid", "vector", "lexical")[counts[n] % 3]
                hits = store.recall(q, k=5, mode=mode, tags={"w": "1"} if counts[n] % 4 == 0 else None)
                assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))
                if stable:
                    fid = stable[int(rng.integers(len(stable)))]
                    assert store.get(fid).id == fid  # published after commit: always visible
                counts[n] += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(n,)) for n in range(n_readers)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    assert len(stable) > 0 and all(c > 0 for c in counts)
    report = store.check()
    assert report.ok, report.problems


def test_8_readers_1_writer(store: MemoryStore):
    readers_and_writer(store, seconds=3.0)


@pytest.mark.slow
def test_8_readers_1_writer_20s(store: MemoryStore):
    readers_and_writer(store, seconds=20.0)


WRITER_SCRIPT = CHILD_PRELUDE + """
name = sys.argv[4]
for session in range(int(sys.argv[5])):
    with MemoryStore(db, emb) as store:
        for i in range(3):
            fid = store.remember(f"{name} session {session} fact {i} about the river")
            print("ok", fid, flush=True)
"""


def test_two_writer_processes_lose_nothing(model_files, embedder, tmp_path: Path):
    db = tmp_path / "two.db"
    MemoryStore(db, embedder).close()
    procs = [
        subprocess.Popen([PYTHON, "-c", WRITER_SCRIPT, str(model_files[0]), str(model_files[1]), str(db), name, "6"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        for name in ("alpha", "beta")
    ]
    acked: set[str] = set()
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        acked |= {line.split()[1] for line in out.splitlines() if line.startswith("ok ")}
    assert len(acked) == 2 * 6 * 3
    with MemoryStore(db, embedder) as store:
        assert {f.id for f in store.list(limit=1000)} == acked
        report = store.check()
        assert report.ok, report.problems
        assert recall_at_k(store, db, ["alpha session 1", "beta fact 2 river"]) >= 0.95


HOLDER_SCRIPT = CHILD_PRELUDE + """
store = MemoryStore(db, emb)
print("open", flush=True)
sys.stdin.readline()
fid = store.remember("written by the child writer about zebras")
print("ok", fid, flush=True)
sys.stdin.readline()
store.flush()
print("flushed", flush=True)
sys.stdin.readline()
store.close()
"""


def test_reader_process_follows_a_writer_process(model_files, embedder, tmp_path: Path):
    db = tmp_path / "rw.db"
    MemoryStore(db, embedder).close()
    proc = subprocess.Popen([PYTHON, "-c", HOLDER_SCRIPT, str(model_files[0]), str(model_files[1]), str(db)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    try:
        assert proc.stdout.readline().strip() == "open"
        with MemoryStore(db, embedder, read_only=True) as reader:
            assert len(reader) == 0
            proc.stdin.write("\n")
            proc.stdin.flush()
            fid = proc.stdout.readline().split()[1]
            assert reader.get(fid).text == "written by the child writer about zebras"
            assert reader.recall("zebras", k=1, mode="lexical")[0].id == fid
            # the vector follows from the writer's background thread; after the writer's flush() it is committed
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "flushed"
            assert reader.recall("written by the child writer about zebras", k=1, mode="vector")[0].id == fid
            assert reader.check().ok
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()[-2000:]
    finally:
        proc.kill()
        proc.wait()
    with MemoryStore(db, embedder) as store:
        assert len(store) == 1 and store.check().ok
