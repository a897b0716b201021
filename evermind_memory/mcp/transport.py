"""Serving the MCP server: stdio, or streamable HTTP behind a guard that treats the network as hostile.

HTTP (docs/reliability.md R16): loopback by default; any other address needs a bearer token, compared as
sha256 digests with hmac.compare_digest (the token itself is not kept); Host and Origin are checked against
an allow-list (DNS rebinding); request bodies, sessions and requests per minute are capped.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import signal
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import InvalidInput

TOKEN_ENV = "EVERMIND_MCP_TOKEN"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_FILE_BYTES = 4096
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
MAX_BODY_BYTES = 1 << 20  # a 100,000-character fact is at most ~600 KB of escaped JSON
MAX_SESSIONS = 100
MCP_PATH = "/mcp"


@dataclass(frozen=True)
class HttpConfig:
    """Where and how `serve_http` listens.

    Attributes:
        host, port: the address to bind (port 0: any free port, announced on stderr).
        token_sha256: digest of the bearer token every request must carry, or None (loopback only).
        hosts: Host header names accepted (lower case, without port).
        origins: Origin values accepted besides loopback ones ("scheme://host[:port]", lower case).
        max_body_bytes: larger request bodies get 413.
        requests_per_minute: more requests in one minute get 429.
    """

    host: str
    port: int
    token_sha256: bytes | None
    hosts: frozenset[str]
    origins: frozenset[str] = field(default_factory=frozenset)
    max_body_bytes: int = MAX_BODY_BYTES
    requests_per_minute: int = 1200


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::", "")


def parse_http(value: str) -> tuple[str, int]:
    """`[HOST:]PORT` (IPv6 as `[::1]:PORT`) -> (host, port); the host defaults to 127.0.0.1.

    Raises:
        InvalidInput: not HOST:PORT, or a port outside 0..65535.
    """
    host, port = "127.0.0.1", value
    if value.startswith("["):
        inner, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise InvalidInput(f"--http expected [HOST:]PORT, e.g. 8765, 127.0.0.1:8765 or [::1]:8765, got {value!r}.")
        host, port = inner, rest[1:]
    elif ":" in value:
        host, _, port = value.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidInput(f"--http expected a port number 0..65535, got {port!r} (in {value!r}).")
    return host or "127.0.0.1", int(port)


def load_token(token_file: Path | None) -> str | None:
    """The bearer token from `token_file`, else from $EVERMIND_MCP_TOKEN, else None.

    Raises:
        InvalidInput: the file is missing, too large, not text, or the token is shorter than 16 characters or
            holds characters a bearer token cannot (RFC 6750: letters, digits, -._~+/=).
    """
    if token_file is not None:
        try:
            info = token_file.stat()
            if info.st_size > MAX_TOKEN_FILE_BYTES:
                raise InvalidInput(f"--token-file {token_file} holds {info.st_size} bytes; a token file holds one "
                                   f"token of at most {MAX_TOKEN_FILE_BYTES} bytes.")
            raw = token_file.read_bytes()[:MAX_TOKEN_FILE_BYTES]
        except OSError as exc:
            raise InvalidInput(f"--token-file {token_file} could not be read ({exc.strerror or exc}). Make one with: "
                               "python3 -c \"import secrets; print(secrets.token_urlsafe(32))\" > FILE && chmod 600 "
                               "FILE") from None
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            print(f"evermind mcp: warning: {token_file} is readable by other users; chmod 600 it.", file=sys.stderr)
        try:
            token, where = raw.decode("utf-8").strip(), f"--token-file {token_file}"
        except UnicodeDecodeError:
            raise InvalidInput(f"--token-file {token_file} is not UTF-8 text.") from None
    elif os.environ.get(TOKEN_ENV):
        token, where = os.environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    else:
        return None
    allowed = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")
    if len(token) < MIN_TOKEN_CHARS or not set(token) <= allowed:
        raise InvalidInput(
            f"{where} expected a token of at least {MIN_TOKEN_CHARS} characters from A-Z a-z 0-9 - . _ ~ + / =, got "
            f"{len(token)} characters{'' if set(token) <= allowed else ' with others'}. Make one with: python3 -c "
            "\"import secrets; print(secrets.token_urlsafe(32))\" > FILE && chmod 600 FILE")
    return token


def http_config(value: str, *, token_file: Path | None = None, allow_hosts: list[str] | None = None,
                allow_origins: list[str] | None = None, requests_per_minute: int = 1200) -> HttpConfig:
    """Check the HTTP options before anything is opened: no token, no start on a non-loopback address.

    Raises:
        InvalidInput: a bad --http value or token, a non-loopback address without a token, or a wildcard
            address (0.0.0.0, ::) without --allow-host naming the host names clients will use.
    """
    host, port = parse_http(value)
    token = load_token(token_file)
    if not is_loopback(host) and token is None:
        raise InvalidInput(
            f"--http {value} listens beyond this machine, so it needs a bearer token: pass --token-file PATH (or "
            f"set ${TOKEN_ENV}); clients send it as 'Authorization: Bearer TOKEN'. No token, no start.")
    names = {h.strip().lower().strip("[]") for h in allow_hosts or [] if h.strip()}
    if is_wildcard(host) and not names:
        raise InvalidInput(
            f"--http {value} listens on every interface: name the host names clients will connect to with "
            "--allow-host NAME (repeatable); requests for any other Host are refused (DNS-rebinding protection).")
    if not is_wildcard(host):
        names.add(host.lower())
    origins = set()
    for origin in allow_origins or []:
        parts = urlsplit(origin.strip().lower())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise InvalidInput("--allow-origin expected scheme://host[:port], e.g. https://app.example, got "
                               f"{origin!r}.")
        origins.add(f"{parts.scheme}://{parts.netloc}")
    if isinstance(requests_per_minute, bool) or not 1 <= requests_per_minute <= 1_000_000:
        raise InvalidInput(f"--max-requests-per-minute expected 1..1000000, got {requests_per_minute!r}.")
    digest = None if token is None else hashlib.sha256(token.encode("utf-8")).digest()
    return HttpConfig(host, port, digest, frozenset(names | set(LOOPBACK_NAMES)), frozenset(origins),
                      requests_per_minute=requests_per_minute)


class Guard:
    """ASGI middleware in front of the whole app: request rate, Host, Origin and bearer token, in that order.

    Refusals are plain-text 4xx answers that say what to fix; nothing reaches the MCP app unless all pass.
    """

    def __init__(self, app: Any, config: HttpConfig) -> None:
        self.app, self.config = app, config
        self._window, self._count, self._lock = 0, 0, threading.Lock()

    def _host_ok(self, host: str | None) -> bool:
        if not host:
            return False
        name = host.lower()
        if name.startswith("["):  # [::1]:8765
            name = name[1:].partition("]")[0]
        elif name.count(":") == 1:
            name = name.partition(":")[0]
        return name in self.config.hosts

    def _origin_ok(self, origin: str | None) -> bool:
        if origin is None:  # not a browser (browsers always send Origin on cross-origin requests)
            return True
        parts = urlsplit(origin.lower())
        if parts.scheme in ("http", "https") and parts.hostname in LOOPBACK_NAMES:
            return True
        return f"{parts.scheme}://{parts.netloc}" in self.config.origins

    def _token_ok(self, authorization: str | None) -> bool:
        if self.config.token_sha256 is None:
            return True
        scheme, _, presented = (authorization or "").partition(" ")
        digest = hashlib.sha256(presented.strip().encode("utf-8", "surrogateescape")).digest()
        # compare digests, always, so neither timing nor an early return tells how much of a token was right
        return hmac.compare_digest(digest, self.config.token_sha256) and scheme.lower() == "bearer"

    def _rate_ok(self) -> bool:
        minute = int(time.monotonic() // 60)
        with self._lock:
            if minute != self._window:
                self._window, self._count = minute, 0
            self._count += 1
            return self._count <= self.config.requests_per_minute

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal = None
        if not self._rate_ok():  # every request counts, refused ones too (token guessing)
            refusal = (429, "Too many requests this minute (--max-requests-per-minute); retry shortly.")
        elif not self._host_ok(headers.get("host")):
            refusal = (421, "Host not allowed: connect by a name the server was started with (--allow-host).")
        elif not self._origin_ok(headers.get("origin")):
            refusal = (403, "Origin not allowed: start the server with --allow-origin for this web origin.")
        elif not self._token_ok(headers.get("authorization")):
            refusal = (401, "Missing or wrong bearer token: send 'Authorization: Bearer TOKEN'.")
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, text = refusal
        extra = [(b"www-authenticate", b'Bearer realm="evermind"')] if status == 401 else []
        extra += [(b"retry-after", b"60")] if status == 429 else []
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"), *extra]})
        await send({"type": "http.response.body", "body": text.encode("utf-8")})


def _stop_on_sigterm() -> None:
    """SIGTERM (how hosts stop a stdio server) unwinds like Ctrl-C, so the caller's finally closes the store."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def serve_stdio(server: Any) -> bool:
    """Serve `server` over stdin/stdout until the client closes stdin (or SIGTERM/SIGINT).

    The signals go through the event loop (its wakeup fd), not a handler that raises wherever the main thread
    happens to be: the kernel may hand a process's signal to any of its threads (the embedding worker, a
    stdin reader), and a Python-level handler then waits for the main thread to run bytecode, which it never
    does while the loop sleeps in select with nothing to do.

    Returns:
        True when a signal stopped it: a worker thread is then still blocked reading stdin, so the caller
        should close what it opened and leave with os._exit (Python would wait for that thread forever).
    """
    import asyncio

    import anyio

    def interrupt() -> None:  # run by the loop: unwinds out of anyio.run like Ctrl-C
        raise KeyboardInterrupt

    async def serve() -> None:
        if threading.current_thread() is threading.main_thread():  # signal handlers belong to the main thread
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, interrupt)
        await server.run_stdio_async()

    try:
        anyio.run(serve)
    except KeyboardInterrupt:
        return True
    return False


