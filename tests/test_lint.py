"""ruff holds the repository to the rules in pyproject.toml ([tool.ruff]): unused and undefined names, and
pycodestyle's error classes. Skipped where ruff is not installed (it is in the `test` extra), except under CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing() -> None:
    try:
        import ruff  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("ruff is not installed (pip install -e '.[test]' brings it)")
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
