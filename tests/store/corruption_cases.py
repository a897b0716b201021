"""Index / manifest corruption variants for test_corruption.py, run inside a child process.

Each variant damages or forges the files of a closed store; reopening must detect it (status "rebuilt") or
replay it (status "loaded"), never crash, and end with a store that passes check() and recalls like exact
search over the vectors in SQLite. A forgery that keeps the files' structure and re-signs the manifest, changing
only what vectors the graph holds for its facts ("verify"), is trusted at open (its manifest matches the
database); check()'s full comparison with SQLite finds it and rebuilds the index (as the background pass does).
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


def _layout(m: dict) -> tuple[int, int, int]:
    links0 = 2 * m["M"] * 4 + 4
    size_per = links0 + m["dim"] * 4 + 8
    return links0, size_per, links0 + m["dim"] * 4


def _neighbour_far(data: bytearray, m: dict) -> None:
    data[96 + 4:96 + 8] = (10**7).to_bytes(4, "little")
    data[96:98] = max(1, int.from_bytes(data[96:98], "little")).to_bytes(2, "little")


def _huge_max_elements(data: bytearray, m: dict) -> None:
    data[8:16] = (2**40).to_bytes(8, "little")


def _bad_size_per(data: bytearray, m: dict) -> None:
    data[24:32] = (struct.unpack_from("<Q", data, 24)[0] + 4).to_bytes(8, "little")


def _bad_count(data: bytearray, m: dict) -> None:
    data[16:24] = (struct.unpack_from("<Q", data, 16)[0] + 1).to_bytes(8, "little")


def _foreign_label(element: int, label: int):
    def mutate(data: bytearray, m: dict) -> None:
        _, size_per, label_off = _layout(m)
        start = 96 + element * size_per + label_off
        data[start:start + 8] = label.to_bytes(8, "little")
    return mutate


def _nan_vector(data: bytearray, m: dict) -> None:
    links0, _, _ = _layout(m)
    data[96 + links0:96 + links0 + 4] = struct.pack("<f", float("nan"))


def _negate_vectors(data: bytearray, m: dict) -> None:
    links0, size_per, label_off = _layout(m)
    count = struct.unpack_from("<Q", data, 16)[0]
    arr = np.frombuffer(bytes(data[96:96 + count * size_per]), dtype=np.uint8).reshape(count, size_per).copy()
    vec = arr[:, links0:label_off].copy().view("<f4")
    arr[:, links0:label_off] = (-vec).view(np.uint8)
    data[96:96 + count * size_per] = arr.tobytes()


def _flip_deleted_flag(data: bytearray, m: dict) -> None:
    data[96 + 2] ^= 1  # element 0 live <-> deleted; the manifest live count is fixed up too
    m["live"] += -1 if data[96 + 2] & 1 else 1


def _trailing(data: bytearray, m: dict) -> bytes:
    return bytes(data) + b"\x00" * 16


def _bitflip(offset_fraction: float):
    def mutate(data: bytearray, m: dict) -> None:
        data[int(len(data) * offset_fraction)] ^= 0x40
    return mutate


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
    for p in [*d.glob(f"{STEM}.*.hnsw"), *d.glob(f"{STEM}.*.groups")]:
        p.unlink()
    for name in (m["file"], _groups_name(m["file"]), f"{STEM}.json"):
        shutil.copy(saved / name, d / name)


def _groups_name(index_file: str) -> str:
    return index_file[: -len(".hnsw")] + ".groups"


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
    "manifest_wrong_format": (_set("format", "evermind-hnsw 999"), "rebuilt"),
    "manifest_other_fingerprint": (_set("fingerprint", "evermind-lm/x/00000000"), "rebuilt"),
    "manifest_other_store": (_set("store_id", "0" * 32), "rebuilt"),
    "manifest_wrong_dim": (_set("dim", 64), "rebuilt"),
    "manifest_wrong_M": (_set("M", 32), "rebuilt"),
    "manifest_future_watermark": (_set("watermark", 10**9), "rebuilt"),
    "manifest_negative_watermark": (_set("watermark", -1), "rebuilt"),
    "manifest_watermark_string": (_set("watermark", "5"), "rebuilt"),
    "manifest_path_escape": (_set("file", "../m.db.evil.hnsw"), "rebuilt"),
    "manifest_wrong_size": (lambda d: _set("size", _manifest(d)["size"] + 1)(d), "rebuilt"),
    "manifest_wrong_sha": (_set("sha256", "0" * 64), "hash"),
    "manifest_wrong_live": (lambda d: _set("live", _manifest(d)["live"] - 1)(d), "rebuilt"),
    "index_truncated_half": (_raw_index(_truncate(0.5), fix_manifest=False), "rebuilt"),
    "index_truncated_to_zero": (_raw_index(_truncate(0.0), fix_manifest=False), "rebuilt"),
    "index_bitflip_header": (_raw_index(lambda b, m: b.__setitem__(20, b[20] ^ 1), fix_manifest=False), "rebuilt"),
    "index_bitflip_body": (_raw_index(_bitflip(0.6), fix_manifest=False), "hash"),  # (valid structure)
    "index_is_directory": (_index_is_directory, "rebuilt"),
    "index_symlink": (_index_symlink, "rebuilt"),
    "forged_neighbour_ids": (_raw_index(_neighbour_far), "rebuilt"),
    "forged_max_elements": (_raw_index(_huge_max_elements), "rebuilt"),
    "forged_size_per_element": (_raw_index(_bad_size_per), "rebuilt"),
    "forged_element_count": (_raw_index(_bad_count), "rebuilt"),
    "forged_truncated": (_raw_index(_truncate(0.7)), "rebuilt"),
    "forged_trailing_bytes": (_raw_index(_trailing), "rebuilt"),
    "forged_bitflip_body": (_raw_index(_bitflip(0.6)), "verify"),  # (the flip lands in a vector)
    "forged_future_label": (_raw_index(_foreign_label(0, 10**9)), "rebuilt"),
    "forged_live_label_swapped_out": (_raw_index(_foreign_label(10, 3)), "rebuilt"),
    "forged_nan_vector": (_raw_index(_nan_vector), "rebuilt"),
    "forged_other_vectors": (_raw_index(_negate_vectors), "verify"),
    "forged_deleted_flag": (_raw_index(_flip_deleted_flag), "rebuilt"),
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
