"""docs/reliability.md, tests B and R8/R14: a full disk (RLIMIT_FSIZE), automatic rebuild after many deletes, fork
safety."""

from __future__ import annotations

import os
import signal
import subprocess
import warnings
from pathlib import Path

import pytest

from evermind_memory import EvermindError, MemoryStore, StoreWarning
from evermind_memory.store.lock import filesystem_type, is_remote_filesystem
from store_helpers import CHILD_PRELUDE, PYTHON, child_env, recall_at_k

DISK_FULL = CHILD_PRELUDE + """
import resource, signal
from evermind_memory import EvermindError
store = MemoryStore(db, emb)
store.remember("written before the limit")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (1_500_000, 1_500_000))
try:
    for i in range(100_000):
        fid = store.remember(f"fact {i} with some padding text to fill the disk quickly " * 8)
        print("ok", fid, flush=True)
except EvermindError as exc:
    print("refused", str(exc)[:200].replace("\\n", " "), flush=True)
store.close()  # the index save may fail too: it is a cache and must not lose anything
print("closed", flush=True)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE")
def test_disk_full_refuses_cleanly_and_loses_nothing(model_files, embedder, tmp_path: Path):
    db = tmp_path / "full.db"
    proc = subprocess.run([PYTHON, "-c", DISK_FULL, str(model_files[0]), str(model_files[1]), str(db)],
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    refused = [line for line in lines if line.startswith("refused")]
    assert refused and "nothing from this call was stored" in refused[0], lines[-3:]
    assert lines[-1] == "closed"
    acked = {line.split()[1] for line in lines if line.startswith("ok ")}
    assert len(acked) > 10
    with MemoryStore(db, embedder) as store:
        present = {f.id for f in store.list(limit=100_000)}
        assert acked <= present and len(present) == len(acked) + 1
        report = store.check()
        assert report.ok, report.problems
        assert recall_at_k(store, db, ["fact 3 with some padding", "written before"]) >= 0.95


def test_many_deletes_trigger_a_rebuild(store: MemoryStore):
    ids = store.remember_many([f"fact {i} about tea" for i in range(200)])
    for fid in ids[:60]:
        store.forget(fid)
    info = store.info()
    assert info["indexed"] == 140
    assert info["index_elements"] < 200  # deleted/total went past 20 %: rebuilt without the dead elements
    assert info["index_status"].startswith("rebuilt (too many deleted")
    assert store.check().ok


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_cannot_use_the_store(store: MemoryStore):
    store.remember("before the fork")
    pid = os.fork()
    if pid == 0:  # child: every call must refuse, not share the parent's SQLite connections
        code = 1
        try:
            store.recall("before")
        except EvermindError as exc:
            code = 0 if "after fork" in str(exc) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert store.recall("before the fork", k=1)[0].text == "before the fork"


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /mnt/team\\040share rw,relatime shared:9 - nfs4 server:/export rw,vers=4.2
31 30 0:41 / /mnt/team\\040share/local rw shared:10 - tmpfs tmpfs rw
32 22 0:42 / /home/ada/remote rw,nosuid - fuse.sshfs ada@host:/srv rw
33 22 0:43 / /home/ada/remote-other rw - xfs /dev/sdb1 rw
"""


@pytest.mark.parametrize("path, expected, remote", [
    ("/var/lib/agent.db", "ext4", False),
    ("/mnt/team share/agent.db", "nfs4", True),             # mount points escape spaces as \040
    ("/mnt/team share/local/agent.db", "tmpfs", False),     # the longest containing mount wins
    ("/home/ada/remote/agent.db", "fuse.sshfs", True),
    ("/home/ada/remote-other/agent.db", "xfs", False),      # a shared prefix is not containment
])
def test_filesystem_type_reads_mountinfo(tmp_path: Path, path: str, expected: str, remote: bool):
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    fs = filesystem_type(path, mountinfo=str(info))
    assert fs == expected
    assert is_remote_filesystem(fs) is remote


def test_filesystem_type_unknown_without_mountinfo(tmp_path: Path):
    assert filesystem_type("/x", mountinfo=str(tmp_path / "missing")) is None
    assert not is_remote_filesystem(None)


def test_a_local_store_opens_without_a_filesystem_warning(tmp_path: Path, embedder):
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreWarning)
        with MemoryStore(tmp_path / "local.db", embedder) as store:
            fs = store.info()["filesystem"]
    assert fs == filesystem_type(tmp_path)
    if Path("/proc/self/mountinfo").exists():
        assert fs is not None and not is_remote_filesystem(fs)
