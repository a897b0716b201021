"""Issue 18, the operating system refusing: a full disk (a 3 MB tmpfs in a user namespace) and permissions with
root's override dropped (setpriv removes CAP_DAC_OVERRIDE and friends from the child). Each runs in a child;
each asserts a clear EvermindError (never a raw sqlite3/OSError, never a stray lock) and that every acknowledged
fact is still there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from store_helpers import CHILD_PRELUDE, PYTHON, child_env

DISK_FULL = CHILD_PRELUDE + """
import json
from evermind_memory import EvermindError, StorageError
acked, refused = [], None
store = MemoryStore(db, emb)
try:
    for i in range(100_000):
        acked.append(store.remember(f"fact {i} with padding to fill the small disk quickly " * 6))
except EvermindError as exc:
    refused = f"{type(exc).__name__}: {exc}"
try:
    store.close()  # the index save and the checkpoint meet the full disk: best effort, never raises
    closed = "ok"
except BaseException as exc:
    closed = f"{type(exc).__name__}: {exc}"
with MemoryStore(db, emb, read_only=True) as reader:
    present = {f.id for f in reader.list(limit=100_000)}
print(json.dumps({"acked": len(acked), "refused": refused, "closed": closed, "lost": len(set(acked) - present)}))
"""


def _unshare_tmpfs_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_tmpfs_works(), reason="needs `unshare -rm` and tmpfs mounts in a user namespace")
def test_a_full_disk_is_a_clear_error_and_loses_nothing(model_files, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = tmp_path / "child.py"
    script.write_text(DISK_FULL)
    cmd = (f"mount -t tmpfs -o size=3m tmpfs {mnt} && exec {PYTHON} {script} {model_files[0]} {model_files[1]} "
           f"{mnt}/full.db")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], env=child_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["acked"] > 10 and out["refused"], out
    assert out["refused"].startswith(("StorageError", "EvermindError")) and ("nothing from this call was "
                                                                             "stored") in out["refused"]
    assert out["closed"] == "ok" and out["lost"] == 0, out


PERMISSIONS = CHILD_PRELUDE + """
import json, os
from pathlib import Path
from evermind_memory import EvermindError
case = sys.argv[4]
d = Path(db).parent
try:
    if case == "reader_in_read_only_dir":
        with MemoryStore(db, emb, read_only=True) as s:
            result = {"opened": True, "facts": len(s)}
    else:
        with MemoryStore(db, emb) as s:
            s.remember("written")
            result = {"opened": True}
except EvermindError as exc:
    result = {"opened": False, "error": type(exc).__name__, "message": str(exc)[:300],
              "errno": getattr(exc, "errno", None)}
except BaseException as exc:
    result = {"raw": f"{type(exc).__name__}: {exc}"[:300]}
print(json.dumps(result))
"""


def _can_drop_override() -> bool:
    return shutil.which("setpriv") is not None and os.geteuid() == 0


@pytest.mark.skipif(not _can_drop_override(), reason="needs setpriv and root (to drop CAP_DAC_OVERRIDE in a child)")
@pytest.mark.parametrize("case", ["new_store_in_read_only_dir", "read_only_db_file", "read_only_lock_file",
                                  "reader_in_read_only_dir"])
def test_permission_denied_is_a_clear_error(model_files, embedder, tmp_path, case):
    from evermind_memory import MemoryStore

    d = tmp_path / "store"
    d.mkdir()
    db = d / "p.db"
    if case != "new_store_in_read_only_dir":
        with MemoryStore(db, embedder) as s:
            s.remember_many(["one fact", "another fact"])
    if case == "read_only_db_file":
        db.chmod(0o444)
    if case == "read_only_lock_file":
        (d / "p.db.lock").chmod(0o444)
    if case in ("new_store_in_read_only_dir", "reader_in_read_only_dir"):
        d.chmod(0o555)
    script = tmp_path / "child.py"
    script.write_text(PERMISSIONS)
    try:
        proc = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--", PYTHON,
                               str(script), str(model_files[0]), str(model_files[1]), str(db), case],
                              env=child_env(), capture_output=True, text=True, timeout=300)
    finally:
        d.chmod(0o755)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "raw" not in out, out
    if case == "reader_in_read_only_dir" and out["opened"]:
        assert out["facts"] == 2  # a reader may read a store in a directory it cannot write
        return
    assert not out["opened"] and out["error"] == "StorageError" and out["errno"], out
    assert "read_only=True" in out["message"] or "permission" in out["message"].lower(), out
    if case == "new_store_in_read_only_dir":
        assert not (d / "p.db.lock").exists()
    if case != "new_store_in_read_only_dir":
        with MemoryStore(db, embedder, read_only=True) as s:
            assert len(s) == 2  # nothing was lost


def test_cli_reports_a_damaged_store_in_one_line_and_repairs_it(model_files, embedder, tmp_path, capsys):
    from evermind_memory import MemoryStore
    from evermind_memory.cli import EXIT_DAMAGED, main

    db = tmp_path / "c.db"
    with MemoryStore(db, embedder) as s:
        s.remember_many(["tea in the morning", "coffee after lunch"])
    data = bytearray(db.read_bytes())
    data[3] ^= 0xFF  # the header's magic
    db.write_bytes(bytes(data))
    args = ["--db", str(db), "--model", str(model_files[0]), "--tokenizer", str(model_files[1])]
    assert main(["list", *args]) == EXIT_DAMAGED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "evermind repair" in err[0] and "Traceback" not in err[0]
    assert main(["check", "--json", *args]) == EXIT_DAMAGED
    assert json.loads(capsys.readouterr().err)["error"] == "StoreCorrupt"
    assert main(["repair", *args]) == 0
    assert "salvaged: 2 facts" in capsys.readouterr().out
    assert main(["list", "--json", *args]) == 0
    assert {f["text"] for f in json.loads(capsys.readouterr().out)} == {"tea in the morning", "coffee after lunch"}
