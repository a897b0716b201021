"""The SQL side of where-filters and scopes: typed tag rows, the schema 3 -> 4 migration, and compilers from a
`Selection` (which facts a call may see: its scope, alive now, its `Filter`) to one parameterised boolean SQL
expression, for SQLite and for PostgreSQL.

Typed tags (schema 4). `fact_tags` keeps one row per (fact, key) and has two more columns:
    vtype  's' str, 'i' int, 'f' float, 'b' bool           (every older row is a str: DEFAULT 's')
    num    the number as a double, for 'i' and 'f' only    (NULL otherwise; a CHECK keeps the two in step)
`value` keeps the text: the string itself, or the JSON of an int / float / bool ("3", "2.5", "true"). So the
exact-match index `fact_tags_kv (key, value)` serves string equality and string ranges, and
`fact_tags_num (key, num)` serves numeric equality and ranges. `facts.tags` (JSON) keeps the types.
The same migration adds to `facts`: `expires_at` (canonical UTC text, NULL: never), `pinned` (0/1) and `scope`
(the scope key, '' for the whole store; see store/scope.py), with indexes on the times and the scope; and to
`changes`: `scope` (so a scope reads only its own history) and `link` (the other fact of a supersede).

Compilers. `selection_sql(sel)` / `to_sqlite(f)` (and their PostgreSQL twins) return (sql, params): a condition
over the facts row aliased `f` (columns id, source, created_at, updated_at, expires_at, scope) and subqueries
on `fact_tags`, for the caller to AND into its WHERE clause. Values travel only as parameters; keys of the
filter are parameters too; column names come from a fixed list. Both are the same compiler over a `Dialect`
(backend/dialect.py: placeholder, null-safe inequality, string order, how a time travels), so another backend
adds a Dialect, not a compiler. PostgreSQL's schema mirrors the one above with `num double precision` and
`timestamptz` times; its strings compare under COLLATE "C" so that their order is the code-point order the
Python evaluator uses.
"""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import datetime
from typing import Mapping, Union

from ..filters import And, Compare, Exists, Filter, FilterValue, MatchAll, Member, Or, TagValue
from ..validate import check_typed_tags, value_type
from .base import Selection
from .dialect import POSTGRES, SQLITE, Dialect

SCHEMA_FROM, SCHEMA_TO = 3, 4
INSERT_TAG_SQL = "INSERT INTO fact_tags (fact_id, key, value, vtype, num) VALUES (?, ?, ?, ?, ?)"
_VTYPE = {str: "s", int: "i", float: "f", bool: "b"}
_ALIAS_RE = re.compile(r"[a-z_][a-z0-9_]{0,30}")

# The schema change: (table, new column, its definition) and the new indexes. Additive only: no row is rewritten.
NEW_COLUMNS = (
    ("fact_tags", "vtype", "TEXT NOT NULL DEFAULT 's' CHECK (vtype IN ('s', 'i', 'f', 'b'))"),
    ("fact_tags", "num", "REAL CHECK ((num IS NOT NULL) = (vtype IN ('i', 'f')))"),
    ("facts", "expires_at", "TEXT"),
    ("facts", "pinned", "INTEGER NOT NULL DEFAULT 0 CHECK (pinned IN (0, 1))"),
    ("facts", "scope", "TEXT NOT NULL DEFAULT ''"),
    ("changes", "scope", "TEXT NOT NULL DEFAULT ''"),
    ("changes", "link", "TEXT"),
)
NEW_INDEXES = (
    "CREATE INDEX IF NOT EXISTS fact_tags_num ON fact_tags (key, num) WHERE num IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS facts_expires ON facts (expires_at) WHERE expires_at IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS facts_created ON facts (created_at)",
    "CREATE INDEX IF NOT EXISTS facts_updated ON facts (updated_at)",
    "CREATE INDEX IF NOT EXISTS facts_scope ON facts (scope)",
)
MIGRATION_3_TO_4 = tuple(f"ALTER TABLE {t} ADD COLUMN {c} {d}" for t, c, d in NEW_COLUMNS) + NEW_INDEXES


def migrate_typed_tags(conn: sqlite3.Connection) -> None:
    """Upgrade an SQLite store to schema 4 (typed tags, expiry, pinning, scopes), in the caller's transaction.

    `MIGRATIONS[3]` of the SQLite backend (which bumps meta.schema_version), and run by `_create_schema` too,
    so new and migrated stores have one schema. Idempotent: a column that exists is left alone, so the
    step is safe whatever order it is merged in with other migrations. Existing tag rows are all strings
    (nothing else could be stored before), which the defaults record; nothing is rewritten, so the migration
    costs one index build over fact_tags and four over facts.
    """
    have: dict[str, set[str]] = {}
    for table, column, definition in NEW_COLUMNS:
        if table not in have:
            have[table] = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if column not in have[table]:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
    for statement in NEW_INDEXES:
        conn.execute(statement)


