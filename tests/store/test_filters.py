"""Where-filters: the language (worked examples), one clear error per malformed filter, the SQLite compiler
against the Python evaluator on the real schema (hypothesis), fuzzing, the schema 2 -> 3 migration on a store
made through the public API, and the shape of the PostgreSQL compiler."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evermind_memory import EvermindError, InvalidInput, MemoryStore
from evermind_memory.store.backend.sqlite import SCHEMA_VERSION
from store_helpers import as_schema_5
from evermind_memory.store.backend.filter_sql import (
    INSERT_TAG_SQL, MIGRATION_3_TO_4, migrate_typed_tags, tag_from_row, tag_rows, to_postgres, to_sqlite,
)
from evermind_memory.store.filters import (
    MATCH_ALL, MAX_CLAUSES, MAX_DEPTH, MAX_IN, MAX_VALUES, all_of, parse_where, tags_filter, time_window,
)
from evermind_memory.store.timing import time_text
from evermind_memory.store.validate import MAX_SAFE_INT, check_typed_tags

UTC = timezone.utc
T0 = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def fact(tags=None, source=None, created=T0, updated=None) -> dict:
    return {"tags": tags or {}, "source": source, "created_at": created, "updated_at": updated or created}


# ---- the language, by hand ----------------------------------------------------------------------------------
def test_values_are_typed_three_and_the_string_three_and_true_differ():
    facts = {"int": fact({"n": 3}), "float": fact({"n": 3.0}), "str": fact({"n": "3"}), "bool": fact({"n": True}),
             "one": fact({"n": 1}), "none": fact()}

    def ids(where):
        f = parse_where(where)
        return {name for name, x in facts.items() if f.matches(x)}

    assert ids({"n": 3}) == {"int", "float"}  # int and float are one type, compared by value
    assert ids({"n": "3"}) == {"str"}
    assert ids({"n": True}) == {"bool"}  # True is not 1
    assert ids({"n": 1}) == {"one"}
    assert ids({"n": {"$ne": 3}}) == {"str", "bool", "one", "none"}  # the complement, missing tags included
    assert ids({"n": {"$gte": 2}}) == {"int", "float"}  # ranges skip values of other types
    assert ids({"n": {"$in": ["3", "x"]}}) == {"str"}
    assert ids({"n": {"$nin": [3]}}) == {"str", "bool", "one", "none"}
    assert ids({"n": {"$exists": False}}) == {"none"}


def test_strings_order_by_code_point_not_by_locale_or_number():
    f = parse_where({"v": {"$gt": "9"}})
    assert not f.matches(fact({"v": "10"}))  # "10" < "9" as strings
    assert parse_where({"v": {"$lt": "a"}}).matches(fact({"v": "B"}))  # upper case sorts first
    assert parse_where({"v": {"$gt": "z"}}).matches(fact({"v": "é"}))  # U+00E9 > U+007A


def test_times_compare_as_instants_whatever_the_offset():
    paris = timezone(timedelta(hours=2))
    f = parse_where({"created_at": {"$gte": "2025-05-01T14:00:00+02:00"}})  # == T0
    assert f.matches(fact(created=T0))
    assert not f.matches(fact(created=T0 - timedelta(microseconds=1)))
    assert parse_where({"created_at": datetime(2025, 5, 1, 14, tzinfo=paris)}).matches(fact(created=T0))
    assert parse_where({"updated_at": {"$lt": "2025-05-01T12:00:00Z"}}).matches(fact(updated=T0 - timedelta(days=1)))


def test_in_memory_facts_may_hold_times_as_text_but_not_naive():
    f = parse_where({"created_at": {"$lt": "2025-05-02T00:00:00Z"}})
    assert f.matches(fact(created="2025-05-01T12:00:00+00:00"))
    with pytest.raises(InvalidInput, match="the fact's created_at expects a time with a timezone"):
        f.matches(fact(created=datetime(2025, 5, 1)))


def test_source_and_a_tag_called_source_are_different_fields():
    x = fact({"source": "mail"}, source="chat")
    assert parse_where({"source": "chat"}).matches(x)
    assert parse_where({"tags[source]": "mail"}).matches(x)
    assert not parse_where({"tags[source]": "chat"}).matches(x)
    assert parse_where({"source": {"$ne": "chat"}}).matches(fact())  # no source: not equal to "chat"
    assert parse_where({"source": {"$exists": False}}).matches(fact())


def test_implicit_and_or_and_nesting():
    f = parse_where({"person": "ada", "$or": [{"n": {"$lt": 0}}, {"n": {"$gt": 10}}, {"flag": True}]})
    assert f.matches(fact({"person": "ada", "n": 11}))
    assert f.matches(fact({"person": "ada", "flag": True}))
    assert not f.matches(fact({"person": "ada", "n": 5}))
    assert not f.matches(fact({"person": "bob", "n": 11}))
    assert parse_where({"n": {"$gt": 1, "$lt": 5}}).matches(fact({"n": 2.5}))
    assert not parse_where({"n": {"$gt": 1, "$lt": 5}}).matches(fact({"n": 5}))


def test_empty_filters_match_everything_and_combine_away():
    assert parse_where(None) is MATCH_ALL and parse_where({}) is MATCH_ALL
    assert all_of(MATCH_ALL, MATCH_ALL) is MATCH_ALL
    f = parse_where({"a": 1})
    assert all_of(MATCH_ALL, f) == f
    assert to_sqlite(MATCH_ALL) == ("1 = 1", [])


def test_matches_reads_real_facts_from_a_store(store):
    fid = store.remember("Ada prefers green tea", tags={"person": "ada"}, source="chat")
    got = store.get(fid)
    assert parse_where({"person": "ada", "source": "chat", "created_at": {"$lte": datetime.now(UTC)}}).matches(got)
    assert not parse_where({"person": "bob"}).matches(got)
    hit = store.recall("green tea", k=1, mode="lexical")[0]
    assert parse_where({"person": {"$in": ["ada", "bob"]}}).matches(hit)


def test_legacy_tags_and_time_windows_become_filters():
    assert tags_filter({"b": "2", "a": "1"}) == parse_where({"a": "1", "b": "2"})
    assert tags_filter({}) is MATCH_ALL
    w = time_window("2025-05-01T00:00:00Z", T0 + timedelta(hours=1))
    assert w.matches(fact(created=T0)) and not w.matches(fact(created=T0 + timedelta(hours=2)))
    assert time_window() is MATCH_ALL
    assert time_window(until=T0, field="updated_at") == parse_where({"updated_at": {"$lte": T0}})
    with pytest.raises(InvalidInput, match=r"since \(2025-05-02.*\) must not be after until"):
        time_window("2025-05-02T00:00:00Z", "2025-05-01T00:00:00Z")


def test_typed_tags_check():
    assert check_typed_tags({"a": 1, "b": 2.5, "c": True, "d": "x"}) == {"a": 1, "b": 2.5, "c": True, "d": "x"}
    assert check_typed_tags(None) == {}
    for bad, msg in [({"a": float("nan")}, "finite number"), ({"a": 2**53}, r"within \+-\(2\*\*53 - 1\)"),
                     ({"a": None}, "expects a str, int, float or bool, got None"),
                     ({"a": [1]}, "got \\[1\\] \\(list\\)"), ({"a": T0}, "Store times in tags as ISO 8601 strings"),
                     ({"bad key": 1}, "keys must match"), ({"a": "x" * 513}, "at most 512 characters"),
                     ("a=1", "expected a dict")]:
        with pytest.raises(InvalidInput, match=msg):
            check_typed_tags(bad)


# ---- one clear error per malformed filter --------------------------------------------------------------------
MALFORMED = [
    ([{"a": 1}], r'^where expects a dict such as \{"topic": "travel"\}'),
    ("person=ada", r"^where expects a dict"),
    ({1: "x"}, r"^where\[1\]: filter keys are strings"),
    ({"$or": [{"a": 1}, {"age": {"$gt": "x", "$lt": True}}]},
     r'^where\["\$or"\]\[1\]\["age"\]: \$lt expects a number or a string, got True \(bool\); bools have no order'),
    ({"$or": [{"a": 1}, {"age": {"$gt": None}}]},
     r'^where\["\$or"\]\[1\]\["age"\]: \$gt expects a number or a string, got None'),
    ({"$or": []}, r'^where\["\$or"\]: \$or expects a non-empty list of filters, got \[\]'),
    ({"$and": {"a": 1}}, r'^where\["\$and"\]: \$and expects a non-empty list'),
    ({"$or": [{"a": 1}, {}]}, r'^where\["\$or"\]\[1\]: \$or expects each item to be a non-empty filter dict'),
    ({"$or": [{"a": 1}, "b"]}, r'^where\["\$or"\]\[1\]: \$or expects each item'),
    ({"$not": {"a": 1}}, r'^where\["\$not"\]: unknown operator \'\$not\'; at this level use \$and or \$or'),
    ({"$eq": 1}, r'^where\["\$eq"\]: \$eq applies to a field; write \{"field": \{"\$eq": ...\}\}'),
    ({"a": {"$regex": "x"}}, r'^where\["a"\]: unknown operator \'\$regex\'; a field takes \$eq, \$ne'),
    ({"a": {"b": 1}}, r'^where\["a"\]: unknown operator \'b\' \(a dict is not a value\)'),
    ({"a": {}}, r'^where\["a"\]: expects a value or an operator dict'),
    ({"a": [1, 2]}, r'^where\["a"\]: expects one value, got a list; for any of several write \{"\$in": \[...\]\}'),
    ({"a b": 1}, r"^where\[\"a b\"\]: 'a b' is not a field"),
    ({"tags[]": 1}, r"is not a field"),
    ({"a": float("nan")}, r'^where\["a"\]: \$eq expects a finite number, got nan'),
    ({"a": {"$lt": float("inf")}}, r'^where\["a"\]: \$lt expects a finite number, got inf'),
    ({"a": -(2**53)}, r'^where\["a"\]: \$eq expects an int within \+-\(2\*\*53 - 1\)'),
    ({"a": None}, r'^where\["a"\]: \$eq expects a str, int, float or bool, got None \(NoneType\)'),
    ({"a": b"x"}, r"got b'x' \(bytes\)"),
    ({"a": T0}, r"Store times in tags as ISO 8601 strings"),
    ({"a": "x\x00y"}, r"must not contain NUL characters"),
    ({"a": "\ud800"}, r"lone surrogate"),
    ({"a": "x" * 513}, r"at most 512 characters"),
    ({"a": {"$in": []}}, r'^where\["a"\]: \$in expects a non-empty list of values, got \[\]'),
    ({"a": {"$nin": "abc"}}, r'^where\["a"\]: \$nin expects a non-empty list of values, got \'abc\''),
    ({"a": {"$in": [1, "1"]}}, r'^where\["a"\]: \$in expects values of one type, got number and str'),
    ({"a": {"$in": [True, 1]}}, r"expects values of one type, got bool and number"),
    ({"a": {"$in": [1, [2]]}}, r'^where\["a"\]: \$in\[1\] expects a str, int, float or bool, got \[2\]'),
    ({"a": {"$in": list(range(MAX_IN + 1))}}, rf"\$in expects at most {MAX_IN} values, got {MAX_IN + 1}"),
    ({"a": {"$exists": 1}}, r'^where\["a"\]: \$exists expects true or false, got 1 \(int\)'),
    ({"source": 3}, r'^where\["source"\]: \$eq on source expects a string, got 3 \(int\)'),
    ({"source": ""}, r"on source expects 1 to 256 characters, got 0"),
    ({"created_at": "2025-05-01"},
     r'^where\["created_at"\]: \$eq expects a time with a timezone, got \'2025-05-01\' \(naive'),
    ({"created_at": {"$gt": datetime(2025, 5, 1)}}, r"\$gt expects a time with a timezone"),
    ({"updated_at": {"$lt": "yesterday"}}, r'^where\["updated_at"\]: \$lt expects an ISO 8601 time with a timezone'),
    ({"created_at": {"$in": ["2025-05-01T00:00:00Z", 5]}},
     r"\$in\[1\] expects a datetime with a timezone or an ISO 8601 string"),
    ({"created_at": "0001-01-01T00:00:00+01:00"}, r"outside the range of UTC datetimes"),
]


@pytest.mark.parametrize("where, message", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_malformed_filter_raises_one_clear_error(where, message):
    with pytest.raises(InvalidInput, match=message):
        parse_where(where)


def test_limits_on_depth_clauses_and_values():
    deep: dict = {"a": 1}
    for _ in range(MAX_DEPTH):
        deep = {"$or": [deep, {"b": 1}]}
    parse_where(deep)  # exactly MAX_DEPTH levels is fine
    with pytest.raises(InvalidInput, match=rf"nest more than {MAX_DEPTH} levels deep"):
        parse_where({"$and": [deep, {"c": 1}]})
    with pytest.raises(InvalidInput, match=rf"more than {MAX_CLAUSES} clauses"):
        parse_where({f"k{i}": i for i in range(MAX_CLAUSES + 1)})
    many = {f"k{i}": {"$in": list(range(MAX_IN))} for i in range(MAX_VALUES // MAX_IN + 1)}
    with pytest.raises(InvalidInput, match=rf"more than {MAX_VALUES} values in all"):
        parse_where(many)


# ---- SQL against the evaluator, on the real schema -----------------------------------------------------------
@pytest.fixture(scope="module")
def schema_sql(tmp_path_factory, embedder) -> list[str]:
    """The CREATE statements of facts and fact_tags from a store made through the public API."""
    path = tmp_path_factory.mktemp("schema") / "s.db"
    MemoryStore(path, embedder).close()
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT sql FROM sqlite_master WHERE tbl_name IN ('facts', 'fact_tags') AND sql IS NOT NULL "
                        "ORDER BY type = 'index', rowid").fetchall()
    conn.close()
    return [r[0] for r in rows]


def scratch_db(schema_sql: list[str], facts: list[dict]) -> sqlite3.Connection:
    """An in-memory database with the store's schema (schema 4), holding `facts` (ids 'f0', 'f1', ...)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    for sql in schema_sql:
        conn.execute(sql)
    conn.execute("BEGIN")
    for i, x in enumerate(facts):
        fid = f"f{i}"
        conn.execute(
            "INSERT INTO facts (id, text, tags, source, created_at, updated_at, seq) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (fid, "t", json.dumps(x["tags"]), x["source"], time_text(x["created_at"]), time_text(x["updated_at"]), i),
        )
        conn.executemany(INSERT_TAG_SQL, tag_rows(fid, x["tags"]))
    conn.execute("COMMIT")
    return conn


