"""Issue 21: what only a server store has. Other nodes' facts reach a node's index in the background (LISTEN/
NOTIFY); `evermind migrate` copies a store to PostgreSQL and back with its history; kill -9 of PostgreSQL
itself mid-write loses nothing acknowledged; the URL's password never shows. (The behavioural suite, the
four writer nodes and kill -9 of nodes run on both backends through the `target` fixture.)"""

from __future__ import annotations

import io
import signal
import subprocess
import time
from pathlib import Path

import pytest

from evermind_memory import MemoryStore
from evermind_memory.cli import main as cli_main
from evermind_memory.errors import EvermindError, InvalidInput
from evermind_memory.store.backend import migrate
from store_helpers import CHILD_PRELUDE, PYTHON, child_env, recall_at_k, stored_rows
from test_expiry import wait_until

TEXTS = [f"note {i}: the {c} fox met a {a} heron by the river" for i, (c, a) in
         enumerate((c, a) for c in ("red", "grey", "small") for a in ("tall", "old", "quiet", "blue"))]

WRITE_SOME = CHILD_PRELUDE + """
with MemoryStore(db, emb) as store:
    ids = store.remember_many([f"the other node wrote fact {i} about otters" for i in range(int(sys.argv[4]))])
print(" ".join(ids), flush=True)
"""


