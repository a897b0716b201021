"""Repair's SQL: audit every fact row, fix what can be fixed, quarantine what cannot, rebuild the derived tables
(full-text index, tag rows), and salvage the readable rows of a damaged file into a new one.

Nothing is dropped silently. A row that cannot be kept goes to the `quarantine` table (created on first use:
no schema version needed, older versions ignore it) with the reason and its original values; a row that can be
kept with a repair (a timestamp, tags or source taken back from its change log, undecodable bytes of its text
replaced by U+FFFD, a damaged vector cleared so the next writer embeds it again) is recorded there too. Every
removal or cleared vector is a change in the change feed, so every process's index follows.

Salvage reads a damaged database table by table, in rowid order, stepping over the pages that fail; a fact whose
row is lost but whose text is in the change log (every remember and update records it) is restored from there.
"""

from __future__ import annotations

import json
import os
import sqlite3
from datetime import datetime
from typing import Iterator

from ..scope import LEVELS
from . import vector_blobs
from .base import new_id, utc_now, utf8_text
from .codec import RepairCounts, ok_tags, ok_text
from .filter_sql import REBUILD_TAGS_SQL
from .session import INSERT_CHANGE

QUARANTINE_SQL = (
    "CREATE TABLE IF NOT EXISTS quarantine (qid INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, "
    "tbl TEXT NOT NULL, fact_id TEXT, reason TEXT NOT NULL, action TEXT NOT NULL, data TEXT NOT NULL)"
)
FACT_RAW = ("SELECT rid, id, typeof(text), CAST(text AS BLOB), tags, source, created_at, updated_at, vector, "
            "(SELECT p.fingerprint FROM fingerprints p WHERE p.id = facts.fingerprint_id), label, seq, expires_at, "
            "scope FROM facts")
MISSES_BEFORE_STOP = 4096  # salvage: consecutive missing rowids after which a table is taken as ended


def _jsonable(value: object) -> object:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return {"hex": value.encode("utf-8", "surrogateescape").hex()}
    return value


def quarantine(conn: sqlite3.Connection, table: str, fact_id: object, reason: str, action: str, row: dict) -> None:
    """Record a row's original values and what was done with it."""
    conn.execute(QUARANTINE_SQL)
    conn.execute("INSERT INTO quarantine (at, tbl, fact_id, reason, action, data) VALUES (?, ?, ?, ?, ?, ?)",
                 (utc_now(), table, fact_id if isinstance(fact_id, str) and ok_text(fact_id) else None, reason,
                  action, json.dumps({k: _jsonable(v) for k, v in row.items()}, ensure_ascii=True)))


def _ok_label(value: object) -> bool:
    """A source a read returns: any text. (The write path also refuses one of only whitespace, but an older version
    wrote such labels and reads return them: they are not damage.)"""
    return isinstance(value, str) and utf8_text(value)


def _ok_time(value: object) -> bool:
    try:
        return isinstance(value, str) and datetime.fromisoformat(value).tzinfo is not None
    except ValueError:
        return False


def _ok_scope(value: object) -> bool:
    """A scope key store/scope.py could have written ("" or level=value parts joined by "/")."""
    if not isinstance(value, str):
        return False
    if not value:
        return True
    parts = [p.partition("=") for p in value.split("/")]
    return all(sep and level in LEVELS and ok_text(v) for level, sep, v in parts)


def _log_row(conn: sqlite3.Connection, seq: int, fid: str, op: str, now: str, label: object, scope: str) -> None:
    """One change the repair makes (a reembed or a forget), in the fact's scope so its scope's history shows it."""
    conn.execute(INSERT_CHANGE, (seq, fid, op, now, None, None, None, 0, label, scope, None))


def _scope_of(conn: sqlite3.Connection, rid: int) -> str:
    row = conn.execute("SELECT scope FROM facts WHERE rid = ?", (rid,)).fetchone()
    return row[0] if row is not None and _ok_scope(row[0]) else ""


def _log_text(conn: sqlite3.Connection, fact_id: object) -> dict:
    """From a fact's change log: its latest text, tags, source and time, and its first time (what was readable)."""
    out: dict = {}
    if not ok_text(fact_id):
        return out
    try:
        rows = conn.execute("SELECT op, at, text, tags, source, scope FROM changes WHERE fact_id = ? ORDER BY seq",
                            (fact_id,)).fetchall()
    except sqlite3.DatabaseError:
        return out
    for op, at, text, tags, source, scope in rows:
        if _ok_scope(scope) and op in ("remember", "update"):
            out["scope"] = scope
        if _ok_time(at):
            out.setdefault("created_at", at)
            out["updated_at"] = at
        if op in ("remember", "update"):
            if ok_text(text):
                out["text"] = text
            if ok_tags(tags):
                out["tags"] = tags
            out["source"] = source if source is None or _ok_label(source) else out.get("source")
        if op == "forget":
            out["forgotten"] = True
    return out


