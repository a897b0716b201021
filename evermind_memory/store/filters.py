"""Where-filters over a fact's tags, source and times: the language, its parser and a pure-Python evaluator.

`parse_where(obj)` turns Chroma-style JSON into an immutable `Filter` tree, or raises one `InvalidInput` that
names the place inside the filter that is wrong. `Filter.matches(fact)` evaluates the tree in Python: the
oracle the SQL compilers (filter_sql.py) are tested against, and an in-memory filter. No SQL here.

The language
    {"topic": "travel"}                              a tag equals a value (implicit $eq)
    {"topic": "travel", "n": {"$gte": 2, "$lt": 5}}  top-level keys and several operators on one key: AND
    {"$or": [{"topic": "travel"}, {"source": "mail"}]}  $and / $or take a non-empty list of filters
    {"created_at": {"$gte": "2025-05-01T00:00:00Z"}}
Fields: `source`, `created_at` and `updated_at` are the fact's own; any other key is a tag key. A tag whose key
is one of those three names is written `tags[source]` (any tag may be written `tags[key]`). The scope levels
(namespace, user, agent, run) are no keys at all: a scope is not a tag (store/scope.py), so {"user": ...} is refused
with the way to say it; `tags[user]` reads such a tag an earlier version stored.
Operators: $eq $ne $gt $gte $lt $lte $in $nin $exists, and $and $or.
Types: a tag value is a str, an int, a float or a bool, and a comparison only matches values of its own type:
`3` and `"3"` and `True` are three different values (bool is not a number). int and float are one type,
"number", compared by value (3 == 3.0); ints are limited to +-(2**53 - 1) so that every number compares
exactly as a double in any database. NaN and infinities are refused. `source` is a str. `created_at` /
`updated_at` take times: aware datetimes or ISO 8601 strings with an offset (naive times are refused).
$gt $gte $lt $lte order numbers, times and strings; strings by Unicode code point (what SQLite's BINARY and
PostgreSQL's "C" collation do), not by locale: "B" < "a" and "10" < "9". Bools have no order.
Missing values: $eq, $gt.., $in match only facts that have the field; $ne and $nin are their exact
complements, so they also match facts without the tag (or without a source). `{"tag": {"$exists": false}}`
finds facts without it. `{}` and None match every fact.
Limits (so a filter stays a small, bounded query): at most MAX_IN values in one $in / $nin, MAX_VALUES values
and MAX_CLAUSES clauses in all, $and / $or nested at most MAX_DEPTH deep.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterator, Mapping, Union

from ..errors import InvalidInput
from .timing import check_window, parse_time, time_text
from .validate import (
    MAX_SOURCE_CHARS, SCOPE_LEVELS, TAG_KEY_RE, TagValue, check_tag_value, plain_string, scope_name_refused, show_value,
    value_type,
)

MAX_IN = 100
MAX_VALUES = 256
MAX_CLAUSES = 64
MAX_DEPTH = 8
FACT_FIELDS = ("source", "created_at", "updated_at")
TIME_FIELDS = ("created_at", "updated_at")
EQUALITY = ("$eq", "$ne")
ORDER = ("$gt", "$gte", "$lt", "$lte")
MEMBERSHIP = ("$in", "$nin")
FIELD_OPS = (*EQUALITY, *ORDER, *MEMBERSHIP, "$exists")
LOGICAL = ("$and", "$or")
_OPS_TEXT = ", ".join(FIELD_OPS)
FilterValue = Union[TagValue, datetime]  # a value a filter compares with: a tag value, or a UTC time


# ---- the tree --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    """What a comparison looks at: a tag (`key` set) or one of the fact's own fields."""

    name: str  # "tag", "source", "created_at" or "updated_at"
    key: str | None = None  # the tag key, for name == "tag"

    def where_key(self) -> str:
        """The key that names this field in a where dict."""
        if self.name != "tag":
            return self.name
        key = self.key or ""
        return f"tags[{key}]" if key in FACT_FIELDS or key in SCOPE_LEVELS else key

    def value_of(self, fact: object) -> tuple[bool, Any]:
        """(present, value) of this field in a Fact, a Recall or a mapping with tags/source/created_at/updated_at.

        The value is Any: the caller orders it against a filter value only once value_type says they are alike.
        """
        if self.name == "tag":
            tags = _attr(fact, "tags")
            tags = tags if isinstance(tags, Mapping) else {}
            return (self.key in tags, tags.get(self.key))
        value = _attr(fact, self.name)
        if value is None:
            return False, None
        if self.name in TIME_FIELDS and not (isinstance(value, datetime) and value.tzinfo is not None):
            value = parse_time(value, f"the fact's {self.name}")  # text, or a naive time refused with a message
        return True, value


