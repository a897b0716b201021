"""`evermind mcp` as a real process: stdio end to end, and streamable HTTP on loopback behind its guard."""

from __future__ import annotations

import ctypes
import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from evermind_memory import MemoryStore, cli
from evermind_memory.mcp import http_config
from evermind_memory.mcp.transport import Guard
from evermind_memory.errors import InvalidInput
from mcp_helpers import error_text, payload

REPO = Path(__file__).resolve().parents[2]
# PYTHONFAULTHANDLER: a server that hangs on shutdown prints every thread's stack on SIGABRT (see stop())
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}


@pytest.mark.anyio
async def test_stdio_end_to_end(tmp_path: Path):
    db = tmp_path / "stdio.db"
    params = StdioServerParameters(command=sys.executable, args=["-m", "evermind_memory", "mcp", "--db", str(db)],
                                   env=ENV)
    async with Client(params, raise_exceptions=True) as c:
        assert c.server_info.name == "evermind"
        fid = payload(await c.call_tool("remember",
                                        {"text": "The stdio server stores this", "tags": {"via": "stdio"}}))["id"]
        hit = payload(await c.call_tool("recall", {"query": "what does the stdio server store?", "k": 1}))
        assert hit["memories"][0]["id"] == fid
        assert "FactNotFound" in error_text(await c.call_tool("memory_history", {"id": "0" * 32}))
    with MemoryStore(db, read_only=True) as store:  # the server closed cleanly and the fact is in SQLite
        assert store.get(fid).tags == {"via": "stdio"}


