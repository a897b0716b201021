"""Schema 6 (issue 34: half the bytes): each embedder fingerprint is stored once, in `fingerprints`, and facts
reference it by id. A store of schema 5 (the string in every fact row) is migrated by its first writer, in one
transaction with the version it records: a writer killed inside it leaves schema 5 whole for the next one."""

from __future__ import annotations

import signal
import subprocess

import pytest

from evermind_memory import EvermindError, MemoryStore
from store_helpers import CHILD_PRELUDE, PYTHON, as_schema_5, child_env, recall_at_k, stored_rows

TEXTS = [f"fact {i}: {w}" for i, w in enumerate(
    ["Ada drinks green tea", "Bob flies to Lisbon", "Carol keeps a cat", "Dmitri plays chess on Sundays",
     "Esther is allergic to peanuts", "Farid moved to Oslo", "Greta reads about volcanoes", "Hiro learns Spanish"])]
QUERIES = ["what does Ada drink", "who moved to Oslo", "chess", "peanut allergy"]
BY_STRING = "SELECT COUNT(*) FROM facts f JOIN fingerprints p ON p.id = f.fingerprint_id WHERE p.fingerprint = ?"
OPEN_SCRIPT = CHILD_PRELUDE + """
MemoryStore(db, emb)
print("never", flush=True)
"""


def test_each_fingerprint_is_stored_once(target, embedder, other_embedder):
    with MemoryStore(target, embedder) as store:
        store.remember_many(TEXTS)
        assert store.info()["schema_version"] == 7
    assert stored_rows(target, "SELECT fingerprint FROM fingerprints") == [(embedder.fingerprint,)]
    assert stored_rows(target, BY_STRING, (embedder.fingerprint,)) == [(len(TEXTS),)]
    with MemoryStore(target, other_embedder) as store:  # another model: its vectors reference a second row
        assert store.get(store.list(limit=1)[0].id).text == TEXTS[0]
        assert recall_at_k(store, target, QUERIES) >= 0.95
    assert sorted(r[0] for r in stored_rows(target, "SELECT fingerprint FROM fingerprints")) == sorted(
        [embedder.fingerprint, other_embedder.fingerprint])
    assert stored_rows(target, BY_STRING, (other_embedder.fingerprint,)) == [(len(TEXTS),)]


def test_a_schema_5_store_is_migrated_by_its_first_writer(target, embedder):
    with MemoryStore(target, embedder) as store:
        ids = store.remember_many(TEXTS)
        before = {q: [h.id for h in store.recall(q, k=3, mode="hybrid")] for q in QUERIES}
    as_schema_5(target)
    assert stored_rows(target, "SELECT COUNT(*) FROM facts WHERE fingerprint = ?", (embedder.fingerprint,)) == [
        (len(TEXTS),)]
    with pytest.raises(EvermindError, match="schema version 5"):
        MemoryStore(target, embedder, read_only=True)  # a reader never migrates
    with MemoryStore(target, embedder) as store:
        assert store.info()["schema_version"] == 7
        assert {q: [h.id for h in store.recall(q, k=3, mode="hybrid")] for q in QUERIES} == before
        new = store.remember("fact 99: Ada keeps a kite in the attic")
        assert store.recall("Ada's kite", k=3, mode="vector")[0].id == new
        assert store.check().ok and store.get(ids[3]).text == TEXTS[3]
    assert stored_rows(target, BY_STRING, (embedder.fingerprint,)) == [(len(TEXTS) + 1,)]
    with MemoryStore(target, embedder) as store:  # opened again: nothing left to migrate
        assert len(store) == len(TEXTS) + 1 and store.check().ok


def test_a_writer_killed_inside_the_migration_leaves_schema_5_whole(target, embedder, model_files):
    with MemoryStore(target, embedder) as store:
        ids = store.remember_many(TEXTS)
    as_schema_5(target)
    proc = subprocess.run([PYTHON, "-c", OPEN_SCRIPT, str(model_files[0]), str(model_files[1]), str(target)],
                          capture_output=True, text=True, timeout=120,
                          env={**child_env(), "EVERMIND_CRASH_AT": "migrate.fingerprints:1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert stored_rows(target, "SELECT value FROM meta WHERE key = 'schema_version'") == [("5",)]
    assert stored_rows(target, "SELECT COUNT(*) FROM facts WHERE fingerprint = ?", (embedder.fingerprint,)) == [
        (len(TEXTS),)]
    with MemoryStore(target, embedder) as store:  # the next writer migrates it from the start
        assert store.info()["schema_version"] == 7
        assert [store.get(i).text for i in ids] == TEXTS
        assert recall_at_k(store, target, QUERIES) >= 0.95 and store.check().ok
    assert stored_rows(target, BY_STRING, (embedder.fingerprint,)) == [(len(TEXTS),)]
