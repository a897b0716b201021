"""The lexical postings of a large SQLite store, saved beside the database (`<db>.postings`), so that a process
meeting a common word for the first time reads its postings in a few milliseconds instead of walking FTS5's
instance vocabulary one row at a time.

Why. Lexical and hybrid recall rank from each query word's postings (rid, count, fact length), which a session
reads at the word's first use (backend/sqlite_session.py) and then keeps current from the change feed. In a store of
a million short facts a common word ("Ada", "tea") is held by 80,000 to 400,000 facts, read at about 0.75 us a
posting: 60 to 300 ms, in every new process, for every such word it meets. That first read was the whole of lexical
and hybrid p99 at that size (benchmarks/scale.py). Here the postings of every term held by at least MIN_POSTINGS
facts are stored compactly (rid gaps, counts and lengths at the narrowest integer width that holds them, zlib),
each term a block of its own with its CRC-32, and read with one `pread`.

Consistency. The file is a cache: SQLite (FTS5) is the truth. It names the store (store_id), the change seq it is
as of and that change's fact id and time (an anchor: a database restored from a backup and written again reaches the
same seq with other changes, and is refused). A reader patches a term's saved postings with the facts remembered or
updated since (at most REPLAY_MAX changes, tokenised as FTS5 does: lexical.text_postings) and accepts the result only
if its count is FTS5's document count for the term: a fact forgotten since the file was written, an FTS index rebuilt
or anything else that disagrees sends that term back to FTS5's vocabulary, exactly as before. So a reader never ranks
from postings FTS5 does not hold.

Writing. `refresh()` rebuilds the whole file in one read transaction (about 4 us a posting: ~4 s for a million short
facts, ~0.3 s for 100,000) and replaces it atomically; MemoryStore.close() calls it, under the "postings" lease,
when the store holds at least MIN_FACTS facts and the file is missing, of another store, or REFRESH_AFTER changes
behind. compact() rewrites it as well. Validation before use (R6): magic, header size and JSON, every block's offset
and size inside the file, its CRC, its decompressed size bounded before it is decompressed, rids ascending.
"""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .._atomic import write_atomic
from .._lazy import lazy_import
from .lexical import TermPostings, instance_runs, varint_array

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

SUFFIX = ".postings"
MAGIC = b"EVPOSTS1"
FORMAT = 1
MIN_POSTINGS = 2_000  # terms held by fewer facts stay with FTS5 (a read of 2,000 postings takes ~1.5 ms)
MIN_FACTS = 20_000  # smaller stores have no file: their largest words read in a few milliseconds
REFRESH_AFTER = 2_000  # close() rewrites a file this many changes behind (readers replay at most REPLAY_MAX)
REPLAY_MAX = 5_000  # changes after the file's seq a reader tokenises and patches in (~30 us a fact)
MAX_HEADER = 64 << 20  # bytes; a larger header is refused unread
LEASE = "postings"
_HEAD = struct.Struct("<8sQ")  # magic, header length
_WIDTHS = (1, 2, 4, 8)


class FileTerm(NamedTuple):
    offset: int
    size: int  # compressed bytes
    postings: int  # how many
    crc: int  # zlib.crc32 of the compressed bytes


class Rejected(Exception):
    """The file is not usable (the message says why); readers go to FTS5."""


def path_for(db_path: str) -> Path:
    return Path(db_path + SUFFIX)


def _width(values: np.ndarray) -> int:
    top = int(values.max()) if len(values) else 0
    return next(w for w in _WIDTHS if top < 1 << (8 * w))


def encode(p: TermPostings) -> bytes:
    """One term's postings as a block: widths (3 bytes), then rid gaps, counts and lengths, zlib-compressed."""
    gaps = np.diff(p.rids, prepend=0)  # (P,) the first rid, then the steps between rids (all > 0)
    parts = [gaps, p.tf, p.lengths]
    widths = [_width(a) for a in parts]
    body = b"".join(a.astype(f"<u{w}").tobytes() for a, w in zip(parts, widths))
    return zlib.compress(bytes(widths) + body, 1)


