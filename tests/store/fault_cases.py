"""Database, WAL, sidecar and single-row damage for test_faults.py, run inside a child process.

Each variant builds a store of FACTS facts (closed, or left open by a killed writer for the WAL variants),
damages it, then:
1. opens it: it must open (reads then skip damaged rows, check() reports them) or raise a clear EvermindError
   (StoreCorrupt naming the part) - never a raw exception, never an empty store where one with facts lived;
2. repairs it (repair_store): every fact whose text is still readable somewhere (its row or its change log) must
   be there afterwards, check() must pass, and recall must answer;
3. reopens it: it must open cleanly.
One JSON line per variant goes to stdout.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Callable

FACTS = 60
STEM = "m.db"


def _sql(*stmts: str) -> Callable[[Path], None]:
    def apply(db: Path) -> None:
        conn = sqlite3.connect(db)
        for stmt in stmts:
            conn.execute(stmt)
        conn.commit()
        conn.close()
    return apply


def _bytes(offset: int | float, mask: int = 0xFF) -> Callable[[Path], None]:
    """XOR one byte at `offset` (an int, negative from the end, or a fraction of the length)."""
    def apply(db: Path) -> None:
        data = bytearray(db.read_bytes())
        at = int(len(data) * offset) if isinstance(offset, float) else offset % len(data)
        data[at] ^= mask
        db.write_bytes(bytes(data))
    return apply


def _truncate(size: int | float) -> Callable[[Path], None]:
    def apply(db: Path) -> None:
        n = int(db.stat().st_size * size) if isinstance(size, float) else size
        with open(db, "r+b") as fh:
            fh.truncate(n)
    return apply


def _vector(rid: int, edit: Callable[[bytearray], bytes]) -> Callable[[Path], None]:
    def apply(db: Path) -> None:
        conn = sqlite3.connect(db)
        blob = bytearray(conn.execute("SELECT vector FROM facts WHERE rid = ?", (rid,)).fetchone()[0])
        conn.execute("UPDATE facts SET vector = ? WHERE rid = ?", (edit(blob), rid))
        conn.commit()
        conn.close()
    return apply


def _nan(blob: bytearray) -> bytes:
    blob[0:4] = b"\x00\x00\xc0\x7f"
    return bytes(blob)


def _page_of_facts(db: Path) -> None:
    """Zero a leaf page holding fact rows in the middle of the table."""
    conn = sqlite3.connect(db)
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(db.read_bytes())
    needle = b"fact number 30 "
    at = data.find(needle)
    start = at - at % page
    data[start:start + page] = bytes(page)
    db.write_bytes(bytes(data))


def _overwrite_text_bytes(db: Path) -> None:
    """Flip a byte inside one fact's text in the file (the row stays structurally valid)."""
    data = bytearray(db.read_bytes())
    at = data.find(b"fact number 17 ")
    data[at + 2] = 0xFF  # not UTF-8 any more
    db.write_bytes(bytes(data))


def _sidecar(name: str, content: bytes | None) -> Callable[[Path], None]:
    def apply(db: Path) -> None:
        target = db.with_name(db.name + name)
        if content is None:
            target.unlink(missing_ok=True)
        else:
            target.write_bytes(content)
    return apply


def _lock_is_directory(db: Path) -> None:
    lock = db.with_name(db.name + ".lock")
    lock.unlink(missing_ok=True)
    lock.mkdir()


