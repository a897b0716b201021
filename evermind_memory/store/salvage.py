"""Repair's file work: rebuild a damaged SQLite store's file from its readable rows, with the damaged files kept
aside, and the report a repair returns. Nothing here opens a MemoryStore: the front (`MemoryStore.repair()`)
and `repair_store(path)` (store/repair.py) open it around this.

salvage needs the store to itself (no other writer: StoreLocked otherwise). The damaged files are first copied
into `<db>.damaged-<time>/` (kept: nothing is deleted); the readable rows are read from that copy, page failures
stepped over, facts whose rows are lost restored from the change log, into a new file that then takes the
store's name. The index sidecars move aside too (a cache: rebuilt on open).
"""

from __future__ import annotations

import os
import secrets
import shutil
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .._atomic import fsync_dir
from ..errors import StoreCorrupt, StoreLocked
from . import postings_file
from .index_files import index_files_of
from .records import CheckReport, RepairReport

if TYPE_CHECKING:
    from ..embedder.base import Embedder
    from .backend.codec import RepairCounts


def report_of(path: str, mode: str, counts: RepairCounts, after: CheckReport, before: tuple[str, ...],
              kept_aside: str | None = None) -> RepairReport:
    """The report of a repair, from what it did (`counts`) and the store's check() afterwards (`after`)."""
    return RepairReport(path=path, mode=mode, facts=after.facts, fixed=counts.fixed, quarantined=counts.quarantined,
                        restored=counts.restored_from_log, vectors_cleared=counts.vectors_cleared,
                        unreadable_reads=counts.unreadable_pages, indexed=after.indexed, kept_aside=kept_aside,
                        problems_before=tuple(before), problems_after=after.problems, notes=tuple(counts.reasons))


def salvage(real: str, embedder: Embedder | None) -> tuple[RepairCounts, Path]:
    """Copy the damaged files aside, rebuild the store's file from their readable rows and swap it in (the caller
    then opens it and embeds what lost its vector). Returns (what the rebuild did, the folder kept aside).

    Raises:
        StoreLocked: another process has the store open.
        StoreCorrupt: the rebuilt file failed its integrity check (the original is left as it was).
    """
    from .backend.sqlite import salvage_into  # (here: sqlite-utils loads only when a store is opened or salvaged)

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
            for side in [p.with_name(p.name + ".json"), postings_file.path_for(str(p)),
                         *index_files_of(p.parent, p.name)]:
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
    return counts, aside


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


def _stored_dim(path: str, embedder: Embedder | None) -> int:
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
