"""A process that exits while its threads still read the store: it exits cleanly.

At interpreter exit, hooks run while daemon threads (a user's recall thread, the store's background verify pass)
may still be inside the HNSW graph. The graph views the snapshot file's map in place, so nothing at exit may unmap
it before the store's own close has stopped those threads: weakref.finalize's exit hook once closed the map first,
and the next read crashed the process (segmentation fault, exit status -11)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from evermind_memory import MemoryStore
from evermind_memory.store import IndexConfig
from store_helpers import CHILD_PRELUDE, PYTHON, child_env

GRAPH = IndexConfig(exact_max=0, threads=1)  # every search through the graph, so every recall reads the map

RECALL_AT_EXIT = CHILD_PRELUDE + """
import threading, time
from evermind_memory.errors import EvermindError
from evermind_memory.store import IndexConfig, vectors
vectors.VERIFY_DELAY = 0.0  # the background pass at once: it hashes the loaded nodes, which then let the map go
store = MemoryStore(db, emb, index_config=IndexConfig(exact_max=0, threads=1))
store.recall("tea at breakfast", k=5, mode="vector")  # loads the saved snapshot: the graph views its map
deadline = time.monotonic() + 60
while store.info()["index_verified"] != "agreed" and time.monotonic() < deadline:
    time.sleep(0.05)
print("verified", store.info()["index_verified"], flush=True)
started = threading.Event()
def recall_forever():
    try:
        while True:
            store.recall("who keeps a dog", k=5, mode="vector")
            started.set()
    except EvermindError:
        pass  # the exit hook closed the store (a traceback printed during shutdown can abort CPython itself)
threading.Thread(target=recall_forever, daemon=True).start()
started.wait(10)
print("exiting", flush=True)
"""


def test_exit_while_a_daemon_thread_recalls_from_a_mapped_snapshot(model_files, embedder, tmp_path: Path):
    db = tmp_path / "exit.db"
    with MemoryStore(db, embedder, index_config=GRAPH) as store:
        store.remember_many([f"person {i} drinks {'tea' if i % 2 else 'coffee'} and keeps a {'dog' if i % 3 else 'cat'}"
                             for i in range(300)])
    assert list(tmp_path.glob("exit.db.*.usearch")), "the close saved no snapshot: the test would not map one"
    for _ in range(3):
        run = subprocess.run([PYTHON, "-c", RECALL_AT_EXIT, *map(str, model_files), str(db)], capture_output=True,
                             text=True, env=child_env(), timeout=120)
        assert "verified agreed" in run.stdout and "exiting" in run.stdout, (run.stdout, run.stderr[-2000:])
        assert run.returncode == 0, (run.returncode, run.stderr[-2000:])


WRITE_AT_EXIT = CHILD_PRELUDE + """
import os, threading
from evermind_memory.errors import EvermindError
store = MemoryStore(db, emb)
acked = os.open(sys.argv[4], os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # (raw writes: a daemon thread holding
started = threading.Event()                                           # stdout's lock at shutdown aborts CPython)
def remember_forever():
    i = 0
    try:
        while True:
            fid = store.remember(f"exit writer fact {i} about river otters")
            os.write(acked, (fid + "\\n").encode())  # acknowledged: remember returned
            i += 1
            if i == 20:
                started.set()
    except EvermindError:
        pass  # the exit hook closed the store
threading.Thread(target=remember_forever, daemon=True).start()
started.wait(60)
print("exiting", flush=True)
"""


def test_exit_while_a_daemon_thread_remembers_keeps_every_acknowledged_fact(model_files, embedder, tmp_path: Path):
    """The store's exit hook closes it while a daemon thread still writes: the thread's next remember fails as on
    a closed store, and every fact a remember acknowledged is in the file, with its vector after the next open."""
    db, acked_file = tmp_path / "writer.db", tmp_path / "acked.txt"
    for _ in range(2):
        run = subprocess.run([PYTHON, "-c", WRITE_AT_EXIT, *map(str, model_files), str(db), str(acked_file)],
                             capture_output=True, text=True, env=child_env(), timeout=120)
        assert run.returncode == 0 and "exiting" in run.stdout, (run.returncode, run.stderr[-2000:])
    acked = acked_file.read_text().split()
    assert len(acked) >= 40
    with MemoryStore(db, embedder) as store:
        store.flush()
        assert [store.get(fid).id for fid in acked] == acked  # (get raises FactNotFound for a lost one)
        assert store.info()["waiting_vectors"] == 0
        report = store.check()
        assert report.ok, report.problems
