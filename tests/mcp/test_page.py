"""The output budget and cursors of MCP results (pure functions: no store, no SDK)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evermind_memory.errors import InvalidInput
from evermind_memory.mcp.page import MIN_TEXT_CHARS, cut_text, decode_cursor, dumps, encode_cursor, fit, resume

any_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=3000)  # escapes, quotes, control chars


def item(i: int, text: str) -> dict:
    return {"id": f"id{i}", "tags": {"k": "v"}, "text": text, "text_chars": len(text), "truncated": False}


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(any_text, min_size=1, max_size=6), room=st.integers(400, 8000))
def test_fit_never_exceeds_the_room_and_keeps_an_order_prefix(texts, room):
    items = [item(i, t) for i, t in enumerate(texts)]
    kept = fit(items, room)
    assert kept, "a page always makes progress"
    assert len(dumps(kept)) - 2 <= room  # the array's elements and commas
    assert [k["id"] for k in kept] == [f"id{i}" for i in range(len(kept))]
    for original, got in zip(items, kept):
        assert original["text"].startswith(got["text"])
        assert got["truncated"] == (got["text"] != original["text"])
    if len(kept) > 1 and kept[-1]["truncated"]:
        assert len(dumps(kept[-1]["text"])) - 2 > MIN_TEXT_CHARS - 6  # no sliver (an escape that did not fit: < 6)


def test_fit_cuts_the_first_item_rather_than_returning_nothing():
    kept = fit([item(0, "x" * 10_000), item(1, "y")], 1000)
    assert len(kept) == 1 and kept[0]["truncated"] and 0 < len(kept[0]["text"]) < 1000
    assert fit([item(0, "x" * 10_000)], 50)[0]["text"] == ""  # even when only its metadata fits (nearly)


@settings(deadline=None)
@given(any_text, st.integers(2, 500))
@example("0\x1f", 4)  # a control character costs 6 JSON characters: cutting by the overshoot cut too much
def test_cut_text_is_the_longest_prefix_that_fits(text, room):
    cut = cut_text(text, room)
    assert text.startswith(cut) and len(dumps(cut)) <= room
    if len(cut) < len(text):
        assert len(dumps(text[: len(cut) + 1])) > room


def test_cursor_round_trip_and_refusals():
    cursor = encode_cursor(40, "abc", "scope1")
    assert decode_cursor(cursor, "scope1") == (40, "abc")
    with pytest.raises(InvalidInput, match="returned for other arguments"):
        decode_cursor(cursor, "scope2")
    for bad in ["", "!!!", "e30", encode_cursor(-1, None, "scope1"), "x" * 600,
                encode_cursor(True, None, "scope1")]:  # noqa: FBT003
        with pytest.raises(InvalidInput, match="not one this server returned"):
            decode_cursor(bad, "scope1")


def test_resume_finds_the_last_item_again_after_removals():
    window = ["a", "c", "d", "e"]  # "b" was removed after a page that ended at "c" (offset 3)
    assert resume(window, 0, 3, "c", key=str) == 2
    assert resume(window, 0, 3, "gone", key=str) == 3  # last item removed too: fall back to the offset
    assert resume(window, 10, 3, None, key=str) == 0