def audit(conn: sqlite3.Connection, dim: int) -> Iterator[tuple[dict, list[str]]]:
    """Every fact row (raw values by column name) with what is wrong with it ([] when nothing)."""
    cols = ("rid", "id", "text_type", "text", "tags", "source", "created_at", "updated_at", "vector",
            "fingerprint", "label", "seq", "expires_at", "scope")
    for raw in conn.execute(FACT_RAW + " ORDER BY rid"):
        row = dict(zip(cols, raw))
        yield row, row_faults(row, dim)


def row_faults(row: dict, dim: int) -> list[str]:
    """What is wrong with one raw fact row (see audit)."""
    faults = []
    if not ok_text(row["id"]) or len(row["id"]) > 128:
        faults.append("id")
    text = row["text"]
    if row["text_type"] != "text" or not isinstance(text, bytes) or not ok_text(text.decode("utf-8", "replace")):
        faults.append("text")
    else:
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            faults.append("text bytes")
    if not ok_tags(row["tags"]):
        faults.append("tags")
    if row["source"] is not None and not _ok_label(row["source"]):
        faults.append("source")
    for name in ("created_at", "updated_at"):
        if not _ok_time(row[name]):
            faults.append(name)
    if row["expires_at"] is not None and not _ok_time(row["expires_at"]):
        faults.append("expires_at")
    if not _ok_scope(row["scope"]):
        faults.append("scope")
    vec, label = row["vector"], row["label"]
    if vec is not None and (not vector_blobs.intact(vec, dim) or label is None
                            or not isinstance(row["fingerprint"], str)):
        faults.append("vector")
    elif vec is None and label is not None:
        faults.append("label")
    return faults


def count_damaged(conn: sqlite3.Connection, dim: int) -> tuple[int, int, str | None]:
    """(rows a read would skip, damaged vectors, the first reason) without changing anything."""
    rows = vectors = 0
    first = None
    for row, faults in audit(conn, dim):
        readable = [f for f in faults if f not in ("vector", "label")]
        rows += bool(readable)
        vectors += "vector" in faults or "label" in faults
        if faults and first is None:
            first = f"row {row['rid']}: {', '.join(faults)}"
    return rows, vectors, first


def _next_seq(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]) + 1


def fix_rows(conn: sqlite3.Connection, dim: int, counts: RepairCounts) -> None:
    """Fix or quarantine every damaged fact row (inside the caller's transaction); each removal or cleared vector
    is logged as a change so every process's index follows."""
    now = utc_now()
    for row, faults in list(audit(conn, dim)):
        counts.scanned += 1
        if not faults:
            continue
        rid, fid = row["rid"], row["id"]
        log = _log_text(conn, fid)
        sets: dict[str, object] = {}
        reasons = []
        if "text" in faults:
            if "text" in log:
                sets["text"] = log["text"]
                reasons.append("text unreadable: restored from the change log")
            else:
                quarantine(conn, "facts", fid, f"text unreadable ({row['text_type']})", "removed", row)
                _remove(conn, rid, fid, row["label"], now)
                counts.quarantined += 1
                counts.note(f"row {rid}: text unreadable, no copy in the change log: quarantined")
                continue
        elif "text bytes" in faults:
            sets["text"] = log.get("text") or row["text"].decode("utf-8", "replace")
            reasons.append("text held bytes that are not UTF-8: " + ("restored from the change log" if "text" in log
                                                                     else "replaced by U+FFFD"))
        if "id" in faults:
            sets["id"] = new_id()
            reasons.append(f"id unreadable: now {sets['id']}")
        if "tags" in faults:
            sets["tags"] = log.get("tags", "{}")
            reasons.append("tags unreadable: " + ("restored from the change log" if "tags" in log else "cleared"))
        if "source" in faults:
            sets["source"] = log.get("source")
            reasons.append("source unreadable")
        if "expires_at" in faults:
            sets["expires_at"] = None
            reasons.append("expires_at unreadable: cleared (the fact no longer expires)")
        if "scope" in faults:
            sets["scope"] = log.get("scope", "")
            reasons.append(f"scope unreadable: now {sets['scope']!r} (from the change log, or the whole store's)")
        for name in ("created_at", "updated_at"):
            if name in faults:
                other = row["updated_at" if name == "created_at" else "created_at"]
                sets[name] = log.get(name) or (other if _ok_time(other) else now)
                reasons.append(f"{name} unreadable: now {sets[name]}")
        if "vector" in faults or "label" in faults:
            sets.update(vector=None, fingerprint_id=None, label=None, owner=None)
            reasons.append("vector damaged: cleared, to be embedded again")
            counts.vectors_cleared += 1
            if row["label"] is not None:
                _log_row(conn, _next_seq(conn), fid if ok_text(fid) else str(sets.get("id", "")), "reembed", now,
                         row["label"], str(sets.get("scope", row["scope"] if _ok_scope(row["scope"]) else "")))
        quarantine(conn, "facts", sets.get("id", fid), "; ".join(reasons), "repaired", row)
        conn.execute(f"UPDATE facts SET {', '.join(f'{k} = ?' for k in sets)} WHERE rid = ?", [*sets.values(), rid])
        if "text" in sets or "id" in sets:  # (the FTS rows are rebuilt as a whole afterwards)
            pass
        counts.fixed += 1
        counts.note(f"row {rid}: " + "; ".join(reasons))


