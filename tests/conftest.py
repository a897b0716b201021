"""Shared fixtures: seeded randomness and a tiny model configuration."""

from __future__ import annotations

import os

# Tiny matrices on a 2-core machine: BLAS threads only oversubscribe (measured 7x slower). Set before numpy
# loads; child processes started by the tests inherit it.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
