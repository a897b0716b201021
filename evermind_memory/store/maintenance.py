"""Looking after a store: check (SQLite, FTS, vectors and the index against SQLite), backup, JSONL
export/import, and keeping the disk bounded: the sweeper thread that deletes expired facts, compact(), stats()
and info(). WAL checkpoints, which every write passes through, are checkpoints.py; repair is repair.py.

Disk. A forget deletes the fact's row, its tags, FTS entry and vector, but keeps its history (every
remember/update row holds the text), so a remember/forget churn grows the changes table without bound.
`compact(keep_history=...)` deletes the history of facts forgotten longer ago than that (default 30 days; 0:
all of it), runs FTS5's optimize, VACUUMs and rebuilds the index; without VACUUM, SQLite reuses the free pages,
so the file stops growing once the history is pruned. benchmarks/store_churn.py measures it.
"""

from __future__ import annotations

import json
import os
import re
import threading
import weakref
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

from .._atomic import atomic_write
from .._lazy import lazy_import
from ..errors import EvermindError, InvalidInput, StorageError
from .access import Access
from .backend.base import Backend, FactRow, NewFact, Selection, new_id, utc_now
from .damage import readable
from .embedding import VectorWorker, embed_serving
from .generations import Generations
from .index import SearchFailed
from .index_files import index_files_of
from .leases import owner_alive
from . import postings_file
from .records import CheckReport, DuplicatePair, StoreStats
from .scope import check_record_scope
from .search import EXACT_FILTER_MAX
from .timing import parse_time, time_text
from .validate import check_id, check_source, check_text, check_typed_tags
from .vectors import Generation, VectorCache
from .writer import AT_SKEW

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

if TYPE_CHECKING:
    from .parts import StoreParts

MAX_IMPORT_LINE = 1 << 20
SWEEP_INTERVAL = 60.0  # seconds between the sweeper thread's passes
SWEEP_LEASE = "sweep"
KEEP_HISTORY = timedelta(days=30)  # compact()'s default: the history of facts forgotten longer ago goes
T = TypeVar("T")
_ISO_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(\+00:00|Z)?")


def check(db: Backend, cache: VectorCache, worker: VectorWorker, access: Access,
          building: tuple[str, bool] | None = None) -> CheckReport:
    """What is wrong with the store, as a CheckReport (the caller has caught up and drained its vectors).

    Never raises: a part that cannot be checked (a damaged page fails the query) is itself a problem.
    `building` is Generations.build_progress(): a generation part way built, and whether a live process builds
    it. It is reported, not a problem: the complete current generation serves until the swap.
    """
    problems: list[str] = []
    facts = stale = waiting = top = damaged = 0
    live: set[int] | frozenset[int] = set()
    gen = cache.current

    def attempt(what: str, step: Callable[[], T]) -> T | None:
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 (check reports, never raises)
            problems.append(f"{what} failed: {exc}")
            return None

    # The full cross-check an open no longer makes (it trusts a snapshot whose manifest matches the database):
    # every label and vector of the index against SQLite; a disagreeing index is rebuilt (it is a cache), and
    # info()["index_status"] says so.
    attempt("comparing the index with SQLite", cache.verify)
    with db.write_mutex:  # a consistent view: no write of ours in between
        gen = cache.current

        def read() -> tuple:
            with db.snapshot() as r:
                found = r.integrity(cache.dim)
                return (found, r.count(), r.count_foreign(gen.fingerprint), r.waiting_owners(), r.max_seq(),
                        set(r.vectors(gen.fingerprint, cache.dim)[0].tolist()))

        got = attempt("reading the database", read)
        if got is not None:
            found, facts, stale, owners, top, truth = got
            waiting = sum(owners.values())
            if found.messages != ["ok"]:
                problems.append("sqlite integrity_check: " + "; ".join(found.messages[:5]))
            if found.foreign_key_violations:
                problems.append(f"{found.foreign_key_violations} foreign key violations")
            if found.fts_rows != facts:
                problems.append(f"FTS index has {found.fts_rows} rows for {facts} facts")
            if found.tags_out_of_sync:
                problems.append(f"{found.tags_out_of_sync} facts have tags out of sync")
            if stale and access.writes:
                problems.append(f"{stale} facts carry vectors from another embedder; call reembed()")
            # facts another live process is embedding right now are in flight, not a problem (a reader sees every
            # writer's facts before their vectors); ours, after the drain, are facts the embedder failed on
            failed = sum(n for o, n in owners.items() if o == worker.holder.token or owner_alive(o) is False)
            if failed and access.writes:
                why = f" ({worker.vector_error})" if worker.vector_error else ""
                count = f"{failed} facts have" if failed != 1 else "1 fact has"
                problems.append(f"{count} no vector, the embedder failed{why}: lexical recall only until a "
                                "reembed() succeeds")
            if truth and max(truth) > top:
                problems.append(f"the change feed (head {top}) is behind the vectors' labels (up to {max(truth)}): "
                                "a new fact would collide with an old one; repair() moves the head")
            gen = cache.current
            live = gen.index.live_labels()
            if gen.watermark >= top and live != truth:
                problems.append(f"index disagrees with SQLite ({len(truth - live)} missing, {len(live - truth)} extra)")
        rows = attempt("auditing the fact rows", lambda: db.count_damaged(cache.dim))
        if rows is not None:
            damaged, bad_vectors, first = rows
            if damaged:
                problems.append(f"{damaged} fact row{'s are' if damaged > 1 else ' is'} damaged ({first}): reads skip "
                                "them; repair() fixes or quarantines them")
            if bad_vectors and not stale:
                problems.append(f"{bad_vectors} vector{'s are' if bad_vectors > 1 else ' is'} damaged (wrong length, "
                                "not finite or not unit): left out of vector recall; repair() embeds them again")
        fts_error = attempt("the full-text integrity check", db.fts_integrity)  # readers too (on a copy)
        if fts_error is not None:
            problems.append(f"FTS integrity-check: {fts_error} (the full-text index disagrees with the fact texts; "
                            "repair() rebuilds it)")
    return CheckReport(
        ok=not problems, problems=tuple(problems), facts=facts, indexed=len(live), stale_vectors=stale,
        waiting_vectors=waiting, max_seq=top, fingerprint=gen.fingerprint,
        building=None if building is None else building[0], damaged_rows=damaged,
    )


