"""The usearch file parser (store/usearch_file.py, R6): files saved by the installed usearch 2.26.6 parse to exactly
the keys, vectors and removed slots that went in, and usearch itself then loads and views them; every damaged file
(truncated anywhere, bytes appended, each header field and each graph field bent out of range, random bytes flipped)
is refused with IndexRejected, or, where the damage is harmless to usearch (a vector byte, a stale padding slot),
accepted and then loaded, viewed and searched by usearch in a child process without a crash.

The byte offsets the corruptions aim at come from `walk`, a plain per-node reader written from the format notes in
usearch_file.py, not from the parser under test.
"""

from __future__ import annotations

import mmap
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from usearch.index import Index

from evermind_memory.store.index_files import close_quietly
from evermind_memory.store.usearch_file import FREE_KEY, IndexRejected, UsearchInfo, parse_usearch_file


# ----------------------------------------------------------------------------------------------------------- helpers


class Built:
    """A saved index and what went into it: keys (int64), vectors (int8) by key, the removed keys."""

    def __init__(self, n: int, dim: int, M: int, seed: int, removed: float = 0.0, readd: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.dim, self.M = dim, M
        self.keys = rng.choice(2**63 - 1, size=n, replace=False).astype(np.int64) if n else np.zeros(0, np.int64)
        self.vectors = rng.integers(-128, 128, size=(n, dim), dtype=np.int8)
        index = new_index(dim, M)
        if n:
            index.add(self.keys, self.vectors, threads=1)
        self.removed = self.keys[rng.permutation(n)[: int(n * removed)]]
        if len(self.removed):
            index.remove(self.removed)
        self.by_key = {int(k): v for k, v in zip(self.keys, self.vectors)}
        for k in self.removed.tolist():
            del self.by_key[k]
        fresh = rng.integers(-128, 128, size=(readd, dim), dtype=np.int8)  # re-added into removed slots
        for i in range(readd):
            key = 2**62 + i
            index.add(key, fresh[i], threads=1)
            self.by_key[key] = fresh[i]
        self.data: bytes = index.save()


def new_index(dim: int, M: int):
    return Index(ndim=dim, metric="cos", dtype="i8", connectivity=M, expansion_add=32, expansion_search=32)


class Layout:
    """Offsets in a usearch file, found by walking it node by node (independent of the parser under test)."""

    def __init__(self, data: bytes) -> None:
        self.rows, self.cols = struct.unpack_from("<II", data, 0)
        self.dense = 8 + self.rows * self.cols
        self.graph = self.dense + 64
        self.count, self.conn, self.conn_base, self.max_level, self.entry = struct.unpack_from("<5Q", data,
                                                                                               self.graph)
        self.levels_at = self.graph + 40
        self.levels = list(struct.unpack_from(f"<{self.count}h", data, self.levels_at))
        self.nodes: list[int] = []  # each node's first byte
        self.lists: list[tuple[int, int, int]] = []  # (byte offset, level, capacity) of every neighbour list
        at = self.levels_at + 2 * self.count
        for level in self.levels:
            self.nodes.append(at)
            at += 10
            for lvl in range(level + 1):
                cap = self.conn_base if lvl == 0 else self.conn
                self.lists.append((at, lvl, cap))
                at += 4 + 4 * cap
        self.end = at

    def used(self, data: bytes) -> list[tuple[int, int, int]]:
        """(byte offset of a used neighbour slot, the list's level, the slot it names) for every used slot."""
        out = []
        for at, lvl, _ in self.lists:
            n = struct.unpack_from("<I", data, at)[0]
            out += [(at + 4 + 4 * j, lvl, struct.unpack_from("<I", data, at + 4 + 4 * j)[0]) for j in range(n)]
        return out


def patched(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def rejected(data: bytes, dim: int, M: int, match: str | None = None) -> None:
    with pytest.raises(IndexRejected, match=match):
        parse_usearch_file(data, dim, M)


def assert_matches(info: UsearchInfo, built: Built) -> None:
    """The parse holds exactly the live keys and their vectors, bit for bit, and flags the removed slots."""
    live = ~info.removed
    assert info.count == len(built.keys) and info.live == len(built.by_key)
    assert sorted(info.keys[live].tolist()) == sorted(built.by_key)
    for key, vector in zip(info.keys[live].tolist(), info.vectors[live]):
        assert np.array_equal(vector, built.by_key[key])
    assert (info.keys[info.removed] == -1).all()  # usearch's free key, 2**64 - 1, read as int64
    assert not info.vectors.flags.writeable and info.vectors.dtype == np.int8


def assert_usearch_serves(path: Path, data: bytes, built: Built) -> None:
    """usearch views the file and loads the bytes: same size, same vectors, searches return only live keys."""
    viewed = Index.restore(str(path), view=True)
    loaded = new_index(built.dim, built.M)
    loaded.load(data)
    live = set(built.by_key)
    for index in (viewed, loaded):
        assert len(index) == len(live)
        if not live:
            continue
        keys = np.array(sorted(live), dtype=np.uint64)[:20]
        assert np.array_equal(index.get(keys, dtype=np.int8), np.stack([built.by_key[int(k)] for k in keys]))
        for key in keys[:5].tolist():
            found = index.search(built.by_key[key], 10)
            assert set(np.asarray(found.keys).tolist()) <= live and len(found) == min(10, len(live))


CASES = {  # name: (n, dim, M, seed, removed fraction, re-added)
    "plain": (300, 16, 16, 1, 0.0, 0),
    "removed": (400, 32, 16, 2, 0.25, 0),
    "removed-readded": (400, 24, 8, 3, 0.2, 30),
    "all-removed": (50, 8, 4, 4, 1.0, 0),
    "M2-tall": (300, 8, 2, 5, 0.1, 0),
    "one": (1, 8, 16, 6, 0.0, 0),
}


@pytest.fixture(scope="module")
def built() -> dict[str, Built]:
    return {name: Built(*args) for name, args in CASES.items()}


# ------------------------------------------------------------------------------------------------------ valid files


@pytest.mark.parametrize("name", CASES)
def test_real_files_parse_to_what_went_in_and_usearch_serves_them(name, built, tmp_path):
    b = built[name]
    info = parse_usearch_file(b.data, b.dim, b.M)
    assert_matches(info, b)
    assert (info.connectivity, info.connectivity_base, info.dim) == (b.M, 2 * b.M, b.dim)
    layout = Layout(b.data)
    assert layout.end == len(b.data) and info.max_level == layout.max_level == max(layout.levels)
    assert all(slot < layout.count for _, _, slot in layout.used(b.data))  # what the format notes say holds
    assert all(layout.levels[slot] >= lvl for _, lvl, slot in layout.used(b.data))
    path = tmp_path / "index.usearch"
    path.write_bytes(b.data)
    assert_usearch_serves(path, b.data, b)


def test_mmap_and_memoryview_parse_the_same(built, tmp_path):
    b = built["removed"]
    path = tmp_path / "index.usearch"
    path.write_bytes(b.data)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        for data in (mapped, memoryview(b.data)):
            info = parse_usearch_file(data, b.dim, b.M)
            assert_matches(info, b)
            del info  # (release the views before the map closes)


def test_a_map_stays_open_while_its_parsed_vectors_are_viewed(built, tmp_path):
    """close_quietly closes a snapshot's map only once nothing views it: the parsed vectors (and any view of them,
    as a loaded index's node hashes read them in a background thread) must hold the map's buffer. A view that did
    not hold it read unmapped memory after the close: a segmentation fault at interpreter exit."""
    b = built["removed"]
    path = tmp_path / "index.usearch"
    path.write_bytes(b.data)
    with path.open("rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    info = parse_usearch_file(mapped, b.dim, b.M)
    rows = info.vectors[:, ::2]  # a derived view, as the background hashing takes
    del info
    close_quietly(mapped)
    assert not mapped.closed
    assert np.array_equal(rows, b.vectors[:, ::2])  # (the slots are in insertion order: one thread built it)
    del rows
    close_quietly(mapped)
    assert mapped.closed


def test_empty_index_parses_and_loads(tmp_path):
    b = Built(0, 8, 16, 0)
    assert len(b.data) == 8 + 64 + 40
    info = parse_usearch_file(b.data, 8, 16)
    assert (info.count, info.max_level, info.keys.shape, info.vectors.shape) == (0, -1, (0,), (0, 8))
    path = tmp_path / "empty.usearch"
    path.write_bytes(b.data)
    assert_usearch_serves(path, b.data, b)
    rejected(b.data + b"\0", 8, 16, "after its headers")


def test_removed_slots_are_kept_in_place(built):
    """remove() then save() keeps every slot (no compaction): the removed ones hold the free key, their vector and
    their links; the header counts them."""
    b = built["removed"]
    info = parse_usearch_file(b.data, b.dim, b.M)
    assert info.count == len(b.keys) and int(info.removed.sum()) == len(b.removed)
    slot_of = {int(k): i for i, k in enumerate(b.keys)}  # threads=1: slots in insertion order
    slots = [slot_of[k] for k in b.removed.tolist()]
    assert info.removed[slots].all() and np.array_equal(info.vectors[slots], b.vectors[slots])
    assert (info.keys.view(np.uint64)[slots] == FREE_KEY).all()


def test_single_thread_builds_are_byte_identical():
    assert Built(300, 16, 16, 9, 0.1).data == Built(300, 16, 16, 9, 0.1).data


# ---------------------------------------------------------------------------------------------------- damaged files


@pytest.fixture(scope="module")
def small() -> Built:
    return Built(60, 8, 4, 11, 0.2)


def test_every_truncation_is_rejected(small):
    for cut in range(len(small.data)):
        rejected(small.data[:cut], small.dim, small.M)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_truncated_or_extended_files_are_rejected(built, data):
    b = built[data.draw(st.sampled_from(sorted(CASES)))]
    if data.draw(st.booleans()):
        rejected(b.data[: data.draw(st.integers(0, len(b.data) - 1))], b.dim, b.M)
    else:
        rejected(b.data + data.draw(st.binary(min_size=1, max_size=200)), b.dim, b.M)


HEADER_FIELDS = [  # (offset from the dense header, format, bad value, message)
    (0, "<B", ord("U"), "magic"),
    (7, "<H", 3, "version"),
    (9, "<H", 25, "version"),
    (11, "<H", 7, "version"),
    (13, "<B", 101, "metric"),  # l2sq
    (14, "<B", 11, "scalar"),  # f32
    (15, "<B", 20, "key/slot"),  # i64 keys
    (16, "<B", 2, "key/slot"),  # u40 slots
    (33, "<Q", 9, "dimensions"),
    (41, "<B", 1, "multi"),
    (50, "<B", 1, "reserved"),
]


@pytest.mark.parametrize("field", HEADER_FIELDS, ids=lambda f: f"{f[3]}@{f[0]}")
def test_each_dense_header_field_is_checked(small, field):
    offset, fmt, value, message = field
    rejected(patched(small.data, Layout(small.data).dense + offset, fmt, value), small.dim, small.M, message)


def test_counts_that_do_not_add_up_are_rejected(small):
    lay, d = Layout(small.data), small.data
    present, deleted = struct.unpack_from("<QQ", d, lay.dense + 17)
    rejected(patched(d, lay.dense + 17, "<Q", present + 1), 8, 4, "do not add up")
    rejected(patched(d, lay.dense + 25, "<Q", deleted - 1), 8, 4, "do not add up")
    both = patched(patched(d, lay.dense + 17, "<Q", present + 1), lay.dense + 25, "<Q", deleted - 1)
    rejected(both, 8, 4, "removed slots")  # adds up, but the nodes hold another number of free keys
    rejected(patched(d, 0, "<I", lay.rows - 1), 8, 4)  # the matrix shape moves every later field
    rejected(patched(d, 0, "<I", lay.rows + 1), 8, 4)
    rejected(patched(d, 0, "<I", 2**32 - 1), 8, 4, "too short")
    rejected(patched(d, 4, "<I", 9), 8, 4, "wide")
    rejected(patched(d, lay.graph, "<Q", lay.count - 1), 8, 4, "nodes but the matrix")
    rejected(patched(d, lay.graph, "<Q", 2**64 - 1), 8, 4, "nodes but the matrix")


def test_graph_header_fields_are_checked(small):
    lay, d = Layout(small.data), small.data
    rejected(patched(d, lay.graph + 8, "<Q", 5), 8, 4, "connectivity")
    rejected(patched(d, lay.graph + 16, "<Q", 16), 8, 4, "connectivity")
    rejected(d, 8, 5, "connectivity")  # built with M = 4, asked for 5
    rejected(d, 9, 4, "wide")
    rejected(patched(d, lay.graph + 24, "<Q", 2**64 - 1), 8, 4, "max_level")
    rejected(patched(d, lay.graph + 24, "<Q", lay.max_level + 1), 8, 4, "entry slot")  # entry no longer on top
    rejected(patched(d, lay.graph + 32, "<Q", lay.count), 8, 4, "entry slot")
    low = next(i for i, lvl in enumerate(lay.levels) if lvl < lay.max_level)
    rejected(patched(d, lay.graph + 32, "<Q", low), 8, 4, "not the top")


def test_node_levels_are_checked(small):
    lay, d = Layout(small.data), small.data
    for slot in (0, len(lay.levels) // 2, len(lay.levels) - 1):
        rejected(patched(d, lay.levels_at + 2 * slot, "<h", lay.max_level + 1), 8, 4, "outside")
        rejected(patched(d, lay.levels_at + 2 * slot, "<h", -1), 8, 4, "outside")
        rejected(patched(d, lay.levels_at + 2 * slot, "<h", -32768), 8, 4, "outside")
    flat = next(i for i, lvl in enumerate(lay.levels) if lvl == 0)
    rejected(patched(d, lay.levels_at + 2 * flat, "<h", 1), 8, 4)  # the nodes no longer end at the file's end
    rejected(patched(d, lay.nodes[flat] + 8, "<h", 1), 8, 4, "says level")  # the node's own copy disagrees


def test_neighbour_lists_are_checked(small):
    lay, d = Layout(small.data), small.data
    for at, lvl, cap in (lay.lists[0], lay.lists[-1], next(x for x in lay.lists if x[1] > 0)):
        rejected(patched(d, at, "<I", cap + 1), 8, 4, "capacity")
        rejected(patched(d, at, "<I", 2**32 - 1), 8, 4, "capacity")
    used = lay.used(d)
    for at, lvl, _ in (used[0], used[len(used) // 2], used[-1]):
        rejected(patched(d, at, "<I", lay.count), 8, 4, "not below the node count")
        rejected(patched(d, at, "<I", 2**32 - 1), 8, 4, "not below the node count")
    upper = next(u for u in used if u[1] > 0)
    flat = next(i for i, lvl in enumerate(lay.levels) if lvl < upper[1])
    rejected(patched(d, upper[0], "<I", flat), 8, 4, "does not reach")


def test_keys_are_checked(small):
    lay, d = Layout(small.data), small.data
    info = parse_usearch_file(d, 8, 4)
    live = np.flatnonzero(~info.removed)
    a, b = lay.nodes[live[0]], lay.nodes[live[1]]
    rejected(patched(d, b, "<Q", int(info.keys[live[0]])), 8, 4, "more than once")
    rejected(patched(d, a, "<Q", 2**63), 8, 4, "negative")
    rejected(patched(d, a, "<Q", FREE_KEY), 8, 4, "removed slots")  # one more free key than the header counts
    gone = int(np.flatnonzero(info.removed)[0])
    rejected(patched(d, lay.nodes[gone], "<Q", 7), 8, 4, "removed slots")


def test_random_byte_damage_is_rejected_or_harmless_to_usearch(small, tmp_path):
    """Flip random bytes anywhere: the parse raises IndexRejected (nothing else), or accepts, and then usearch
    loads, views and searches the file in a child process without crashing (a crash must not take pytest down)."""
    rng = np.random.default_rng(5)
    accepted: list[Path] = []
    for trial in range(1500):
        damaged = bytearray(small.data)
        for at in rng.integers(0, len(damaged), size=int(rng.integers(1, 4))):
            damaged[at] = int(rng.integers(0, 256))
        try:
            parse_usearch_file(bytes(damaged), small.dim, small.M)
        except IndexRejected:
            continue
        path = tmp_path / f"{trial}.usearch"
        path.write_bytes(bytes(damaged))
        accepted.append(path)
    assert 0 < len(accepted) < 1500  # vector bytes and padding slots are harmless; most damage is not
    child = (
        "import sys, numpy as np\n"
        "from usearch.index import Index\n"
        "for p in sys.argv[1:]:\n"
        "    for view in (True, False):\n"
        "        ix = Index.restore(p, view=view)\n"
        "        q = np.arange(8, dtype=np.int8)\n"
        "        ix.search(q, 10); ix.search(np.stack([q, -q]), 60)\n"
        "print('ok', len(sys.argv) - 1)\n"
    )
    done = subprocess.run([sys.executable, "-c", child, *map(str, accepted)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == f"ok {len(accepted)}", done.stderr[-2000:]
