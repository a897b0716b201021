"""MemoryStore's maintenance methods: rebuild_index, reembed, check, repair, backup, export, import_, sweep,
compact, stats and duplicates. They check their arguments here and hand the work to maintenance.py (and the vector
cache, generations and writer). MemoryStore inherits them; nothing else uses this class.

Whole-store work (rebuild_index, reembed, check, repair, compact) needs the handle that opened the store, not a scope
view; backup copies every fact, so it also needs an unscoped one. export, import_, sweep, stats and duplicates
act on the handle's scope.
"""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EvermindError, InvalidInput, StoreCorrupt, StoreLocked
from . import closing, maintenance
from .generations import REEMBED_BATCH
from .parts import StoreParts, connect
from .records import CheckReport, DuplicatePair, RepairReport, StoreStats
from .selection import select
from .timing import DurationArg, check_retention
from .validate import MAX_LIST_LIMIT, check_flag, check_int, check_path

if TYPE_CHECKING:
    from ..embedder.base import Embedder


class MaintenanceMethods:
    """The maintenance part of MemoryStore's public API (a mixin: it uses the store's guards and parts)."""

    _scope: str  # the handle's scope key
    _parts: StoreParts  # what the store is made of (shared with its views)

    if TYPE_CHECKING:  # MemoryStore's, the one class that mixes this in (memory_store.py)
        def _check_usable(self) -> None: ...

        def _check_writable(self, method: str) -> None: ...

        def _check_owner(self, method: str) -> None: ...

        @property
        def embedder(self) -> Embedder: ...

        def flush(self) -> None: ...

        def close(self) -> None: ...

        def __len__(self) -> int: ...

    def rebuild_index(self) -> int:
        """Rebuild the HNSW index from the vectors in SQLite and (for a writer) save it.

        Thread-safe; recalls keep using the old index until the swap.

        Returns:
            how many vectors the new index holds.
        """
        self._check_usable()
        self._check_owner("rebuild_index")
        self._parts.worker.wait()
        return self._parts.vectors.rebuild("rebuild_index() was called")

    def reembed(self, *, force: bool = False, batch_size: int = REEMBED_BATCH) -> int:
        """Re-embed facts whose vector came from another embedder (every fact with force=True).

        Resumable: each batch is one transaction, so an interrupted run continues where it stopped. Vectors of
        the serving model replace others in place (every process follows batch by batch); to change the model,
        open the store with the new embedder instead (a generation built beside the serving one).
        Thread-safe (writes are serialised; recalls continue).

        Args:
            force: re-embed every fact, not only stale ones.
            batch_size: facts per transaction.
        Returns:
            how many facts were re-embedded.
        Raises:
            StoreLocked: another process is re-embedding or building a generation right now.
        """
        self._check_writable("reembed")
        self._check_owner("reembed")
        force = check_flag(force, "force", "reembed")
        batch_size = check_int(batch_size, "batch_size", 1, 100_000, "reembed")
        with self._parts.gens.claimed() as mine:
            if not mine:
                raise StoreLocked("reembed(): another process is re-embedding this store or building a new "
                                  "generation; try again when it has finished.")
            return self._parts.gens.reembed(force=force, with_index=True, batch_size=batch_size)

    def check(self) -> CheckReport:
        """Check SQLite integrity, FTS, fact rows, vectors and the index against SQLite; report, never raise.

        A part that cannot be checked (a damaged page, a closed store) is itself reported as a problem.
        Thread-safe.

        Returns:
            CheckReport (ok is True when nothing is wrong).
        Raises:
            InvalidInput: a scope view (check the store that opened it).
        """
        self._check_owner("check")
        try:
            self._check_usable()
        except EvermindError as exc:
            return CheckReport(ok=False, problems=(str(exc),))
        early = []
        for step in ((self._parts.worker.wait,) if self._parts.access.writes else ()) + (self._parts.vectors.catch_up,):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 (reported, never raised)
                early.append(f"{type(exc).__name__}: {exc}")
        try:
            building = self._parts.gens.build_progress()
        except Exception:  # noqa: BLE001
            building = None
        report = maintenance.check(self._parts.db, self._parts.vectors, self._parts.worker, self._parts.access,
                                   building)
        if early:
            report = replace(report, ok=False, problems=tuple(early) + report.problems)
        return report

    def repair(self) -> RepairReport:
        """Repair this store: keep every readable fact, fix or quarantine damaged rows, rebuild what is derived.

        In place when SQLite's own structure is sound (one transaction; other processes may stay open): damaged
        fact rows get their fields back from the change log (or U+FFFD for undecodable bytes) or go to the
        `quarantine` table with the reason; damaged vectors are cleared and embedded again; tag rows, the
        full-text index and the HNSW index are rebuilt. When the file itself is damaged, the store is closed, its
        files copied into `<db>.damaged-<time>/`, the readable rows salvaged into a new file (facts whose rows
        are lost come back from the change log) and the store reopened: that needs every other process closed.
        See store/repair.py.

        Returns:
            RepairReport (its ok is True when check() passes afterwards).
        Raises:
            StoreLocked: salvage is needed and another process has the store open (this store stays open).
            StoreCorrupt: salvage could not build a sound file (the original is left as it was).
            InvalidInput: a scope view (repair the store that opened it).
        """
        from .salvage import report_of, salvage

        self._check_writable("repair")
        self._check_owner("repair")
        before = self.check().problems
        if not before:
            return RepairReport(path=self._parts.access.path, mode="nothing to repair", facts=len(self),
                                indexed=self._parts.vectors.current.index.live_count)
        if self._parts.access.memory:
            raise EvermindError("repair() needs a store file; an in-memory store has nothing to salvage.")
        try:
            counts, found = self._parts.db.repair_rows(self._parts.opening.dim)
        except StoreCorrupt as exc:
            counts, found = None, [str(exc)]
        mode, aside = "in place", None
        if counts is None or found != ["ok"]:
            if self._parts.access.remote:
                raise StoreCorrupt(f"{self._parts.access.path}: repair could not make the store sound "
                                   f"({'; '.join(found[:3])}); the server's own tools (pg_amcheck, a restore) are "
                                   "needed.", path=self._parts.access.path)
            embedder = self.embedder
            self.close()
            try:
                counts, aside = salvage(self._parts.access.path, embedder)
            finally:
                # this same object, on the rebuilt file (or the old one when salvage refused)
                self._parts = connect(self._parts.opening, owner=self)
            mode = "salvaged"
        else:
            self._parts.vectors.rebuild("repair()")
        try:
            self.flush()  # adopts the facts whose vectors were cleared or lost, embeds them
        except EvermindError:
            pass  # the embedder failed on some: the report's check says which
        return report_of(self._parts.access.path, mode, counts, self.check(), before,
                         kept_aside=None if aside is None else str(aside))

    def backup(self, dest: str | os.PathLike) -> Path:
        """Write a consistent copy of the database to `dest` while the store stays live (`VACUUM INTO`).

        The index is not copied (it is rebuilt on first open). Thread-safe.

        Args:
            dest: a new file path (must not exist; its directory must).
        Returns:
            the destination path.
        Raises:
            InvalidInput: dest is not a text path (None, bytes, empty, NUL), exists, or its directory is missing;
                a scoped handle (the copy holds every scope: export() writes one scope's facts).
        """
        self._check_usable()
        dest = check_path(dest, "dest", "backup")
        self._check_owner("backup")
        if self._scope:
            raise InvalidInput("backup() copies every fact of every scope; call it on a store opened without "
                               "namespace=, or export() this scope's facts.")
        return maintenance.backup(self._parts.db, dest)

    def export(self, path: str | os.PathLike) -> int:
        """Write this scope's facts as JSON lines (id, text, tags, source, created_at, updated_at, expires_at,
        pinned, scope; no vectors, no expired facts).

        Thread-safe; written to a temp file and renamed, so a crash leaves no half file.

        Args:
            path: the JSONL file to write (replaced if it exists).
        Returns:
            how many facts were written.
        Raises:
            InvalidInput: path is not a text path (None, bytes, empty, NUL), or its directory is missing.
        """
        self._check_usable()
        path = check_path(path, "path", "export")
        return maintenance.export(self._parts.db, path, select("export", self._scope))

    def import_(self, path: str | os.PathLike) -> int:
        """Add the facts of a JSONL export (ids, timestamps and scopes kept; ids already present are skipped).

        A record without a scope lands in this handle's scope; one with a scope must lie in it. One
        transaction: on any bad line nothing is imported. Thread-safe.

        Args:
            path: a file written by export().
        Returns:
            how many facts were added.
        Raises:
            InvalidInput: path is not a text path (None, bytes, empty, NUL) or no readable file; a line is not a
                valid fact (a timestamp without a zone or in the future, updated_at before created_at ...), or
                its scope is outside this handle's (the line is named).
        """
        self._check_writable("import_")
        path = check_path(path, "path", "import_")
        records = maintenance.read_export(path, self._scope)
        added = maintenance.import_records(self._parts.db, self._parts.vectors, records)
        if any(rec.expires_at is not None for rec in records):
            self._parts.start_sweeper(None)
        return added

    def sweep(self) -> int:
        """Delete this scope's expired facts now, through forget (each keeps its history).

        Reads leave expired facts out whether or not they were swept; sweeping frees their space. A writer whose
        store has expiring facts also sweeps in a background thread every minute. Thread-safe.

        Returns:
            how many facts were deleted.
        """
        self._check_writable("sweep")
        return self._parts.writer.sweep(self._scope, datetime.now(timezone.utc))

    def compact(self, *, keep_history: DurationArg = maintenance.KEEP_HISTORY, vacuum: bool = True) -> StoreStats:
        """Keep the disk bounded: sweep expired facts, delete the history of facts forgotten more than
        `keep_history` ago, merge the full-text index, VACUUM the file, rebuild the vector index without its
        deleted elements and, for a store large enough for one, write the lexical postings file afresh (a file
        older than pruned history can no longer be brought up to date; a long-lived process gets a fresh one
        without closing).

        History of live facts is never pruned; nor is the newest change (the change feed's head). A reader in
        another process whose index predates the pruned changes rebuilds it when it next catches up. VACUUM
        needs free disk space about the size of the file and waits for readers' transactions. Thread-safe
        (writes wait while it runs).

        Args:
            keep_history: seconds or a timedelta (>= 0; default 30 days): how long a forgotten fact's history
                stays readable through history().
            vacuum: give the free pages back to the file system (False: SQLite reuses them for new writes).
        Returns:
            stats() after compacting.
        Raises:
            InvalidInput: a bad keep_history or vacuum; a scope view.
        """
        self._check_writable("compact")
        self._check_owner("compact")
        keep = check_retention(keep_history, "keep_history")
        vacuum = check_flag(vacuum, "vacuum", "compact")
        self.flush()
        self._parts.sweep_expired()
        maintenance.prune_history(self._parts.db, keep)
        if vacuum:
            self._parts.db.vacuum()
            self._parts.checkpoints.now()  # the file shrinks once the WAL holding the rewritten pages is copied back
        index = self._parts.vectors.current.index
        if index.retired_count:
            self._parts.vectors.rebuild("compact() was called")
        closing.save_postings(self._parts, force=True)
        return self.stats()

    def stats(self) -> StoreStats:
        """What the store holds and its size on disk (facts counted in this scope; the rest for the whole file).

        Thread-safe.
        """
        self._check_usable()
        index = Path(self._parts.access.path).resolve() if self._parts.access.snapshot_files else None
        return maintenance.stats(self._parts.db, self._parts.vectors, select("stats", self._scope), index)

    def duplicates(self, *, tags: dict | None = None, where: dict | None = None, source: str | None = None,
                   limit: int = 100) -> list[DuplicatePair]:
        """Pairs of stored facts of which the newer repeats the older, by remember(dedup=True)'s rule. Thread-safe.

        Each newer fact of this scope (filtered as in list()) is compared with its nearest older facts of the
        same scope, tags and source, and listed once, with its best match. Forget `drop` (or supersede).

        Returns:
            list of DuplicatePair (at most `limit`, 1..100,000), in the order the newer facts were remembered.
        """
        self._check_usable()
        limit = check_int(limit, "limit", 1, MAX_LIST_LIMIT, "duplicates")
        sel = select("duplicates", self._scope, tags=tags, where=where, source=source)
        self.flush()
        with self._parts.vectors.serving() as gen:
            return maintenance.duplicate_pairs(self._parts.db, gen, sel, limit)
