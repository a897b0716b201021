"""Time in the store: ttl / expires_at (expired facts are never returned; sweep and the background sweeper delete
them with history), pinned facts, since / until windows, the opt-in recency weight, and compact()/stats()
keeping the disk bounded."""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from evermind_memory import FactNotFound, InvalidInput, MemoryStore
from evermind_memory.store import maintenance

UTC = timezone.utc


def wait_until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_expired_facts_are_never_returned_and_sweep_keeps_their_history(store):
    keep = store.remember("Ada prefers green tea", tags={"person": "ada"})
    soon = store.remember("Ada's green tea order is ready", tags={"person": "ada"}, ttl=0.3)
    later = store.remember("Ada's green tea promo", expires_at=datetime.now(UTC) + timedelta(hours=1))
    assert store.get(soon).expires_at is not None and store.get(keep).expires_at is None
    assert len(store) == 3
    time.sleep(0.35)
    assert len(store) == store.count() == 2 and store.count(tags={"person": "ada"}) == 1
    with pytest.raises(FactNotFound, match="expired"):
        store.get(soon)
    with pytest.raises(FactNotFound):
        store.update(soon, "renewed")
    assert soon not in {f.id for f in store.list()}
    for mode in ("vector", "hybrid", "lexical"):
        ids = [h.id for h in store.recall("green tea", k=5, mode=mode)]
        assert soon not in ids and keep in ids
    assert store.stats().expired == 1
    assert [c.op for c in store.history(soon)] == ["remember"]  # expired, not yet swept: history as it was
    assert store.sweep() == 1 and store.sweep() == 0
    assert [c.op for c in store.history(soon)] == ["remember", "forget"]
    assert store.stats().expired == 0 and store.check().ok
    assert store.get(later).expires_at > datetime.now(UTC)


def test_unfiltered_vector_recall_skips_expired_facts_and_tops_up(target, embedder):
    with MemoryStore(target, embedder) as store:
        texts = [f"note {i} about the quick brown fox" for i in range(40)]
        live = store.remember_many(texts[:30])
        store.remember_many(texts[30:], ttl=0.2)
        time.sleep(0.25)
        hits = store.recall("quick brown fox", k=35, mode="vector")
        assert len(hits) == 30 and {h.id for h in hits} == set(live)  # the 10 expired never take a slot


def test_the_background_sweeper_deletes_expired_facts(target, embedder, monkeypatch):
    monkeypatch.setattr(maintenance, "SWEEP_INTERVAL", 0.05)
    with MemoryStore(target, embedder) as store:
        fid = store.remember("short-lived", ttl=0.1)
        assert any(t.name == "evermind-sweeper" for t in threading.enumerate())
        wait_until(lambda: len(store.history(fid)) == 2)
        assert store.history(fid)[-1].op == "forget" and store.info()["sweep_error"] is None
    with MemoryStore(target, embedder) as store:  # no expiring fact left: no sweeper thread
        assert store.stats().facts == 0


def test_expiry_arguments_are_checked(store):
    for kwargs, message in [({"ttl": 0}, "duration > 0"), ({"ttl": -5}, "duration > 0"), ({"ttl": True}, "seconds"),
                            ({"ttl": float("nan")}, "finite"), ({"ttl": 10**12}, "at most 36,525 days"),
                            ({"ttl": 5, "expires_at": datetime.now(UTC) + timedelta(hours=1)}, "got both"),
                            ({"expires_at": "2020-01-01T00:00:00Z"}, "after now"),
                            ({"expires_at": datetime(2030, 1, 1)}, "naive"),
                            ({"ttl": 60, "pinned": True}, "never expires"), ({"pinned": "yes"}, "True or False")]:
        with pytest.raises(InvalidInput, match=message):
            store.remember("x", **kwargs)
    assert len(store) == 0
    assert store.get(store.remember("x", ttl=timedelta(days=1))).expires_at.tzinfo is not None


def test_pinned_facts_never_expire_and_keep_their_score_under_recency(target, embedder):
    with MemoryStore(target, embedder) as store:
        old = store.remember("The office wifi password is on the fridge", pinned=True)
        same = store.remember("The office wifi password is on the fridge")  # same text: same score
        assert store.get(old).pinned and not store.get(same).pinned
        base = {h.id: h.score for h in store.recall("wifi password", k=2, mode="vector")}
        time.sleep(0.05)
        decayed = {h.id: h.score for h in store.recall("wifi password", k=2, mode="vector", recency=0.05)}
        assert decayed[old] == pytest.approx(base[old]) and decayed[same] < base[same] * 0.6
        with pytest.raises(InvalidInput, match="recency expects"):
            store.recall("x", recency=-1)


