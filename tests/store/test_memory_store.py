"""MemoryStore through its public API with the tiny real embedder: round trips, recall modes, tags,
updates, forgets, history, fingerprint changes, readers, backup and export/import."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import FrozenInstanceError
from pathlib import Path

import numpy as np
import pytest

from evermind_memory import EmbedderMismatch, EvermindError, Fact, FactNotFound, InvalidInput, MemoryStore, Recall
from evermind_memory.store.backend.sqlite import SCHEMA_VERSION
from evermind_memory.store.index import groups_name
from store_helpers import recall_at_k

TEXTS = [
    "Ada prefers green tea in the morning",
    "Bob drinks espresso every day",
    "The cat sat on the mat",
    "Paris is the capital of France",
    "SQLite is a small database engine",
    "Agents remember facts about users",
]


def test_remember_get_round_trip(store: MemoryStore):
    fid = store.remember("Ada prefers green tea", tags={"person": "ada", "topic": "drinks"}, source="chat")
    fact = store.get(fid)  # committed: readable at once, whether or not its vector has arrived
    assert isinstance(fact, Fact) and fact.id == fid
    assert (fact.text, fact.tags, fact.source) == ("Ada prefers green tea", {"person": "ada", "topic": "drinks"},
                                                   "chat")
    assert fact.created_at == fact.updated_at and fact.created_at.tzinfo is not None
    store.flush()  # default background embedding: the vector (and its fingerprint) after flush()
    after = store.get(fid)
    assert after.fingerprint == store.fingerprint
    assert (after.text, after.tags, after.created_at, after.updated_at) == (fact.text, fact.tags, fact.created_at,
                                                                            fact.updated_at)
    with pytest.raises(FrozenInstanceError):
        fact.text = "x"  # type: ignore[misc]


def test_synchronous_remember_has_its_vector_on_return(db_path: Path, embedder):
    with MemoryStore(db_path, embedder, background_embedding=False) as store:
        fid = store.remember("Ada prefers green tea")
        assert store.get(fid).fingerprint == store.fingerprint
        assert store.info()["waiting_vectors"] == 0 and store.info()["indexed"] == 1


def test_ids_are_opaque_and_unique(store: MemoryStore):
    ids = store.remember_many(["a fact", "a fact", "another"])
    assert len(set(ids)) == 3 and all(isinstance(i, str) and i for i in ids)
    assert len(store) == 3


def test_recall_modes_find_the_exact_text(store: MemoryStore):
    ids = store.remember_many(TEXTS)
    for mode in ("hybrid", "vector", "lexical"):
        hits = store.recall("Paris is the capital of France", k=3, mode=mode)
        assert isinstance(hits[0], Recall) and hits[0].id == ids[3], mode
        assert all(a.score >= b.score for a, b in zip(hits, hits[1:])), mode
    top = store.recall("Paris is the capital of France", k=1, mode="vector")[0]
    assert top.score == pytest.approx(1.0, abs=1e-3)
    assert store.recall("capital France", mode="hybrid", fusion="rrf")[0].id == ids[3]


def test_lexical_uses_porter_stemming(store: MemoryStore):
    fid = store.remember("She was running marathons")
    assert [h.id for h in store.recall("runs marathon", mode="lexical")] == [fid]
    assert store.recall("zebra", mode="lexical") == []
    assert store.recall("!!! ??? ...", mode="lexical") == []  # no words: no FTS syntax error


def test_fts_syntax_in_queries_is_harmless(store: MemoryStore):
    store.remember_many(TEXTS)
    for q in ('"unbalanced', "tea AND OR NOT", "col:tea", "NEAR(tea cat)", "tea*", "-tea", "^tea"):
        store.recall(q, mode="lexical")
        store.recall(q)


@pytest.mark.parametrize("query", ["green tea morning", "Ada drinks tea in Paris"])
def test_hybrid_is_bm25_over_the_best_plus_weighted_cosine(store: MemoryStore, query: str):
    store.remember_many(TEXTS)
    hybrid = {h.id: h.score for h in store.recall(query, k=6, mode="hybrid")}
    vector = {h.id: h.score for h in store.recall(query, k=6, mode="vector")}
    lexical = {h.id: h.score for h in store.recall(query, k=6, mode="lexical")}
    best = max(lexical.values())
    for fid, score in hybrid.items():
        bm = lexical[fid] / best if fid in lexical else 0.0
        assert score == pytest.approx(bm + 2.0 * vector[fid], abs=1e-4)
    if query.startswith("Ada"):  # three facts match different words: the weakest match keeps its share
        assert len(lexical) == 3 and 0.0 < min(lexical.values()) / best < 1.0


def test_k_bounds_and_min_score(store: MemoryStore):
    store.remember_many(TEXTS)
    assert len(store.recall("tea", k=1000, mode="vector")) == len(TEXTS)
    assert len(store.recall("tea", k=2, mode="vector")) == 2
    hits = store.recall("Ada prefers green tea in the morning", k=6, mode="vector", min_score=0.99)
    assert [h.text for h in hits] == [TEXTS[0]]
    assert store.recall("tea", k=6, mode="vector", min_score=1.5) == []


def test_empty_store_recall(store: MemoryStore):
    for mode in ("hybrid", "vector", "lexical"):
        assert store.recall("anything", mode=mode) == []


def test_tag_filters_are_exact(store: MemoryStore):
    a = store.remember("Ada likes tea", tags={"person": "ada"})
    store.remember("Bob likes tea", tags={"person": "bob"})
    store.remember("Ada's cat likes tea", tags={"person": "ada ", "pet": "cat"})
    c = store.remember("Ada walks", tags={"person": "ada", "pet": "dog"})
    for mode in ("hybrid", "vector", "lexical"):
        got = {h.id for h in store.recall("likes tea", k=10, tags={"person": "ada"}, mode=mode)}
        assert got <= {a, c} and a in got, mode
    assert [h.id for h in store.recall("walks", tags={"person": "ada", "pet": "dog"}, mode="vector")] == [c]
    assert store.recall("tea", tags={"person": "nobody"}) == []
    assert {f.id for f in store.list(tags={"person": "ada"})} == {a, c}


def test_large_tag_filter_uses_index_and_stays_exact(store: MemoryStore, rng):
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    texts = [" ".join(rng.choice(words, 6)) + f" {i}" for i in range(4400)]
    store.remember_many(texts[:4200], tags={"group": "big"})
    store.remember_many(texts[4200:], tags={"group": "small"})
    hits = store.recall("alpha beta gamma", k=20, tags={"group": "big"}, mode="vector")
    assert len(hits) == 20 and all(h.tags == {"group": "big"} for h in hits)


def test_hnsw_recall_at_10_matches_exact_search(tmp_path: Path, embedder, rng):
    words = ("tea coffee cat dog Paris France database agent memory river fox morning lunch news user "
             "project meeting deadline green black small quick lazy capital engine").split()
    texts = [" ".join(rng.choice(words, 5)) + f" number {i}" for i in range(3000)]
    db = tmp_path / "m.db"
    with MemoryStore(db, embedder) as store:
        store.remember_many(texts)
    queries = [" ".join(rng.choice(words, 3)) for _ in range(40)]
    with MemoryStore(db, embedder) as store:
        assert recall_at_k(store, db, queries) >= 0.95


def test_update_text_tags_source(store: MemoryStore):
    fid = store.remember("Ada prefers green tea", tags={"person": "ada"})
    old = store.get(fid)
    new = store.update(fid, "Ada prefers black coffee")
    assert new.text == "Ada prefers black coffee" and new.tags == {"person": "ada"} and new.created_at == old.created_at
    assert new.updated_at >= old.updated_at
    assert store.recall("green tea", mode="lexical") == []
    assert store.recall("black coffee", mode="lexical")[0].id == fid
    hits = store.recall("Ada prefers black coffee", k=5, mode="vector")
    assert [h.id for h in hits].count(fid) == 1 and hits[0].score == pytest.approx(1.0, abs=1e-3)
    assert store.update(fid, tags={"person": "bob"}).tags == {"person": "bob"}
    assert store.list(tags={"person": "ada"}) == []
    assert store.update(fid, source="import").source == "import"
    assert store.check().ok


def test_update_merges_tags_unless_told_to_replace_them(store: MemoryStore):
    fid = store.remember("Cy's notes", tags={"n": 3, "who": "cy"})
    assert store.update(fid, tags={"mood": "happy"}).tags == {"n": 3, "who": "cy", "mood": "happy"}
    assert store.count(tags={"who": "cy"}) == 1  # still in every who=cy filter
    assert store.update(fid, tags={"mood": None, "n": 4}).tags == {"n": 4, "who": "cy"}  # None removes a tag
    assert store.update(fid, tags={"who": "cy"}, replace_tags=True).tags == {"who": "cy"}
    with pytest.raises(InvalidInput, match="merge nothing.*replace_tags=True"):
        store.update(fid, tags={})
    with pytest.raises(InvalidInput, match="expected tags= as well"):
        store.update(fid, "text", replace_tags=True)
    with pytest.raises(InvalidInput, match=r"tags\['x'\] expects a str, int, float or bool"):
        store.update(fid, tags={"x": None}, replace_tags=True)
    with pytest.raises(InvalidInput, match="more than 32"):
        store.update(fid, tags={f"k{i}": i for i in range(32)})
    assert store.update(fid, tags={}, replace_tags=True).tags == {}
    assert [c.tags for c in store.history(fid)][-1] == {} and store.check().ok


def test_an_update_that_changes_nothing_records_nothing(store: MemoryStore):
    """No history entry and the same updated_at (recency reads it) for a no-op; a change of a tag's type is one."""
    fid = store.remember("Cy's notes", tags={"n": 1, "who": "cy"}, source="chat")
    store.flush()  # its vector made (an update of a fact still waiting for one embeds it: a change)
    before = store.get(fid)
    for kwargs in ({"text": "Cy's notes"}, {"tags": {"gone": None}}, {"tags": {"who": "cy"}}, {"source": "chat"},
                   {"tags": {"n": 1, "who": "cy"}, "replace_tags": True}):
        assert store.update(fid, **kwargs) == before, kwargs
    assert [c.op for c in store.history(fid)] == ["remember"]
    assert store.update(fid, tags={"n": True}).tags == {"n": True, "who": "cy"}  # 1 == True, but not as a tag
    assert [c.op for c in store.history(fid)] == ["remember", "update"] and store.check().ok