def _remove(conn: sqlite3.Connection, rid: int, fid: object, label: object, now: str) -> None:
    scope = _scope_of(conn, rid)
    conn.execute("DELETE FROM facts WHERE rid = ?", (rid,))
    if ok_text(fid):
        conn.execute("DELETE FROM fact_tags WHERE fact_id = ?", (fid,))
        conn.execute("DELETE FROM feedback WHERE fact_id = ?", (fid,))
    _log_row(conn, _next_seq(conn), fid if ok_text(fid) else "", "forget", now,
             label if isinstance(label, int) else None, scope)


def rebuild_derived(conn: sqlite3.Connection) -> None:
    """Rebuild what is derived from the fact rows: tag rows, the full-text index, orphans, the change feed's head."""
    conn.execute("DELETE FROM fact_tags")
    conn.execute(REBUILD_TAGS_SQL)
    conn.execute("DELETE FROM feedback WHERE fact_id NOT IN (SELECT id FROM facts)")
    conn.execute("INSERT INTO facts_fts (facts_fts) VALUES ('rebuild')")
    head = conn.execute("SELECT MAX(COALESCE(MAX(label), 0), COALESCE(MAX(seq), 0)) FROM facts").fetchone()[0]
    if head > _next_seq(conn) - 1:  # the feed must stay ahead of every label, or a new one would collide
        _log_row(conn, head, "", "reembed", utc_now(), None, "")


def integrity(conn: sqlite3.Connection) -> list[str]:
    """PRAGMA integrity_check's findings (["ok"] when clean)."""
    return [r[0] for r in conn.execute("PRAGMA integrity_check(20)").fetchall()]


# ---- salvage: a damaged file's readable rows into a new store ----------------------------------------------
def _rows(conn: sqlite3.Connection, table: str, cols: str, key: str, counts: RepairCounts) -> Iterator[tuple]:
    """Every readable row of `table` in `key` order, stepping over damaged pages (each failed read counted)."""
    last = None
    try:
        for row in conn.execute(f"SELECT {key}, {cols} FROM {table} ORDER BY {key}"):
            last = row[0]
            yield row
        return
    except sqlite3.DatabaseError:
        counts.unreadable_pages += 1
    try:  # the scan broke at a damaged page: look rows up one by one past it
        top = conn.execute(f"SELECT MAX({key}) FROM {table}").fetchone()[0]
    except sqlite3.DatabaseError:
        top = None
    key_at = (last or 0) + 1
    misses = 0
    while (top is not None and key_at <= top) or (top is None and misses < MISSES_BEFORE_STOP):
        try:
            row = conn.execute(f"SELECT {key}, {cols} FROM {table} WHERE {key} = ?", (key_at,)).fetchone()
        except sqlite3.DatabaseError:
            counts.unreadable_pages += 1
            row = None
        if row is None:
            misses += 1
        else:
            misses = 0
            yield row
        key_at += 1


def open_damaged(path: str) -> sqlite3.Connection:
    """A read-only connection to a damaged copy (its WAL applied, nothing written back)."""
    from pathlib import Path

    conn = sqlite3.connect(Path(path).as_uri() + "?mode=ro", uri=True)
    conn.text_factory = lambda b: b.decode("utf-8", "surrogateescape")
    conn.execute("PRAGMA query_only = ON")
    return conn