def test_postgres_node_indexes_other_nodes_facts_in_the_background(model_files, embedder, pg_url, monkeypatch):
    """A node that makes no call still has another node's facts in its index soon after they commit: its
    follower thread is woken by the NOTIFY of each commit (the fallback poll is set to a minute here, so only a
    notification can wake it within wait_until's 10 s)."""
    from evermind_memory.store.backend import postgres

    monkeypatch.setattr(postgres, "POLL_S", 60.0)
    with MemoryStore(pg_url, embedder) as node:
        node.remember("this node's own first fact")
        node.flush()
        proc = subprocess.run([PYTHON, "-c", WRITE_SOME, *map(str, model_files), pg_url, "12"],
                              capture_output=True, text=True, env=child_env(), timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        ids = proc.stdout.split()
        assert len(ids) == 12
        head = node.info()["max_seq"]  # (info() reads; it does not catch the index up)
        wait_until(lambda: node.info()["index_watermark"] >= head)
        info = node.info()
        assert info["indexed"] == 13 and info["notifications"] > 0
        hits = node.recall("the other node wrote fact 7 about otters", k=1, mode="vector")
        assert hits[0].id == ids[7] and hits[0].score == pytest.approx(1.0, abs=1e-3)


def test_postgres_migrate_there_and_back_keeps_everything(db_path: Path, pg_server, pg_url, embedder, tmp_path: Path):
    with MemoryStore(db_path, embedder) as store:
        ids = store.remember_many(TEXTS, tags={"kind": "note"})
        store.update(ids[1], tags={"kind": "note", "n": 1})
        store.forget(ids[2])
        store.feedback("fox by the river", ids[3], useful=True)
        store.flush()
        facts = [(f.id, f.text, f.tags) for f in store.list(limit=100)]
        histories = {fid: [c.op for c in store.history(fid)] for fid in ids[:3]}
        top = [h.id for h in store.recall("grey fox and a quiet heron", k=5)]
        fingerprint = store.fingerprint
    vectors = stored_rows(db_path, "SELECT id, vector FROM facts ORDER BY id")

    out = io.StringIO()
    assert cli_main(["migrate", "--from", str(db_path), "--to", pg_url], out=out) == 0
    assert "verified" in out.getvalue() and "facts" in out.getvalue()
    assert pg_server.password not in out.getvalue()

    with MemoryStore(pg_url, embedder) as pg:
        assert [(f.id, f.text, f.tags) for f in pg.list(limit=100)] == facts
        assert {fid: [c.op for c in pg.history(fid)] for fid in ids[:3]} == histories
        assert pg.fingerprint == fingerprint and pg.info()["waiting_vectors"] == 0  # the vectors came along
        assert [(i, bytes(v)) for i, v in stored_rows(pg_url, "SELECT id, vector FROM facts ORDER BY id")] == vectors
        assert [h.id for h in pg.recall("grey fox and a quiet heron", k=5)] == top
        assert pg.check().ok
        added = pg.remember("written on the server after the migration")

    back = tmp_path / "back.db"
    report = migrate(pg_url, str(back))
    assert report.rows["facts"] == len(facts) + 1 and set(report.checksums) >= {"facts", "changes", "feedback"}
    with MemoryStore(back, embedder) as local:
        assert local.get(added).text == "written on the server after the migration"
        assert [c.op for c in local.history(ids[1])] == histories[ids[1]]
        assert local.check().ok

    with pytest.raises(InvalidInput, match="already holds a store"):
        migrate(str(db_path), pg_url)
    with pytest.raises(InvalidInput, match="exists"):
        migrate(pg_url, str(back))


def test_postgres_password_never_shows(pg_server, pg_url, embedder):
    secret = pg_server.password
    with MemoryStore(pg_url, embedder) as store:
        shown = repr(store) + str(store.info()) + store.path
        assert secret not in shown and "***" in store.path
    wrong = "not-the-password-7f3a"
    with pytest.raises(EvermindError) as err:
        MemoryStore(pg_server.url(password=wrong), embedder)
    assert wrong not in str(err.value) and secret not in str(err.value)
    assert "password" in str(err.value)  # it says what to check


NODE_THROUGH_CRASH = CHILD_PRELUDE + """
import time
from evermind_memory.errors import EvermindError
store = MemoryStore(db, emb)
print("open", flush=True)
i = 0
while True:
    try:
        fid = store.remember(f"fact {i} written through a server crash about badgers")
    except EvermindError as exc:
        print("err", type(exc).__name__, flush=True)
        time.sleep(0.05)
        continue
    print("ok", fid, flush=True)
    i += 1
"""


def _read_acks(proc: subprocess.Popen, count: int, acked: list[str], errors: list[str]) -> None:
    """Read the node's lines until it acknowledged `count` more facts."""
    want = len(acked) + count
    for line in proc.stdout:
        kind, _, rest = line.strip().partition(" ")
        if kind == "ok" and line.endswith("\n"):
            acked.append(rest)
        elif kind == "err":
            errors.append(rest)
        if len(acked) >= want:
            return
    raise AssertionError(proc.stderr.read()[-3000:])


def test_postgres_server_killed_mid_write_loses_nothing_acknowledged(model_files, embedder):
    """kill -9 of the postmaster and its backends while a node writes: the node's calls wait for the pool's
    new connection or fail with StorageError meanwhile, it writes again once the server is back (no restart of
    the node), and every fact it acknowledged before or after is there. A server of its own: the session's keeps
    serving."""
    from pg_server import PgServer

    server = PgServer.start()
    proc = None
    try:
        url = server.new_database()
        MemoryStore(url, embedder).close()
        proc = subprocess.Popen([PYTHON, "-c", NODE_THROUGH_CRASH, *map(str, model_files), url],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=child_env())
        assert proc.stdout.readline().strip() == "open", proc.stderr.read()[-2000:]
        acked: list[str] = []
        errors: list[str] = []
        _read_acks(proc, 30, acked, errors)
        before = server.pid()
        server.kill()
        assert not Path(f"/proc/{before}").exists()
        time.sleep(0.5)  # the node keeps trying against no server
        server.restart()
        assert server.pid() != before
        _read_acks(proc, 30, acked, errors)  # it writes again, through the same store object
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert set(errors) <= {"StorageError"}, errors  # (a call may also just wait for the pool's new connection)
        with MemoryStore(url, embedder) as store:
            present = {f.id for f in store.list(limit=10_000)}
            assert set(acked) <= present, f"lost {len(set(acked) - present)} acknowledged facts"
            store.flush()  # the node's waiting vectors are adopted and embedded
            report = store.check()
            assert report.ok and report.waiting_vectors == 0, report.problems
            assert recall_at_k(store, url, ["badgers", "fact 12 written through a server crash"]) >= 0.95
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()


def test_postgres_cli_commands_take_a_url(pg_server, pg_url, embedder):
    """`--db postgresql://...` in the CLI: write, read back, inspect; the password shows in no output."""
    import json

    def run(*argv: str) -> tuple[int, str]:
        out = io.StringIO()
        return cli_main([*argv, "--db", pg_url, "--json"], embedder=embedder, out=out), out.getvalue()

    code, out = run("remember", "Ada's laptop is a grey ThinkPad", "--tag", "person=ada")
    assert code == 0
    fid = json.loads(out)["id"]
    code, out = run("recall", "which laptop does Ada use", "--tag", "person=ada", "-k", "1")
    assert code == 0 and json.loads(out)[0]["id"] == fid
    code, out = run("info")
    info = json.loads(out)
    assert code == 0 and info["backend"] == "postgresql" and info["facts"] == 1
    assert info["pgvector"] is None  # (Debian's server package has no pgvector; detected, never required)
    code, out = run("check")
    assert code == 0 and pg_server.password not in out


def test_postgres_adapter_is_published_in_the_database_and_every_node_follows(pg_url, embedder):
    """An adaptation round on one node: the adapter goes into the store's `adapters` table (no file on any
    node), the other node serves the new generation after the swap without reopening (the old one until then:
    test_other_processes_serve_the_old_generation_until_the_swap[postgres]);
    a rollback made on the other node is followed back; a node opened later applies the active adapter."""
    from test_adaptation_store import FACTS, FAST, QUERIES

    with MemoryStore(pg_url, embedder) as a, MemoryStore(pg_url, embedder) as b:
        a.remember_many(FACTS)
        base = a.fingerprint
        b.flush()
        before = [[h.id for h in b.recall(q, k=5, mode="vector")] for q in QUERIES]
        report = a.adapt_now(FAST)
        assert report.status == "swapped" and a.fingerprint != base
        assert stored_rows(pg_url, "SELECT id FROM adapters") == [(report.adapter_id,)]
        b.flush()  # follows the swap before answering (its follower thread may have already)
        assert b.fingerprint == a.fingerprint and recall_at_k(b, pg_url, QUERIES) >= 0.95
        assert [e["id"] for e in b.adapter_history() if e["active"]] == [report.adapter_id]
        assert b.rollback_adapter("base").status == "swapped"
        a.flush()
        assert a.fingerprint == base and [[h.id for h in a.recall(q, k=5, mode="vector")] for q in QUERIES] == before
        assert b.rollback_adapter(report.adapter_id).status == "swapped"
    with MemoryStore(pg_url, embedder) as late:
        assert late.fingerprint == report.fingerprint_after and late.check().ok


def test_postgres_writer_waits_for_another_nodes_lock_then_raises_store_locked(embedder, pg_url):
    """A node holding the store's write lock (here a bare session that took the advisory lock) makes a remember
    wait busy_timeout and raise StoreLocked with nothing stored (busy_timeout=0: at once); once it lets go, the
    same store writes again."""
    import psycopg

    from evermind_memory.errors import StoreLocked
    from evermind_memory.store.backend.postgres import LOCK_KEY

    with MemoryStore(pg_url, embedder, busy_timeout=0.3) as store, MemoryStore(pg_url, embedder, busy_timeout=0) as now:
        store.remember("before the lock: otters hold hands")
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s, hashtext(current_schema()))", (LOCK_KEY,))
            t0 = time.monotonic()
            with pytest.raises(StoreLocked, match="busy_timeout"):
                store.remember("while locked: herons stand still")
            assert time.monotonic() - t0 >= 0.3
            with pytest.raises(StoreLocked, match="busy_timeout"):
                now.remember("while locked, no waiting: herons stand still")
            other.execute("SELECT pg_advisory_unlock(%s, hashtext(current_schema()))", (LOCK_KEY,))
        fid = store.remember("after the lock: foxes sleep")
        store.flush()  # (its vector thread's transaction would make the next call, which never waits, StoreLocked)
        now.remember("after the lock, no waiting: badgers dig")
        assert [f.text for f in store.list()] == ["before the lock: otters hold hands", "after the lock: foxes sleep",
                                                  "after the lock, no waiting: badgers dig"]
        assert fid in {h.id for h in store.recall("foxes sleep", k=3)}


def test_postgres_calls_after_the_servers_connections_drop_just_work(pg_server, embedder):
    """A restart (here: every backend of a database of its own terminated, as a restart does) left the pool's idle
    connections dead, and the first call of every open store failed with StorageError though the server was up;
    connections are now tried as they leave the pool."""
    import psycopg

    pg_url = pg_server.new_database()
    with MemoryStore(pg_url, embedder) as store:
        fid = store.remember("Ada prefers green tea in the morning")
        store.flush()
        with psycopg.connect(pg_url, autocommit=True) as admin:
            gone = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                 "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()[0]
        assert gone >= 1
        assert store.count() == 1  # the first call after the drop
        assert store.get(fid).text == "Ada prefers green tea in the morning"
        assert store.remember("Bob drinks coffee") and store.count() == 2