def test_forget_never_returns_the_fact(store: MemoryStore):
    ids = store.remember_many(TEXTS)
    store.forget(ids[0])
    with pytest.raises(FactNotFound, match="no fact with id"):
        store.get(ids[0])
    with pytest.raises(FactNotFound):
        store.forget(ids[0])
    with pytest.raises(FactNotFound):
        store.update(ids[0], "again")
    for mode in ("hybrid", "vector", "lexical"):
        assert ids[0] not in {h.id for h in store.recall(TEXTS[0], k=100, mode=mode)}
    assert [c.op for c in store.history(ids[0])] == ["remember", "forget"]
    assert store.check().ok


def test_forget_where(store: MemoryStore):
    store.remember_many(["a1", "a2"], tags={"person": "ada"}, source="chat")
    keep = store.remember("b1", tags={"person": "bob"}, source="chat")
    assert store.forget_where(tags={"person": "ada"}) == 2
    assert store.forget_where(source="nobody") == 0
    assert [f.id for f in store.list()] == [keep]
    assert store.forget_where(source="chat") == 1
    assert len(store) == 0 and store.check().ok


def test_list_pagination(store: MemoryStore):
    ids = store.remember_many([f"fact {i}" for i in range(25)], source="s")
    assert [f.id for f in store.list(limit=10)] == ids[:10]
    assert [f.id for f in store.list(limit=10, offset=20)] == ids[20:]
    assert [f.id for f in store.list(source="s", limit=100)] == ids
    assert store.list(source="other") == []