def serve_http(server: Any, config: HttpConfig, *, announce: Any = None) -> None:
    """Serve `server` as streamable HTTP at http://HOST:PORT/mcp behind `Guard` until SIGTERM/SIGINT.

    The listening address is printed to `announce` (default stderr) once the socket is bound, port 0 resolved.
    """
    import anyio
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = [f"[{h}]" if ":" in h else h for h in sorted(config.hosts)]
    loopback = ("127.0.0.1", "localhost", "[::1]")
    security = TransportSecuritySettings(  # the SDK's own check, behind ours, from the same lists
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts + [f"{h}:*" for h in hosts],
        allowed_origins=[f"{s}://{h}{p}" for s in ("http", "https") for h in loopback for p in ("", ":*")]
        + sorted(config.origins),
    )
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=config.host, transport_security=security,
                                     max_request_body_size=config.max_body_bytes, max_sessions=MAX_SESSIONS)
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
        # Listen before announcing: a client that connects as soon as it reads the port waits in the backlog
        # until uvicorn accepts, instead of being refused while the app still starts.
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"--http could not listen on {config.host}:{config.port} ({exc.strerror or exc}).") from None
    port = sock.getsockname()[1]
    shown = f"[{config.host}]" if ":" in config.host else config.host
    auth = "bearer token required" if config.token_sha256 else "no token: any local process can use it"
    print(f"evermind mcp: listening on http://{shown}:{port}{MCP_PATH} ({auth})", file=announce or sys.stderr,
          flush=True)
    uv = uvicorn.Server(uvicorn.Config(Guard(app, config), log_level="warning", server_header=False,
                                       timeout_keep_alive=5, limit_concurrency=256, lifespan="on"))
    _stop_on_sigterm()  # uvicorn shuts down gracefully on SIGTERM, then raises it again: end as for Ctrl-C
    try:
        anyio.run(uv.serve, [sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
