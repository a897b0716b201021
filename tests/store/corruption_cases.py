"""Index / manifest corruption variants for test_corruption.py, run inside a child process.

Each variant damages or forges the files of a closed store (a usearch int8 graph `<db>.<token>.usearch`, its
groups file `<db>.<token>.groups` and the manifest `<db>.json`); reopening must detect it (status "rebuilt") or
replay it (status "loaded"), never crash, and end with a store that passes check() and recalls like exact
search over the vectors in SQLite.

"forged_*" variants re-sign the manifest (size + sha256) after changing the graph file, so only the parse
(usearch_file.py: the matrix shape, the dense and graph headers, the levels, the neighbour lists, the keys) or the
load (keys against the watermark and the groups file) can tell: those are "rebuilt" at open. A forgery that keeps
the file's structure and changes only the vectors the graph holds for its facts ("verify": a flipped high bit, an
all-zero row, every vector negated, two nodes' vectors swapped) is trusted at open (its manifest matches the
database); check()'s full comparison with SQLite finds it and rebuilds the index (as the background pass does). A
structurally valid file whose bytes no longer match the manifest's sha256 ("hash") loads too, and the hash,
compared after the open, finds it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import sys
from pathlib import Path
from typing import Callable

import numpy as np

STEM = "m.db"


def _manifest(d: Path) -> dict:
    return json.loads((d / f"{STEM}.json").read_text())


def _write_manifest(d: Path, m: dict) -> None:
    (d / f"{STEM}.json").write_text(json.dumps(m))


def _set(key: str, value) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        m = _manifest(d)
        m[key] = value
        _write_manifest(d, m)
    return apply


def _index_path(d: Path) -> Path:
    return d / _manifest(d)["file"]


def _raw_index(mutate: Callable[[bytearray, dict], bytes | bytearray | None], *, fix_manifest: bool = True):
    """Mutate the index bytes; optionally re-sign the manifest (size + sha256) so only deeper checks can tell."""
    def apply(d: Path) -> None:
        m = _manifest(d)
        path = d / m["file"]
        data = bytearray(path.read_bytes())
        out = mutate(data, m)
        data = bytearray(out) if out is not None else data
        path.write_bytes(bytes(data))
        if fix_manifest:
            m["size"] = len(data)
            m["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
            _write_manifest(d, m)
    return apply


FREE_KEY = 2**64 - 1  # usearch's key of a removed slot


class _Usearch:
    """Where things are in a usearch 2.26.6 index file (the layout in evermind_memory/store/usearch_file.py's
    docstring), read here on its own so the forgeries do not lean on the parser they attack: the int8 vectors
    from byte 8 (slot i at 8 + i * dim), the dense header at `dense`, the graph header (size, connectivity,
    connectivity_base, max_level, entry_slot: u64 each) at `graph`, the levels (i16 a slot) at `levels_at`, then
    the node records (key u64, level i16, level-0 list: u32 count + 2M u32 slots, upper lists: u32 count + M u32
    slots each) at `starts`."""

    def __init__(self, data: bytearray) -> None:
        self.rows, self.dim = struct.unpack_from("<II", data, 0)
        self.dense = 8 + self.rows * self.dim
        self.graph = self.dense + 64
        self.size, self.conn, self.conn_base, self.max_level, self.entry = struct.unpack_from("<5Q", data, self.graph)
        self.levels_at = self.graph + 40
        self.levels = np.frombuffer(bytes(data), dtype="<i2", count=self.size, offset=self.levels_at).astype(int)
        self.base, self.upper = 10 + 4 + 4 * self.conn_base, 4 + 4 * self.conn
        sizes = self.base + self.upper * self.levels  # (N,)
        self.starts = self.levels_at + 2 * self.size + np.cumsum(sizes) - sizes  # (N,) each node record's offset
        assert int(self.starts[-1] + sizes[-1]) == len(data), "not a usearch file of the expected layout"
        self.keys = [struct.unpack_from("<Q", data, int(at))[0] for at in self.starts]  # (N,) slot order

    def vector_at(self, slot: int) -> int:
        return 8 + slot * self.dim

    def key_at(self, slot: int) -> int:
        return int(self.starts[slot])

    def list_at(self, slot: int, level: int = 0) -> int:
        """The offset of a node's neighbour list (its u32 count) on `level`."""
        return int(self.starts[slot]) + 10 + (0 if level == 0 else self.base - 10 + self.upper * (level - 1))

    def live(self) -> list[int]:
        return [slot for slot, key in enumerate(self.keys) if key != FREE_KEY]

    def removed(self) -> list[int]:
        return [slot for slot, key in enumerate(self.keys) if key == FREE_KEY]

    def live_on_level0(self) -> int:
        """The first live slot that has no upper levels."""
        return next(slot for slot in self.live() if self.levels[slot] == 0)


