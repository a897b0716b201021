"""Caller ids and upsert, count / clear / len, supersede, remember(dedup=True) and duplicates()."""

from __future__ import annotations

import subprocess
import threading

import pytest

from evermind_memory import FactNotFound, InvalidInput, MemoryStore
from store_helpers import CHILD_PRELUDE, PYTHON, child_env


def test_remember_with_an_id_inserts_then_replaces_keeping_history(store):
    assert store.remember("Ada's flight is on Tuesday", id="ada-flight", tags={"person": "ada"},
                          ttl=3600) == "ada-flight"
    first = store.get("ada-flight")
    assert first.expires_at is not None
    assert store.remember("Ada's flight is on Wednesday", id="ada-flight", source="mail", pinned=True) == "ada-flight"
    fact = store.get("ada-flight")
    assert (fact.text, fact.tags, fact.source, fact.expires_at, fact.pinned) == (
        "Ada's flight is on Wednesday", {}, "mail", None, True)  # every part is the new call's
    assert fact.created_at == first.created_at and fact.updated_at > first.updated_at
    assert [(c.op, c.text) for c in store.history("ada-flight")] == [
        ("remember", "Ada's flight is on Tuesday"), ("update", "Ada's flight is on Wednesday")]
    assert len(store) == 1
    assert store.recall("Wednesday flight", k=1, mode="vector")[0].id == "ada-flight"  # re-embedded
    assert store.remember("Ada's flight is on Wednesday", id="ada-flight", source="mail", pinned=True) == "ada-flight"
    assert store.check().ok


def test_ids_are_checked_and_an_id_of_another_scope_is_refused(store):
    for bad, message in [("", "1 to 128"), ("x" * 129, "1 to 128"), (5, "expected a str"), ("a\x00b", "NUL")]:
        with pytest.raises(InvalidInput, match=message):
            store.remember("x", id=bad)
    store.scope(user="bob").remember("Bob's secret", id="shared")
    with pytest.raises(InvalidInput, match="outside this scope"):
        store.scope(user="ada").remember("Ada's overwrite", id="shared")
    assert store.get("shared").text == "Bob's secret"  # the root sees it; ada neither read nor changed it
    with pytest.raises(InvalidInput, match="not both"):
        store.remember("x", id="y", dedup=True)


def test_count_len_and_clear(store):
    ada = store.scope(user="ada")
    ada.remember_many(["one", "two"], tags={"k": 1})
    store.remember("three", tags={"k": 2})
    assert len(store) == store.count() == 3 and len(ada) == 2
    assert store.count(where={"k": {"$gte": 2}}) == 1 and store.count(tags={"k": 1}) == 2
    with pytest.raises(InvalidInput, match="clear\\(confirm=True\\)"):
        ada.clear()
    with pytest.raises(InvalidInput, match="clear\\(confirm=True\\)"):
        ada.clear(confirm="yes")
    assert ada.clear(confirm=True) == 2 and len(ada) == 0 and len(store) == 1
    with pytest.raises(InvalidInput, match="call clear\\(confirm=True\\)"):
        store.forget_where()
    assert store.clear(confirm=True) == 1 and len(store) == 0 and store.check().ok


def test_supersede_links_both_histories(store):
    old = store.remember("Ada lives in Bern", tags={"person": "ada"}, source="chat")
    new = store.supersede(old, "Ada moved to Zurich")
    fact = store.get(new)
    assert (fact.text, fact.tags, fact.source) == ("Ada moved to Zurich", {"person": "ada"}, "chat")  # inherited
    with pytest.raises(FactNotFound):
        store.get(old)
    assert [(c.op, c.replaced_by) for c in store.history(old)] == [("remember", None), ("forget", new)]
    assert [(c.op, c.replaces) for c in store.history(new)] == [("remember", old)]
    assert [h.id for h in store.recall("where does Ada live", k=5)] == [new]
    other = store.supersede(new, "Ada moved to Geneva", tags={"person": "ada", "city": "Geneva"})
    assert store.get(other).tags == {"person": "ada", "city": "Geneva"}
    with pytest.raises(FactNotFound):
        store.supersede(old, "again")
    with pytest.raises(FactNotFound):
        store.scope(user="bob").supersede(other, "Bob's takeover")
    assert store.check().ok


