"""MCP fixtures: a store on the shipped model (loaded once per process) and a helper to call tools in-process.

The whole folder needs the `mcp` extra (it is part of `test`); without it the tests skip and say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mcp.server", reason="the MCP SDK is the 'mcp' extra: pip install -e '.[test]'")

from evermind_memory import MemoryStore  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture
def store(db: Path):
    with MemoryStore(db) as s:  # the shipped model (default_embedder caches it for the whole session)
        yield s