def test_history_records_every_change(store: MemoryStore):
    fid = store.remember("v1", tags={"a": "1"})
    store.update(fid, "v2")
    store.update(fid, tags={"a": "2"})
    store.forget(fid)
    history = store.history(fid)
    assert [c.op for c in history] == ["remember", "update", "update", "forget"]
    assert [c.text for c in history] == ["v1", "v2", "v2", None]
    assert [c.seq for c in history] == sorted(c.seq for c in history)
    with pytest.raises(FactNotFound):
        store.history("never-used")


def test_reopen_keeps_everything_and_loads_index(db_path: Path, embedder):
    with MemoryStore(db_path, embedder) as store:
        ids = store.remember_many(TEXTS, tags={"k": "v"})
        store.forget(ids[1])
    with MemoryStore(db_path, embedder) as store:
        assert store.info()["index_status"].startswith("loaded")
        assert {f.id for f in store.list()} == set(ids) - {ids[1]}
        assert store.recall(TEXTS[2], k=1, mode="vector")[0].id == ids[2]
        assert store.check().ok


def test_replay_after_watermark(db_path: Path, embedder):
    with MemoryStore(db_path, embedder) as store:
        store.remember_many(TEXTS)
    manifest = json.loads((db_path.parent / "memory.db.json").read_text())
    files = (manifest["file"], groups_name(manifest["file"]))  # the graph, and which facts each node holds
    saved = [(db_path.parent / name).read_bytes() for name in files]
    with MemoryStore(db_path, embedder) as store:
        new = store.remember("a brand new fact about zebras")
        gone = store.list()[0].id
        store.forget(gone)
    # put back the older index generation: the store must replay the two changes after its watermark
    (db_path.parent / "memory.db.json").write_text(json.dumps(manifest))
    for name, data in zip(files, saved):
        (db_path.parent / name).write_bytes(data)
    with MemoryStore(db_path, embedder) as store:
        # remember, forget and (default background embedding) the new fact's vector: all after the watermark
        changes = store.info()["max_seq"] - manifest["watermark"]
        assert changes == 3 and store.info()["index_status"] == f"loaded (replayed {changes} changes)"
        assert store.recall("a brand new fact about zebras", k=1, mode="vector")[0].id == new
        assert gone not in {h.id for h in store.recall(TEXTS[0], k=10, mode="vector")}
        assert store.check().ok