def sql_ids(conn: sqlite3.Connection, where) -> set[str]:
    sql, params = to_sqlite(where)
    return {r[0] for r in conn.execute(f"SELECT f.id FROM facts f WHERE {sql}", params)}


KEYS = ["a", "b", "c", "source"]
_POOL_STR = st.sampled_from(["", "x", "X", "10", "9", "é", "x y"])
STRINGS = st.one_of(_POOL_STR, _POOL_STR, _POOL_STR, st.text(st.sampled_from("aBz9é😀ÿ_"), max_size=3))
_POOL_NUM = st.sampled_from([-2, -0.0, 0, 1, 1.0, 2.5, 3, MAX_SAFE_INT, -MAX_SAFE_INT, 1e300, -1e-300])
NUMBERS = st.one_of(_POOL_NUM, _POOL_NUM, _POOL_NUM, st.integers(-3, 3), st.floats(-5, 5, allow_nan=False))
BOOLS = st.booleans()
SCALARS = STRINGS | NUMBERS | BOOLS
SOURCES = st.sampled_from(["chat", "mail", "Chat", "é"])
TIMES = st.sampled_from([T0 + timedelta(hours=h) for h in (-48, -1, 0, 1, 24)] + [T0 + timedelta(microseconds=1)])
OFFSETS = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5, minutes=-30))])