def tag_row(fact_id: str, key: str, value: str | int | float | bool) -> tuple[str, str, str, str, float | None]:
    """One `fact_tags` row (fact_id, key, value, vtype, num) for a checked tag value (see INSERT_TAG_SQL)."""
    vtype = _VTYPE[type(value)]
    if isinstance(value, str):  # (vtype "s")
        return fact_id, key, value, "s", None
    return fact_id, key, json.dumps(value), vtype, (None if vtype == "b" else float(value))


def tag_rows(fact_id: str, tags: Mapping[str, TagValue]) -> list[tuple[str, str, str, str, float | None]]:
    """The `fact_tags` rows of one fact's tags (checked with filters.check_typed_tags)."""
    return [tag_row(fact_id, k, v) for k, v in check_typed_tags(tags, scope_names=True).items()]


# Every fact's tag rows again, from facts.tags (repair): the rows tag_row() writes. (A float's `value` text may be
# written otherwise than Python's JSON, "1.0e+16" for "1e+16"; filters compare numbers by `num`, never by it.)
REBUILD_TAGS_SQL = (
    "INSERT INTO fact_tags (fact_id, key, value, vtype, num) SELECT f.id, j.key, "
    "CASE j.type WHEN 'text' THEN j.value WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' ELSE CAST(j.value AS TEXT) "
    "END, CASE j.type WHEN 'text' THEN 's' WHEN 'integer' THEN 'i' WHEN 'real' THEN 'f' ELSE 'b' END, "
    "CASE WHEN j.type IN ('integer', 'real') THEN j.value END "
    "FROM facts f, json_each(f.tags) j WHERE j.type IN ('text', 'integer', 'real', 'true', 'false')"
)


def tag_from_row(value: str, vtype: str) -> str | int | float | bool:
    """A tag value back from its (value, vtype) columns (check() can compare these with facts.tags)."""
    return value if vtype == "s" else json.loads(value)


