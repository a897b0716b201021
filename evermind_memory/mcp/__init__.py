"""`evermind mcp`: the memory as a Model Context Protocol server (official Python SDK v2, the `mcp` extra).

    from evermind_memory import MemoryStore
    from evermind_memory.mcp import build_server, serve_stdio
    with MemoryStore("agent.db") as store:
        serve_stdio(build_server(store))

server.py holds the tools, transport.py stdio and guarded HTTP, page.py the output budget and cursors.
"""

from __future__ import annotations

from .server import build_server
from .transport import HttpConfig, http_config, serve_http, serve_stdio

__all__ = ["HttpConfig", "build_server", "http_config", "serve_http", "serve_stdio"]