facts_st = st.lists(st.fixed_dictionaries({
    "tags": st.dictionaries(st.sampled_from(KEYS), SCALARS, max_size=4),
    "source": st.none() | SOURCES,
    "created_at": TIMES,
    "updated_at": TIMES,
}), min_size=3, max_size=12)


@st.composite
def time_value(draw):
    dt = draw(TIMES).astimezone(draw(OFFSETS))
    return dt.isoformat() if draw(st.booleans()) else dt


def one_type_list(values):
    return st.lists(values, min_size=1, max_size=4)


@st.composite
def leaf(draw):
    field = draw(st.sampled_from(["a", "b", "c", "tags[source]", "missing", "source", "created_at", "updated_at"]))
    op = draw(st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "implicit"]))
    if op == "$exists":
        return {field: {"$exists": draw(st.booleans())}}
    if field in ("created_at", "updated_at"):
        values = time_value()
    elif field == "source":
        values = SOURCES
    elif op in ("$gt", "$gte", "$lt", "$lte"):
        values = draw(st.sampled_from([STRINGS, NUMBERS]))
    else:
        values = draw(st.sampled_from([STRINGS, NUMBERS, BOOLS]))
    if op in ("$in", "$nin"):
        return {field: {op: draw(one_type_list(values))}}
    value = draw(values)
    return {field: value} if op == "implicit" else {field: {op: value}}