def test_rebuild_index(store: MemoryStore):
    ids = store.remember_many(TEXTS)
    assert store.rebuild_index() == len(TEXTS)
    assert store.recall(TEXTS[4], k=1, mode="vector")[0].id == ids[4]
    assert store.info()["index_status"].startswith("rebuilt")


def test_deleting_index_files_loses_nothing(db_path: Path, embedder):
    with MemoryStore(db_path, embedder) as store:
        ids = store.remember_many(TEXTS)
    for p in db_path.parent.glob("memory.db.*.usearch"):
        p.unlink()
    (db_path.parent / "memory.db.json").unlink()
    with MemoryStore(db_path, embedder) as store:
        assert store.recall(TEXTS[3], k=1, mode="vector")[0].id == ids[3]
        assert store.check().ok


def test_fingerprint_change_reembeds_without_mixing(target, embedder, other_embedder):
    assert embedder.fingerprint != other_embedder.fingerprint
    with MemoryStore(target, embedder) as store:
        ids = store.remember_many(TEXTS)
    with pytest.raises(EmbedderMismatch, match="on_mismatch='reembed'"):
        MemoryStore(target, other_embedder, on_mismatch="raise")
    with MemoryStore(target, other_embedder) as store:
        assert store.fingerprint == other_embedder.fingerprint
        assert all(f.fingerprint == other_embedder.fingerprint for f in store.list())
        top = store.recall(TEXTS[5], k=6, mode="vector")
        assert top[0].id == ids[5] and top[0].score == pytest.approx(1.0, abs=1e-3)
        want = other_embedder.embed_many([store.get(h.id).text for h in top]) @ other_embedder.embed(TEXTS[5])
        # every score from the new model (stored vectors are int8: a score moves by less than 5e-3)
        assert np.allclose([h.score for h in top], want, atol=5e-3)
        assert [c.op for c in store.history(ids[0])] == ["remember"]  # a model swap changes no fact
        assert store.check().ok