def _wal(edit: str) -> Callable[[Path], None]:
    """Damage the WAL a killed writer left (the variant's store was not closed)."""
    def apply(db: Path) -> None:
        wal = db.with_name(db.name + "-wal")
        data = bytearray(wal.read_bytes())
        if edit == "flip_frame":
            data[32 + 24 + 200] ^= 0xFF  # the first frame's page: its checksum no longer matches
        elif edit == "flip_header":
            data[0] ^= 0xFF  # the magic: SQLite ignores the whole log
        elif edit == "truncate":
            data = data[: len(data) // 2]
        elif edit == "garbage":
            data = bytearray(os.urandom(len(data)))
        wal.write_bytes(bytes(data))
    return apply


def _wal_and_empty_db(db: Path) -> None:
    with open(db, "r+b") as fh:
        fh.truncate(0)


# name -> (damage, how the store is left before it: "closed" or "killed", facts that must survive repair)
VARIANTS: dict[str, tuple[Callable[[Path], None], str, int]] = {
    # the database file
    "db_truncated_to_zero": (_truncate(0), "closed", 0),
    "db_truncated_half": (_truncate(0.5), "closed", 0),
    "db_truncated_one_page_short": (_truncate(0.99), "closed", 0),
    "db_header_magic_flipped": (_bytes(3), "closed", FACTS),
    "db_header_page_size_flipped": (_bytes(16, 0x40), "closed", FACTS),
    "db_header_byte_20_flipped": (_bytes(20), "closed", FACTS),
    "db_byte_flipped_at_40pc": (_bytes(0.4), "closed", 0),
    "db_byte_flipped_at_70pc": (_bytes(0.7), "closed", 0),
    "db_last_byte_flipped": (_bytes(-100), "closed", FACTS),
    "db_page_of_facts_zeroed": (_page_of_facts, "closed", 0),
    "db_not_sqlite": (lambda db: db.write_bytes(b"hello, not a database\n" * 400), "closed", 0),
    "db_random_bytes": (lambda db: db.write_bytes(os.urandom(db.stat().st_size)), "closed", 0),
    # the schema
    "fts_table_dropped": (_sql("DROP TABLE facts_fts"), "closed", FACTS),
    "fts_rows_deleted": (_sql("DELETE FROM facts_fts_data WHERE id > 10"), "closed", FACTS),
    "fact_tags_dropped": (_sql("DROP TABLE fact_tags"), "closed", FACTS),
    "changes_dropped": (_sql("DROP TABLE changes"), "closed", FACTS),
    "meta_schema_version_text": (_sql("UPDATE meta SET value = 'abc' WHERE key = 'schema_version'"), "closed", FACTS),
    "meta_schema_version_future": (_sql("UPDATE meta SET value = '99' WHERE key = 'schema_version'"), "closed", -1),
    "index_facts_id_dropped": (_sql("DROP INDEX facts_id"), "closed", FACTS),
    # single rows
    "row_created_at_month_13": (_sql("UPDATE facts SET created_at = '2024-13-01T00:00:00+00:00' WHERE rid = 3"),
                                "closed", FACTS),
    "row_updated_at_garbage": (_sql("UPDATE facts SET updated_at = 'yesterday' WHERE rid = 4"), "closed", FACTS),
    "row_tags_malformed_json": (_sql("UPDATE facts SET tags = '{bad' WHERE rid = 5"), "closed", FACTS),
    "row_tags_not_object": (_sql("UPDATE facts SET tags = '[1, 2]' WHERE rid = 6"), "closed", FACTS),
    "row_text_not_utf8": (_sql("UPDATE facts SET text = CAST(x'ff4142' AS TEXT) WHERE rid = 7"), "closed", FACTS),
    "row_text_empty": (_sql("UPDATE facts SET text = '' WHERE rid = 8"), "closed", FACTS),
    "row_text_blob": (_sql("UPDATE facts SET text = x'00ff' WHERE rid = 9"), "closed", FACTS),
    "row_text_byte_in_file": (_overwrite_text_bytes, "closed", FACTS),
    "row_source_blob": (_sql("UPDATE facts SET source = x'ff' WHERE rid = 10"), "closed", FACTS),
    "row_vector_nan": (_vector(11, _nan), "closed", FACTS),
    "row_vector_short": (_sql("UPDATE facts SET vector = x'0000' WHERE rid = 12"), "closed", FACTS),
    "row_vector_not_unit": (_vector(13, lambda b: bytes(b[:-4]) + b"\x00\x00\x80\x4b"), "closed", FACTS),
    "row_vector_text": (_sql("UPDATE facts SET vector = 'abc' WHERE rid = 14"), "closed", FACTS),
    "row_label_without_vector": (_sql("UPDATE facts SET vector = NULL WHERE rid = 15"), "closed", FACTS),
    "row_tag_rows_out_of_sync": (_sql("DELETE FROM fact_tags WHERE rowid IN (SELECT rowid FROM fact_tags LIMIT 3)"),
                                 "closed", FACTS),
    "row_change_feed_behind_labels": (_sql("DELETE FROM changes WHERE seq > 50"), "closed", FACTS),
    # sidecars
    "sidecar_lock_is_directory": (_lock_is_directory, "closed", -1),
    "sidecar_manifest_garbage_db_fine": (_sidecar(".json", b"\x00garbage"), "closed", FACTS),
    "sidecar_shm_garbage": (_sidecar("-shm", os.urandom(32768)), "closed", FACTS),
    "sidecar_empty_wal_beside_store": (_sidecar("-wal", b""), "closed", FACTS),
    "sidecar_adapter_history_beside_empty_db": (lambda db: (_truncate(0)(db), db.with_name(db.name + ".json").unlink(),
                                                             [p.unlink()
                                                              for p in db.parent.glob(db.name + ".*.usearch*")],
                                                             [p.unlink()
                                                              for p in db.parent.glob(db.name + ".*.groups")],
                                                             db.with_name(db.name + ".adapters").mkdir(),
                                                             (db.with_name(db.name + ".adapters")
                                                              / "index.json").write_text("{}")),
                                                "closed", 0),
    # the WAL left by a killed writer
    "wal_intact_after_kill": (lambda db: None, "killed", FACTS),
    "wal_frame_flipped": (_wal("flip_frame"), "killed", 0),
    "wal_header_flipped": (_wal("flip_header"), "killed", 0),
    "wal_truncated": (_wal("truncate"), "killed", 0),
    "wal_garbage": (_wal("garbage"), "killed", 0),
    "wal_beside_emptied_db": (_wal_and_empty_db, "killed", 0),
}

# a representative subset for the default run (the whole matrix runs with -m slow)
DEFAULT = ["db_truncated_to_zero", "db_header_magic_flipped", "db_page_of_facts_zeroed", "db_not_sqlite",
           "fts_table_dropped", "row_created_at_month_13", "row_tags_malformed_json", "row_text_not_utf8",
           "row_vector_nan", "row_change_feed_behind_labels", "sidecar_lock_is_directory", "wal_frame_flipped",
           "wal_beside_emptied_db"]

KILLED_WRITER = """
import os, sys
sys.path.insert(0, sys.argv[2])
from store_helpers import build_embedder
from evermind_memory import MemoryStore
s = MemoryStore(sys.argv[1], build_embedder(), background_embedding=False)
s.remember_many([f"fact number {i} about tea and cats" for i in range(%d)], tags={"t": "x"})
os.kill(os.getpid(), 9)
""" % FACTS


def build(d: Path, how: str, emb) -> Path:
    from evermind_memory import MemoryStore

    db = d / STEM
    if how == "killed":
        env = dict(os.environ, EVERMIND_BLAS_THREADS="1")
        subprocess.run([sys.executable, "-c", KILLED_WRITER, str(db), str(Path(__file__).parent)], env=env,
                       timeout=120)
        assert db.with_name(STEM + "-wal").stat().st_size > 0
    else:
        with MemoryStore(db, emb) as store:
            store.remember_many([f"fact number {i} about tea and cats" for i in range(FACTS)], tags={"t": "x"})
    return db


def run(workdir: str, names: list[str]) -> None:
    from evermind_memory import EvermindError, MemoryStore
    from evermind_memory.store import repair_store
    from store_helpers import build_embedder

    emb = build_embedder()
    for name in names:
        damage, how, must_keep = VARIANTS[name]
        d = Path(workdir) / name
        d.mkdir()
        result = {"name": name, "must_keep": must_keep}
        try:
            db = build(d, how, emb)
            damage(db)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with MemoryStore(db, emb) as store:
                        report = store.check()
                        listed = len(store.list(limit=10_000))
                        store.recall("tea", k=3)
                        result.update(opened=True, check_ok=report.ok, facts=report.facts, listed=listed,
                                      problems=list(report.problems)[:3])
                except EvermindError as exc:
                    result.update(opened=False, error=type(exc).__name__, message=str(exc)[:300],
                                  part=getattr(exc, "part", None))
            result["warnings"] = [str(w.message)[:200] for w in caught if "skipped" in str(w.message)]
            try:
                rep = repair_store(db, emb)
                result.update(repaired=rep.mode, repair_ok=rep.ok, kept=rep.facts, fixed=rep.fixed,
                              quarantined=rep.quarantined, restored=rep.restored, after=list(rep.problems_after))
                with MemoryStore(db, emb) as store:
                    result.update(reopen_check=store.check().ok, reopen_facts=len(store),
                                  recall=len(store.recall("tea cats", k=3)))
            except EvermindError as exc:
                result.update(repair_error=type(exc).__name__, repair_message=str(exc)[:300])
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result["raw"] = f"{type(exc).__name__}: {exc}"[:500]
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    run(sys.argv[1], sys.argv[2].split(","))