filters_st = st.recursive(
    leaf(),
    lambda inner: st.one_of(
        st.builds(lambda xs: {"$and": xs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda xs: {"$or": xs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda xs: {k: v for x in xs for k, v in x.items()}, st.lists(inner, min_size=2, max_size=3)),
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(facts=facts_st, where=filters_st)
def test_sqlite_returns_exactly_what_the_evaluator_accepts(schema_sql, facts, where):
    f = parse_where(where)
    conn = scratch_db(schema_sql, facts)
    try:
        for node in f.walk():  # the whole filter and each part of it, down to every leaf
            expected = {f"f{i}" for i, x in enumerate(facts) if node.matches(x)}
            assert sql_ids(conn, node) == expected, (node, to_sqlite(node))
    finally:
        conn.close()
    assert parse_where(json.loads(json.dumps(f.to_where()))) == f  # the JSON form parses back to the same tree


def test_sqlite_and_evaluator_agree_on_hand_cases(schema_sql):
    facts = [fact({"n": 3}), fact({"n": "3"}), fact({"n": True}), fact({"n": 2.5}, source="chat"),
             fact({"source": "x"}, created=T0 + timedelta(days=1)), fact()]
    conn = scratch_db(schema_sql, facts)
    cases = {
        json.dumps({"n": 3}): {"f0"}, json.dumps({"n": {"$lt": 3}}): {"f3"},
             json.dumps({"n": {"$ne": 3}}): {"f1", "f2", "f3", "f4", "f5"},
        json.dumps({"n": {"$gt": "2"}}): {"f1"},
             json.dumps({"source": {"$ne": "chat"}}): {"f0", "f1", "f2", "f4", "f5"},
        json.dumps({"tags[source]": "x"}): {"f4"}, json.dumps({"created_at": {"$gt": "2025-05-01T12:00:00Z"}}): {"f4"},
        json.dumps({"$or": [{"n": True}, {"source": "chat"}]}): {"f2", "f3"},
    }
    for where, want in cases.items():
        f = parse_where(json.loads(where))
        assert sql_ids(conn, f) == want == {f"f{i}" for i, x in enumerate(facts) if f.matches(x)}, where


def test_the_indexes_serve_tag_and_time_filters(schema_sql):
    conn = scratch_db(schema_sql, [])
    for where, index in [({"n": {"$gt": 2}}, "fact_tags_num"), ({"n": 3}, "fact_tags_num"),
                         ({"u": "ada"}, "fact_tags_kv"), ({"u": {"$in": ["a", "b"]}}, "fact_tags_kv"),
                         ({"created_at": {"$gte": T0}}, "facts_created")]:
        sql, params = to_sqlite(parse_where(where))
        plan = " | ".join(r[3]
                          for r in conn.execute(f"EXPLAIN QUERY PLAN SELECT f.id FROM facts f WHERE {sql}", params))
        assert f"USING INDEX {index}" in plan or f"USING COVERING INDEX {index}" in plan, (where, plan)


# ---- fuzzing: nothing but InvalidInput --------------------------------------------------------------------------
ODD_KEYS = st.sampled_from(["a", "$and", "$or", "$eq", "$in", "$nin", "$gt", "$exists", "$not", "source", "created_at",
                            "tags[a]", "tags[", "", " ", "a" * 65, "x.y:z-1"]) | st.text(max_size=4) | st.integers()
ODD_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6) | st.binary(max_size=3)
               | st.datetimes() | st.datetimes(timezones=st.just(UTC))
               | st.sampled_from(["2025-05-01T00:00:00Z", "Z", "zz"]))
odd_json = st.recursive(
    ODD_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ODD_KEYS, inner, max_size=4) | st.tuples(inner)
    | st.frozensets(st.integers(), max_size=2),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=odd_json | st.dictionaries(ODD_KEYS, odd_json, max_size=4))
def test_fuzzed_filters_raise_only_invalid_input_and_what_parses_runs(schema_sql, where):
    try:
        f = parse_where(where)
    except InvalidInput as exc:
        assert str(exc).startswith("where") and len(str(exc)) < 600
        return
    conn = scratch_db(schema_sql, [fact({"a": 1}), fact({"a": "x"}, source="chat")])
    try:
        sql_ids(conn, f)  # whatever parses compiles to SQL that runs
    finally:
        conn.close()


# ---- the schema 3 -> 4 migration on a store made through the public API --------------------------------------------
def downgrade(path: Path, version: int) -> None:
    """Turn a store file back into what schema 3 (no typed tags, expiry, pin, scope or links) or schema 2 (nor
    the many-writers leases and owners) looked like."""
    as_schema_5(path)
    conn = sqlite3.connect(path, isolation_level=None)
    for name in ("fact_tags_num", "facts_expires", "facts_created", "facts_updated", "facts_scope"):
        conn.execute(f"DROP INDEX {name}")
    for table, column in (("fact_tags", "num"), ("fact_tags", "vtype"), ("facts", "expires_at"), ("facts", "pinned"),
                          ("facts", "scope"), ("changes", "scope"), ("changes", "link")):
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    if version == 2:
        conn.execute("DROP INDEX facts_waiting")
        conn.execute("ALTER TABLE facts DROP COLUMN owner")
        conn.execute("DROP TABLE leases")
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
    conn.close()


def test_migration_keeps_every_tag_a_string_and_answers_old_filters_alike(tmp_path: Path, embedder):
    path = tmp_path / "old.db"
    with MemoryStore(path, embedder) as s:
        s.remember_many([f"fact {i}" for i in range(6)], tags={"person": "ada"})
        s.remember("three", tags={"n": "3", "person": "bob"}, source="chat")
        s.remember("untagged")
        before = {json.dumps(t): {f.id for f in s.list(tags=t)}
                  for t in ({"person": "ada"}, {"n": "3"}, {"person": "bob", "n": "3"})}
        pre_rows = s.list(limit=100)
    downgrade(path, 3)
    conn = sqlite3.connect(path, isolation_level=None)
    assert "vtype" not in {r[1] for r in conn.execute("PRAGMA table_info(fact_tags)")}
    conn.execute("BEGIN IMMEDIATE")
    migrate_typed_tags(conn)
    conn.execute("COMMIT")
    cols = {r[1] for r in conn.execute("PRAGMA table_info(fact_tags)")}
    assert {"vtype", "num"} <= cols and "expires_at" in {r[1] for r in conn.execute("PRAGMA table_info(facts)")}
    assert conn.execute("SELECT DISTINCT vtype, num FROM fact_tags").fetchall() == [("s", None)]
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    for tags, ids in before.items():  # the old exact-match filter, compiled, finds the same facts
        assert sql_ids(conn, tags_filter(json.loads(tags))) == ids
    assert sql_ids(conn, parse_where({"n": 3})) == set()  # the stored "3" is a string, not the number 3
    # typed rows round-trip, and the CHECK keeps vtype and num in step
    fid = next(f.id for f in pre_rows if f.text == "untagged")
    typed = {"n": 3, "x": 2.5, "ok": False, "s": "3"}
    conn.execute("BEGIN")
    conn.execute("UPDATE facts SET tags = ? WHERE id = ?", (json.dumps(typed), fid))
    conn.executemany(INSERT_TAG_SQL, tag_rows(fid, typed))
    conn.execute("COMMIT")
    got = {k: tag_from_row(v, t)
           for k, v, t in conn.execute("SELECT key, value, vtype FROM fact_tags WHERE fact_id = ?", (fid,))}
    assert got == typed and type(got["n"]) is int and type(got["ok"]) is bool
    assert sql_ids(conn, parse_where({"n": {"$gte": 2.5, "$lt": 3.5}, "ok": False})) == {fid}
    for bad in [(fid, "z", "3", "i", None), (fid, "z", "x", "s", 1.0), (fid, "z", "x", "q", None)]:
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
            conn.execute(INSERT_TAG_SQL, bad)
    conn.close()
    # The change is additive: the current code opens, writes and checks the migrated file.
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    conn.close()
    with MemoryStore(path, embedder) as s:
        s.remember("after", tags={"person": "ada"})
        assert len(s.list(tags={"person": "ada"})) == 7
        assert s.check().ok


def test_a_schema_2_store_opens_migrated_with_its_facts_and_history(tmp_path: Path, embedder):
    path = tmp_path / "old.db"
    with MemoryStore(path, embedder) as s:
        fid = s.remember("Ada's flight is on Tuesday", tags={"person": "ada"}, source="chat")
        gone = s.remember("an old note")
        s.forget(gone)
    downgrade(path, 2)
    with pytest.raises(EvermindError, match="schema version 2"):
        MemoryStore(path, embedder, read_only=True)  # a reader never migrates
    with MemoryStore(path, embedder) as s:
        assert s.info()["schema_version"] == SCHEMA_VERSION == 7
        fact = s.get(fid)
        assert ((fact.tags, fact.source, fact.expires_at, fact.pinned, fact.scope)
                == ({"person": "ada"}, "chat", None, False, {}))
        assert [c.op for c in s.history(gone)] == ["remember", "forget"]  # old history rows belong to the whole store
        assert s.list(where={"person": {"$in": ["ada"]}}) == [fact] and s.check().ok
        ada = s.scope(user="ada")
        assert ada.count() == 0 and s.count() == 1  # old facts were remembered unscoped
    # migrating twice changes nothing (the step is idempotent, whatever order migrations merge in)
    conn = sqlite3.connect(path, isolation_level=None)
    before = conn.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall()
    migrate_typed_tags(conn)
    assert conn.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall() == before
    conn.close()


def test_migration_statements_name_only_new_columns_and_indexes():
    text = " ".join(MIGRATION_3_TO_4)
    assert "DROP" not in text and "UPDATE" not in text and "DELETE" not in text


# ---- the PostgreSQL compiler: shape only (no server here) -------------------------------------------------------
def test_postgres_compiler_shape():
    where = parse_where({"person": "ada", "n": {"$gt": 2}, "name": {"$lt": "m"}, "source": {"$ne": "chat"},
                         "$or": [{"created_at": {"$gte": "2025-05-01T00:00:00Z"}}, {"ok": {"$in": [True]}}]})
    sql, params = to_postgres(where)
    lite_sql, lite_params = to_sqlite(where)
    assert sql.count("%s") == len(params) == len(lite_params) == lite_sql.count("?")
    assert "?" not in sql and "ada" not in sql and "chat" not in sql  # values only as parameters
    assert 'value COLLATE "C" < %s' in sql and "f.source IS DISTINCT FROM %s" in sql
    assert params[params.index("n") + 1] == 2.0
    assert datetime(2025, 5, 1, tzinfo=UTC) in params  # times travel as datetimes, not text