def _attr(fact: object, name: str) -> object:
    return fact.get(name) if isinstance(fact, Mapping) else getattr(fact, name, None)


class Filter:
    """A parsed where-filter (immutable). Build one with `parse_where`; combine with `all_of`."""

    def matches(self, fact: object) -> bool:
        """Whether a fact (Fact, Recall, or a mapping with tags, source, created_at, updated_at) passes.

        Raises:
            InvalidInput: the fact's created_at / updated_at is naive or not a time (only when the filter reads it).
        """
        raise NotImplementedError

    def to_where(self) -> dict:
        """The filter as a where dict (JSON-ready: times as ISO text); parse_where(f.to_where()) == f."""
        raise NotImplementedError

    def walk(self) -> Iterator["Filter"]:
        """This node and every node below it, depth first."""
        yield self

    def __str__(self) -> str:
        return json.dumps(self.to_where(), ensure_ascii=False, sort_keys=False)


@dataclass(frozen=True)
class MatchAll(Filter):
    """No condition: every fact passes (the filter of None and {})."""

    def matches(self, fact: object) -> bool:
        return True

    def to_where(self) -> dict:
        return {}


@dataclass(frozen=True)
class Compare(Filter):
    """field <op> value, op one of $eq $ne $gt $gte $lt $lte."""

    field: Field
    op: str
    value: FilterValue  # a UTC datetime for time fields

    def matches(self, fact: object) -> bool:
        present, got = self.field.value_of(fact)
        same = present and value_type(got) == value_type(self.value)
        if self.op == "$ne":
            return not (same and got == self.value)
        if not same:
            return False
        if self.op == "$eq":
            return got == self.value
        if self.op == "$gt":
            return got > self.value
        if self.op == "$gte":
            return got >= self.value
        if self.op == "$lt":
            return got < self.value
        return got <= self.value

    def to_where(self) -> dict:
        return {self.field.where_key(): {self.op: _json_value(self.value)}}


@dataclass(frozen=True)
class Member(Filter):
    """field $in values (negate: $nin, the complement); the values share one type."""

    field: Field
    values: tuple[FilterValue, ...]
    negate: bool = False

    def matches(self, fact: object) -> bool:
        present, got = self.field.value_of(fact)
        kind = value_type(self.values[0])
        hit = present and value_type(got) == kind and any(got == v for v in self.values)
        return hit != self.negate

    def to_where(self) -> dict:
        return {self.field.where_key(): {"$nin" if self.negate else "$in": [_json_value(v) for v in self.values]}}


@dataclass(frozen=True)
class Exists(Filter):
    """The fact has (present=True) or lacks (False) the field."""

    field: Field
    present: bool = True

    def matches(self, fact: object) -> bool:
        return self.field.value_of(fact)[0] == self.present

    def to_where(self) -> dict:
        return {self.field.where_key(): {"$exists": self.present}}


@dataclass(frozen=True)
class _Group(Filter):
    """A node over two or more parts."""

    parts: tuple[Filter, ...]

    def walk(self) -> Iterator[Filter]:
        yield self
        for p in self.parts:
            yield from p.walk()


@dataclass(frozen=True)
class And(_Group):
    """Every part matches (two or more parts)."""

    def matches(self, fact: object) -> bool:
        return all(p.matches(fact) for p in self.parts)

    def to_where(self) -> dict:
        # The implicit form {"a": 1, "n": {"$gt": 1, "$lt": 5}} when it parses back to the same parts in the same
        # order (distinct keys, or one key's operators side by side); an explicit $and list otherwise.
        merged: dict = {}
        last = None
        for p in self.parts:
            w = p.to_where()
            if len(w) != 1:
                return {"$and": [p.to_where() for p in self.parts]}
            (key, value), = w.items()
            if key in merged and (key != last or key in LOGICAL or merged[key].keys() & value.keys()):
                return {"$and": [p.to_where() for p in self.parts]}
            merged[key] = {**merged[key], **value} if key in merged else value
            last = key
        return merged


@dataclass(frozen=True)
class Or(_Group):
    """At least one part matches (two or more parts)."""

    def matches(self, fact: object) -> bool:
        return any(p.matches(fact) for p in self.parts)

    def to_where(self) -> dict:
        return {"$or": [p.to_where() for p in self.parts]}