def start_http(db: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    """Start `evermind mcp --http 127.0.0.1:0` and return it with the port it announced on stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "evermind_memory", "mcp", "--db", str(db), "--http", "127.0.0.1:0",
                             *extra], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=60)
            if "listening on http://127.0.0.1:" in line:
                return proc, int(line.split("127.0.0.1:")[1].split("/")[0])
    except queue.Empty:
        proc.kill()
        raise AssertionError("the HTTP server did not announce its port within 60 s") from None


def stop(proc: subprocess.Popen, *, signalled: bool = False) -> int:
    """SIGTERM (unless `signalled` already), then the exit status; a server still running 30 s later is made to
    dump its threads' stacks (faulthandler, on SIGABRT), which the failure shows."""
    if not signalled:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        raise AssertionError(f"the server did not stop within 30 s of SIGTERM; its threads:\n{err[-8000:]}") from None


@pytest.mark.anyio
async def test_http_with_and_without_the_token_and_a_wrong_origin(tmp_path: Path):
    token = secrets.token_urlsafe(32)
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "token").chmod(0o600)
    proc, port = start_http(tmp_path / "http.db", "--token-file", str(tmp_path / "token"))
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
        json_headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        good = {**json_headers, "authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(timeout=30) as http:
            assert (await http.post(url, json=init, headers=json_headers)).status_code == 401
            wrong = await http.post(url, json=init, headers={**json_headers, "authorization": f"Bearer {token[:-1]}x"})
            assert wrong.status_code == 401 and wrong.headers["www-authenticate"].startswith("Bearer")
            evil = await http.post(url, json=init, headers={**good, "origin": "http://evil.example"})
            assert evil.status_code == 403 and "Origin" in evil.text
            rebound = await http.post(url, json=init, headers={**good, "host": f"evil.example:{port}"})
            assert rebound.status_code == 421
            huge = await http.post(url, content=b"x" * (2 << 20), headers=good)
            assert huge.status_code == 413
            assert (await http.post(url, json=init,
                                    headers={**good, "origin": f"http://localhost:{port}"})).status_code == 200
        transport = streamable_http_client(
            url, http_client=create_mcp_http_client(headers={"authorization": f"Bearer {token}"}))
        async with Client(transport, raise_exceptions=True) as c:
            fid = payload(await c.call_tool("remember", {"text": "HTTP clients share this memory"}))["id"]
            assert payload(await c.call_tool("recall",
                                             {"query": "shared memory over HTTP", "k": 1}))["memories"][0]["id"] == fid
    finally:
        assert stop(proc) == 0  # SIGTERM: a clean shutdown that closes the store


def test_http_refuses_to_start_without_a_token_beyond_loopback(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.delenv("EVERMIND_MCP_TOKEN", raising=False)
    db = tmp_path / "never.db"
    assert cli.main(["mcp", "--db", str(db), "--http", "0.0.0.0:8765"]) == cli.EXIT_USAGE
    assert "needs a bearer token" in capsys.readouterr().err and not db.exists()  # refused before opening anything
    assert cli.main(["mcp", "--db", str(db), "--token-file", str(tmp_path / "t")]) == cli.EXIT_USAGE  # stdio: no
    assert "apply to --http" in capsys.readouterr().err


def test_http_config_checks(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("EVERMIND_MCP_TOKEN", raising=False)
    assert http_config("8765").host == "127.0.0.1" and http_config("8765").token_sha256 is None
    assert http_config("[::1]:0").host == "::1"
    (tmp_path / "short").write_text("abc")
    (tmp_path / "good").write_text(secrets.token_urlsafe(24))
    cases = [("127.0.0.1:70000", {}, "port number"), ("localhost:x", {}, "port number"),
             ("8765", {"token_file": tmp_path / "short"}, "at least 16 characters"),
             ("8765", {"token_file": tmp_path / "missing"}, "could not be read"),
             ("0.0.0.0:8765", {"token_file": tmp_path / "good"}, "--allow-host"),
             ("8765", {"allow_origins": ["evil.example"]}, "scheme://host")]
    for value, kwargs, message in cases:
        with pytest.raises(InvalidInput, match=message):
            http_config(value, **kwargs)
    wide = http_config("0.0.0.0:8765", token_file=tmp_path / "good", allow_hosts=["Box.LAN"])
    assert "box.lan" in wide.hosts and "0.0.0.0" not in wide.hosts and wide.token_sha256 is not None
    monkeypatch.setenv("EVERMIND_MCP_TOKEN", "y" * 20)
    assert http_config("10.1.2.3:80").token_sha256 is not None  # the env var is a token source too


def signal_a_worker_thread(proc: subprocess.Popen) -> None:
    """SIGTERM to one of the server's threads other than the main one, as the kernel may choose to deliver it."""
    tgkill = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)
    if tgkill is None or not Path(f"/proc/{proc.pid}/task").is_dir():
        pytest.skip("needs Linux's tgkill and /proc to aim a signal at one thread")
    main = Path(f"/proc/{proc.pid}/task/{proc.pid}/wchan")  # wait until the main thread sleeps in epoll, the loop
    for _ in range(1000):                                     # idle: where a wake-up that never comes hangs it
        if not main.exists() or "epoll" in main.read_text():
            break
        time.sleep(0.01)
    workers = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
    assert workers, "the server runs worker threads (the embedder, the stdin reader)"
    assert tgkill(proc.pid, workers[0], signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())


@pytest.mark.parametrize("target", ["process", "worker thread"])
def test_stdio_server_stops_cleanly_on_sigterm(tmp_path: Path, target: str):
    """Hosts stop stdio servers with SIGTERM while stdin is still open: the store closes and the process exits 0,
    whichever thread the kernel hands the signal to (a worker's used to leave the idle loop asleep forever)."""
    db = tmp_path / "term.db"
    proc = subprocess.Popen([sys.executable, "-m", "evermind_memory", "mcp", "--db", str(db)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "remember", "arguments": {"text": "kept across SIGTERM"}}}
        for message in (init, {"jsonrpc": "2.0", "method": "notifications/initialized"}, call):
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
        replies = [json.loads(proc.stdout.readline()) for _ in range(2)]
        fid = replies[1]["result"]["structuredContent"]["id"]
        if target == "worker thread":
            signal_a_worker_thread(proc)
        assert stop(proc, signalled=target == "worker thread") == 0
    finally:
        proc.kill()
    with MemoryStore(db, read_only=True) as store:
        assert store.get(fid).text == "kept across SIGTERM" and store.check().ok


@pytest.mark.anyio
async def test_guard_checks_host_origin_token_and_rate_before_the_app(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("EVERMIND_MCP_TOKEN", raising=False)
    token = secrets.token_urlsafe(24)
    (tmp_path / "t").write_text(token)
    (tmp_path / "t").chmod(0o600)
    config = http_config("127.0.0.1:8765", token_file=tmp_path / "t", allow_hosts=["box.lan"],
                         allow_origins=["https://app.example"], requests_per_minute=9)
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["type"])
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = Guard(app, config)

    async def status(**headers: str) -> int:
        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]}
        await guard(scope, None, send)
        return sent[0]["status"]

    auth = f"Bearer {token}"
    assert await status(host="127.0.0.1:8765", authorization=auth) == 200
    assert await status(host="[::1]:8765", authorization=f"bearer {token}") == 200
    assert await status(host="BOX.LAN:8765", authorization=auth, origin="https://app.example") == 200
    assert await status(host="evil.example:8765", authorization=auth) == 421
    assert await status(authorization=auth) == 421  # no Host at all
    assert await status(host="localhost:8765", authorization=auth, origin="null") == 403
    assert await status(host="localhost:8765", authorization=auth, origin="https://app.example.evil") == 403
    assert await status(host="localhost:8765", authorization=f"Basic {token}") == 401
    assert await status(host="localhost:8765") == 401
    assert await status(host="localhost:8765", authorization=auth) == 429  # the 10th request this minute
    assert reached == ["http"] * 3
    await guard({"type": "lifespan"}, None, None)  # lifespan events pass through untouched
    assert reached[-1] == "lifespan"