def decode(block: bytes, count: int) -> TermPostings:
    """A block written by `encode` holding `count` postings; its size is bounded before it is inflated.

    Raises:
        Rejected: not a block of `count` postings with ascending rids.
    """
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(block, 3 + 24 * count + 1)
    except zlib.error as exc:
        raise Rejected(f"a postings block does not inflate ({exc})") from None
    if len(raw) < 3 or any(w not in _WIDTHS for w in raw[:3]):
        raise Rejected("a postings block has no valid widths")
    wg, wt, wl = raw[0], raw[1], raw[2]
    if len(raw) != 3 + count * (wg + wt + wl) or inflate.unconsumed_tail or not inflate.eof:
        raise Rejected("a postings block holds another number of postings than the header says")
    a, b = 3 + count * wg, 3 + count * (wg + wt)
    gaps = np.frombuffer(raw, dtype=f"<u{wg}", count=count, offset=3).astype(np.int64)  # (P,)
    if count and (int(gaps[1:].min(initial=1)) <= 0 or int(gaps.max()) >= 1 << 62):
        raise Rejected("a postings block's rids are not ascending")
    rids = np.cumsum(gaps)  # (P,)
    tf = np.frombuffer(raw, dtype=f"<u{wt}", count=count, offset=a).astype(np.int32)  # (P,)
    lengths = np.frombuffer(raw, dtype=f"<u{wl}", count=count, offset=b).astype(np.int32)  # (P,)
    return TermPostings(rids, tf, lengths)


class PostingsFile:
    """A validated postings file: its header, and its blocks read on demand (`read`)."""

    def __init__(self, path: Path, key: tuple, header: dict, terms: dict[str, FileTerm]) -> None:
        self.path = path
        self.key = key  # (device, inode, size, mtime_ns) when opened: a replaced file is opened again
        self.store_id: str = header["store_id"]
        self.seq: int = header["seq"]
        self.anchor: list = header["anchor"]
        self.terms = terms

    @classmethod
    def open(cls, path: Path) -> "PostingsFile":
        """Read and check the header. Raises Rejected (a missing file too: FileNotFoundError is not caught)."""
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            head = f.read(_HEAD.size)
            if len(head) != _HEAD.size:
                raise Rejected("the postings file is shorter than its header")
            magic, size = _HEAD.unpack(head)
            if magic != MAGIC or size > MAX_HEADER or _HEAD.size + size > st.st_size:
                raise Rejected("not a postings file of this version, or a header larger than the file")
            try:
                header = json.loads(f.read(size).decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise Rejected(f"the postings header is not JSON ({exc})") from None
        start = _HEAD.size + size
        if (not isinstance(header, dict) or header.get("format") != FORMAT
                or not isinstance(header.get("store_id"), str) or not _count(header.get("seq"))
                or not isinstance(header.get("anchor"), list) or not isinstance(header.get("terms"), dict)):
            raise Rejected("the postings header lacks its fields")
        terms: dict[str, FileTerm] = {}
        for term, entry in header["terms"].items():
            if not (isinstance(entry, list) and len(entry) == 4 and all(_count(v) for v in entry)):
                raise Rejected(f"the postings header's entry for {term!r:.40} is malformed")
            t = FileTerm(entry[0] + start, *entry[1:])
            if t.offset + t.size > st.st_size or t.postings > 1 << 40:
                raise Rejected(f"the postings block of {term!r:.40} lies outside the file")
            terms[term] = t
        return cls(path, file_key(st), header, terms)

    def read(self, term: str) -> TermPostings | None:
        """The term's saved postings (None: the file does not hold the term). Raises Rejected, OSError."""
        entry = self.terms.get(term)
        if entry is None:
            return None
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if file_key(os.fstat(fd)) != self.key:
                raise Rejected("the postings file was replaced")
            block = os.pread(fd, entry.size, entry.offset)
        finally:
            os.close(fd)
        if len(block) != entry.size or zlib.crc32(block) != entry.crc:
            raise Rejected(f"the postings block of {term!r:.40} fails its checksum")
        return decode(block, entry.postings)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def file_key(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def anchor(conn: sqlite3.Connection, seq: int) -> list:
    """What identifies change `seq` of this history: its fact id and time ([] for seq 0 or a pruned row)."""
    row = conn.execute("SELECT fact_id, at FROM changes WHERE seq = ?", (seq,)).fetchone()
    return [] if row is None else [str(row[0]), str(row[1])]


def build(conn: sqlite3.Connection, min_postings: int | None = None) -> bytes:
    """The file's bytes for the store on `conn` (a read connection), read in one read transaction: the terms held
    by at least `min_postings` facts (default MIN_POSTINGS)."""
    min_postings = MIN_POSTINGS if min_postings is None else min_postings
    conn.execute("BEGIN")
    try:
        seq = int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0])
        row = conn.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
        header: dict = {"format": FORMAT, "store_id": "" if row is None else str(row[0]), "seq": seq,
                        "anchor": anchor(conn, seq)}
        conn.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.postings_vocab USING fts5vocab(main, facts_fts, row)")
        conn.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.postings_instances USING fts5vocab(main, facts_fts, "
                     "instance)")
        frequent = conn.execute("SELECT term FROM temp.postings_vocab WHERE doc >= ? ORDER BY term",
                                (min_postings,)).fetchall()
        if frequent:
            ids, sizes = zip(*conn.execute("SELECT id, sz FROM facts_fts_docsize ORDER BY id").fetchall())
            doc_ids = np.fromiter(ids, dtype=np.int64, count=len(ids))  # (N,) ascending
            doc_lengths = varint_array(sizes)  # (N,)
        blocks: list[bytes] = []
        entries: dict[str, list[int]] = {}
        offset = 0
        for (term,) in frequent:
            docs = np.fromiter((d for (d,) in conn.execute(
                "SELECT doc FROM temp.postings_instances WHERE term = ?", (term,))), dtype=np.int64)  # (I,)
            first, tf = instance_runs(docs)  # (P,), (P,)
            rids = docs[first]  # (P,)
            at = np.minimum(np.searchsorted(doc_ids, rids), len(doc_ids) - 1)  # (P,)
            if len(rids) and (doc_ids[at] != rids).any():
                raise sqlite3.DatabaseError("facts_fts_docsize lacks a fact that facts_fts holds")
            p = TermPostings(rids, tf, doc_lengths[at].astype(np.int32))
            block = encode(p)
            entries[term] = [offset, len(block), len(rids), zlib.crc32(block)]
            blocks.append(block)
            offset += len(block)
    finally:
        conn.execute("COMMIT")
    header["terms"] = entries  # (offsets count from the end of the header)
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    return _HEAD.pack(MAGIC, len(text)) + text + b"".join(blocks)