def test_recency_is_opt_in_and_ranks_newer_facts_first(target, embedder):
    with MemoryStore(target, embedder) as store:
        first = store.remember("Ada's team meets on Monday")
        time.sleep(0.2)
        second = store.remember("Ada's team meets on Monday")
        plain = store.recall("team meeting", k=2, mode="vector")
        assert [h.id for h in plain] == [first, second]  # no weighting by default: ties stay in label order
        assert plain[0].score == pytest.approx(plain[1].score)
        weighted = store.recall("team meeting", k=2, mode="vector", recency=timedelta(seconds=0.1))
        assert [h.id for h in weighted] == [second, first] and weighted[1].score < weighted[0].score * 0.5
        store.update(first, tags={"touched": True})  # a change makes it recent again
        assert store.recall("team meeting", k=1, mode="vector", recency=0.1)[0].id == first


def test_since_and_until_bound_created_at(store):
    a = store.remember("first fact")
    time.sleep(0.01)
    middle = datetime.now(UTC)
    time.sleep(0.01)
    b = store.remember("second fact")
    assert [f.id for f in store.list(since=middle)] == [b]
    assert [f.id for f in store.list(until=middle)] == [a]
    assert store.count(since=middle.isoformat(), until=datetime.now(UTC)) == 1
    assert [h.id for h in store.recall("fact", k=5, mode="lexical", until=middle)] == [a]
    assert store.forget_where(since=middle) == 1 and [f.id for f in store.list()] == [a]


def test_compact_prunes_old_history_and_the_file_shrinks(tmp_path, embedder):
    path = tmp_path / "m.db"
    with MemoryStore(path, embedder) as store:
        keep = store.remember("a fact that stays")
        ids = store.remember_many([f"churned fact number {i} " + "padding " * 40 for i in range(300)])
        for fid in ids:
            store.forget(fid)
        before = store.stats()
        assert before.forgotten == 300 and before.changes >= 601
        kept = store.compact()  # default: keep 30 days of history
        assert kept.forgotten == 300 and len(store.history(ids[0])) == 2
        after = store.compact(keep_history=0)
        # left: the live fact's remember (and its first vector), and the newest change, the head of the change
        # feed, which is never pruned: the last forgotten fact's remember and forget
        assert (after.forgotten == 1 and after.changes == 4
                and [c.op for c in store.history(ids[-1])] == ["remember", "forget"])
        with pytest.raises(FactNotFound):
            store.history(ids[0])
        assert [c.op for c in store.history(keep)] == ["remember"]
        assert after.db_bytes < before.db_bytes + before.wal_bytes and after.free_bytes == 0
        assert after.facts == 1 and store.check().ok
        new = store.remember("remembered after compacting")  # seqs (and labels) keep growing
        assert store.recall("remembered after compacting", k=1, mode="vector")[0].id == new
        with pytest.raises(InvalidInput, match="keep_history expects a duration >= 0"):
            store.compact(keep_history=-1)
        with pytest.raises(InvalidInput, match="scope view"):
            store.scope(user="ada").compact()


def test_a_reader_behind_the_pruned_history_rebuilds_its_index(tmp_path, embedder):
    path = tmp_path / "m.db"
    with MemoryStore(path, embedder) as writer:
        writer.remember("the first fact")
        writer.flush()
        reader = MemoryStore(path, embedder, read_only=True)
        reader.flush()  # its index is loaded now (on first use), so the churn below leaves it behind
        doomed = writer.remember_many([f"doomed {i}" for i in range(20)])
        for fid in doomed:
            writer.forget(fid)
        live = writer.remember("a fact after the churn")
        writer.compact(keep_history=0, vacuum=False)
        hits = reader.recall("a fact after the churn", k=3, mode="vector")
        assert live in {h.id for h in hits} and not set(doomed) & {h.id for h in hits}
        assert "compacted" in reader.info()["index_status"] and reader.check().ok
        reader.close()


def test_stats_count_what_is_on_disk(tmp_path, embedder):
    with MemoryStore(tmp_path / "m.db", embedder) as store:
        store.scope(user="ada").remember_many(["one", "two"], pinned=True)
        store.remember("three")
        store.flush()
        stats = store.stats()
        assert (stats.facts, stats.pinned, stats.expired, stats.forgotten) == (3, 2, 0, 0)
        assert store.scope(user="ada").stats().facts == 2
        assert stats.db_bytes > 0 and stats.index_bytes >= 0
        conn = sqlite3.connect(tmp_path / "m.db")
        assert conn.execute("SELECT COUNT(*) FROM changes").fetchone()[0] == stats.changes
        conn.close()
    with MemoryStore(":memory:", embedder) as mem:
        assert mem.stats().db_bytes > 0 and np.isfinite(mem.stats().free_bytes)
