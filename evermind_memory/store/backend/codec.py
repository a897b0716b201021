"""How a fact row's fields are written and checked, the same for both engines (neither owns this module): the
canonical tag JSON, the checks repair runs on a raw field, and the counts a repair reports.

How a vector is stored and read back (int8 rows with a scale, the length and unit-norm checks) is
backend/vector_blobs.py, shared the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeGuard

from .base import row_problem, utf8_text


def tags_json(tags: dict) -> str:
    """Canonical JSON for a tag dict."""
    return json.dumps(tags, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@dataclass
class RepairCounts:
    """What a repair did, row by row."""

    scanned: int = 0
    fixed: int = 0  # rows kept with a repaired field
    quarantined: int = 0  # rows removed into the quarantine table
    vectors_cleared: int = 0  # damaged vectors cleared (the facts are embedded again)
    restored_from_log: int = 0  # facts whose row was lost, restored from the change log (salvage)
    salvaged: int = 0  # fact rows copied out of a damaged file (salvage)
    unreadable_pages: int = 0  # reads that failed during salvage
    reasons: list[str] = field(default_factory=list)  # the first few, for the report

    def note(self, reason: str) -> None:
        if len(self.reasons) < 20:
            self.reasons.append(reason)


def ok_text(value: object) -> TypeGuard[str]:
    """Text a fact field may hold: a str, not blank, encodable as UTF-8 (no lone surrogates)."""
    return isinstance(value, str) and bool(value.strip()) and utf8_text(value)


def ok_tags(value: object) -> TypeGuard[str]:
    """A tags column as the store writes it: a JSON object of labels (str -> str, int, float or bool)."""
    if not ok_text(value):
        return False
    try:
        tags = json.loads(value)
    except ValueError:
        return False
    probe = {"id": "x", "text": "x", "tags": tags, "source": None, "created_at": datetime.now().astimezone(),
             "updated_at": datetime.now().astimezone()}
    return row_problem(probe) is None
