"""Store fixtures: a tiny real embedder (BPE + untrained EvermindLM, built once per session) and stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from evermind_memory import MemoryStore
from evermind_memory.embedder import LMEmbedder
from store_helpers import build_embedder

@pytest.fixture(scope="session")
def embedder() -> LMEmbedder:
    return build_embedder(seed=0)


@pytest.fixture(scope="session")
def other_embedder() -> LMEmbedder:
    """Same architecture and tokenizer, other weights: another fingerprint."""
    return build_embedder(seed=1)


@pytest.fixture(scope="session")
def model_files(tmp_path_factory: pytest.TempPathFactory, embedder: LMEmbedder) -> tuple[Path, Path]:
    """The session embedder saved to disk, for child processes and the CLI."""
    d = tmp_path_factory.mktemp("tiny_model")
    embedder.model.save(d / "model.evl")
    embedder.tokenizer.save(d / "tokenizer.json")
    return d / "model.evl", d / "tokenizer.json"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    """The store's backend: the behavioural tests that take `store` or `target` run on both (`-k postgres`
    selects the PostgreSQL runs)."""
    return request.param


@pytest.fixture
def target(request: pytest.FixtureRequest, backend: str, db_path: Path):
    """Where a new, empty store lives: an SQLite file path, or a PostgreSQL URL (a schema of its own)."""
    return db_path if backend == "sqlite" else request.getfixturevalue("pg_url")


@pytest.fixture
def store(target, embedder: LMEmbedder):
    with MemoryStore(target, embedder) as s:
        yield s


@pytest.fixture(scope="session")
def other_model_files(tmp_path_factory: pytest.TempPathFactory, other_embedder: LMEmbedder) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tiny_model_other")
    other_embedder.model.save(d / "model.evl")
    other_embedder.tokenizer.save(d / "tokenizer.json")
    return d / "model.evl", d / "tokenizer.json"
