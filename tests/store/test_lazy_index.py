"""The vector index is loaded on first use, not at open (issue 19): a store used for rows only never reads, loads
or saves the index snapshot; the first vector use loads it once, from any number of threads at a time, and
sees every process's commits; a writer's first commit loads it, so its close leaves an up-to-date snapshot."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

from evermind_memory import MemoryStore
from store_helpers import CHILD_PRELUDE, PYTHON, child_env

FACTS = [f"fact number {i}: the {word} is {colour}" for i, (word, colour) in
         enumerate((w, c) for w in ("door", "kettle", "bicycle", "lamp", "umbrella") for c in ("red", "blue", "green"))]


def snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.parent.glob(path.name + ".*"))}


def test_rows_only_leave_the_snapshot_alone_and_a_later_open_loads_it(db_path: Path, embedder) -> None:
    with MemoryStore(db_path, embedder) as s:
        ids = s.remember_many(FACTS)
    saved = snapshot(db_path)
    assert any(name.endswith(".usearch") for name in saved) and f"{db_path.name}.json" in saved
    with MemoryStore(db_path, embedder) as s:  # a writer that only reads rows
        assert s.get(ids[0]).text == FACTS[0] and s.count() == len(FACTS) and len(s.list()) == len(FACTS)
        assert s.recall("kettle", mode="lexical")[0].text.startswith("fact number 3")
        assert [c.op for c in s.history(ids[1])] == ["remember"]
    assert snapshot(db_path) == saved  # closing a never-loaded cache neither saved nor dropped the snapshot
    with MemoryStore(db_path, embedder) as s:
        assert s.recall(FACTS[7], k=1, mode="vector")[0].id == ids[7]
        assert s.info()["index_status"] == "loaded (replayed 0 changes)" and s.check().ok


def test_first_commit_loads_the_index_and_close_saves_it(db_path: Path, embedder) -> None:
    with MemoryStore(db_path, embedder) as s:
        s.remember_many(FACTS[:5])
    with MemoryStore(db_path, embedder) as s:
        fid = s.remember(FACTS[5])  # background embedding: the commit's mirror loads the index
        s.flush()
        top = s.info()["max_seq"]
        assert s.info()["index_watermark"] == top
    manifest = json.loads((db_path.parent / f"{db_path.name}.json").read_text())
    assert manifest["watermark"] == top  # saved at close, with the new fact
    with MemoryStore(db_path, embedder, read_only=True) as r:
        assert r.recall(FACTS[5], k=1, mode="vector")[0].id == fid
        assert r.info()["index_status"] == "loaded (replayed 0 changes)"


def test_a_reader_that_never_loaded_sees_the_writers_commits(db_path: Path, embedder) -> None:
    with MemoryStore(db_path, embedder) as w:
        w.remember_many(FACTS[:3])
        reader = MemoryStore(db_path, embedder, read_only=True)
        try:
            assert reader.count() == 3  # rows only: its index is not loaded
            later = w.remember_many(FACTS[3:9])
            w.remember("the kettle is forgotten soon")
            w.forget(w.recall("the kettle is forgotten soon", k=1, mode="lexical")[0].id)
            hits = reader.recall(FACTS[8], k=3, mode="vector")
            assert hits[0].id == later[-1] and reader.count() == 9
            assert reader.check().ok
        finally:
            reader.close()


# In a child: several threads' first vector recalls race (and a writer thread commits meanwhile); the snapshot
# is read once, every recall finds its fact.
RACE = CHILD_PRELUDE + """
import json, os, threading
facts = json.loads(sys.argv[4])
opened = []
sys.addaudithook(lambda event, args: opened.append(os.fsdecode(args[0]))
                 if event == "open" and isinstance(args[0], (str, bytes)) else None)