@pytest.mark.parametrize("other_id", [-7, 99, None])
def test_vectors_of_another_model_under_the_serving_one_are_found_at_open(db_path: Path, embedder, other_id):
    """A re-embed cut short leaves vectors of another model in a store that serves ours: the next writer to open it
    re-embeds them, whether that model's fingerprint id sorts below ours, above it, or the row lost it (the open
    looks for them in the fingerprint index instead of counting every fact)."""
    with MemoryStore(db_path, embedder) as store:
        ids = store.remember_many(TEXTS)
    with sqlite3.connect(db_path) as conn:
        if other_id is not None:
            conn.execute("INSERT INTO fingerprints (id, fingerprint) VALUES (?, 'another-model/0000')", (other_id,))
        conn.execute("UPDATE facts SET fingerprint_id = ? WHERE id IN (?, ?)", (other_id, ids[1], ids[4]))
    with MemoryStore(db_path, embedder) as store:
        assert all(f.fingerprint == embedder.fingerprint for f in store.list())
        assert store.recall(TEXTS[4], k=1, mode="vector")[0].id == ids[4]
        assert store.check().ok


def test_reembed_force(store: MemoryStore):
    ids = store.remember_many(TEXTS)
    assert store.reembed() == 0
    assert store.reembed(force=True, batch_size=4) == len(TEXTS)
    assert store.recall(TEXTS[1], k=1, mode="vector")[0].id == ids[1]
    assert store.check().ok


def test_recall_stays_whole_while_another_handle_reembeds(db_path: Path, embedder):
    """reembed(force=True) gives every fact a new label; a handle that caught up just before a batch committed
    read its index's old labels in SQLite, found none and answered [] (44 of 4,932 recalls in one run). It now
    catches up and searches again."""
    import threading

    with MemoryStore(db_path, embedder) as s:
        s.remember_many([f"person {i} enjoys jazz in Oslo and chess on sunday, note {i}" for i in range(120)])
    stop = threading.Event()

    def churn() -> None:
        with MemoryStore(db_path, embedder) as other:
            while not stop.is_set():
                other.reembed(force=True)

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        with MemoryStore(db_path, embedder) as store:
            short = [len(hits) for hits in (store.recall("who enjoys jazz in Oslo", k=5, mode=mode)
                                            for _ in range(400) for mode in ("vector", "hybrid")) if len(hits) < 5]
    finally:
        stop.set()
        thread.join()
    assert short == []


def test_reader_sees_writer_commits(target, embedder):
    with MemoryStore(target, embedder) as writer:
        writer.remember("first fact")
        with MemoryStore(target, embedder, read_only=True) as reader:
            fid = writer.remember("the second fact is about zebras")
            assert reader.get(fid).text == "the second fact is about zebras"  # the text once committed
            assert reader.recall("second fact zebras", k=1, mode="lexical")[0].id == fid
            writer.flush()  # its vector: the writer embeds in the background
            assert reader.recall("second fact zebras", k=1, mode="vector")[0].id == fid
            writer.forget(fid)
            assert fid not in {h.id for h in reader.recall("second fact zebras", k=5)}
            with pytest.raises(EvermindError, match="read_only=True"):
                reader.remember("nope")
            assert reader.check().ok


def test_two_writers_on_one_path_share_it(target, embedder):
    with MemoryStore(target, embedder) as first, MemoryStore(target, embedder) as second:
        a = first.remember("from the first writer")
        b = second.remember("from the second writer")
        second.flush()  # its vector: each writer embeds its own facts (in the background)
        for s in (first, second):
            s.flush()
            assert {f.id for f in s.list()} == {a, b}
            assert s.recall("from the second writer", k=1, mode="vector")[0].id == b


def test_closed_store_refuses(target, embedder):
    store = MemoryStore(target, embedder)
    store.close()
    store.close()
    with pytest.raises(EvermindError, match="closed"):
        store.recall("x")


def test_backup_is_consistent_and_opens(store: MemoryStore, tmp_path: Path, embedder):
    ids = store.remember_many(TEXTS)
    dest = store.backup(tmp_path / "copy.db")
    with pytest.raises(Exception, match="exists"):
        store.backup(dest)
    with MemoryStore(dest, embedder) as copy:
        assert [f.id for f in copy.list()] == ids
        assert copy.recall(TEXTS[0], k=1, mode="vector")[0].id == ids[0]