_SQL_OP = {"$eq": "=", "$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


def selection_sql(sel: Selection, *, fact: str = "f") -> tuple[str, list]:
    """Compile a Selection to an SQLite condition on the facts row aliased `fact`: in the scope, alive at
    `sel.now`, matching `sel.where`.

        sql, params = selection_sql(sel)
        conn.execute(f"SELECT f.label, f.vector FROM facts f WHERE +f.fingerprint_id = ? AND {sql}", [fp, *params])

    The scope and expiry conditions come first and are always there (the front builds them; no where-filter
    can leave them out). Keep the unary plus on other indexed equalities (see to_sqlite).
    """
    return compile_selection(sel, SQLITE, fact)


def selection_postgres(sel: Selection, *, fact: str = "f") -> tuple[str, list]:
    """Compile a Selection to a PostgreSQL condition (psycopg `%s` parameters; times as datetimes)."""
    return compile_selection(sel, POSTGRES, fact)


def compile_selection(sel: Selection, dialect: Dialect, fact: str = "f") -> tuple[str, list]:
    """Compile a Selection for `dialect` (see selection_sql)."""
    params: list = []
    scope = scope_condition(f"{_alias(fact)}.scope", sel.scope, sel.below, dialect, params)
    params.append(dialect.time_param(sel.now))
    parts = [scope] if scope else []
    parts.append(f"({fact}.expires_at IS NULL OR {fact}.expires_at > {dialect.mark})")
    if not isinstance(sel.where, MatchAll):
        parts.append(_node(sel.where, dialect, fact, params))
    return " AND ".join(parts), params


def _alias(fact: str) -> str:
    if not _ALIAS_RE.fullmatch(fact):
        raise ValueError(f"fact alias must be a plain identifier, got {fact!r}")  # our own code passes it
    return fact


def scope_condition(column: str, scope: str, below: bool, dialect: Dialect, params: list) -> str:
    """The condition "`column` holds `scope` (or, with `below`, a scope under it)", or "" for the whole store.

    A scope key's parts are joined by "/", which no part contains (store/scope.py), and "/" sorts just before
    "0", so K and the keys under it all lie in [K, K + "0"), one index range in code-point order; inside it,
    the keys other than K that sort before K + "/" are siblings such as "user=ada-2", which the last test drops.
    """
    if not scope and below:
        return ""
    if not below:
        params.append(scope)
        return f"{column} = {dialect.mark}"
    params.extend((scope, scope + "0", scope, scope + "/"))
    m, c = dialect.mark, f"{column}{dialect.text_order}"
    return f"({c} >= {m} AND {c} < {m} AND ({column} = {m} OR {c} >= {m}))"


def to_sqlite(where: Filter, *, fact: str = "f") -> tuple[str, list]:
    """Compile a Filter to an SQLite condition on the facts row aliased `fact` (schema 4), with `?` parameters.

        sql, params = to_sqlite(parse_where({"n": {"$gt": 2}}))
        conn.execute(f"SELECT f.label, f.vector FROM facts f WHERE +f.fingerprint_id = ? AND {sql}", [fp, *params])

    Write other indexed equalities next to it with a unary plus (`+f.fingerprint_id = ?`): a store has no ANALYZE
    statistics, so SQLite would drive from that index and probe every fact; with the plus it drives from the
    filter's own index (tag subquery -> facts_id, or facts_created). 50k facts, a 0.1% tag: 94 ms -> 0.09 ms
    (benchmarks/filter_speed.py).

    Returns:
        (sql, params); MATCH_ALL compiles to "1 = 1".
    """
    return compile_filter(where, SQLITE, fact)


def to_postgres(where: Filter, *, fact: str = "f") -> tuple[str, list]:
    """Compile a Filter to a PostgreSQL condition (psycopg `%s` parameters; times as datetimes)."""
    return compile_filter(where, POSTGRES, fact)


def compile_filter(where: Filter, dialect: Dialect, fact: str = "f") -> tuple[str, list]:
    """Compile a Filter for `dialect` (see to_sqlite). `fact` is the alias of the facts table in the query."""
    params: list = []
    sql = _node(where, dialect, _alias(fact), params)
    return sql, params


Leaf = Union[Compare, Member, Exists]  # a condition on one field


def _marks(d: Dialect, n: int) -> str:
    return ", ".join([d.mark] * n)


def _node(node: Filter, d: Dialect, fact: str, params: list) -> str:
    if isinstance(node, MatchAll):
        return "1 = 1"
    if isinstance(node, (And, Or)):
        glue = " AND " if isinstance(node, And) else " OR "
        return "(" + glue.join(_node(p, d, fact, params) for p in node.parts) + ")"
    if not isinstance(node, (Compare, Member, Exists)):
        raise TypeError(f"not a filter node: {type(node).__name__}")
    if node.field.name == "tag":
        return _tag_leaf(node, d, fact, params)
    return _column_leaf(node, d, fact, params)


def _column_leaf(node: Leaf, d: Dialect, fact: str, params: list) -> str:
    """A condition on the fact's own column (source, created_at, updated_at)."""
    col = f"{fact}.{node.field.name}"

    def conv(value: FilterValue) -> object:  # a time field's values are UTC datetimes, the source's text
        return d.time_param(value) if isinstance(value, datetime) else value
    if isinstance(node, Exists):
        return f"{col} IS {'NOT ' if node.present else ''}NULL"
    if isinstance(node, Member):
        params.extend(conv(v) for v in node.values)
        marks = _marks(d, len(node.values))
        return f"({col} IS NULL OR {col} NOT IN ({marks}))" if node.negate else f"{col} IN ({marks})"
    params.append(conv(node.value))
    if node.op == "$ne":
        return f"{col} {d.distinct} {d.mark}"
    order = d.text_order if node.field.name == "source" and node.op != "$eq" else ""
    return f"{col}{order} {_SQL_OP[node.op]} {d.mark}"


def _tag_leaf(node: Leaf, d: Dialect, fact: str, params: list) -> str:
    """`fact.id [NOT] IN (the facts whose tag row satisfies the condition)`; $ne / $nin / $exists false negate."""
    params.append(node.field.key)
    if isinstance(node, Exists):
        cond, negate = "", not node.present
    elif isinstance(node, Member):
        cond, negate = _tag_values(value_type(node.values[0]), "IN", node.values, d, params), node.negate
    elif node.op == "$ne":
        cond, negate = _tag_values(value_type(node.value), "=", (node.value,), d, params), True
    else:
        cond, negate = _tag_values(value_type(node.value), _SQL_OP[node.op], (node.value,), d, params), False
    sub = f"SELECT fact_id FROM fact_tags WHERE key = {d.mark}{cond}"
    return f"{fact}.id {'NOT IN' if negate else 'IN'} ({sub})"


def _tag_values(kind: str, op: str, values: tuple, d: Dialect, params: list) -> str:
    """' AND <typed condition>' on a fact_tags row for values of one type."""
    rhs = f"({_marks(d, len(values))})" if op == "IN" else d.mark
    if kind == "number":
        params.extend(float(v) for v in values)
        return f" AND num {op} {rhs}"
    if kind == "bool":
        params.extend("true" if v else "false" for v in values)
        return f" AND value {op} {rhs} AND vtype = 'b'"
    params.extend(values)
    order = d.text_order if op not in ("=", "IN") else ""
    return f" AND value{order} {op} {rhs} AND vtype = 's'"
