"""Issue 18: every fault is a clear error or a self-repair.

The corruption matrix (fault_cases.py: the database file, its schema, single rows, sidecars and the WAL of a
killed writer) runs in a child process: a representative subset by default, all of it with -m slow. Each
variant must open (damaged rows skipped, check() reporting them) or raise a clear EvermindError, and repair
must keep every fact still readable somewhere, pass check() and reopen cleanly. The index/manifest variants
are in test_corruption.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fault_cases import DEFAULT, FACTS, VARIANTS
from store_helpers import PYTHON, child_env

HERE = Path(__file__).resolve().parent
EMPTIED = {"db_truncated_to_zero", "wal_beside_emptied_db", "sidecar_adapter_history_beside_empty_db"}
CLEAR = {"StoreCorrupt", "StorageError", "EvermindError", "StoreLocked"}


def _matrix(tmp: Path, names: list[str]) -> dict[str, dict]:
    proc = subprocess.run([PYTHON, str(HERE / "fault_cases.py"), str(tmp), ",".join(names)], env=child_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-2000:]}"
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["name"]: r for r in out}


@pytest.fixture(scope="module")
def default_results(tmp_path_factory) -> dict[str, dict]:
    return _matrix(tmp_path_factory.mktemp("faults"), DEFAULT)


def check_variant(r: dict) -> None:
    assert "raw" not in r, r["raw"]  # never a raw exception, never a crash
    if not r["opened"]:
        assert r["error"] in CLEAR and r["message"], r
    if r["name"] in EMPTIED:  # an emptied database where a store lived is an error, not a new store
        assert not r["opened"] and r["error"] == "StoreCorrupt", r
    if r["must_keep"] < 0:  # a refusal (a newer schema, a lock that is a directory) must stay clear on repair too
        assert r.get("repair_error") in CLEAR, r
        return
    assert "repair_error" not in r, r.get("repair_message")
    assert r["repair_ok"] and r["reopen_check"], r
    assert r["kept"] >= r["must_keep"] and r["reopen_facts"] == r["kept"], r
    if r["kept"]:
        assert r["recall"] > 0
    if r["must_keep"] == FACTS and r.get("opened"):
        # a damaged single row is skipped by reads (with a warning), never blocks the rest
        assert r["listed"] >= FACTS - 1, r


def test_the_matrix_has_at_least_40_variants_with_the_index_ones():
    from corruption_cases import VARIANTS as INDEX_VARIANTS

    assert len(VARIANTS) >= 40 and len(VARIANTS) + len(INDEX_VARIANTS) >= 80
    assert set(DEFAULT) <= set(VARIANTS)


@pytest.mark.parametrize("name", DEFAULT)
def test_fault_is_a_clear_error_or_repaired(default_results, name):
    check_variant(default_results[name])


@pytest.mark.slow
def test_whole_fault_matrix(tmp_path):
    results = _matrix(tmp_path, list(VARIANTS))
    assert set(results) == set(VARIANTS)
    for r in results.values():
        check_variant(r)
