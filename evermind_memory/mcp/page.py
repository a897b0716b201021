"""Bounded, paged tool output: a character budget that cuts long texts, and opaque list cursors.

A host refuses (or silently truncates) a tool result that is too long, so every result that carries memory
text is packed into `max_chars` characters of its JSON form here. Pure functions over dicts: nothing in this
file knows about the MCP SDK or the store.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from ..errors import InvalidInput

MIN_TEXT_CHARS = 200  # a memory cut shorter than this is left out (when another one came first) rather than shown
MAX_CURSOR_CHARS = 512
RESYNC_WINDOW = 256  # a list cursor finds its last memory again after up to this many earlier ones were forgotten


def dumps(value: Any) -> str:
    """The compact JSON text of a tool result (what the budget counts and the text copy carries)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def cut_text(text: str, room: int) -> str:
    """The longest prefix of `text` whose JSON string (quotes and escapes included) fits in `room` characters."""
    low, high = 0, min(len(text), max(room - 2, 0))  # the answer lies in [low, high]: each character costs >= 1
    while low < high:  # the JSON length grows with the prefix, so bisect (escapes make it no simple sum)
        mid = (low + high + 1) // 2
        if len(dumps(text[:mid])) <= room:
            low = mid
        else:
            high = mid - 1
    return text[:low]


def fit(items: list[dict], room: int, *, always_one: bool = True) -> list[dict]:
    """The leading items whose compact JSON fits in `room` characters, the last one's "text" cut to fit.

    Each item holds "text" (str or None) and "truncated" (bool). An item that does not fit whole is kept with a
    shortened text (and "truncated": True) when at least MIN_TEXT_CHARS of its text fit, or when it would be
    the only one (`always_one`: a page must make progress even if one memory's tags alone overflow). Nothing
    after it is kept.

    Args:
        items: dicts in the order they should appear.
        room: characters available for the JSON array's elements and separators.
        always_one: keep the first item (cut to fit, possibly to an empty text) even if it does not fit.
    Returns:
        the kept items (copies where cut).
    """
    kept: list[dict] = []
    used = 0
    for item in items:
        size = len(dumps(item)) + (1 if kept else 0)  # + the comma before it
        if used + size <= room:
            kept.append(item)
            used += size
            continue
        text = item.get("text")
        if isinstance(text, str) and text:
            shell = {**item, "text": "", "truncated": True}
            spare = room - used - (len(dumps(shell)) + (1 if kept else 0)) + 2  # + 2: the empty string's quotes
            if spare - 2 >= MIN_TEXT_CHARS or (always_one and not kept):
                kept.append({**shell, "text": cut_text(text, max(spare, 2))})
        elif always_one and not kept:
            kept.append(item)
        break
    return kept


def scope_digest(**scope: Any) -> str:
    """A short digest of the arguments a cursor belongs to (so a cursor is not replayed with other filters)."""
    return hashlib.sha256(dumps(scope).encode("utf-8")).hexdigest()[:12]


def encode_cursor(offset: int, after: str | None, scope: str) -> str:
    """An opaque cursor: the position of the next item, the id of the last one returned, and the scope digest."""
    raw = dumps({"o": offset, "a": after, "s": scope}).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, scope: str) -> tuple[int, str | None]:
    """(offset, id of the last item returned) from a cursor made by `encode_cursor` for the same scope.

    Raises:
        InvalidInput: not a cursor this server issued, or issued for other arguments.
    """
    what = "cursor is not one this server returned; call again without a cursor to start from the beginning."
    if not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_CURSOR_CHARS:
        raise InvalidInput(f"the {what}")
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, TypeError):
        raise InvalidInput(f"the {what}") from None
    offset, after = (data.get("o"), data.get("a")) if isinstance(data, dict) else (None, None)
    if (isinstance(offset, bool) or not isinstance(offset, int) or offset < 0
            or not (after is None or isinstance(after, str))):
        raise InvalidInput(f"the {what}")
    if data.get("s") != scope:
        raise InvalidInput("the cursor was returned for other arguments (tags, where or id); pass the same ones, or "
                           "start again without a cursor.")
    return offset, after


def resume(window: list[Any], window_start: int, offset: int, after: str | None, key) -> int:
    """Where the next page starts inside `window` (items from position `window_start` of the full list).

    The item with id `after` was the last one returned: the page starts right after it even if earlier items
    were removed since (offsets alone would then skip some). If it is gone, the page starts at `offset`.
    """
    if after is not None:
        for i, item in enumerate(window):
            if key(item) == after:
                return i + 1
    return min(max(offset - window_start, 0), len(window))
