"""Import an optional extra for a test module: skip with the install command when it is missing, except in CI
(CI=true), where a missing extra is a failure: the framework tests must run there."""

from __future__ import annotations

import os
from types import ModuleType

import pytest


def require(module: str, extra: str) -> ModuleType:
    """The module, or a skip (a failure in CI) that names the extra to install."""
    reason = f"{module} is missing: the '{extra}' extra (pip install -e '.[test]' has it)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        try:
            return __import__(module, fromlist=["_"])
        except ImportError as exc:
            raise RuntimeError(f"CI must run the {extra} tests, but {reason}") from exc
    return pytest.importorskip(module, reason=reason)