def test_export_import_round_trip(store: MemoryStore, tmp_path: Path, embedder):
    ids = store.remember_many(TEXTS, tags={"t": "x"}, source="src")
    assert store.export(tmp_path / "out.jsonl") == len(TEXTS)
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["id"] == ids[0] and "vector" not in json.loads(lines[0])
    with MemoryStore(tmp_path / "other.db", embedder) as other:
        assert other.import_(tmp_path / "out.jsonl") == len(TEXTS)
        assert other.import_(tmp_path / "out.jsonl") == 0  # ids already present are skipped
        assert [(f.id, f.text, f.tags, f.source, f.created_at) for f in other.list()] == [
            (f.id, f.text, f.tags, f.source, f.created_at) for f in store.list()
        ]
        assert other.recall(TEXTS[2], k=1, mode="vector")[0].id == ids[2]


def test_two_handles_importing_one_file_at_once_add_it_once(target, tmp_path: Path, embedder):
    """Both check the ids, embed, then commit: the second finds every id imported meanwhile and adds none (on
    PostgreSQL its empty insert once raised TypeError)."""
    import threading

    handles = [MemoryStore(target, embedder) for _ in range(2)]
    try:
        for round_ in range(3):
            path = tmp_path / f"in{round_}.jsonl"
            path.write_text("".join(json.dumps({"id": f"imp{round_}-{i}", "text": f"imported fact {i} about tea",
                                                "created_at": "2024-01-02T03:04:05+00:00"}) + "\n"
                                    for i in range(40)))
            start, added, errors = threading.Barrier(2), [], []

            def run(store: MemoryStore) -> None:
                start.wait()
                try:
                    added.append(store.import_(path))
                except Exception as exc:  # noqa: BLE001 (the assertion shows it)
                    errors.append(exc)

            threads = [threading.Thread(target=run, args=(h,)) for h in handles]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == [] and sum(added) == 40 and handles[0].count() == 40 * (round_ + 1)
    finally:
        for h in handles:
            h.close()


def test_import_is_all_or_nothing(store: MemoryStore, tmp_path: Path):
    from evermind_memory import InvalidInput

    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": "bad\u0000nul"}) + "\n")
    with pytest.raises(InvalidInput, match="line 2"):
        store.import_(p)
    assert len(store) == 0


def test_memory_path(embedder):
    with MemoryStore(":memory:", embedder) as store:
        fid = store.remember("in memory only")
        assert store.recall("in memory only", k=1)[0].id == fid
        assert store.check().ok


def test_info_reports_sqlite_and_durability(tmp_path: Path, embedder):
    with MemoryStore(tmp_path / "f.db", embedder, durability="full") as store:
        info = store.info()
        assert info["durability"] == "full" and info["sqlite_version"] == sqlite3.sqlite_version
        assert info["fingerprint"] == embedder.fingerprint and info["schema_version"] == SCHEMA_VERSION == 7


def test_not_a_store_and_newer_schema_are_refused(tmp_path: Path, embedder):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE x (a)")
    with pytest.raises(EvermindError, match="not an evermind store"):
        MemoryStore(other, embedder)
    db = tmp_path / "m.db"
    MemoryStore(db, embedder).close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(EvermindError, match="schema version 99"):
        MemoryStore(db, embedder)


def test_pragmas_follow_the_connection_policy(db_path: Path, embedder):
    with MemoryStore(db_path, embedder, durability="full"):
        pass
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        kinds = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert {"facts", "fact_tags", "changes", "meta", "facts_fts"} <= kinds


def test_background_embedding_serves_every_remembered_fact(tmp_path: Path, embedder):
    db = tmp_path / "bg.db"
    texts = [f"background fact {i} about {w}" for i, w in enumerate(["tea", "rivers", "owls", "maps"] * 30)]
    with MemoryStore(db, embedder, background_embedding=True) as store:
        ids = [store.remember(t) for t in texts]
        # a vector recall waits for every waiting vector: each fact is found by its own text
        for fid, text in zip(ids[::17], texts[::17]):
            assert fid in [h.id for h in store.recall(text, k=10, mode="vector")]
        assert store.info()["waiting_vectors"] == 0
        report = store.check()
        assert report.ok and report.indexed == len(texts), report.problems
        forgotten = store.remember("forgotten before its vector")
        store.forget(forgotten)
    with MemoryStore(db, embedder) as store:
        assert len(store) == len(texts) and store.check().ok