def _put(data: bytearray, fmt: str, offset: int, value: int) -> None:
    struct.pack_into(fmt, data, offset, value)


def _add(data: bytearray, fmt: str, offset: int, delta: int) -> None:
    struct.pack_into(fmt, data, offset, struct.unpack_from(fmt, data, offset)[0] + delta)


def _matrix_rows(data: bytearray, m: dict) -> None:
    _add(data, "<I", 0, 1)  # every offset after the vectors moves: the dense header is read out of place


def _vector_width(data: bytearray, m: dict) -> None:
    _add(data, "<I", 4, 1)


def _version(data: bytearray, m: dict) -> None:
    _add(data, "<H", _Usearch(data).dense + 11, 1)  # 2.26.6 -> 2.26.7


def _present_count(data: bytearray, m: dict) -> None:
    _add(data, "<Q", _Usearch(data).dense + 17, 1)  # count_present + count_deleted no longer = rows


def _removed_count(data: bytearray, m: dict) -> None:
    u = _Usearch(data)  # the counts still add up, but the nodes hold another number of removed slots
    _add(data, "<Q", u.dense + 17, -1)
    _add(data, "<Q", u.dense + 25, 1)


def _graph_field(field: int, value: Callable[[int], int]):
    """Set one of the graph header's u64 fields (0 size, 1 connectivity, 2 connectivity_base, 3 max_level,
    4 entry_slot) to value(its old value)."""
    def mutate(data: bytearray, m: dict) -> None:
        at = _Usearch(data).graph + 8 * field
        _put(data, "<Q", at, value(struct.unpack_from("<Q", data, at)[0]))
    return mutate


def _entry_low(data: bytearray, m: dict) -> None:
    u = _Usearch(data)  # an entry slot in range, but on level 0 below the graph's top
    _put(data, "<Q", u.graph + 32, u.live_on_level0())


def _level(value: int):
    """A live level-0 node's entry in the levels array set to `value` (its record still says 0)."""
    def mutate(data: bytearray, m: dict) -> None:
        u = _Usearch(data)
        _put(data, "<h", u.levels_at + 2 * u.live_on_level0(), value)
    return mutate


def _node_level(data: bytearray, m: dict) -> None:
    u = _Usearch(data)  # the node record's own level disagrees with the levels array
    _put(data, "<h", u.key_at(u.live_on_level0()) + 8, 1)


def _neighbour_far(data: bytearray, m: dict) -> None:
    u = _Usearch(data)  # node 0's first level-0 neighbour (made used if the list was empty) points far away
    # (slot 0 is a removed slot in these stores: usearch keeps its links and search still walks through it)
    at = u.list_at(0)
    _put(data, "<I", at, max(1, struct.unpack_from("<I", data, at)[0]))
    _put(data, "<I", at + 4, 10**7)


def _neighbour_overfull(data: bytearray, m: dict) -> None:
    u = _Usearch(data)  # a live node's level-0 list claims one slot more than it has room for (usearch would
    _put(data, "<I", u.list_at(u.live()[0]), u.conn_base + 1)  # read the next node's bytes as neighbours)


