"""Vectors stored compactly (issue 34 item 3), on both engines: int8 components and a float32 scale a row (schema 7;
float16 in schemas 5 and 6, float32 before), stores of schema 4 and 6 migrated by the first writer that opens them,
and recall that answers like exact search over what the database holds."""

from __future__ import annotations

import signal
import subprocess

import numpy as np
import pytest

from evermind_memory import EvermindError, MemoryStore
from store_helpers import CHILD_PRELUDE, PYTHON, SCHEMA_5, child_env, execute, recall_at_k, row_vector, stored_rows

TEXTS = [f"fact {i}: {name} keeps {thing} in the {room}" for i, (name, thing, room) in enumerate(
    (n, t, r) for n in ("Ada", "Bob", "Carol", "Dmitri") for t in ("tea", "maps", "keys", "books", "plants")
    for r in ("kitchen", "hall", "attic"))]
QUERIES = ["where does Ada keep tea?", "Carol books", "what is in the attic?", "Dmitri's plants"]


def _as_schema_4(db, dim: int) -> None:
    """Rewrite a store as the previous release left it: float32 vectors (unit length), schema version 4."""
    execute(db, SCHEMA_5 + _rewritten(db, dim, "<f4") + [("UPDATE meta SET value = '4' WHERE key = 'schema_version'",
                                                            ())])


def _as_schema_6(db, dim: int) -> None:
    """Rewrite a store as the previous release left it: float16 vectors, schema version 6."""
    execute(db, _rewritten(db, dim, "<f2") + [("UPDATE meta SET value = '6' WHERE key = 'schema_version'", ())])


def _rewritten(db, dim: int, dtype: str, table: str = "facts", key: str = "rid") -> list[tuple[str, tuple]]:
    """Statements that rewrite every vector of `table` (facts, or adapt_vectors: a generation being built) as unit
    rows of `dtype`."""
    updates = []
    for k, blob in stored_rows(db, f"SELECT {key}, vector FROM {table} WHERE vector IS NOT NULL"):
        v = row_vector(bytes(blob), dim)
        updates.append((f"UPDATE {table} SET vector = ? WHERE {key} = ?",
                        ((v / np.linalg.norm(v)).astype(dtype).tobytes(), k)))
    return updates


def _lengths(db) -> set[int]:
    return {len(bytes(r[0])) for r in stored_rows(db, "SELECT vector FROM facts")}


def _migrated(target, embedder, version: int, before: dict) -> MemoryStore:
    """A store of schema `version`, refused to a reader and opened by a writer, which migrates it: schema 7, int8
    rows, the same best vector answer to every query as `before` (query -> ids), recall like exact search over what
    the rows hold. Returns the writer, open."""
    with pytest.raises(EvermindError, match=f"schema version {version}"):
        MemoryStore(target, embedder, read_only=True)  # a reader never migrates
    store = MemoryStore(target, embedder)
    try:
        assert store.info()["schema_version"] == 7
        assert _lengths(target) == {embedder.dimensions + 4}
        after = {q: [h.id for h in store.recall(q, k=5, mode="vector")] for q in QUERIES}
        assert all(after[q][0] == before[q][0] for q in QUERIES)  # the same best answer
        assert recall_at_k(store, target, QUERIES) >= 0.95
    except BaseException:
        store.close()
        raise
    return store


def test_a_row_holds_one_byte_a_component_and_a_scale(target, embedder):
    with MemoryStore(target, embedder) as store:
        store.remember_many(TEXTS)
        assert _lengths(target) == {embedder.dimensions + 4}
        top = store.recall(TEXTS[7], k=1, mode="vector")[0]
        assert top.text == TEXTS[7] and top.score == pytest.approx(1.0, abs=1e-3)  # unit length, int8 rounding
        assert recall_at_k(store, target, QUERIES) >= 0.95 and store.check().ok


def test_a_schema_4_store_is_migrated_by_its_first_writer(target, embedder):
    with MemoryStore(target, embedder) as store:
        ids = store.remember_many(TEXTS)
        before = {q: [h.id for h in store.recall(q, k=5, mode="vector")] for q in QUERIES}
    _as_schema_4(target, embedder.dimensions)
    assert _lengths(target) == {4 * embedder.dimensions}
    with _migrated(target, embedder, 4, before) as store:
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


def test_a_schema_6_store_is_migrated_and_keeps_its_index(target, embedder):
    with MemoryStore(target, embedder) as store:
        ids = store.remember_many(TEXTS)
        before = {q: [h.id for h in store.recall(q, k=5, mode="vector")] for q in QUERIES}
    _as_schema_6(target, embedder.dimensions)
    if str(target).endswith(".db"):  # the snapshot as the previous release saved it: of float16 rows
        manifest = target.with_name(target.name + ".json")
        manifest.write_text(manifest.read_text().replace('"vectors": "int8"', '"vectors": "float16"'))
    assert _lengths(target) == {2 * embedder.dimensions}
    with _migrated(target, embedder, 6, before) as store:
        status = store.info()["index_status"]
        assert status.startswith("loaded") if str(target).endswith(".db") else "built from the database" in status
        assert store.check().ok and store.get(ids[5]).text == TEXTS[5]  # the float16 nodes agree with the int8 rows


REEMBED_SCRIPT = CHILD_PRELUDE + """
store = MemoryStore(db, emb)  # another embedder: builds its generation in batches of 256, dies after the 2nd
"""


def test_a_generation_half_built_by_the_previous_release_is_migrated_and_finished(db_path, embedder, other_embedder,
                                                                                   other_model_files):
    with MemoryStore(db_path, embedder) as store:
        ids = store.remember_many([f"fact {i} about tea" for i in range(600)])
    proc = subprocess.run([PYTHON, "-c", REEMBED_SCRIPT, *map(str, other_model_files), str(db_path)],
                          capture_output=True, text=True, timeout=120,
                          env={**child_env(), "EVERMIND_CRASH_AT": "adapt.reembed.batch:2"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    dim = embedder.dimensions
    execute(db_path, _rewritten(db_path, dim, "<f2") + _rewritten(db_path, dim, "<f2", "adapt_vectors", "label")
            + [("UPDATE meta SET value = '6' WHERE key = 'schema_version'", ())])
    assert {len(bytes(r[0])) for r in stored_rows(db_path, "SELECT vector FROM adapt_vectors")} == {2 * dim}
    with MemoryStore(db_path, other_embedder) as store:  # migrates both tables, resumes the build and swaps
        assert store.info()["schema_version"] == 7 and store.fingerprint == other_embedder.fingerprint
        assert _lengths(db_path) == {dim + 4}
        hit = store.recall("fact 7 about tea", k=1, mode="vector")[0]
        assert hit.score == pytest.approx(1.0, abs=1e-3)  # the text itself, from a migrated row
        assert sorted(f.id for f in store.list(limit=1000)) == sorted(ids)
        assert recall_at_k(store, db_path, QUERIES) >= 0.95 and store.check().ok
