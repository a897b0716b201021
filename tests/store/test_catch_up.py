"""A node that stayed open while another process wrote many changes answers like a freshly opened store,
whichever way it catches up: replaying the change feed; adopting the newer snapshot the other process saved
(after it validates and holds as many vectors as SQLite) when that skips more changes than a fraction of the
snapshot's size, whether or not the node is far behind; when it is far behind (more pending changes than a
multiple of its index) and there is no snapshot or it fails a check, rebuilding its index from the vectors table;
or rebuilding because the replay would retire so many vectors that the index would be rebuilt right after
anyway."""

from __future__ import annotations

import json
import subprocess

import pytest

from evermind_memory import MemoryStore
from evermind_memory.store import vectors
from store_helpers import CHILD_PRELUDE, PYTHON, child_env

OTHER_NODE = CHILD_PRELUDE + """
seed_ids, forgets = sys.argv[4].split(","), int(sys.argv[5])
with MemoryStore(db, emb) as store:
    new = store.remember_many([f"node b fact {i} about river {i % 7} and garden {i * 13 % 11}" for i in range(150)])
    for n, fid in enumerate(seed_ids[:20]):
        store.update(fid, text=f"updated seed fact {n}: the meeting moved to friday {n * 3}")
    for fid in seed_ids[20:20 + forgets] + new[:15]:
        store.forget(fid)
    again = store.remember_many([f"late fact {i} about coffee {i % 5} in tokyo" for i in range(30)])
    store.flush()
    print(",".join(new[15:] + again), flush=True)
"""

# (REBUILD_BEHIND_MIN, REBUILD_BEHIND_RATIO, ADOPT_BEHIND_RATIO) that force each path for ~270 pending changes
# on 100 vectors; "adopt_near": not far behind, but the snapshot skips more changes than 0.1 x its vectors;
# "retire": a replay of at least 50 changes that would leave over 20 % of the graph deleted rebuilds instead
PATHS = {"replay": (10**9, 1.0, 0.1), "rebuild": (1, 0.0, 0.1), "adopt": (1, 0.0, 10**6),
         "adopt_near": (1, 10**6, 0.1), "adopt_damaged": (1, 0.0, 0.1), "retire": (50, 10**6, 10**6)}
FORGETS = {"replay": 25, "rebuild": 25, "adopt": 25, "adopt_near": 25, "adopt_damaged": 25, "retire": 60}  # seed
# facts node B
# forgets (it updates 20 more); "rebuild": node B's snapshot is removed, "adopt_damaged": a byte of it flipped


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_node_left_behind_answers_like_a_fresh_open(path, model_files, embedder, db_path, monkeypatch):
    minimum, ratio, adopt = PATHS[path]
    monkeypatch.setattr(vectors, "REBUILD_BEHIND_MIN", minimum)
    monkeypatch.setattr(vectors, "REBUILD_BEHIND_RATIO", ratio)
    monkeypatch.setattr(vectors, "ADOPT_BEHIND_RATIO", adopt)
    with MemoryStore(db_path, embedder) as node:
        seed = node.remember_many([f"seed fact {i} about tea {i % 5} with ada in paris {i * 7 % 9}"
                                   for i in range(100)])
        node.flush()
        assert len(node.recall("seed fact 3 about tea", k=3, mode="vector")) == 3  # caught up, now idle
        before = node.info()["index_status"]
        child = subprocess.run([PYTHON, "-c", OTHER_NODE, *map(str, model_files), str(db_path), ",".join(seed),
                                str(FORGETS[path])],
                               capture_output=True, text=True, env=child_env(), timeout=300)
        assert child.returncode == 0, child.stderr[-3000:]
        written = child.stdout.split()[-1].split(",")
        gone = set(seed[20:20 + FORGETS[path]])
        manifest = db_path.parent / f"{db_path.name}.json"
        if path == "rebuild":
            manifest.unlink()  # no snapshot to adopt
        elif path == "adopt_damaged":
            graph = db_path.parent / json.loads(manifest.read_text())["file"]
            data = bytearray(graph.read_bytes())
            data[len(data) // 2] ^= 0x40
            graph.write_bytes(bytes(data))

        queries = [f"updated seed fact {n}: the meeting moved to friday {n * 3}" for n in range(0, 20, 3)]
        queries += [f"seed fact {i} about tea {i % 5} with ada in paris {i * 7 % 9}" for i in range(80, 100, 4)]
        queries += [f"node b fact {i} about river {i % 7} and garden {i * 13 % 11}" for i in range(15, 150, 17)]
        queries += [f"late fact {i} about coffee {i % 5} in tokyo" for i in range(0, 30, 7)]
        answers = {q: [h.id for h in node.recall(q, k=5, mode="vector")] for q in queries}
        status = node.info()["index_status"]
        if path == "replay":
            assert status == before, status  # replayed: no rebuild
        elif path in ("rebuild", "adopt_damaged"):
            assert status.startswith("rebuilt (") and "changes behind" in status, status
        elif path in ("adopt", "adopt_near"):
            assert status.startswith("adopted a saved index"), status
        else:
            assert status.startswith("rebuilt (") and "retiring" in status, status
        assert node.info()["indexed"] == 100 - FORGETS[path] + 135 + 30
        assert node.check().ok
        with MemoryStore(db_path, embedder) as fresh:
            assert fresh.info()["indexed"] == node.info()["indexed"]
            for q, ids in answers.items():
                assert ids == [h.id for h in fresh.recall(q, k=5, mode="vector")], q
                assert not gone & set(ids)
        for n in range(0, 20, 3):  # an updated fact is found by its new text, exactly
            assert answers[queries[n // 3]][0] == seed[n]
        assert {answers[q][0] for q in queries[-4:]} <= set(written)


def test_a_change_indexed_ahead_of_the_feed_is_replayed_in_order_around_it(target, embedder):
    """Issue 34: a node indexes the vectors of its own commit at once even when another node committed since its
    watermark (no catch-up under the write mutex, its own vectors not read back); the next catch-up replays the
    other node's changes in order around them, forgets included, and a snapshot saved in between (SQLite) is
    loaded, replayed and trusted by the next open."""
    a = MemoryStore(target, embedder, background_embedding=False)
    b = MemoryStore(target, embedder, background_embedding=False)
    seed = a.remember_many([f"seed fact {i} about the harbour crane {i}" for i in range(6)])
    assert a.recall("harbour crane", k=1, mode="vector")  # a's index is loaded and at the head of the feed
    theirs = b.remember_many([f"node b fact {i}: the orchard pears ripen in week {i}" for i in range(5)])
    b.forget(seed[0])
    mine = a.remember("Ada keeps three beehives on the library roof")  # indexed ahead of b's changes
    b.forget(theirs[1])
    got = [h.id for h in a.recall("Ada keeps three beehives on the library roof", k=20, mode="vector")]
    assert got[0] == mine
    assert set(got) == set(seed[1:]) | {theirs[0]} | set(theirs[2:]) | {mine}  # b's forgets retired, b's adds in
    a.remember("a second fact of node a, about the tram timetable")
    b.remember("node b again: the bakery opens at seven")
    a.remember("a third fact of node a, about the bicycle lock")  # ahead again, then closed with it pending
    a.close()
    b.close()
    with MemoryStore(target, embedder) as c:
        hits = c.recall("Ada keeps three beehives on the library roof", k=20, mode="vector")
        assert hits[0].id == mine and len(hits) == len(c) == 5 + 4 + 3 + 1
        assert c.check().ok
        if c.info()["backend"] == "sqlite":
            assert c.info()["index_status"].startswith("loaded")  # the snapshot a saved was trusted, not rebuilt
