"""Repair a damaged store: keep every readable fact, quarantine what cannot be read, rebuild what is derived.

Two ways, chosen by what the damage allows:
- in place (`MemoryStore.repair()` on a store that opens): one write transaction, safe while other processes
  keep the store open. Damaged fact rows are fixed from their change log (timestamps, tags, source, text) or
  quarantined in the `quarantine` table with the reason and their original values; damaged vectors are cleared
  and embedded again; tag rows and the full-text index are rebuilt; then the HNSW index.
- salvage (`repair_store(path)`, `evermind repair PATH`, or `repair()` when SQLite's own integrity check still
  fails): needs the store to itself (no other writer: StoreLocked otherwise). The damaged files are first copied
  into `<db>.damaged-<time>/` (kept: nothing is deleted); the readable rows are read from that copy, page
  failures stepped over, facts whose rows are lost restored from the change log, into a new file that then
  takes the store's name. The index sidecars move aside too (a cache: rebuilt on open).

Afterwards the store is opened with the embedder given, facts without a vector are embedded, and the report says
what was kept, fixed, quarantined and restored.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._atomic import fsync_dir
from ..errors import EvermindError, InvalidInput, StoreCorrupt, StoreLocked
from .backend.sqlite_repair import RepairCounts


@dataclass(frozen=True)
class RepairReport:
    """What a repair did.

    Attributes:
        path: the store's database file.
        mode: "in place", "salvaged" (rows copied into a new file) or "nothing to repair".
        facts: facts in the store afterwards.
        fixed: fact rows kept with a field repaired (from the change log, or U+FFFD for undecodable bytes).
        quarantined: fact rows that could not be kept: moved to the `quarantine` table with the reason.
        restored: facts whose row was lost, restored from the change log (salvage).
        vectors_cleared: damaged vectors cleared and embedded again.
        unreadable_reads: reads of the damaged file that failed and were stepped over (salvage).
        indexed: vectors in the rebuilt index.
        kept_aside: the folder holding the damaged original files (salvage), else None.
        problems_before, problems_after: what check() (or opening) reported before and after.
        notes: the first repairs, row by row.
    """

    path: str
    mode: str
    facts: int = 0
    fixed: int = 0
    quarantined: int = 0
    restored: int = 0
    vectors_cleared: int = 0
    unreadable_reads: int = 0
    indexed: int = 0
    kept_aside: str | None = None
    problems_before: tuple[str, ...] = ()
    problems_after: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """Whether the store passes check() now."""
        return not self.problems_after


def report_of(path: str, mode: str, counts: RepairCounts, store: Any, before: tuple[str, ...],
              kept_aside: str | None = None) -> RepairReport:
    """The report of a repair whose store is open (and caught up) as `store`."""
    after = store.check()
    return RepairReport(path=path, mode=mode, facts=after.facts, fixed=counts.fixed, quarantined=counts.quarantined,
                        restored=counts.restored_from_log, vectors_cleared=counts.vectors_cleared,
                        unreadable_reads=counts.unreadable_pages, indexed=after.indexed, kept_aside=kept_aside,
                        problems_before=tuple(before), problems_after=after.problems, notes=tuple(counts.reasons))


def repair_store(path: str | os.PathLike, embedder: Any = None, **options: Any) -> RepairReport:
    """Repair the store at `path`, whether or not it opens (see the module docstring).

    Args:
        path: the database file.
        embedder: the embedder the store is used with (None: the shipped model); it embeds the facts whose
            vectors were damaged or lost.
        options: passed to MemoryStore (index_config, durability, busy_timeout).
    Returns:
        RepairReport.
    Raises:
        InvalidInput: `path` is not a text path (None, bytes, empty, NUL), or no file is there.
        StoreLocked: salvage is needed and another process has the store open.
        StoreCorrupt: the file is not an SQLite database and nothing beside it says it was a store (repair leaves
            it alone), or salvage could not produce a sound file (the original is untouched).
    """
    from .backend.base import is_server_url
    from .memory_store import MemoryStore
    from .validate import check_path

    path = check_path(path, "path", "repair_store")
    if is_server_url(path):  # a server keeps its pages sound: only the rows can need repair
        with MemoryStore(path, embedder, **options) as store:
            return store.repair()
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        raise InvalidInput(f"repair found no store file at {real}.")
    try:
        store = MemoryStore(real, embedder, **options)
    except StoreCorrupt as exc:
        if exc.part == "database header" and "show it was" not in str(exc) and "shorter" not in str(exc) \
                and "page size" not in str(exc):
            raise StoreCorrupt(f"{real} is not an SQLite database and nothing beside it says it was an evermind store; "
                               "repair leaves it alone. Choose another path.", path=real, part=exc.part) from None
        return salvage_store(real, embedder, (str(exc),), **options)
    with store:
        return store.repair()


def salvage_store(real: str, embedder: Any, before: tuple[str, ...], **options: Any) -> RepairReport:
    """Copy the damaged files aside, rebuild the store from their readable rows, swap it in, open and embed.

    Raises:
        StoreLocked: another process has the store open.
        StoreCorrupt: the rebuilt file failed its integrity check (the original is left as it was).
    """
    from .backend.sqlite import salvage_into  # (here: sqlite-utils loads only when a store is opened or salvaged)
    from .memory_store import MemoryStore

    p = Path(real)
    lock = _exclusive(real)
    try:
        aside = p.with_name(f"{p.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}")
        aside.mkdir()
        for suffix in ("", "-wal"):
            if os.path.exists(real + suffix):
                shutil.copy2(real + suffix, aside / (p.name + suffix))
        work = aside / (p.name + ".work")  # the copy salvage reads (its header may be patched): the kept one stays
        shutil.copy2(real, work)
        if os.path.exists(real + "-wal"):
            shutil.copy2(real + "-wal", str(work) + "-wal")
        new = p.with_name(f"{p.name}.repair-{secrets.token_hex(4)}.tmp")
        try:
            counts, found = salvage_into(str(work), str(new), real, _stored_dim(str(work), embedder))
            if found != ["ok"]:
                raise StoreCorrupt(f"{real}: repair could not build a sound copy ({'; '.join(found[:3])}); the store "
                                   f"was left as it was, with a copy in {aside}.", path=real)
            for suffix in ("-wal", "-shm"):  # a stale WAL beside the new file would be replayed into it
                if os.path.exists(real + suffix):
                    os.replace(real + suffix, aside / (p.name + suffix + ".old"))
            for side in [p.with_name(p.name + ".json"), *p.parent.glob(p.name + ".*.hnsw")]:
                if side.is_file():
                    os.replace(side, aside / side.name)
            os.replace(new, real)
            fsync_dir(p.parent)
        finally:
            for leftover in (new, Path(str(new) + ".lock"), Path(str(new) + "-wal"), Path(str(new) + "-shm"),
                             work, Path(str(work) + "-wal"), Path(str(work) + "-shm")):
                leftover.unlink(missing_ok=True)
    finally:
        os.close(lock)
    with MemoryStore(real, embedder, **options) as store:
        try:
            store.flush()  # facts whose vectors were lost are embedded now
        except EvermindError:
            pass  # the embedder failed on some: check() reports them below
        return report_of(real, "salvaged", counts, store, before, kept_aside=str(aside))


def _exclusive(real: str) -> int:
    """Hold `<db>.lock` exclusively (every open writer holds it shared), so no writer is open during a salvage.

    Raises:
        StoreLocked: a writer has the store open.
    """
    import fcntl

    fd = os.open(real + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        import shlex

        raise StoreLocked(f"{real} needs repair from its files, and another process has it open; close every process "
                          f"using it (MCP servers, scripts), then run `evermind repair {shlex.quote(real)}` again."
                          ) from None
    return fd


def _stored_dim(path: str, embedder: Any) -> int:
    """The vector length of the store's vectors: meta "dim", else the embedder's."""
    try:
        conn = sqlite3.connect(Path(path).as_uri() + "?mode=ro", uri=True)
        try:
            raw = conn.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
        finally:
            conn.close()
        if raw is not None and str(raw[0]).isdigit():
            return int(raw[0])
    except sqlite3.Error:
        pass
    if embedder is None:
        from .generations import resolve_embedder

        embedder = resolve_embedder(None)
    return int(embedder.dimensions)
