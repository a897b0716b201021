"""mypy holds store/, embedder/ and adaptation/ to their annotations (pyproject.toml's [tool.mypy]: every module,
no exclude list). Skipped where mypy is not installed (it is in the `test` extra), except under CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_nothing() -> None:
    try:
        import mypy  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("mypy is not installed (pip install -e '.[test]' brings it)")
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
