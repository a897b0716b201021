"""Repair of a PostgreSQL store: the server keeps its pages and types sound, so what can go wrong is a row's
content (tags that are not a JSON object of labels, a vector of the wrong length or not of unit norm, a scope
key no handle could have written) and the derived rows (tag rows, full-text statistics) falling out of step
with the facts. `repair()` fixes both in the caller's transaction, recording what it did in `quarantine`, as
the SQLite repair does (the same checks of a row: backend/codec.py for its fields, backend/vector_blobs.py
for its vector).
"""

from __future__ import annotations

import json
from typing import Any

from ...errors import RowDamaged
from .base import FactRow, utc_now
from .filter_sql import tag_rows
from .postgres_session import FACT_COLS, FTS_CONFIG, PostgresSession, when
from . import vector_blobs
from .codec import RepairCounts, ok_tags

_INSERT_TAG = "INSERT INTO fact_tags (fact_id, key, value, vtype, num) VALUES (%s, %s, %s, %s, %s)"


def _rows(s: PostgresSession) -> list[tuple[FactRow, Any]]:
    """Every fact row with its raw vector bytes."""
    out = []
    with s.conn.cursor(binary=True) as cur:
        for row in cur.execute(f"SELECT {FACT_COLS}, vector FROM facts ORDER BY rid"):
            out.append((FactRow._make(row[:-1]), None if row[-1] is None else bytes(row[-1])))
    return out


def _damage(row: FactRow) -> str | None:
    try:
        row.to_fact()
    except RowDamaged as exc:
        return str(exc)
    return None


def count_damaged(s: PostgresSession, dim: int) -> tuple[int, int, str | None]:
    """(fact rows a read would skip, damaged vectors, the first reason)."""
    damaged = bad = 0
    first = None
    for row, blob in _rows(s):
        reason = _damage(row)
        if reason is not None:
            damaged += 1
            first = first or reason
        if blob is not None and not vector_blobs.intact(blob, dim):
            bad += 1
    return damaged, bad, first


def _quarantine(s: PostgresSession, row: FactRow, reason: str, action: str) -> None:
    s.conn.execute("INSERT INTO quarantine (at, tbl, fact_id, reason, action, data) VALUES (%s, 'facts', %s, %s, "
                   "%s, %s)",
                   (when(utc_now()), row.id, reason, action, json.dumps(row._asdict(), ensure_ascii=True)))


def repair(s: PostgresSession, dim: int) -> RepairCounts:
    """Fix damaged rows (tags from the change log or none, damaged vectors cleared so the facts are embedded again),
    then rebuild the tag rows and the full-text statistics from the facts. Inside a write transaction."""
    counts = RepairCounts()
    now = utc_now()
    seq = s.max_seq()
    for row, blob in _rows(s):
        counts.scanned += 1
        if not ok_tags(row.tags_json):
            logged = s.conn.execute("SELECT tags FROM changes WHERE fact_id = %s AND tags IS NOT NULL ORDER BY seq "
                                    "DESC LIMIT 1", (row.id,)).fetchone()
            tags = logged[0] if logged is not None and ok_tags(logged[0]) else "{}"
            s.conn.execute("UPDATE facts SET tags = %s WHERE rid = %s", (tags, row.rid))
            _quarantine(s, row, "tags are not a JSON object of labels", f"tags set to {tags}")
            counts.fixed += 1
            counts.note(f"fact {row.id}: tags restored")
        if blob is not None and not vector_blobs.intact(blob, dim):
            seq += 1
            s.conn.execute("UPDATE facts SET vector = NULL, label = NULL, fingerprint_id = NULL, owner = NULL, seq "
                           "= %s WHERE rid = %s", (seq, row.rid))
            s.log_changes([(seq, row.id, "reembed", when(now), None, None, None, 0, row.label, row.scope, None)])
            _quarantine(s, row, "its vector is damaged", "vector cleared: it is embedded again")
            counts.vectors_cleared += 1
            counts.note(f"fact {row.id}: damaged vector cleared")
    s.conn.execute("DELETE FROM fact_tags")
    for fid, tags in s.conn.execute("SELECT id, tags FROM facts").fetchall():
        rows = tag_rows(fid, json.loads(tags))
        if rows:
            s.conn.cursor().executemany(_INSERT_TAG, rows)
    s.conn.execute(f"UPDATE facts SET tsv = to_tsvector('{FTS_CONFIG}', evermind_fts_text(text))")
    s.conn.execute("UPDATE facts SET ntok = evermind_ntok(tsv)")
    s.conn.execute("DELETE FROM fts_terms")
    s.conn.execute("INSERT INTO fts_terms (term, df) SELECT u, COUNT(*) FROM facts, unnest(tsvector_to_array(tsv)) u "
                   "GROUP BY u")
    s.conn.execute("UPDATE fts_stats SET docs = (SELECT COUNT(*) FROM facts), "
                   "tokens = (SELECT COALESCE(SUM(ntok), 0) FROM facts)")
    s.changed = True
    return counts
