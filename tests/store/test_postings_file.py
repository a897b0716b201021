"""The lexical postings saved beside a large SQLite store (store/postings_file.py, issue 34 item 1): a process that
meets a word for the first time reads its postings from the file, patched with the changes since, and ranks exactly
as FTS5's own postings rank (the exhaustive BM25 of test_lexical_topk); a file that is stale, of another store or
damaged is never believed; close() writes it for a store large enough to need it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from evermind_memory import MemoryStore
from evermind_memory.store import postings_file

from test_lexical_topk import QUERIES, assert_exact_top_k, corpus, exhaustive


def recalls_exactly(store: MemoryStore, texts: list[str]) -> None:
    for query in QUERIES + [["x3", "tea"]]:
        assert_exact_top_k(store.recall(" ".join(query), k=7, mode="lexical"), exhaustive(texts, query), 7)


def test_saved_postings_are_fts5s_and_a_new_process_ranks_from_them(db_path, embedder):
    texts = corpus(300, seed=11)
    with MemoryStore(db_path, embedder) as store:
        store.remember_many(texts)
    postings_file.refresh(str(db_path), min_postings=20)
    saved = postings_file.PostingsFile.open(postings_file.path_for(str(db_path)))
    assert set(saved.terms) >= {"tea", "river", "lamp", "jazz"} and "zebra" not in saved.terms  # (2-3 facts)
    rids = {}
    with MemoryStore(db_path, embedder) as store:
        for h in store.recall("tea", k=300, mode="lexical"):
            rids[h.text] = h
        tea = saved.read("tea")
        assert len(tea.rids) == len(rids) == sum("tea" in t.split() for t in texts)
        assert np.all(np.diff(tea.rids) > 0)
        assert sorted(tea.tf.tolist()) == sorted(t.split().count("tea") for t in texts if "tea" in t.split())
        assert sorted(tea.lengths.tolist()) == sorted(len(t.split()) for t in texts if "tea" in t.split())
        recalls_exactly(store, texts)
        with store._parts.db.reading() as session:  # (this thread's session read its words from the file)
            assert session._file is not None and session._file.seq == saved.seq
        beside = [p for p in db_path.parent.iterdir() if p.name.startswith(db_path.name + ".")
                  and not p.name.endswith(".lock")]  # snapshot, groups, manifest, postings
        assert store.stats().index_bytes == sum(p.stat().st_size for p in beside)


def test_changes_after_the_file_are_patched_in_and_forgets_fall_back(db_path, embedder):
    texts = corpus(200, seed=12)
    with MemoryStore(db_path, embedder) as store:
        ids = store.remember_many(texts)
    postings_file.refresh(str(db_path), min_postings=10)
    with MemoryStore(db_path, embedder) as writer:
        new = writer.remember_many(["tea okapi", "river lamp lamp x1"])
        texts += ["tea okapi", "river lamp lamp x1"]
        writer.update(ids[3], "jazz jazz tea")
        texts[3] = "jazz jazz tea"
        with MemoryStore(db_path, embedder) as fresh:  # its first read of each word: the file + 3 changes
            recalls_exactly(fresh, texts)
            assert fresh.recall("okapi", k=3, mode="lexical")[0].id == new[0]
        writer.forget(ids[5])
        writer.forget(new[1])
        del texts[-1], texts[5]
        with MemoryStore(db_path, embedder) as fresh:  # terms of the forgotten facts: their counts disagree
            recalls_exactly(fresh, texts)
        with MemoryStore(db_path, embedder) as fresh, MemoryStore(db_path, embedder) as other:
            recalls_exactly(fresh, texts)  # held now; then another store writes, and `fresh` catches up
            more = corpus(30, seed=13)
            other.remember_many(more)
            texts += more
            recalls_exactly(fresh, texts)


def test_a_file_too_far_behind_is_not_used(db_path, embedder, monkeypatch):
    from evermind_memory.store import postings_file as pf

    texts = corpus(100, seed=14)
    with MemoryStore(db_path, embedder) as store:
        store.remember_many(texts)
    postings_file.refresh(str(db_path), min_postings=10)
    monkeypatch.setattr(pf, "REPLAY_MAX", 3)
    with MemoryStore(db_path, embedder) as store:
        more = corpus(10, seed=15)
        store.remember_many(more)
        texts += more
    with MemoryStore(db_path, embedder) as store:
        recalls_exactly(store, texts)


def test_another_stores_file_or_a_damaged_one_is_refused(tmp_path, embedder):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    texts_a, texts_b = corpus(150, seed=16), corpus(150, seed=17)
    for path, texts in ((a, texts_a), (b, texts_b)):
        with MemoryStore(path, embedder) as store:
            store.remember_many(texts)
        postings_file.refresh(str(path), min_postings=10)
    shutil.copy(postings_file.path_for(str(a)), postings_file.path_for(str(b)))  # same seq, another store
    with MemoryStore(b, embedder) as store:
        recalls_exactly(store, texts_b)
    path = postings_file.path_for(str(a))
    saved = postings_file.PostingsFile.open(path)
    entry = saved.terms["tea"]
    data = bytearray(path.read_bytes())
    data[entry.offset + entry.size // 2] ^= 0x55  # one flipped byte in a block: its CRC fails
    path.write_bytes(bytes(data))
    with pytest.raises(postings_file.Rejected):
        postings_file.PostingsFile.open(path).read("tea")
    with MemoryStore(a, embedder) as store:
        recalls_exactly(store, texts_a)
    for junk in (b"", b"EVPOSTS1" + (10**9).to_bytes(8, "little"), b"EVPOSTS1" + (5).to_bytes(8, "little") + b"{nope"):
        path.write_bytes(junk)
        with pytest.raises(postings_file.Rejected):
            postings_file.PostingsFile.open(path)
        with MemoryStore(a, embedder) as store:
            recalls_exactly(store, texts_a)


def test_blocks_refuse_what_they_do_not_hold():
    from evermind_memory.store.lexical import TermPostings

    p = TermPostings(np.array([3, 9, 70_000], dtype=np.int64), np.array([1, 2, 300], dtype=np.int32),
                     np.array([4, 5, 6], dtype=np.int32))
    block = postings_file.encode(p)
    back = postings_file.decode(block, 3)
    assert back.rids.tolist() == [3, 9, 70_000] and back.tf.tolist() == [1, 2, 300]
    assert back.lengths.tolist() == [4, 5, 6]
    for count in (2, 4, 10**6):
        with pytest.raises(postings_file.Rejected):
            postings_file.decode(block, count)
    with pytest.raises(postings_file.Rejected):
        postings_file.decode(b"not zlib", 3)
    ones = np.array([1, 1], dtype=np.int32)
    bad = TermPostings(np.array([5, 5], dtype=np.int64), ones, ones)
    with pytest.raises(postings_file.Rejected):
        postings_file.decode(postings_file.encode(bad), 2)  # rids must ascend


def test_close_writes_the_file_for_a_large_store_only(db_path, embedder, monkeypatch):
    from evermind_memory.store import postings_file as pf

    path = postings_file.path_for(str(db_path))
    with MemoryStore(db_path, embedder) as store:
        store.remember_many(corpus(60, seed=18))
    assert not path.exists()  # below MIN_FACTS
    monkeypatch.setattr(pf, "MIN_FACTS", 50)
    monkeypatch.setattr(pf, "MIN_POSTINGS", 10)
    monkeypatch.setattr(pf, "REFRESH_AFTER", 5)
    with MemoryStore(db_path, embedder) as store:
        pass
    first = postings_file.PostingsFile.open(path)
    assert "tea" in first.terms
    with MemoryStore(db_path, embedder) as store:
        store.remember_many(corpus(3, seed=19))
    assert postings_file.PostingsFile.open(path).seq == first.seq  # 3 changes: not due
    with MemoryStore(db_path, embedder, read_only=True) as store:
        store.recall("tea", k=3, mode="lexical")
    with MemoryStore(db_path, embedder) as store:
        store.remember_many(corpus(5, seed=20))
    assert postings_file.PostingsFile.open(path).seq == first.seq + 8
    monkeypatch.setattr(pf, "MIN_FACTS", 10_000)
    with MemoryStore(db_path, embedder) as store:
        pass
    assert not path.exists()  # the store is small again for the rule: its file goes


def test_compact_writes_the_file_afresh_without_closing(db_path, embedder, monkeypatch):
    from evermind_memory.store import postings_file as pf

    monkeypatch.setattr(pf, "MIN_FACTS", 50)
    monkeypatch.setattr(pf, "MIN_POSTINGS", 10)
    monkeypatch.setattr(pf, "REFRESH_AFTER", 10_000)  # never due by age here: what writes it is compact()
    path = postings_file.path_for(str(db_path))
    texts = corpus(120, seed=21)
    with MemoryStore(db_path, embedder) as store:
        ids = store.remember_many(texts)
        assert not path.exists()
        store.compact(keep_history=0)
        first = postings_file.PostingsFile.open(path)  # the store is still open
        assert "tea" in first.terms
        store.forget(ids[0])
        store.forget(ids[1])
        more = corpus(5, seed=22)
        store.remember_many(more)
        texts = texts[2:] + more
        store.compact(keep_history=0)  # the forgets' history goes: the first file could not be patched past it
        assert postings_file.PostingsFile.open(path).seq > first.seq
        with MemoryStore(db_path, embedder) as fresh:
            recalls_exactly(fresh, texts)
    monkeypatch.setattr(pf, "MIN_FACTS", 10_000)
    with MemoryStore(db_path, embedder) as store:
        store.compact()
    assert not path.exists()  # too small for one now


def test_scoped_and_filtered_recall_rank_from_the_file_with_their_own_statistics(db_path, embedder):
    a, b = corpus(150, seed=22), corpus(120, seed=23)
    with MemoryStore(db_path, embedder) as store:
        store.scope(user="a").remember_many(a, tags={"half": "a"})
        store.remember_many(b, tags={"half": "b"})
    postings_file.refresh(str(db_path), min_postings=10)
    with MemoryStore(db_path, embedder) as store:
        for query in QUERIES:
            text = " ".join(query)
            assert_exact_top_k(store.scope(user="a").recall(text, k=7, mode="lexical"), exhaustive(a, query), 7)
            assert_exact_top_k(store.recall(text, k=7, mode="lexical", tags={"half": "b"}), exhaustive(b, query), 7)
            assert_exact_top_k(store.recall(text, k=7, mode="lexical"), exhaustive(a + b, query), 7)


def test_a_file_of_another_history_of_the_same_store_is_refused(tmp_path, embedder):
    """A backup restored and written again reaches the file's seq with other changes: the anchor (the fact id and
    time of the file's own seq) differs, and the file is not used."""
    live, restored = tmp_path / "live.db", tmp_path / "restored.db"
    texts = corpus(120, seed=24)
    with MemoryStore(live, embedder) as store:
        store.remember_many(texts)
        store.backup(restored)  # (the same store id)
        store.remember_many(["tea tea lamp x1", "tea river x2", "jazz tea x3"])
    postings_file.refresh(str(live), min_postings=10)
    shutil.copy(postings_file.path_for(str(live)), postings_file.path_for(str(restored)))
    other = ["lamp lamp x4", "river x5 x6", "jazz x7", "kiwi x8"]
    with MemoryStore(restored, embedder) as store:
        store.remember_many(other)  # (its seq passes the file's, by other facts)
    with MemoryStore(restored, embedder) as store:
        recalls_exactly(store, texts + other)
        with store._parts.db.reading() as session:
            assert session._postings_file() is None


def test_repair_in_place_drops_the_file(db_path, embedder):
    """Repair rebuilds the full-text index from rows it may change without a change row: the saved postings go."""
    import sqlite3
    import warnings

    from evermind_memory import StoreWarning

    texts = corpus(80, seed=25)
    with MemoryStore(db_path, embedder) as store:
        ids = store.remember_many(texts)
    postings_file.refresh(str(db_path), min_postings=10)
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE facts SET created_at = '2024-13-45T00:00:00+00:00' WHERE id = ?", (ids[2],))
    conn.commit()
    conn.close()
    with MemoryStore(db_path, embedder) as store, warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreWarning)
        assert store.repair().mode == "in place"
        assert not postings_file.path_for(str(db_path)).exists()
        recalls_exactly(store, texts)