def backup(db: Backend, dest: str | os.PathLike) -> Path:
    """`dest` (a new file) becomes a consistent copy of the database; returns its resolved path.

    Raises:
        InvalidInput: dest exists or its directory is missing.
    """
    dest_path = Path(os.fspath(dest)).resolve()
    if dest_path.exists():
        raise InvalidInput(f"backup() expected a new file, but {dest_path} exists; choose another name.")
    if not dest_path.parent.is_dir():
        raise InvalidInput(f"backup() expected the directory {dest_path.parent} to exist.")
    db.backup(str(dest_path))
    return dest_path


def export(db: Backend, path: str | os.PathLike, sel: Selection) -> int:
    """Write every fact `sel` selects as a JSON line to `path`, atomically; returns how many.

    Raises:
        InvalidInput: the directory is missing.
    """
    out = Path(os.fspath(path))
    if not out.resolve().parent.is_dir():
        raise InvalidInput(f"export() expected the directory {out.resolve().parent} to exist.")
    count = 0
    try:
        with db.snapshot() as r, atomic_write(out, text=True) as fh:
            for fact in readable(r.list_rows(-1, 0, sel), FactRow.to_fact, "export"):  # a damaged row: skipped, warned
                record = {"id": fact.id, "text": fact.text, "tags": fact.tags, "source": fact.source,
                          "created_at": fact.created_at.isoformat(timespec="microseconds"),
                          "updated_at": fact.updated_at.isoformat(timespec="microseconds"),
                          "expires_at": None if fact.expires_at is None else time_text(fact.expires_at),
                          "pinned": fact.pinned, "scope": fact.scope}
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
    except OSError as exc:
        if isinstance(exc, EvermindError):
            raise
        err = StorageError(f"export() could not write {out} ({exc.strerror or exc}); nothing was written.")
        err.errno = exc.errno
        raise err from None
    return count