def test_dedup_returns_the_stored_id_for_a_repeat_and_stores_a_change(store):
    first = store.remember("Ada's flight is on Tuesday", tags={"person": "ada"})
    assert store.remember("ada's flight is on tuesday.", tags={"person": "ada"}, dedup=True) == first
    wednesday = store.remember("Ada's flight is on Wednesday", tags={"person": "ada"}, dedup=True)
    assert wednesday != first  # close in meaning, but a different day: a new fact
    other_tags = store.remember("Ada's flight is on Tuesday", tags={"person": "bob"}, dedup=True)
    other_source = store.remember("Ada's flight is on Tuesday", tags={"person": "ada"}, source="mail", dedup=True)
    other_scope = store.scope(user="ada").remember("Ada's flight is on Tuesday", tags={"person": "ada"}, dedup=True)
    assert len({first, other_tags, other_source, other_scope}) == 4  # duplicates only within scope, tags, source
    assert len(store) == 5
    assert [c.op for c in store.history(first)] == ["remember"]  # the repeat wrote nothing


def test_dedup_sees_facts_still_waiting_for_their_vector_and_races_store_once(tmp_path, embedder):
    with MemoryStore(tmp_path / "m.db", embedder) as store:
        first = store.remember("The staging server runs on port 8080")  # queued for the background worker
        assert store.remember("the staging server runs on port 8080!", dedup=True) == first
        results: list[str] = []

        def remember() -> None:
            results.append(store.remember("Bob prefers dark mode in the editor", dedup=True))

        threads = [threading.Thread(target=remember) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(results)) == 1 and store.count() == 2


def test_duplicates_lists_pairs_with_reasons(store):
    a = store.remember("The staging server runs on port 8080")
    store.remember("Ada's flight is on Tuesday")
    b = store.remember("the staging server runs on port 8080!")
    store.remember("Ada's flight is on Wednesday")  # close, but not a duplicate
    store.remember("The staging server runs on port 8080", tags={"env": "x"})  # other tags: another group
    pairs = store.duplicates()
    assert [(p.keep, p.drop) for p in pairs] == [(a, b)]
    assert pairs[0].reason.startswith("duplicate") and pairs[0].overlap == 1.0
    assert store.scope(user="ada").duplicates() == [] and store.duplicates(where={"env": "x"}) == []
    with pytest.raises(InvalidInput, match="limit"):
        store.duplicates(limit=0)


DEDUP_WRITER = CHILD_PRELUDE + """
store = MemoryStore(db, emb)
print("open", flush=True)
sys.stdin.readline()  # everyone starts together
for i in range(int(sys.argv[4])):
    print(store.remember(f"The backup of server {i} runs at night", dedup=True), flush=True)
store.close()
"""


def test_dedup_holds_across_writer_processes(model_files, tmp_path, embedder):
    db = tmp_path / "m.db"
    MemoryStore(db, embedder).close()
    procs = [subprocess.Popen([PYTHON, "-c", DEDUP_WRITER, str(model_files[0]), str(model_files[1]), str(db), "12"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=child_env()) for _ in range(3)]
    for p in procs:
        assert p.stdout.readline().strip() == "open", p.stderr.read()[-2000:]
    for p in procs:
        p.stdin.write("\n")
        p.stdin.flush()
    answers = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        answers.append(out.split())
    with MemoryStore(db, embedder) as store:
        assert len(store) == 12  # each fact stored once, whichever process got there first
        assert answers[0] == answers[1] == answers[2]  # and every process got its id back
