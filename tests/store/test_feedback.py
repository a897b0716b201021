"""store.feedback(query, id, useful=...): judgements kept in SQLite (schema 2, migrated from 1), bounded,
dropped with their fact, and trained on by the next adaptation round (never on the gate's probes)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from evermind_memory import FactNotFound, MemoryStore
from evermind_memory.adaptation import AdaptationPolicy
from evermind_memory.errors import EvermindError, InvalidInput
from evermind_memory.store import memory_store as memory_store_module
from evermind_memory.store.backend.sqlite import SCHEMA_VERSION
from store_helpers import as_schema_5

WHO = ["Ada", "Bob", "Cyd", "Dee", "Eve", "Fay"]
WHAT = ["green tea", "river foxes", "Paris trains", "SQLite pages", "black cats", "lazy dogs", "news at eight"]
FACTS = [f"{w} keeps notes on {t} number {i}" for i, (w, t) in enumerate((w, t) for w in WHO for t in WHAT)]
FAST = AdaptationPolicy(steps=4, batch_size=8, lr=5e-3, gate_tolerance=1.0, require_gain=False, min_probe=4,
                        max_probe=6, gate_corpus=16, reembed_batch=8, min_facts=8, query_batch=4)


def judged(db: Path) -> list[tuple[str, str, int]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT query, fact_id, useful FROM feedback ORDER BY id").fetchall()


def test_feedback_is_recorded_counted_and_dropped_with_its_fact(db_path: Path, embedder) -> None:
    with MemoryStore(db_path, embedder) as store:
        a, b = store.remember_many(["Ada drinks green tea", "Bob reads old maps"])
        store.feedback("what does Ada drink", a)
        store.feedback("maps", b, useful=False)
        assert store.info()["feedback"] == 2
        assert judged(db_path) == [("what does Ada drink", a, 1), ("maps", b, 0)]
        store.forget(a)
        assert judged(db_path) == [("maps", b, 0)] and store.info()["feedback"] == 1
        assert store.check().ok


def test_forget_where_drops_feedback_too(db_path: Path, embedder) -> None:
    with MemoryStore(db_path, embedder) as store:
        a = store.remember("Ada drinks green tea", source="chat")
        keep = store.remember("Bob reads old maps", source="notes")
        store.feedback("tea", a)
        store.feedback("maps", keep)
        assert store.forget_where(source="chat") == 1
        assert [fid for _, fid, _ in judged(db_path)] == [keep]


@pytest.mark.parametrize("call, error", [
    (lambda s, fid: s.feedback("", fid), InvalidInput),
    (lambda s, fid: s.feedback("q\x00", fid), InvalidInput),
    (lambda s, fid: s.feedback(7, fid), InvalidInput),
    (lambda s, fid: s.feedback("q", fid, useful=1), InvalidInput),
    (lambda s, fid: s.feedback("q", fid, useful="yes"), InvalidInput),
    (lambda s, fid: s.feedback("q", ""), InvalidInput),
    (lambda s, fid: s.feedback("q", "0" * 32), FactNotFound),
])
def test_bad_feedback_is_refused_and_writes_nothing(db_path: Path, embedder, call, error) -> None:
    with MemoryStore(db_path, embedder) as store:
        fid = store.remember("Ada drinks green tea")
        with pytest.raises(error):
            call(store, fid)
        assert store.info()["feedback"] == 0


def test_a_reader_cannot_give_feedback(db_path: Path, embedder) -> None:
    with MemoryStore(db_path, embedder) as store:
        fid = store.remember("Ada drinks green tea")
        store.flush()
        with MemoryStore(db_path, embedder, read_only=True) as reader:
            with pytest.raises(EvermindError, match="read_only"):
                reader.feedback("tea", fid)


def test_only_the_newest_judgements_are_kept(db_path: Path, embedder, monkeypatch) -> None:
    monkeypatch.setattr(memory_store_module, "FEEDBACK_LIMIT", 3)
    with MemoryStore(db_path, embedder) as store:
        fid = store.remember("Ada drinks green tea")
        for i in range(5):
            store.feedback(f"query {i}", fid)
        assert [q for q, _, _ in judged(db_path)] == ["query 2", "query 3", "query 4"]


def test_a_first_release_store_migrates_to_the_current_schema(db_path: Path, embedder) -> None:
    with MemoryStore(db_path, embedder) as store:
        fid = store.remember("Ada drinks green tea")
    as_schema_5(db_path)
    with sqlite3.connect(db_path) as conn:  # what schema 1 looked like: no feedback (2), leases or owners (3)
        conn.execute("DROP TABLE feedback")
        conn.execute("DROP TABLE leases")
        conn.execute("DROP INDEX facts_waiting")
        conn.execute("ALTER TABLE facts DROP COLUMN owner")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    with pytest.raises(EvermindError, match="schema version 1"):
        MemoryStore(db_path, embedder, read_only=True)  # a reader never migrates
    with MemoryStore(db_path, embedder) as store:
        assert store.info()["schema_version"] == SCHEMA_VERSION == 7
        assert store.get(fid).text == "Ada drinks green tea"
        store.feedback("tea", fid)
        assert store.info()["feedback"] == 1 and store.check().ok


def test_a_round_trains_on_standing_useful_judgements_only(db_path: Path, embedder) -> None:
    with MemoryStore(db_path, embedder) as store:
        ids = store.remember_many(FACTS)
        for i, fid in enumerate(ids[:10]):
            store.feedback(f"who keeps notes, entry {i}", fid)
        store.feedback("who keeps notes, entry 0", ids[0], useful=False)  # withdrawn: the latest judgement wins
        store.feedback("unrelated", ids[11], useful=False)  # never a pair
        report = store.adapt_now(FAST)
        assert report.status == "swapped"
        # nine standing pairs, less those whose fact the gate holds out as a probe
        assert 9 - FAST.max_probe <= report.feedback_pairs <= 9
        assert report.to_dict()["feedback_pairs"] == report.feedback_pairs
        # the judgements follow the facts into the new generation
        again = store.adapt_now(FAST)
        assert again.feedback_pairs == report.feedback_pairs
