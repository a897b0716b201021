"""The queries both engines answer alike, written once: `Session` holds every method of backend.Reads and
backend.Writes whose SQL differs between SQLite and PostgreSQL only in spelling, which its engine's `Dialect`
(backend/dialect.py) supplies. Statements are written with `?` placeholders; a compiled Selection
(backend/filter_sql.py) carries the engine's own.

An engine's session (backend/sqlite_session.py, backend/postgres_session.py) subclasses it, runs the statements
(`_all`, `_one`, `_run`, `_many`, `_iter`) and keeps what truly differs: full-text search (FTS5 or tsvector),
inserting facts and their change rows, storage sizes, integrity checks and the generation table's life. Every
read of stored vectors goes through backend/vector_blobs.py's `read` (length, then unit norm), on both engines.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from ..._lazy import lazy_import
from ..records import Change
from . import vector_blobs
from .base import ChangeRow, FactRow, GenerationRows, LeaseRow, Selection, StaleRow, WaitingRow
from .codec import tags_json
from .dialect import Dialect
from .filter_sql import INSERT_TAG_SQL, compile_selection, scope_condition, tag_row

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

GEN_TABLE = "adapt_vectors"  # the vectors of the generation being built, keyed by label (one text version)
# the facts' times (text in SQLite, timestamptz in PostgreSQL)
TIME_COLUMNS = ("created_at", "updated_at", "expires_at")
INSERT_CHANGE = (
    "INSERT INTO changes (seq, fact_id, op, at, text, tags, source, vector_added, label_removed, scope, link) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


GEN_JOIN = (f"SELECT f.label, CASE WHEN g.vector IS NULL THEN f.text END, g.vector FROM facts f LEFT JOIN "
            f"{GEN_TABLE} g ON g.label = f.label AND g.fingerprint = ? WHERE ")  # generation_rows, before its condition


# A fingerprint as the id its facts reference (schema 6: each fingerprint string is stored once, in
# `fingerprints`); 0, which no fingerprint has, for one no fact references yet, so that `fingerprint_id = ...`
# matches no row and `fingerprint_id IS NOT ...` every row, as the string comparisons did.
FINGERPRINT_ID = "COALESCE((SELECT id FROM fingerprints WHERE fingerprint = ?), 0)"


def fact_columns(dialect: Dialect, alias: str = "") -> str:
    """The select list of a FactRow (its fields, in order; `tags_json` is the `tags` column) over `alias` (or
    `facts`); the fingerprint is read from `fingerprints` by the id the row references."""
    a = f"{alias}." if alias else ""
    names = ["tags" if f == "tags_json" else f for f in FactRow._fields]
    fingerprint = f"(SELECT p.fingerprint FROM fingerprints p WHERE p.id = {alias or 'facts'}.fingerprint_id)"
    return ", ".join(dialect.time_column(a + n) if n in TIME_COLUMNS else fingerprint if n == "fingerprint" else a + n
                     for n in names)


class Session:
    """The shared queries of one connection (backend.Reads and backend.Writes, with the engine's subclass)."""

    dialect: Dialect
    changed = False  # a write touched the change feed or meta (PostgreSQL notifies its followers at commit)
    _cols: str  # fact_columns(dialect): a FactRow from `facts`
    _f_cols: str  # fact_columns(dialect, "f"): a FactRow from `facts f`

    # ---- what an engine supplies ---------------------------------------------------------------------------
    def _all(self, sql: str, params: Sequence = (), *, binary: bool = False) -> list:
        """Every row of `sql` (binary: bytea columns as bytes, where the engine tells text from binary)."""
        raise NotImplementedError

    def _one(self, sql: str, params: Sequence = ()) -> Any:
        """The first row of `sql`, or None."""
        raise NotImplementedError

    def _iter(self, sql: str, params: Sequence = ()) -> Iterable:
        """The rows of `sql`, as they are read."""
        raise NotImplementedError

    def _run(self, sql: str, params: Sequence = ()) -> Any:
        """Run one statement; returns its cursor (rowcount)."""
        raise NotImplementedError

    def _many(self, sql: str, rows: Sequence[Sequence]) -> None:
        """Run one statement for each of `rows`."""
        raise NotImplementedError

    def _storage_bytes(self) -> tuple[int, int]:
        """(bytes the store's tables take, bytes free in them) for stats()."""
        raise NotImplementedError

    def _scalar(self, sql: str, params: Sequence = ()) -> int:
        return int(self._one(sql, params)[0])

    def _selection(self, sel: Selection) -> tuple[str, list]:
        return compile_selection(sel, self.dialect, "f")

    def _fingerprint_id(self, fingerprint: str) -> int:
        """The id facts reference `fingerprint` by, stored now if no fact did yet (inside a write transaction)."""
        row = self._one("SELECT id FROM fingerprints WHERE fingerprint = ?", (fingerprint,))
        if row is None:
            row = self._one("INSERT INTO fingerprints (fingerprint) VALUES (?) RETURNING id", (fingerprint,))
        return int(row[0])

    # ---- meta ----------------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = ?", (key,))
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        self._run("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                  (key, value))
        self.changed = True

    def delete_meta(self, *keys: str) -> None:
        for cond, params in self.dialect.in_list("key", keys):
            self._run(f"DELETE FROM meta WHERE {cond}", params)
        self.changed = True

    # ---- leases --------------------------------------------------------------------------------------------
    def lease(self, name: str) -> LeaseRow | None:
        row = self._one("SELECT owner, expires FROM leases WHERE name = ?", (name,))
        return None if row is None else LeaseRow(row[0], float(row[1]))

    def set_lease(self, name: str, owner: str, expires: float) -> None:
        self._run("INSERT INTO leases (name, owner, expires) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE "
                  "SET owner = excluded.owner, expires = excluded.expires", (name, owner, expires))

    def drop_lease(self, name: str, owner: str) -> None:
        self._run("DELETE FROM leases WHERE name = ? AND owner = ?", (name, owner))

    # ---- the change feed -----------------------------------------------------------------------------------
    def max_seq(self) -> int:
        return self._scalar("SELECT COALESCE(MAX(seq), 0) FROM changes")

    def changes_after(self, seq: int, upto: int) -> list[ChangeRow]:
        return [ChangeRow(s, bool(added), removed) for s, added, removed in self._all(
            "SELECT seq, vector_added, label_removed FROM changes WHERE seq > ? AND seq <= ? ORDER BY seq",
            (seq, upto))]

    def remembered_since(self, seq: int) -> int:
        return self._scalar("SELECT COUNT(*) FROM changes WHERE seq > ? AND op = 'remember'", (seq,))

    def history(self, fact_id: str, scope: str) -> list[Change]:
        # The arrival of a first vector (a 'reembed' that removed no label: background embedding of a remembered
        # fact) is part of remembering it, so a history reads the same whether it was embedded before or after.
        params: list = [fact_id]
        in_scope = scope_condition("scope", scope, True, self.dialect, params)
        rows = self._all(
            "SELECT seq, op, at, text, tags, source, link FROM changes WHERE fact_id = ? "
            f"AND NOT (op = 'reembed' AND label_removed IS NULL){' AND ' + in_scope if in_scope else ''} ORDER BY seq",
            params)
        return [Change(seq=r[0], op=r[1], at=self.dialect.read_time(r[2]), text=r[3],
                       tags=None if r[4] is None else json.loads(r[4]), source=r[5],
                       replaces=r[6] if r[1] == "remember" else None,
                       replaced_by=r[6] if r[1] == "forget" else None) for r in rows]

    # ---- facts ---------------------------------------------------------------------------------------------
    def count(self, fingerprint: str | None = None) -> int:
        if fingerprint is None:
            return self._scalar("SELECT COUNT(*) FROM facts")
        return self._scalar(f"SELECT COUNT(*) FROM facts WHERE fingerprint_id = {FINGERPRINT_ID}", (fingerprint,))

    def fetch(self, fact_id: str) -> FactRow | None:
        row = self._one(f"SELECT {self._cols} FROM facts WHERE id = ?", (fact_id,))
        return None if row is None else FactRow._make(row)

    def fetch_where(self, column: str, values: Sequence) -> dict:
        if column not in ("rid", "id", "label"):
            raise ValueError(f"fetch_where() expected rid, id or label, got {column!r}")
        keys = [v if column == "id" else int(v) for v in values]
        out: dict = {}
        for cond, params in self.dialect.in_list(column, keys):
            for row in self._all(f"SELECT {self._cols} FROM facts WHERE {cond}", params):
                fact = FactRow._make(row)
                out[getattr(fact, column)] = fact
        return out

    def list_rows(self, limit: int, offset: int, sel: Selection) -> list[FactRow]:
        where, params = self._selection(sel)
        sql = f"SELECT {self._f_cols} FROM facts f WHERE {where} ORDER BY f.rid LIMIT ? OFFSET ?"
        return [FactRow._make(r) for r in self._all(sql, [*params, self.dialect.limit(limit), offset])]

    def count_selected(self, sel: Selection, fingerprint: str | None = None) -> int:
        where, params = self._selection(sel)
        if fingerprint is None:
            return self._scalar(f"SELECT COUNT(*) FROM facts f WHERE {where}", params)
        return self._scalar(f"SELECT COUNT(*) FROM facts f WHERE {self.dialect.hint}f.fingerprint_id = "
                            f"{FINGERPRINT_ID} AND {where}",
                            [fingerprint, *params])

    def expired_rows(self, now: datetime, scope: str, limit: int) -> list[FactRow]:
        params: list = [self.dialect.time_param(now)]
        in_scope = scope_condition("f.scope", scope, True, self.dialect, params)
        sql = (f"SELECT {self._f_cols} FROM facts f WHERE f.expires_at <= ?{' AND ' + in_scope if in_scope else ''} "
               "ORDER BY f.expires_at, f.rid LIMIT ?")
        return [FactRow._make(r) for r in self._all(sql, [*params, limit])]

    def recent_selected(self, sel: Selection, seq: int) -> list[FactRow]:
        # Driven from the few recent changes and waiting facts (the change feed's key, the waiting index), then
        # filtered: never a scan of the scope's facts.
        where, params = self._selection(sel)
        return [FactRow._make(r) for r in self._all(
            f"SELECT {self._f_cols} FROM (SELECT fact_id AS id FROM changes WHERE seq > ? UNION "
            f"SELECT id FROM facts WHERE vector IS NULL) r {self.dialect.driving_join} facts f ON f.id = r.id "
            f"WHERE {where} ORDER BY f.rid", [seq, *params])]

    def _count_expired(self, now: datetime) -> int:
        return self._scalar("SELECT COUNT(*) FROM facts WHERE expires_at <= ?", (self.dialect.time_param(now),))

    def sizes(self) -> dict:
        page_bytes, free_bytes = self._storage_bytes()
        return {
            "facts": self.count(), "expired": self._count_expired(datetime.now(timezone.utc)),
            "pinned": self._scalar("SELECT COUNT(*) FROM facts WHERE pinned = 1"),
            "changes": self._scalar("SELECT COUNT(*) FROM changes"),
            "forgotten": self._scalar("SELECT COUNT(DISTINCT c.fact_id) FROM changes c WHERE NOT EXISTS "
                                      "(SELECT 1 FROM facts f WHERE f.id = c.fact_id)"),
            "page_bytes": page_bytes, "free_bytes": free_bytes,
        }

    def export_rows(self) -> Iterator[FactRow]:
        for row in self._iter(f"SELECT {self._cols} FROM facts ORDER BY rid"):
            yield FactRow._make(row)

    # ---- vectors -------------------------------------------------------------------------------------------
    def vectors(self, fingerprint: str, dim: int, *, labels: Sequence[int] | None = None,
                sel: Selection | None = None) -> tuple[np.ndarray, np.ndarray]:
        rows: list = []
        if labels is not None:
            for cond, params in self.dialect.in_list("label", [int(x) for x in labels]):
                rows += self._all(f"SELECT label, vector FROM facts WHERE fingerprint_id = {FINGERPRINT_ID} AND {cond}",
                                  [fingerprint, *params], binary=True)
        elif sel is None:  # every vector (the index holds expired facts too, until they are swept)
            rows = self._all(f"SELECT f.label, f.vector FROM facts f WHERE f.fingerprint_id = {FINGERPRINT_ID} ORDER "
                             "BY f.label",
                             (fingerprint,), binary=True)
        else:
            where, params = self._selection(sel)
            rows = self._all(f"SELECT f.label, f.vector FROM facts f WHERE {self.dialect.hint}f.fingerprint_id = "
                             f"{FINGERPRINT_ID} AND {where} ORDER BY f.label", [fingerprint, *params], binary=True)
        ok, matrix = vector_blobs.read([r[1] for r in rows], dim)  # (N,), (N, D)
        out = np.array([r[0] for r in rows], dtype=np.int64)  # (N,)
        if not ok.all():  # a vector of the wrong length, or damaged (NaN, Inf, zero), is left out
            return out[ok], matrix[ok]
        return out, matrix

    def memory_texts(self, fingerprint: str, dim: int) -> tuple[np.ndarray, list[str]]:
        rows = self._all(f"SELECT label, text, vector FROM facts WHERE fingerprint_id = {FINGERPRINT_ID} AND label IS "
                         "NOT NULL AND vector IS NOT NULL ORDER BY label", (fingerprint,), binary=True)
        ok = vector_blobs.read([r[2] for r in rows], dim)[0].tolist()  # (the vectors `vectors(labels=...)` gives)
        kept = [r for r, fine in zip(rows, ok) if fine]
        return np.array([r[0] for r in kept], dtype=np.int64), [r[1] for r in kept]  # (N,), N texts

    # ---- labels and the vector worker's queue --------------------------------------------------------------
    def labels(self, fingerprint: str | None) -> set[int]:
        if fingerprint is None:
            return {r[0] for r in self._all("SELECT label FROM facts WHERE label IS NOT NULL")}
        return {r[0]
                for r in self._all(f"SELECT label FROM facts WHERE fingerprint_id = {FINGERPRINT_ID}", (fingerprint,))}

    def selected_labels(self, sel: Selection, fingerprint: str) -> np.ndarray:
        where, params = self._selection(sel)
        rows = self._all(f"SELECT f.label FROM facts f WHERE {self.dialect.hint}f.fingerprint_id = {FINGERPRINT_ID} "
                         f"AND {where}",
                         [fingerprint, *params])
        return np.array([r[0] for r in rows], dtype=np.int64)  # (N,)

    def expired_labels(self, fingerprint: str, now: datetime) -> set[int]:
        return {r[0] for r in self._all(f"SELECT label FROM facts WHERE expires_at <= ? AND {self.dialect.hint}"
                                        f"fingerprint_id = {FINGERPRINT_ID}",
                                        (self.dialect.time_param(now), fingerprint))}

    def _stale_sql(self, include_waiting: bool) -> str:
        """The WHERE condition (one `?`: the current fingerprint) for stale vectors, with or without missing ones."""
        if include_waiting:
            return f"(fingerprint_id {self.dialect.distinct} {FINGERPRINT_ID} OR vector IS NULL)"
        return f"(vector IS NOT NULL AND fingerprint_id {self.dialect.distinct} {FINGERPRINT_ID})"

    def stale(self, fingerprint: str | None, limit: int, *, after_rid: int = 0,
              include_waiting: bool = True) -> list[StaleRow]:
        if fingerprint is None:
            rows = self._all("SELECT rid, id, text, label FROM facts WHERE rid > ? ORDER BY rid LIMIT ?",
                             (after_rid, limit))
        else:
            rows = self._all(f"SELECT rid, id, text, label FROM facts WHERE {self._stale_sql(include_waiting)} "
                             "AND rid > ? ORDER BY rid LIMIT ?", (fingerprint, after_rid, limit))
        return [StaleRow._make(r) for r in rows]

    def count_stale(self, fingerprint: str, include_waiting: bool = True) -> int:
        return self._scalar(f"SELECT COUNT(*) FROM facts WHERE {self._stale_sql(include_waiting)}", (fingerprint,))

    def count_foreign(self, fingerprint: str) -> int:
        # Every open asks, and the answer is nearly always none: that is settled first from the (fingerprint_id,
        # label) index, by the ranges on either side of this fingerprint's id and the rows without one (the facts
        # waiting for a vector), instead of counting the whole table (0.76 s at a million facts; 0.3 ms this way).
        if not self._scalar(f"SELECT EXISTS (SELECT 1 FROM facts WHERE fingerprint_id < {FINGERPRINT_ID} AND vector IS "
                            f"NOT NULL) OR EXISTS (SELECT 1 FROM facts WHERE fingerprint_id > {FINGERPRINT_ID} AND "
                            "vector IS NOT NULL) OR EXISTS (SELECT 1 FROM facts WHERE fingerprint_id IS NULL AND "
                            "vector IS NOT NULL)", (fingerprint, fingerprint)):
            return 0
        return self._scalar(f"SELECT COUNT(*) FROM facts WHERE vector IS NOT NULL AND fingerprint_id "
                            f"{self.dialect.distinct} {FINGERPRINT_ID}", (fingerprint,))

    def waiting(self) -> list[WaitingRow]:
        return [WaitingRow._make(r)
                for r in self._all("SELECT rid, id, text FROM facts WHERE vector IS NULL ORDER BY rid")]

    def waiting_owners(self) -> dict[str | None, int]:
        return dict(self._all("SELECT owner, COUNT(*) FROM facts WHERE vector IS NULL GROUP BY owner"))

    def adopt_waiting(self, old_owner: str | None, new_owner: str | None) -> list[WaitingRow]:
        rows = self._all(f"UPDATE facts SET owner = ? WHERE vector IS NULL AND owner {self.dialect.same} ? "
                         "RETURNING rid, id, text", (new_owner, old_owner))
        return sorted(WaitingRow._make(r) for r in rows)

    def still_waiting(self, rids: Sequence[int]) -> dict[int, str]:
        out: dict[int, str] = {}
        for cond, params in self.dialect.in_list("rid", [int(r) for r in rids]):
            out.update(self._all(f"SELECT rid, text FROM facts WHERE vector IS NULL AND {cond}", params))
        return out

    def count_waiting(self) -> int:
        return self._scalar("SELECT COUNT(*) FROM facts WHERE vector IS NULL")

    # ---- feedback ------------------------------------------------------------------------------------------
    def add_feedback(self, at: str, query: str, fact_id: str, useful: bool, limit: int) -> None:
        new = self._scalar("INSERT INTO feedback (at, query, fact_id, useful) VALUES (?, ?, ?, ?) RETURNING id",
                           (self.dialect.text_time(at), query, fact_id, int(useful)))
        self._run("DELETE FROM feedback WHERE id <= ?", (new - limit,))

    def feedback_pairs(self, fingerprint: str) -> list[tuple[str, int]]:
        return [(r[0], r[1]) for r in self._all(
            "SELECT f.query, facts.label FROM feedback f JOIN facts ON facts.id = f.fact_id "
            f"WHERE facts.fingerprint_id = {FINGERPRINT_ID} AND facts.label IS NOT NULL AND f.id = "
            "(SELECT MAX(g.id) FROM feedback g WHERE g.query = f.query AND g.fact_id = f.fact_id) AND f.useful = 1 "
            "ORDER BY f.id", (fingerprint,))]

    def count_feedback(self) -> int:
        return self._scalar("SELECT COUNT(*) FROM feedback")

    # ---- writes (inside a transaction) ---------------------------------------------------------------------
    def log_changes(self, rows: Sequence[tuple]) -> None:
        """Append change rows (INSERT_CHANGE's columns) to the change feed, inside a write transaction (a repair
        records what it cleared this way)."""
        if rows:
            self._many(INSERT_CHANGE, rows)
            self.changed = True

    def _text_changed(self, row: FactRow, text: str) -> None:
        """Keep the full-text index in step with a fact whose text became `text` (PostgreSQL: its trigger does)."""

    def _texts_removed(self, rows: Sequence[FactRow]) -> None:
        """Take forgotten facts out of the full-text index (PostgreSQL: its trigger does)."""

    def _encode(self, vector: np.ndarray) -> bytes:
        """A vector as its row's bytes (the engine module's codec)."""
        raise NotImplementedError

    def update(self, row: FactRow, *, text: str, tags: dict, source: str | None, vector: np.ndarray | None,
               fingerprint: str | None, now: str, expires_at: str | None, pinned: bool) -> tuple[int, int | None]:
        d = self.dialect
        seq = self.max_seq() + 1
        tj = tags_json(tags)
        text_set = "text = ?, " if text != row.text else ""  # (an unchanged text keeps its full-text entry)
        params = [text] if text_set else []
        if vector is not None:
            self._run(f"UPDATE facts SET {text_set}tags = ?, source = ?, updated_at = ?, vector = ?, fingerprint_id "
                      "= ?, label = ?, seq = ?, expires_at = ?, pinned = ? WHERE rid = ?",
                      [*params, tj, source, d.text_time(now), self._encode(vector),
                       None if fingerprint is None else self._fingerprint_id(fingerprint), seq, seq,
                       d.text_time(expires_at), int(pinned), row.rid])
        else:
            self._run(f"UPDATE facts SET {text_set}tags = ?, source = ?, updated_at = ?, seq = ?, expires_at = ?, "
                      "pinned = ? WHERE rid = ?",
                      [*params, tj, source, d.text_time(now), seq, d.text_time(expires_at), int(pinned), row.rid])
        if text_set:
            self._text_changed(row, text)
        self._run("DELETE FROM fact_tags WHERE fact_id = ?", (row.id,))
        if tags:
            self._many(INSERT_TAG_SQL, [tag_row(row.id, k, v) for k, v in tags.items()])
        removed = row.label if vector is not None else None
        self.log_changes([(seq, row.id, "update", d.text_time(now), text, tj, source, int(vector is not None), removed,
                    row.scope, None)])
        return seq, removed

    def delete(self, rows: Sequence[FactRow], now: str, replaced_by: str | None = None) -> list[int]:
        if not rows:
            return []
        for cond, params in self.dialect.in_list("fact_id", [row.id for row in rows]):
            self._run(f"DELETE FROM fact_tags WHERE {cond}", params)
            self._run(f"DELETE FROM feedback WHERE {cond}", params)  # a forgotten fact leaves no trace there
        self._texts_removed(rows)
        for cond, params in self.dialect.in_list("rid", [row.rid for row in rows]):
            self._run(f"DELETE FROM facts WHERE {cond}", params)
        seq, at = self.max_seq(), self.dialect.text_time(now)
        self.log_changes([(seq + i, row.id, "forget", at, None, None, None, 0, row.label, row.scope, replaced_by)
                   for i, row in enumerate(rows, start=1)])
        return [row.label for row in rows if row.label is not None]

    def prune_history(self, before: str, upto: int) -> int:
        # Every change of a fact up to (and with) a forget older than `before`: the history of an incarnation
        # that ended long ago. The newest change row is never deleted (upto: the current max seq), so max_seq()
        # and the labels it hands out keep growing.
        doomed = (
            "SELECT c.seq FROM changes c JOIN (SELECT fact_id, MAX(seq) AS last FROM changes "
            "WHERE op = 'forget' AND at < ? AND seq < ? GROUP BY fact_id) g ON c.fact_id = g.fact_id AND c.seq <= "
            "g.last"
        )
        params = (self.dialect.text_time(before), upto)
        top = self._one(f"SELECT MAX(seq) FROM ({doomed}) d", params)[0]
        if top is None:
            return 0
        cur = self._run(f"DELETE FROM changes WHERE seq IN ({doomed})", params)
        self.set_meta("history_pruned", str(max(int(top), int(self.meta("history_pruned") or 0))))
        return cur.rowcount

    # ---- the generation being built (adaptation, rollback) -------------------------------------------------
    def _generation_table(self) -> None:
        """Make sure the generation table exists (PostgreSQL's schema has it)."""

    def generation_begin(self, fingerprint: str, labels: np.ndarray | None, vectors: np.ndarray | None) -> None:
        self._generation_table()
        self._run(f"DELETE FROM {GEN_TABLE} WHERE fingerprint != ?", (fingerprint,))
        if labels is not None and vectors is not None:
            self.generation_store(fingerprint, labels.tolist(), vectors)

    def generation_store(self, fingerprint: str, labels: Sequence[int], vectors: np.ndarray) -> None:
        self._many(f"INSERT INTO {GEN_TABLE} (label, fingerprint, vector) VALUES (?, ?, ?) ON CONFLICT (label) DO "
                   "UPDATE SET fingerprint = excluded.fingerprint, vector = excluded.vector",
                   [(int(lab), fingerprint, self._encode(v)) for lab, v in zip(labels, vectors)])

    def generation_rows(self, fingerprint: str, dim: int, labels: Sequence[int] | None = None) -> GenerationRows:
        if labels is None:
            rows = self._all(GEN_JOIN + "f.label IS NOT NULL ORDER BY f.label", (fingerprint,), binary=True)
        else:  # (sorted before the IN lists, so that the chunks of SQLite's come back in label order too)
            rows = []
            for cond, params in self.dialect.in_list("f.label", sorted({int(x) for x in labels})):
                rows += self._all(GEN_JOIN + f"{cond} ORDER BY f.label", [fingerprint, *params], binary=True)
        have, vectors = vector_blobs.read([r[2] for r in rows], dim)  # (N,), (N, D): a damaged one is made again
        out = np.array([r[0] for r in rows], dtype=np.int64)  # (N,)
        return GenerationRows(out, vectors, [(i, r[1]) for i, (r, ok) in enumerate(zip(rows, have.tolist())) if not ok])

    def generation_missing(self, fingerprint: str, after: int, limit: int) -> list[tuple[int, str]]:
        return [(r[0], r[1]) for r in self._all(
            f"SELECT f.label, f.text FROM facts f WHERE f.label > ? AND NOT EXISTS (SELECT 1 FROM "
            f"{GEN_TABLE} g WHERE g.label = f.label AND g.fingerprint = ?) ORDER BY f.label LIMIT ?",
            (after, fingerprint, limit))]

    def generation_count_missing(self, fingerprint: str) -> int:
        return self._scalar(
            f"SELECT COUNT(*) FROM facts f WHERE f.label IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "
            f"{GEN_TABLE} g WHERE g.label = f.label AND g.fingerprint = ?)", (fingerprint,))

    def generation_adopt(self, fingerprint: str) -> None:
        # only facts with a vector (a label): one still waiting for its first keeps no fingerprint until a
        # worker embeds it, with whatever model serves then (it once took the new one with no vector)
        self._run(f"UPDATE facts SET vector = (SELECT g.vector FROM {GEN_TABLE} g WHERE g.label = facts.label "
                  "AND g.fingerprint = ?), fingerprint_id = ? WHERE label IS NOT NULL",
                  (fingerprint, self._fingerprint_id(fingerprint)))
        self.changed = True