def salvage(src: sqlite3.Connection, dst: sqlite3.Connection, counts: RepairCounts) -> None:
    """Copy every readable row of a damaged store into a new one (inside the caller's transaction on `dst`)."""
    for key, value in _rows(src, "meta", "value", "key", counts) if _has(src, "meta") else ():
        if key not in ("schema_version", "path") and isinstance(value, str) and ok_text(key):
            dst.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = "
                        "excluded.value",
                        (key, value))
    if _has(src, "changes"):
        cols = "fact_id, op, at, text, tags, source, vector_added, label_removed, " + (
            "scope, link" if _has_column(src, "changes", "scope") else "'', NULL")  # a store older than schema 4
        for row in _rows(src, "changes", cols, "seq", counts):
            try:
                dst.execute(INSERT_CHANGE, row)
            except sqlite3.Error:
                counts.note(f"change {row[0]} unreadable: left out")
    seen_ids: set[str] = set()
    if _has(src, "facts"):
        # A store of schema 6 references its fingerprints by id: read them apart (a lost page of them leaves
        # those facts' vectors without a fingerprint, cleared by the repair that follows, and the facts kept).
        by_id = dict(_rows(src, "fingerprints", "fingerprint", "id", counts)) if _has(src, "fingerprints") else None
        fp_col = "fingerprint" if by_id is None else "fingerprint_id"
        cols = (f"id, typeof(text), CAST(text AS BLOB), tags, source, created_at, updated_at, vector, {fp_col}, label, "
                "seq, ") + (
            "expires_at, pinned, scope" if _has_column(src, "facts", "scope") else "NULL, 0, ''")
        for (rid, fid, ttype, text, tags, source, created, updated, vec, fp, label, seq, expires, pinned,
             scope) in _rows(src, "facts", cols, "rid", counts):
            if by_id is not None:
                fp = by_id.get(fp)
            original = dict(rid=rid, id=fid, text_type=ttype, text=text, tags=tags, source=source, created_at=created,
                            updated_at=updated, vector=vec, fingerprint=fp, label=label, seq=seq)
            kept = (expires if _ok_time(expires) else None, 1 if pinned == 1 and not _ok_time(expires) else 0,
                    scope if _ok_scope(scope) else "")
            if isinstance(fid, str) and fid in seen_ids:
                original["id"] = fid = new_id()
                quarantine(dst, "facts", fid, "a second row with the id of another fact: given a new id", "repaired",
                           original)
            try:
                dst.execute(
                    "INSERT INTO facts (rid, id, text, tags, source, created_at, updated_at, vector, fingerprint_id, "
                    "label, seq, owner, expires_at, pinned, scope) VALUES (?, ?, CAST(? AS TEXT), ?, ?, ?, ?, ?, ?, ?, "
                    "?, NULL, ?, ?, ?)",
                    (rid, fid if isinstance(fid, str) else new_id(), text if isinstance(text, bytes) else b"",
                     tags if isinstance(tags, str) else "{}", source, created if isinstance(created, str) else "",
                     updated if isinstance(updated, str) else "", vec, _fingerprint_id(dst, fp),
                     label if isinstance(label, int) else None, seq if isinstance(seq, int) else 0, *kept))
            except sqlite3.IntegrityError:  # a label another row holds: keep the fact, embed it again
                dst.execute(
                    "INSERT INTO facts (rid, id, text, tags, source, created_at, updated_at, seq, expires_at, pinned, "
                    "scope) VALUES (?, ?, CAST(? AS TEXT), ?, ?, ?, ?, ?, ?, ?, ?)",
                    (rid, fid if isinstance(fid, str) else new_id(), text if isinstance(text, bytes) else b"",
                     tags if isinstance(tags, str) else "{}", source if isinstance(source, str) else None,
                     created if isinstance(created, str) else "", updated if isinstance(updated, str) else "",
                     seq if isinstance(seq, int) else 0, *kept))
            if isinstance(fid, str):
                seen_ids.add(fid)
            counts.salvaged += 1
    # facts whose row was lost but whose latest text is in the change log
    lost = {r[0] for r in dst.execute("SELECT DISTINCT fact_id FROM changes WHERE op IN ('remember', 'update') "
                                      "AND fact_id NOT IN (SELECT id FROM facts)")}
    for fid in sorted(lost):
        got = _log_text(dst, fid)
        if got.get("forgotten") and _last_op(dst, fid) == "forget" or "text" not in got:
            continue
        now = utc_now()
        dst.execute("INSERT INTO facts (id, text, tags, source, created_at, updated_at, seq, scope) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (fid, got["text"], got.get("tags", "{}"), got.get("source"), got.get("created_at", now),
                     got.get("updated_at", now), _next_seq(dst) - 1, got.get("scope", "")))
        quarantine(dst, "facts", fid, "its row was unreadable: restored from the change log (no vector yet)",
                   "restored", {"id": fid})
        counts.restored_from_log += 1
    for table, cols, key in (("feedback", "at, query, fact_id, useful", "id"),):
        if _has(src, table):
            for row in _rows(src, table, cols, key, counts):
                try:
                    dst.execute(f"INSERT INTO {table} (id, {cols}) VALUES (?, ?, ?, ?, ?)", row)
                except sqlite3.Error:
                    pass


