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
    while True:
        store.recall("who keeps a dog", k=5, mode="vector")
        started.set()
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