def read_export(path: str | os.PathLike, scope: str = "") -> list[NewFact]:
    """The facts of a JSONL export, validated, each id once, for a handle scoped to `scope` (a record without a
    scope lands in it; one with a scope must lie in it).

    Raises:
        InvalidInput: a line is not a valid fact (the line number is named): not UTF-8, not JSON, nested too
            deeply, a bad field or timestamp; or `path` is not a readable file.
        StorageError: the operating system refused reading it.
    """
    records = []
    try:
        with open(os.fspath(path), "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                records.extend(_import_line(raw, number, scope))
    except FileNotFoundError:
        raise InvalidInput(f"import_() found no file at {os.fspath(path)!r:.200}.") from None
    except IsADirectoryError:
        raise InvalidInput(f"import_() expected a file, got the directory {os.fspath(path)!r:.200}.") from None
    except OSError as exc:
        err = StorageError(f"import_() could not read {os.fspath(path)!r:.200} ({exc.strerror or exc}).")
        err.errno = exc.errno
        raise err from None
    seen: set[str] = set()
    first = []
    for r in records:
        if r.id not in seen:
            seen.add(r.id)
            first.append(r)
    return first


def _import_line(raw: bytes, number: int, scope: str) -> list[NewFact]:
    """The fact of one export line ([] for a blank one), for a handle scoped to `scope`.

    Raises:
        InvalidInput: naming the line.
    """
    if len(raw) > MAX_IMPORT_LINE * 4:
        raise InvalidInput(f"import_() line {number} is longer than {MAX_IMPORT_LINE} characters.")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"import_() line {number} is not UTF-8 text (byte {exc.start}: "
                           f"{raw[exc.start:exc.start + 1]!r}); an export is written as UTF-8 JSON lines.") from None
    if len(line) > MAX_IMPORT_LINE:
        raise InvalidInput(f"import_() line {number} is longer than {MAX_IMPORT_LINE} characters.")
    if not line.strip():
        return []
    try:
        rec = json.loads(line)
    except RecursionError:
        raise InvalidInput(f"import_() line {number} nests JSON too deeply to be a fact.") from None
    except ValueError as exc:
        raise InvalidInput(f"import_() line {number} is not JSON ({exc}).") from None
    if not isinstance(rec, dict):
        raise InvalidInput(f"import_() line {number} expected a JSON object.")
    try:
        fid = check_id(rec.get("id")) if rec.get("id") is not None else new_id()
        text = check_text(rec.get("text"))
        tags = check_typed_tags(rec.get("tags"))
        source = check_source(rec.get("source"))
        created = check_time(rec.get("created_at"))
        updated = check_time(rec.get("updated_at"), default=created)
        if datetime.fromisoformat(created) > datetime.now(timezone.utc) + AT_SKEW:
            raise InvalidInput(f"created_at {created} lies in the future.")
        if updated < created:  # both normalised to UTC with microseconds: text order is time order
            raise InvalidInput(f"updated_at {updated} is before created_at {created}.")
        expires = rec.get("expires_at")
        expires = None if expires is None else time_text(parse_time(expires, "expires_at"))
        pinned = rec.get("pinned", False)
        if not isinstance(pinned, bool) or (pinned and expires is not None):
            raise InvalidInput("expected pinned to be true or false (and false when expires_at is set), got "
                               f"{pinned!r:.20}.")
        where = check_record_scope(rec.get("scope"), scope, "the record")
    except InvalidInput as exc:
        raise InvalidInput(f"import_() line {number}: {exc}") from None
    return [NewFact(fid, text, tags, source, created, updated, expires, pinned, where)]


def import_records(db: Backend, cache: VectorCache, records: list[NewFact]) -> int:
    """Add the records whose ids are not in the store yet, embedded, in one transaction; returns how many."""
    with db.reading() as r:
        present = set(r.fetch_where("id", [rec.id for rec in records]))
    records = [rec for rec in records if rec.id not in present]
    if not records:
        return 0
    texts = [rec.text for rec in records]
    made = embed_serving(cache, texts)
    with db.write_mutex:
        gen, vectors = embed_serving(cache, texts, made)  # (N, D), again only if the model changed meanwhile
        with db.transaction() as tx:
            Generations.require_serving(tx, gen.fingerprint, "import_")
            present = set(tx.fetch_where("id", [rec.id for rec in records]))
            keep = [i for i, rec in enumerate(records) if rec.id not in present]
            if not keep:  # another process imported them all meanwhile (an empty insert is not one on PostgreSQL)
                return 0
            before = tx.max_seq()
            labels, _ = tx.insert([records[i] for i in keep], vectors[keep], gen.fingerprint)
            top = tx.max_seq()
        cache.apply(np.array(labels, dtype=np.int64), vectors[keep], [], before, top)
    return len(keep)