MATCH_ALL = MatchAll()


def _json_value(value: object) -> object:
    return time_text(value) if isinstance(value, datetime) else value


def all_of(*filters: Filter) -> Filter:
    """The AND of some filters, flattening nested ANDs and dropping match-alls (MATCH_ALL for none left)."""
    parts: list[Filter] = []
    for f in filters:
        if isinstance(f, And):
            parts.extend(f.parts)
        elif not isinstance(f, MatchAll):
            parts.append(f)
    if not parts:
        return MATCH_ALL
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def tags_filter(tags: Mapping[str, TagValue]) -> Filter:
    """The filter of the exact-match `tags=` argument (already checked by validate.check_tags): an AND of $eq."""
    return all_of(*(Compare(Field("tag", k), "$eq", v) for k, v in sorted(tags.items())))


def time_window(since: object = None, until: object = None, field: str = "created_at") -> Filter:
    """recall's since / until (inclusive, each optional) as a filter on `field` (created_at or updated_at).

    Raises:
        InvalidInput: a naive or unparsable time, or since after until.
    """
    lo, hi = check_window(since, until)
    f = Field(field)
    return all_of(*([] if lo is None else [Compare(f, "$gte", lo)]), *([] if hi is None else [Compare(f, "$lte", hi)]))


# ---- parsing ---------------------------------------------------------------------------------------------------
class _Budget:
    """Counts clauses and values while parsing, so an oversized filter fails with one message."""

    def __init__(self) -> None:
        self.clauses = 0
        self.values = 0

    def clause(self, path: str) -> None:
        self.clauses += 1
        if self.clauses > MAX_CLAUSES:
            raise InvalidInput(f"{path}: the filter has more than {MAX_CLAUSES} clauses; split the query or use $in.")

    def value(self, path: str, n: int = 1) -> None:
        self.values += n
        if self.values > MAX_VALUES:
            raise InvalidInput(f"{path}: the filter holds more than {MAX_VALUES} values in all; narrow it down.")


def _index(path: str, key: object) -> str:
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]" if isinstance(key, str) else f"{path}[{key}]"


def parse_where(where: object) -> Filter:
    """Parse a Chroma-style where dict (see the module docstring) into a Filter.

        parse_where({"topic": "travel", "n": {"$gte": 2}}).matches(fact)

    Args:
        where: None, {} (both: every fact) or a dict of fields and $and / $or.
    Returns:
        an immutable Filter (MATCH_ALL for None and {}).
    Raises:
        InvalidInput: one message naming the path of the first problem, e.g.
            `where["$or"][1]["age"]: $gt expects a number, a string or a time, got True (bool).`
    """
    if where is None:
        return MATCH_ALL
    if not isinstance(where, Mapping):
        raise InvalidInput(
            f'where expects a dict such as {{"topic": "travel"}} or {{"$or": [...]}}, got {show_value(where)}.'
        )
    if not where:
        return MATCH_ALL
    return _parse_doc(where, "where", 0, _Budget())


def _parse_doc(doc: Mapping, path: str, depth: int, budget: _Budget) -> Filter:
    parts: list[Filter] = []
    for key, value in doc.items():
        here = _index(path, key)
        if not isinstance(key, str):
            raise InvalidInput(f"{here}: filter keys are strings (a tag key, source, created_at, updated_at, $and, "
                               f"$or), got {show_value(key)}.")
        if key in LOGICAL:
            parts.append(_parse_logical(key, value, here, depth, budget))
        elif key.startswith("$"):
            if key in FIELD_OPS:
                raise InvalidInput(f'{here}: {key} applies to a field; write {{"field": {{"{key}": ...}}}}.')
            raise InvalidInput(f"{here}: unknown operator {key!r}; at this level use $and or $or (fields take "
                               f"{_OPS_TEXT}).")
        else:
            parts.extend(_parse_field(_field(key, here), value, here, budget))
    return all_of(*parts)