found, errors = {}, []
with MemoryStore(db, emb) as store:
    start = threading.Barrier(7)
    def recall(i):
        try:
            start.wait()
            found[i] = store.recall(facts[i], k=1, mode="vector")[0].text
        except BaseException as exc:
            errors.append(repr(exc))
    def write():
        try:
            start.wait()
            store.remember_many(["written while the index loads " + str(j) for j in range(5)])
        except BaseException as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=recall, args=(i,)) for i in range(6)] + [threading.Thread(target=write)]
    for t in threads: t.start()
    for t in threads: t.join()
    extra = store.recall("written while the index loads 3", k=1, mode="vector")[0].text
    reads = len([p for p in opened if p.endswith(".usearch")])  # (before check(), which reads it again for its hash)
    print(json.dumps({"found": found, "errors": errors, "extra": extra, "ok": store.check().ok,
                      "status": store.info()["index_status"], "hnsw_reads": reads}))
"""


def test_concurrent_first_vector_recalls_load_the_index_once(db_path: Path, embedder, model_files) -> None:
    with MemoryStore(db_path, embedder) as s:
        s.remember_many(FACTS)
    run = subprocess.run([PYTHON, "-c", RACE, str(model_files[0]), str(model_files[1]), str(db_path),
                          json.dumps(FACTS)], capture_output=True, text=True, env=child_env(), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["errors"] == [] and result["ok"]
    assert result["found"] == {str(i): FACTS[i] for i in range(6)}
    assert result["extra"] == "written while the index loads 3"
    assert result["hnsw_reads"] == 1 and result["status"].startswith("loaded")


def test_threads_of_one_process_share_one_load(db_path: Path, embedder) -> None:
    with MemoryStore(db_path, embedder) as s:
        ids = s.remember_many(FACTS)
    with MemoryStore(db_path, embedder, read_only=True) as r:
        hits: dict[int, str] = {}

        def first_hit(i: int) -> None:
            hits[i] = r.recall(FACTS[i], k=1, mode="vector")[0].id

        threads = [threading.Thread(target=first_hit, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert hits == {i: ids[i] for i in range(8)} and r.info()["index_status"] == "loaded (replayed 0 changes)"


def _wait_verified(store: MemoryStore, timeout: float = 60.0) -> str | None:
    """info()["index_verified"] once the background pass has finished (None while it has not begun or runs)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        verified = store.info()["index_verified"]
        if verified not in (None, "running"):
            return verified
        time.sleep(0.02)
    return store.info()["index_verified"]


def test_the_background_pass_agrees_while_this_process_and_another_write(db_path: Path, embedder, monkeypatch) -> None:
    """The paced background comparison after a trusted load, a chunk at a time with the write mutex released in
    between: while this store remembers and forgets and another store on the file does too, every chunk is
    compared at a point where the index has replayed the feed, so a sound snapshot is never rebuilt."""
    from evermind_memory.store import vectors

    monkeypatch.setattr(vectors, "VERIFY_DELAY", 0.0)
    monkeypatch.setattr(vectors, "VERIFY_CHUNK", 8)
    with MemoryStore(db_path, embedder) as seed:
        ids = seed.remember_many([f"seed fact {i} about the orchard and pear {i % 9}" for i in range(150)])
    other = MemoryStore(db_path, embedder)
    with MemoryStore(db_path, embedder) as store:
        assert store.recall("orchard pear", k=3, mode="vector")  # the trusted load starts the pass
        assert store.info()["index_status"].startswith("loaded")
        for i in range(40):
            store.remember(f"written during the pass {i}: the tram leaves at {i % 12}")
            other.remember(f"the other node writes {i}: ferry at {i % 7}")
            if i % 5 == 0:  # (few enough forgets that the index is not rebuilt for its deleted elements)
                store.forget(ids[i])
                other.forget(ids[100 + i])
        assert _wait_verified(store) == "agreed"
        assert store.info()["index_status"].startswith("loaded")  # never rebuilt
        assert store.check().ok
    other.close()
