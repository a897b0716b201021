"""docs/reliability.md, tests C: 65 corrupted, forged or mismatched index/manifest variants, reopened in a child
process.

Every one must be detected and rebuilt (or, for a valid older generation, replayed), never crash the process,
and leave a store that passes check() with recall@10 >= 0.95 against exact search. Detected at open, except a
file whose structure is valid but whose bytes differ from its manifest's sha256 ("hash": the hash is compared
after the open) and a forgery that re-signs a structurally valid file and changes only vectors ("verify"): the
open trusts a manifest that matches the database, and check() (the hash, then the full comparison with SQLite)
rebuilds it, as does the paced background pass that follows a trusted load.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from store_helpers import PYTHON, child_env
from corruption_cases import VARIANTS

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def results(tmp_path_factory, model_files) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("corrupt")
    proc = subprocess.run(
        [PYTHON, str(HERE / "corruption_cases.py"), str(model_files[0]), str(model_files[1]), str(work),
         ",".join(VARIANTS)],
        env=child_env(), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-2000:]}"
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["name"]: r for r in out}


def test_there_are_at_least_20_variants():
    assert len(VARIANTS) >= 20


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_is_detected_and_store_recovers(results, name):
    r = results[name]
    assert "error" not in r, r.get("error")
    if r["expected"] in ("verify", "hash"):
        assert r["status"].startswith("loaded"), r["status"]
        found = "index vectors disagree" if r["expected"] == "verify" else "index file sha256 does not match"
        assert r["checked_status"].startswith(f"rebuilt ({found}"), r["checked_status"]
        assert r["paced_status"].startswith(f"rebuilt ({found}"), r["paced_status"]  # the background pass too
    else:
        assert r["status"].startswith(r["expected"]), r["status"]
    assert r["ok"], r["problems"]
    assert r["facts"] == (95 if name != "older_generation" else 114)
    assert r["recall"] >= 0.95
    assert r["reopen_status"].startswith("loaded"), r["reopen_status"]  # the rebuilt index was saved validly