def _upper_neighbour_low(data: bytearray, m: dict) -> None:
    u = _Usearch(data)  # the entry node's level-1 list names a node that only lives on level 0
    at = u.list_at(int(u.entry), 1)
    _put(data, "<I", at, max(1, struct.unpack_from("<I", data, at)[0]))
    _put(data, "<I", at + 4, int(np.flatnonzero(u.levels == 0)[0]))


def _key(slot: Callable[[_Usearch], int], key: Callable[[_Usearch], int]):
    """Set the key (u64, in its node record) of slot(layout) to key(layout)."""
    def mutate(data: bytearray, m: dict) -> None:
        u = _Usearch(data)
        _put(data, "<Q", u.key_at(slot(u)), key(u))
    return mutate


def _forgotten_label(u: _Usearch) -> int:
    """A label the store once held and forgot: not a live key (the removed slots' keys are gone, so the
    smallest positive label no live slot holds; the stores here forget their first facts)."""
    live = {u.keys[s] for s in u.live()}
    return next(label for label in range(1, 10**6) if label not in live)


def _removed_to_live(data: bytearray, m: dict) -> None:
    u = _Usearch(data)  # a removed slot comes back under the label it was forgotten as; the counts are fixed up
    _put(data, "<Q", u.key_at(u.removed()[0]), _forgotten_label(u))
    _add(data, "<Q", u.dense + 17, 1)
    _add(data, "<Q", u.dense + 25, -1)
    m["live"] += 1


def _live_to_removed(fix_live: bool):
    """A live slot's key set to the free key and the header's counts fixed up (and, with fix_live, the
    manifest's live count too), so the graph adds up but has lost a node the groups file still lists."""
    def mutate(data: bytearray, m: dict) -> None:
        u = _Usearch(data)
        _put(data, "<Q", u.key_at(u.live()[3]), FREE_KEY)
        _add(data, "<Q", u.dense + 17, -1)
        _add(data, "<Q", u.dense + 25, 1)
        if fix_live:
            m["live"] -= 1
    return mutate


def _flip_high_bit(data: bytearray, slot: int) -> None:
    """Bit 6 of the largest component (+-127 in every row we write) of a slot's int8 vector: the step moves by
    64 (127 -> 63, -127 -> -63), far beyond check()'s tolerance (index_nodes.NEAR_TOL, 8e-3 a unit component;
    one step of a row is its largest component / 127, so a low bit could stay within it)."""
    u = _Usearch(data)
    row = np.frombuffer(bytes(data), dtype=np.int8, count=u.dim, offset=u.vector_at(slot))
    data[u.vector_at(slot) + int(np.argmax(np.abs(row)))] ^= 0x40