def saved_seq(path: Path, store_id: str) -> int | None:
    """The seq of the file at `path` if it is this store's and readable, else None."""
    try:
        f = PostingsFile.open(path)
    except (OSError, Rejected):
        return None
    return f.seq if f.store_id == store_id else None


def due(db_path: str, *, facts: int, seq: int, store_id: str, force: bool = False) -> bool:
    """Whether the file of the store at `db_path` (its facts, change seq and store_id as the caller read them)
    should be written: at least MIN_FACTS facts, and `force`, no file of this store, or one REFRESH_AFTER
    changes behind. A store too small for one loses a file left from when it was larger."""
    path = path_for(db_path)
    if facts < MIN_FACTS:
        if path.exists():
            path.unlink(missing_ok=True)
        return False
    if force:
        return True
    old = saved_seq(path, store_id)
    return old is None or not 0 <= seq - old < REFRESH_AFTER


def refresh(db_path: str, min_postings: int | None = None) -> None:
    """Write the file of the store at `db_path` afresh, atomically, with the terms held by at least `min_postings`
    facts (default MIN_POSTINGS). Raises OSError, sqlite3.Error."""
    conn = sqlite3.connect(Path(db_path).as_uri() + "?mode=ro", uri=True, isolation_level=None)
    try:
        conn.execute("PRAGMA trusted_schema = OFF")
        data = build(conn, min_postings)
    finally:
        conn.close()
    write_atomic(path_for(db_path), data)