def _fingerprint_id(conn: sqlite3.Connection, fingerprint: object) -> int | None:
    """The id a salvaged fact references `fingerprint` by in the new store (None for no fingerprint, or one that
    is not text: its vector is then cleared by the repair)."""
    if not isinstance(fingerprint, str) or not ok_text(fingerprint):
        return None
    row = conn.execute("SELECT id FROM fingerprints WHERE fingerprint = ?", (fingerprint,)).fetchone()
    if row is None:
        row = conn.execute("INSERT INTO fingerprints (fingerprint) VALUES (?) RETURNING id", (fingerprint,)).fetchone()
    return int(row[0])


def _has_column(conn: sqlite3.Connection, table: str, column: str) -> bool:
    try:
        return column in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
    except sqlite3.DatabaseError:
        return False


def _last_op(conn: sqlite3.Connection, fid: str) -> str | None:
    row = conn.execute("SELECT op FROM changes WHERE fact_id = ? ORDER BY seq DESC LIMIT 1", (fid,)).fetchone()
    return None if row is None else row[0]


def _has(conn: sqlite3.Connection, table: str) -> bool:
    try:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                            (table,)).fetchone() is not None
    except sqlite3.DatabaseError:
        return True  # the schema page itself is damaged: try the table anyway


def patch_header(path: str) -> bool:
    """Give a database file whose 100-byte header is damaged a plausible one (page size from the file), so SQLite
    can read its pages. Only for a copy. Returns whether it changed anything."""
    with open(path, "r+b") as fh:
        head = bytearray(fh.read(100))
        size = os.fstat(fh.fileno()).st_size
        if len(head) < 100:
            return False
        page = int.from_bytes(head[16:18], "big")
        page = 65536 if page == 1 else page
        if head[:16] == b"SQLite format 3\x00" and _sane_page(head):
            if int.from_bytes(head[28:32], "big") * page <= size:
                return False
            head[28:32] = (size // page).to_bytes(4, "big")  # a truncated file: its header promised more pages
            fh.seek(0)
            fh.write(bytes(head))
            return True
        if not _sane_page(head):
            page = 4096
        head[0:16] = b"SQLite format 3\x00"
        head[16:18] = (1 if page == 65536 else page).to_bytes(2, "big")
        head[18:24] = bytes([1, 1, 0, 64, 32, 32])
        head[28:32] = (size // page).to_bytes(4, "big")
        head[32:40] = bytes(8)  # no freelist (its pages were free anyway)
        head[44:48] = (4).to_bytes(4, "big")
        head[56:60] = (1).to_bytes(4, "big")  # UTF-8
        head[92:96] = head[24:28]
        fh.seek(0)
        fh.write(bytes(head))
    return True


def drop_lost_tables(path: str) -> int:
    """In a scratch copy of a truncated file: forget the schema entries whose root page is past its end, which
    otherwise make SQLite refuse the whole schema ("invalid rootpage"). writable_schema is used on this copy only,
    never on a store (R2). Returns how many entries were dropped."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        try:
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return 0
        except sqlite3.DatabaseError:
            pass
        pages = os.path.getsize(path) // max(1, conn.execute("PRAGMA page_size").fetchone()[0])
        conn.execute("PRAGMA writable_schema = ON")
        gone = conn.execute("DELETE FROM sqlite_master WHERE rootpage > ?", (pages,)).rowcount
        conn.execute("PRAGMA writable_schema = OFF")
        return gone
    except sqlite3.DatabaseError:
        return 0
    finally:
        conn.close()


def _sane_page(head: bytes | bytearray) -> bool:
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    return page >= 512 and not page & (page - 1)
