"""Fact ids: opaque 32 hex digits, distinct, and sorting by the time they were made (the time first, as UUIDv7), so
inserts append to the id indexes (benchmarks/fact_ids.py)."""

from __future__ import annotations

import re
import time

from evermind_memory import MemoryStore


def test_ids_are_distinct_hex_and_sort_by_when_they_were_made(target, embedder):
    with MemoryStore(target, embedder) as store:
        first = store.remember_many([f"note {i} about the garden" for i in range(50)])
        time.sleep(0.005)  # ids share a prefix within a millisecond: later ones sort after earlier ones
        later = store.remember("a later note about the garden")
        assert store.get(later).text == "a later note about the garden"
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in [*first, later])
    assert len(set(first)) == len(first)
    assert all(i < later for i in first)