def _bitflip_vector(data: bytearray, m: dict) -> None:
    live = _Usearch(data).live()
    _flip_high_bit(data, live[len(live) // 2])


def _zero_vector(data: bytearray, m: dict) -> None:
    u = _Usearch(data)  # int8 has no NaN: the most degenerate row is all zeros (no direction, norm 0)
    at = u.vector_at(u.live()[7])
    data[at:at + u.dim] = bytes(u.dim)


def _negate_vectors(data: bytearray, m: dict) -> None:
    u = _Usearch(data)  # every slot's vector negated (we write steps in [-127, 127]: clip keeps -128 out)
    rows = np.frombuffer(bytes(data), dtype=np.int8, count=u.rows * u.dim, offset=8).astype(np.int16)
    data[8:8 + u.rows * u.dim] = np.clip(-rows, -127, 127).astype(np.int8).tobytes()


def _swap_vectors(data: bytearray, m: dict) -> None:
    u = _Usearch(data)  # two live nodes trade vectors: each of their facts would get the other's
    a, b = (u.vector_at(s) for s in u.live()[2:4])
    data[a:a + u.dim], data[b:b + u.dim] = data[b:b + u.dim], data[a:a + u.dim]


def _dense_header_flip(data: bytearray, m: dict) -> None:
    data[_Usearch(data).dense + 2] ^= 1  # the magic "usearch" -> "usdarch"


def _trailing(data: bytearray, m: dict) -> bytes:
    return bytes(data) + b"\x00" * 16


def _truncate(fraction: float):
    def mutate(data: bytearray, m: dict) -> bytes:
        return bytes(data[: int(len(data) * fraction)])
    return mutate


def _unlink(kind: str) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        (d / f"{STEM}.json" if kind == "manifest" else _index_path(d)).unlink()
    return apply


def _write_manifest_bytes(data: bytes) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        (d / f"{STEM}.json").write_bytes(data)
    return apply


def _index_is_directory(d: Path) -> None:
    p = _index_path(d)
    p.unlink()
    p.mkdir()


def _index_symlink(d: Path) -> None:
    p = _index_path(d)
    target = d / "elsewhere.bin"
    p.rename(target)
    p.symlink_to(target)


def _nan_in_manifest(d: Path) -> None:
    text = (d / f"{STEM}.json").read_text().replace('"dim": ', '"dim": NaN, "x": ', 1)
    (d / f"{STEM}.json").write_text(text)


def _older_generation(d: Path) -> None:
    saved = d / "older"
    m = json.loads((saved / f"{STEM}.json").read_text())
    for p in [*d.glob(f"{STEM}.*.usearch"), *d.glob(f"{STEM}.*.hnsw"), *d.glob(f"{STEM}.*.groups")]:
        p.unlink()
    for name in (m["file"], _groups_name(m["file"]), f"{STEM}.json"):
        shutil.copy(saved / name, d / name)


def _groups_name(index_file: str) -> str:
    return index_file[: -len(".usearch")] + ".groups"  # "<db>.<token>.usearch" -> "<db>.<token>.groups"


def _raw_groups(mutate: Callable[[np.ndarray], np.ndarray]):
    """Rewrite the groups file's (label, node) rows and re-sign the manifest, so only deeper checks can tell."""
    def apply(d: Path) -> None:
        m = _manifest(d)
        path = d / _groups_name(m["file"])
        rows = mutate(np.frombuffer(path.read_bytes(), dtype="<i8").reshape(-1, 2).copy())
        data = np.ascontiguousarray(rows, dtype="<i8").tobytes()
        path.write_bytes(data)
        m["groups_size"], m["groups_sha256"] = len(data), hashlib.sha256(data).hexdigest()
        m["live"] = len(rows)
        _write_manifest(d, m)
    return apply


def _swap_nodes(rows: np.ndarray) -> np.ndarray:
    rows[[3, 40], 1] = rows[[40, 3], 1]  # two facts claim each other's node: each would get the other's vector
    return rows


def _groups_unlink(d: Path) -> None:
    (d / _groups_name(_manifest(d)["file"])).unlink()


# name -> (damage, expected status prefix)
VARIANTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "manifest_missing": (_unlink("manifest"), "rebuilt"),
    "index_missing": (_unlink("index"), "rebuilt"),
    "manifest_empty": (_write_manifest_bytes(b""), "rebuilt"),
    "manifest_truncated": (lambda d: (d / f"{STEM}.json").write_bytes((d / f"{STEM}.json").read_bytes()[:40]),
                           "rebuilt"),
    "manifest_not_object": (_write_manifest_bytes(b"[1, 2, 3]"), "rebuilt"),
    "manifest_huge": (_write_manifest_bytes(b"{" + b" " * 100_000 + b"}"), "rebuilt"),
    "manifest_nan": (_nan_in_manifest, "rebuilt"),
    "manifest_binary": (_write_manifest_bytes(bytes(range(256))), "rebuilt"),
    "manifest_wrong_format": (_set("format", "evermind-usearch 999"), "rebuilt"),
    "manifest_hnsw_format": (_set("format", "evermind-hnsw 2"), "rebuilt"),  # (an earlier release's manifest)
    "manifest_other_fingerprint": (_set("fingerprint", "evermind-lm/x/00000000"), "rebuilt"),
    "manifest_other_store": (_set("store_id", "0" * 32), "rebuilt"),
    "manifest_wrong_dim": (_set("dim", 64), "rebuilt"),
    "manifest_wrong_M": (_set("M", 32), "rebuilt"),
    "manifest_future_watermark": (_set("watermark", 10**9), "rebuilt"),
    "manifest_negative_watermark": (_set("watermark", -1), "rebuilt"),
    "manifest_watermark_string": (_set("watermark", "5"), "rebuilt"),
    "manifest_path_escape": (_set("file", "../m.db.evil.usearch"), "rebuilt"),
    "manifest_hnsw_file": (lambda d: _set("file", _manifest(d)["file"][: -len(".usearch")] + ".hnsw")(d),
                           "rebuilt"),
    "manifest_wrong_size": (lambda d: _set("size", _manifest(d)["size"] + 1)(d), "rebuilt"),
    "manifest_wrong_sha": (_set("sha256", "0" * 64), "hash"),
    "manifest_wrong_count": (lambda d: _set("count", _manifest(d)["count"] + 1)(d), "rebuilt"),
    "manifest_wrong_live": (lambda d: _set("live", _manifest(d)["live"] - 1)(d), "rebuilt"),
    "index_truncated_half": (_raw_index(_truncate(0.5), fix_manifest=False), "rebuilt"),
    "index_truncated_to_zero": (_raw_index(_truncate(0.0), fix_manifest=False), "rebuilt"),
    "index_bitflip_header": (_raw_index(_dense_header_flip, fix_manifest=False), "rebuilt"),
    "index_bitflip_body": (_raw_index(_bitflip_vector, fix_manifest=False), "hash"),  # (valid structure)
    "index_is_directory": (_index_is_directory, "rebuilt"),
    "index_symlink": (_index_symlink, "rebuilt"),
    # forged: the manifest re-signed (size + sha256), so only the parse, the load or check() can tell
    "forged_matrix_rows": (_raw_index(_matrix_rows), "rebuilt"),
    "forged_vector_width": (_raw_index(_vector_width), "rebuilt"),
    "forged_version": (_raw_index(_version), "rebuilt"),
    "forged_present_count": (_raw_index(_present_count), "rebuilt"),
    "forged_removed_count": (_raw_index(_removed_count), "rebuilt"),
    "forged_graph_size": (_raw_index(_graph_field(0, lambda v: v + 1)), "rebuilt"),
    "forged_connectivity": (_raw_index(_graph_field(1, lambda v: v + 4)), "rebuilt"),
    "forged_connectivity_base": (_raw_index(_graph_field(2, lambda v: v + 4)), "rebuilt"),
    "forged_max_level": (_raw_index(_graph_field(3, lambda v: 2**40)), "rebuilt"),
    "forged_entry_slot": (_raw_index(_graph_field(4, lambda v: 10**7)), "rebuilt"),
    "forged_entry_level": (_raw_index(_entry_low), "rebuilt"),
    "forged_level": (_raw_index(_level(2**14)), "rebuilt"),
    "forged_negative_level": (_raw_index(_level(-1)), "rebuilt"),
    "forged_node_level": (_raw_index(_node_level), "rebuilt"),
    "forged_neighbour_ids": (_raw_index(_neighbour_far), "rebuilt"),
    "forged_neighbour_count": (_raw_index(_neighbour_overfull), "rebuilt"),
    "forged_upper_neighbour": (_raw_index(_upper_neighbour_low), "rebuilt"),
    "forged_truncated": (_raw_index(_truncate(0.7)), "rebuilt"),
    "forged_trailing_bytes": (_raw_index(_trailing), "rebuilt"),
    "forged_bitflip_body": (_raw_index(_bitflip_vector), "verify"),
    "forged_future_label": (_raw_index(_key(lambda u: u.live()[0], lambda u: 10**9)), "rebuilt"),
    "forged_negative_label": (_raw_index(_key(lambda u: u.live()[0], lambda u: 2**63)), "rebuilt"),
    "forged_live_label_swapped_out": (_raw_index(_key(lambda u: u.live()[10], lambda u: u.keys[u.live()[20]])),
                                      "rebuilt"),  # (the key twice)
    "forged_forgotten_label": (_raw_index(_key(lambda u: u.live()[10], _forgotten_label)), "rebuilt"),
    "forged_zero_vector": (_raw_index(_zero_vector), "verify"),
    "forged_other_vectors": (_raw_index(_negate_vectors), "verify"),
    "forged_vectors_swapped": (_raw_index(_swap_vectors), "verify"),
    "forged_deleted_flag": (_raw_index(_live_to_removed(fix_live=True)), "rebuilt"),
    "forged_deleted_flag_live_kept": (_raw_index(_live_to_removed(fix_live=False)), "rebuilt"),
    "forged_undeleted": (_raw_index(_removed_to_live), "rebuilt"),
    "older_generation": (_older_generation, "loaded (replayed"),
    "groups_missing": (_groups_unlink, "rebuilt"),
    "groups_truncated": (_raw_groups(lambda rows: rows[:-1]), "rebuilt"),
    "groups_nodes_swapped": (_raw_groups(_swap_nodes), "verify"),
    "groups_unordered": (_raw_groups(lambda rows: rows[::-1]), "rebuilt"),
    "groups_foreign_node": (_raw_groups(lambda rows: np.column_stack([rows[:, 0],
                                                                      np.where(rows[:, 1] == rows[0, 1], 10**6,
                                                                               rows[:, 1])])), "rebuilt"),
}


def _background_pass(db: Path, emb, query: str) -> str:
    """Open a damaged store whose snapshot the open trusts, let the background pass run at once, and return
    info()["index_status"] once it has finished (or after 60 s)."""
    import time

    from evermind_memory import MemoryStore
    from evermind_memory.store import vectors

    vectors.VERIFY_DELAY = 0.0
    with MemoryStore(db, emb) as store:
        store.recall(query, k=3, mode="vector")  # the trusted load starts the pass
        deadline = time.monotonic() + 60
        while store.info()["index_verified"] in (None, "running") and time.monotonic() < deadline:
            time.sleep(0.02)
        return store.info()["index_status"]


def run(model_path: str, tok_path: str, workdir: str, names: list[str]) -> None:
    from evermind_memory import MemoryStore
    from evermind_memory.embedder import LMEmbedder
    from evermind_memory.lm.model import EvermindLM
    from evermind_memory.lm.tokenizer import BPETokenizer
    from store_helpers import recall_at_k

    emb = LMEmbedder(EvermindLM.load(model_path), BPETokenizer.load(tok_path))
    rng = np.random.default_rng(5)
    words = "tea coffee cat dog Paris France database agent memory river fox morning user meeting".split()
    texts = [" ".join(rng.choice(words, 4)) + f" {i}" for i in range(120)]
    queries = [" ".join(rng.choice(words, 3)) for _ in range(10)]
    for name in names:
        damage, expected = VARIANTS[name]
        d = Path(workdir) / name
        d.mkdir()
        db = d / STEM
        result = {"name": name}
        try:
            with MemoryStore(db, emb) as store:
                ids = store.remember_many(texts[:100])
                for fid in ids[:5]:
                    store.forget(fid)
            if name == "older_generation":
                (d / "older").mkdir()
                m = _manifest(d)
                for saved in (m["file"], _groups_name(m["file"]), f"{STEM}.json"):
                    shutil.copy(d / saved, d / "older" / saved)
                with MemoryStore(db, emb) as store:
                    store.remember_many(texts[100:])
                    store.forget(ids[10])
            damage(d)
            if expected in ("verify", "hash"):  # the same damage for the background pass to find (below)
                shutil.copytree(d, Path(workdir) / f"{name}.paced")
            with MemoryStore(db, emb) as store:
                status = store.info()["index_status"]
                report = store.check()
                result.update(status=status, checked_status=store.info()["index_status"], ok=report.ok,
                              problems=list(report.problems), facts=report.facts,
                              recall=recall_at_k(store, db, queries), expected=expected)
            with MemoryStore(db, emb) as store:
                result["reopen_status"] = store.info()["index_status"]
            if expected in ("verify", "hash"):
                result["paced_status"] = _background_pass(Path(workdir) / f"{name}.paced" / STEM, emb, queries[0])
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(","))
