"""Shared fixtures: seeded randomness and a tiny model configuration."""

from __future__ import annotations

import os

# Tiny matrices on a 2-core machine: BLAS threads only oversubscribe (measured 7x slower). Set before numpy
# loads; child processes started by the tests inherit it.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def pg_server():
    """One throwaway PostgreSQL server for the whole session (tests/pg_server.py), started on first use.

    Skips when the binaries are missing, except under CI (CI=true), where the PostgreSQL tests must run.
    """
    from pg_server import PgServer, find_bin

    reason = None
    if find_bin() is None:
        reason = "PostgreSQL binaries not found (apt-get install postgresql; .ci/run installs it)"
    else:
        try:
            import psycopg  # noqa: F401
            import psycopg_pool  # noqa: F401
        except ImportError:
            reason = "psycopg / psycopg-pool not installed (pip install -e '.[test]')"
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason + ": CI must run the PostgreSQL tests")
        pytest.skip(reason)
    server = PgServer.start()
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server) -> str:
    """The URL of a new, empty PostgreSQL store (a schema of its own in the session's server)."""
    return pg_server.new_schema()
