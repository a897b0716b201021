"""Helpers for reading MCP tool results in tests."""

from __future__ import annotations

import json


def payload(result) -> dict:
    """A successful tool result's structured content, checked against its text copy (the same JSON)."""
    assert not result.is_error, result.content[0].text
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def error_text(result) -> str:
    """An is_error tool result's message."""
    assert result.is_error, result.structured_content
    return result.content[0].text
