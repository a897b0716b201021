"""Vectors stored as float16 (schema 5, issue 34 item 3), on both engines: half the bytes of a row's vector, a
store of schema 4 (float32 rows, what the previous release wrote) migrated by the first writer that opens it,
and recall that answers like exact search over what the database holds."""

from __future__ import annotations

import numpy as np
import pytest

from evermind_memory import EvermindError, MemoryStore
from store_helpers import SCHEMA_5, execute, recall_at_k, stored_rows

TEXTS = [f"fact {i}: {name} keeps {thing} in the {room}" for i, (name, thing, room) in enumerate(
    (n, t, r) for n in ("Ada", "Bob", "Carol", "Dmitri") for t in ("tea", "maps", "keys", "books", "plants")
    for r in ("kitchen", "hall", "attic"))]
QUERIES = ["where does Ada keep tea?", "Carol books", "what is in the attic?", "Dmitri's plants"]


def _as_schema_4(db, dim: int) -> None:
    """Rewrite a store as the previous release left it: float32 vectors (unit length), schema version 4."""
    rows = stored_rows(db, "SELECT rid, vector FROM facts WHERE vector IS NOT NULL")
    updates = []
    for rid, blob in rows:
        v = np.frombuffer(bytes(blob), np.float16).astype(np.float32)
        updates.append(("UPDATE facts SET vector = ? WHERE rid = ?",
                        ((v / np.linalg.norm(v)).astype("<f4").tobytes(), rid)))
    execute(db, SCHEMA_5 + updates + [("UPDATE meta SET value = '4' WHERE key = 'schema_version'", ())])


def test_a_row_holds_two_bytes_a_component(target, embedder):
    with MemoryStore(target, embedder) as store:
        store.remember_many(TEXTS)
        lengths = {len(bytes(r[0])) for r in stored_rows(target, "SELECT vector FROM facts")}
        assert lengths == {2 * embedder.dimensions}
        top = store.recall(TEXTS[7], k=1, mode="vector")[0]
        assert top.text == TEXTS[7] and top.score == pytest.approx(1.0, abs=1e-5)  # read back at unit length
        assert recall_at_k(store, target, QUERIES) >= 0.95 and store.check().ok


def test_a_schema_4_store_is_migrated_by_its_first_writer(target, embedder):
    with MemoryStore(target, embedder) as store:
        ids = store.remember_many(TEXTS)
        before = {q: [h.id for h in store.recall(q, k=5, mode="vector")] for q in QUERIES}
    _as_schema_4(target, embedder.dimensions)
    assert {len(bytes(r[0])) for r in stored_rows(target, "SELECT vector FROM facts")} == {4 * embedder.dimensions}
    with pytest.raises(EvermindError, match="schema version 4"):
        MemoryStore(target, embedder, read_only=True)  # a reader never migrates
    with MemoryStore(target, embedder) as store:
        assert store.info()["schema_version"] == 6
        lengths = {len(bytes(r[0])) for r in stored_rows(target, "SELECT vector FROM facts")}
        assert lengths == {2 * embedder.dimensions}
        after = {q: [h.id for h in store.recall(q, k=5, mode="vector")] for q in QUERIES}
        assert all(after[q][0] == before[q][0] for q in QUERIES)  # the same best answer
        assert recall_at_k(store, target, QUERIES) >= 0.95
        new = store.remember("fact 99: Ada keeps a kite in the attic")
        assert store.recall("Ada's kite", k=3, mode="hybrid")[0].id == new
        assert store.check().ok and store.get(ids[3]).text == TEXTS[3]
    with MemoryStore(target, embedder) as store:  # the index saved after the migration is trusted again
        status = store.info()["index_status"]  # (a PostgreSQL node keeps no index files: it builds from the database)
        assert status.startswith("loaded") if str(target).endswith(".db") else "built from the database" in status
        assert store.check().ok


def test_a_float32_row_written_after_the_migration_is_still_read(db_path, embedder):
    with MemoryStore(db_path, embedder) as store:
        ids = store.remember_many(TEXTS[:10])
    v = embedder.embed(TEXTS[2]).astype(np.float32)
    execute(db_path,
            [("UPDATE facts SET vector = ? WHERE id = ?", ((v / np.linalg.norm(v)).astype("<f4").tobytes(), ids[2]))])
    with MemoryStore(db_path, embedder) as store:
        assert store.check().ok  # a row of the previous format is not damaged
        store.rebuild_index()
        assert store.recall(TEXTS[2], k=1, mode="vector")[0].id == ids[2]