def check_time(value: object, default: str | None = None) -> str:
    """An ISO 8601 UTC timestamp, normalised (None: `default`, else now).

    Raises:
        InvalidInput: not such a timestamp.
    """
    if value is None:
        return default or utc_now()
    if not isinstance(value, str) or not _ISO_RE.fullmatch(value):
        raise InvalidInput(f"expected an ISO 8601 UTC timestamp, got {value!r:.40}.")
    from datetime import datetime, timezone

    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInput(f"expected an ISO 8601 UTC timestamp, got {value!r:.40} ({exc}).") from None
    if dt.tzinfo is None:
        raise InvalidInput(f"expected a timestamp with a timezone (Z or +00:00), got {value!r:.40}: without one "
                           "its zone would be a guess.")
    return dt.astimezone(timezone.utc).isoformat(timespec="microseconds")


# ---- disk: the sweeper, compaction, stats ----------------------------------------------------------------------
class Sweeper:
    """A daemon thread that sweeps expired facts every SWEEP_INTERVAL seconds, for a writer whose store has
    facts with an expiry (started at open, or by the first remember with one).

    It holds the object whose method sweeps (the store's parts) only while sweeping, so a dropped store is still
    collected. A failed pass (SQLite refusing the write) is kept in `error` and retried at the next one; reads never
    depend on it, since they leave expired facts out themselves.

    Args:
        sweep: a bound method that makes one pass (StoreParts.sweep_expired), held through a weak reference.
        interval: seconds between passes (None: SWEEP_INTERVAL, read when the thread starts).
    """

    def __init__(self, sweep: Callable[[], int], interval: float | None = None) -> None:
        self._sweep = weakref.WeakMethod(sweep)
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    @property
    def running(self) -> bool:
        """Whether the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def start_if_needed(self, db: Backend, *, known: bool = False) -> None:
        """Start the thread unless it runs, once the store holds a fact with an expiry (`known`: one was just
        remembered; else look)."""
        if self.running:
            return
        if not known:
            with db.reading() as r:
                if not r.expired_rows(datetime.max.replace(tzinfo=timezone.utc), "", 1):
                    return
        self.start()

    def start(self) -> None:
        """Start the thread unless it runs."""
        if not self.running:
            self._stop.clear()
            self._thread = threading.Thread(target=Sweeper._run, args=(weakref.ref(self),), name="evermind-sweeper",
                                            daemon=True)
            self._thread.start()

    @staticmethod
    def _run(self_ref: "weakref.ref[Sweeper]") -> None:
        me = self_ref()
        if me is None:
            return
        stop, interval = me._stop, SWEEP_INTERVAL if me._interval is None else me._interval
        del me
        while not stop.wait(interval):
            me = self_ref()
            sweep = None if me is None else me._sweep()
            if me is None or sweep is None:
                return
            try:
                sweep()
                me.error = None
            except EvermindError as exc:
                me.error = str(exc)
            finally:
                del sweep, me

    def signal_stop(self) -> None:
        """Ask the thread to end (without waiting)."""
        self._stop.set()

    def stop(self) -> None:
        """End the thread and wait for it."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._thread = None


def prune_history(db: Backend, keep_history: timedelta) -> int:
    """Delete the history of facts forgotten more than `keep_history` ago (never the newest change); returns the
    change rows deleted. The caller has caught its cache up: caches elsewhere that lag behind rebuild."""
    before = time_text(datetime.now(timezone.utc) - keep_history)
    with db.write_mutex:
        with db.transaction() as tx:
            return tx.prune_history(before, tx.max_seq())