def _parse_logical(op: str, value: object, path: str, depth: int, budget: _Budget) -> Filter:
    if depth + 1 > MAX_DEPTH:
        raise InvalidInput(f"{path}: $and / $or nest more than {MAX_DEPTH} levels deep; flatten the filter.")
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidInput(f"{path}: {op} expects a non-empty list of filters, got {show_value(value)}.")
    budget.clause(path)
    parts = []
    for i, item in enumerate(value):
        here = _index(path, i)
        if not isinstance(item, Mapping) or not item:
            raise InvalidInput(f'{here}: {op} expects each item to be a non-empty filter dict such as {{"topic": '
                               f'"travel"}}, '
                               f"got {show_value(item)}.")
        parts.append(_parse_doc(item, here, depth + 1, budget))
    if len(parts) == 1:
        return parts[0]
    if op == "$and":
        return all_of(*parts)
    return Or(tuple(q for p in parts for q in (p.parts if isinstance(p, Or) else (p,))))


def _field(key: str, path: str) -> Field:
    if key in FACT_FIELDS:
        return Field(key)
    if key in SCOPE_LEVELS:  # a scope, not a tag; tags[user] still reads such a tag an earlier version stored
        err = scope_name_refused(key, path)
        raise InvalidInput(f"{err} (A tag named {key!r} that an earlier version stored is read as 'tags[{key}]'.)")
    tag = key[5:-1] if key.startswith("tags[") and key.endswith("]") else key
    if not TAG_KEY_RE.fullmatch(tag):
        raise InvalidInput(
            f"{path}: {key!r:.80} is not a field: use source, created_at, updated_at, $and, $or or a tag key "
            "([A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}, or tags[key])."
        )
    return Field("tag", tag)


def _parse_field(field: Field, value: object, path: str, budget: _Budget) -> list[Filter]:
    if isinstance(value, Mapping):
        if not value:
            raise InvalidInput(f'{path}: expects a value or an operator dict such as {{"$eq": ...}}, got {{}}.')
        out = []
        for op, arg in value.items():
            if op not in FIELD_OPS:
                hint = "" if isinstance(op, str) and op.startswith("$") else " (a dict is not a value)"
                raise InvalidInput(f"{path}: unknown operator {op!r:.40}{hint}; a field takes {_OPS_TEXT}.")
            out.append(_parse_op(field, op, arg, path, budget))
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        raise InvalidInput(f'{path}: expects one value, got a {type(value).__name__}; for any of several write '
                           f'{{"$in": [...]}}.')
    return [_parse_op(field, "$eq", value, path, budget)]


def _parse_op(field: Field, op: str, arg: object, path: str, budget: _Budget) -> Filter:
    """One operator on one field; errors read `<path of the field>: <op> expects ..., got ...`."""
    budget.clause(path)
    if op == "$exists":
        if not isinstance(arg, bool):
            raise InvalidInput(f"{path}: $exists expects true or false, got {show_value(arg)}.")
        return Exists(field, arg)
    if op in MEMBERSHIP:
        if not isinstance(arg, (list, tuple)) or not arg:
            raise InvalidInput(f"{path}: {op} expects a non-empty list of values, got {show_value(arg)}.")
        if len(arg) > MAX_IN:
            raise InvalidInput(f"{path}: {op} expects at most {MAX_IN} values, got {len(arg)}; split the filter "
                               "with $or.")
        budget.value(path, len(arg))
        values = tuple(_scalar(field, op, v, f"{path}: {op}[{i}]") for i, v in enumerate(arg))
        kinds = {value_type(v) for v in values}
        if len(kinds) > 1:
            raise InvalidInput(f"{path}: {op} expects values of one type, got {' and '.join(sorted(kinds))}; "
                               "a tag holds one value, so split the list with $or.")
        return Member(field, values, negate=op == "$nin")
    budget.value(path)
    return Compare(field, op, _scalar(field, op, arg, f"{path}: {op}"))


def _scalar(field: Field, op: str, value: object, what: str) -> FilterValue:
    """Check one filter value against its field and operator (`what` names it); times come back in UTC."""
    if field.name in TIME_FIELDS:
        return parse_time(value, what)
    if field.name == "source":
        if not isinstance(value, str):
            raise InvalidInput(f"{what} on source expects a string, got {show_value(value)}.")
        if not 1 <= len(value) <= MAX_SOURCE_CHARS:
            raise InvalidInput(f"{what} on source expects 1 to {MAX_SOURCE_CHARS} characters, got {len(value)}.")
        plain_string(value, what)
        return value
    if op in ORDER and value_type(value) not in ("number", "str"):
        raise InvalidInput(f"{what} expects a number or a string, got {show_value(value)}"
                           + ("; bools have no order, use $eq." if isinstance(value, bool) else "."))
    return check_tag_value(value, what)