def summary(parts: StoreParts, facts: int, scope: dict[str, str]) -> dict:
    """MemoryStore.info(): sizes, identity, durability, the engine and its versions, the index, background work
    (`facts`: how many the handle's scope holds; `scope`: its levels)."""
    opening, access = parts.opening, parts.access
    with parts.db.reading() as r:
        top = r.max_seq()
        waiting = r.count_waiting()
        judged = r.count_feedback()
    engine = parts.db.describe()
    building = parts.gens.build_progress()
    gen = parts.vectors.current
    return {
        "path": access.path, "read_only": access.read_only, "durability": opening.durability,
        "facts": facts,
        "indexed": gen.index.live_count, "index_elements": gen.index.element_count,
        "index_status": parts.vectors.status, "index_verified": parts.vectors.verified or None,
        "index_watermark": gen.watermark, "max_seq": top,
        "fingerprint": gen.fingerprint, "dimensions": opening.dim, "store_id": parts.vectors.store_id,
        "schema_version": engine["schema_version"], "backend": engine.get("backend", "sqlite"),
        "server_version": engine.get("server_version"), "pgvector": engine.get("pgvector"),
        "notifications": engine.get("notifications"),
        "sqlite_version": engine["sqlite_version"],
        "sqlite_wal_reset_fixed": engine["sqlite_wal_reset_fixed"], "filesystem": opening.fs_type,
        "hybrid_weight": opening.hybrid_weight,
        "adapter": parts.gens.active_adapter_id(), "adaptation_pending": parts.gens.pending() is not None,
        "background_embedding": access.embeds_in_background, "waiting_vectors": waiting,
        "vector_error": parts.worker.vector_error, "feedback": judged, "checkpoints": parts.checkpoints.done,
        "building": None if building is None else building[0], "scope": scope,
        "sweep_error": parts.sweeper.error,
    }


def stats(db: Backend, cache: VectorCache, sel: Selection, index_path: Path | None) -> StoreStats:
    """The StoreStats of a store (facts counted in `sel`, the rest for the whole file)."""
    with db.snapshot() as r:
        sizes = r.sizes()
        facts = r.count_selected(sel)
    files = db.file_bytes()
    index_bytes = 0
    if index_path is not None:
        files_of_index = [*index_files_of(index_path.parent, index_path.name),
                          index_path.parent / f"{index_path.name}.json",
                          postings_file.path_for(str(index_path))]
        index_bytes = sum(p.stat().st_size for p in files_of_index if p.is_file())
    return StoreStats(facts=facts, expired=sizes["expired"], pinned=sizes["pinned"], changes=sizes["changes"],
                      forgotten=sizes["forgotten"], db_bytes=files["db"] or sizes["page_bytes"], wal_bytes=files["wal"],
                      index_bytes=index_bytes, free_bytes=sizes["free_bytes"])


def duplicate_pairs(db: Backend, gen: Generation, sel: Selection, limit: int) -> list[DuplicatePair]:
    """(older, newer) pairs among the facts `sel` selects where the newer repeats the older (store/dedup.py's
    rule), each newer fact once with its best match, in the order the newer facts were remembered.

    Facts are compared within groups of one scope, tags and source (what remember(dedup=True) compares), each
    with its NEIGHBOURS nearest older facts: exactly for groups up to EXACT_FILTER_MAX facts, through
    the index's filtered search above that.
    """
    from .dedup import NEIGHBOURS, find_duplicate  # (imported when it is used: opening a store does not need it)

    with db.snapshot() as r:
        rows = r.list_rows(-1, 0, sel)
        labels, vecs = r.vectors(gen.fingerprint, gen.index.dim, sel=sel)
    by_label = dict(zip(labels.tolist(), range(len(labels))))
    groups: dict[tuple, list] = {}
    for row in rows:
        if row.label in by_label:
            groups.setdefault((row.scope, row.tags_json, row.source), []).append(row)
    found = []
    for members in groups.values():
        if len(members) < 2:
            continue
        v = vecs[[by_label[row.label] for row in members]]  # (G, D) in insertion order
        position = {row.label: i for i, row in enumerate(members)}
        for i in range(1, len(members)):
            if len(members) <= EXACT_FILTER_MAX:
                sims = v[:i] @ v[i]  # (i,) cosine with every older member
                older = np.argsort(-sims, kind="stable")[:NEIGHBOURS].tolist()
            else:
                try:
                    near, _ = gen.index.query(v[i], NEIGHBOURS + 1, position.__contains__)
                except SearchFailed:
                    near = np.zeros(0, dtype=np.int64)
                older = [position[label] for label in near.tolist() if position[label] < i]
            best = find_duplicate(members[i].text, v[i], [(j, members[j].text, v[j]) for j in older])
            if best is not None:
                j, decision = best
                found.append((members[i].rid, DuplicatePair(
                    keep=members[j].id, drop=members[i].id, keep_text=members[j].text, drop_text=members[i].text,
                    cosine=decision.cosine, overlap=decision.overlap, reason=decision.reason)))
    found.sort(key=lambda pair: pair[0])
    return [pair for _, pair in found[:limit]]
