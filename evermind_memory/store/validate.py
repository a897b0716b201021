"""Input checks at the public boundary of MemoryStore (docs/reliability.md R19).

Each check raises `InvalidInput` with what was expected, what arrived and what to do; inner code trusts the
values these functions return.
"""

from __future__ import annotations

import math
import os
import re
from datetime import datetime
from typing import Iterator, Mapping, Union

from ..errors import InvalidInput

MAX_TEXT_CHARS = 100_000
MAX_TAGS = 32
MAX_TAG_VALUE_CHARS = 512
MAX_SAFE_INT = 2**53 - 1  # typed tag ints: exact as doubles, so numbers compare alike in SQLite, PostgreSQL, Python
MAX_SOURCE_CHARS = 256
MAX_ID_CHARS = 128
K_MAX = 1000
MAX_LIST_LIMIT = 100_000
TAG_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}")
# The scope levels (store/scope.py), in nesting order. Their names are not tag keys: "user" means one thing in
# every interface, the user a fact belongs to (store.scope(user=...), the CLI's --user, `evermind mcp --user`).
SCOPE_LEVELS = ("namespace", "user", "agent", "run")
_SCOPE_EXAMPLE = {"namespace": "acme", "user": "ada", "agent": "planner", "run": "r1"}
MODES = ("hybrid", "vector", "lexical")
FUSIONS = ("score", "rrf")
TagValue = Union[str, int, float, bool]  # what a typed tag holds (check_tag_value)


def plain_string(value: str, what: str) -> None:
    """Refuse NUL and lone surrogates, which SQLite truncates or refuses (R19)."""
    nul = value.find("\x00")
    if nul >= 0:
        raise InvalidInput(f"{what} must not contain NUL characters, found one at position {nul}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"{what} must be valid Unicode text, found a lone surrogate {value[exc.start]!r} at position "
            f"{exc.start}. Decode your bytes with errors='replace' first."
        ) from None


def check_text(text: object, what: str = "text") -> str:
    """A fact's text or a query: a non-blank str of at most MAX_TEXT_CHARS characters.

    Raises:
        InvalidInput: not a str, blank, too long, NUL or lone surrogates.
    """
    if not isinstance(text, str):
        raise InvalidInput(f"{what} expected a str, got {type(text).__name__}.")
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidInput(
            f"{what} expected at most {MAX_TEXT_CHARS:,} characters, got {len(text):,}. Split it into smaller facts."
        )
    if not text.strip():
        raise InvalidInput(f"{what} expected some non-blank text, got {text!r:.40}.")
    plain_string(text, what)
    return text


def scope_name_refused(key: str, what: str) -> InvalidInput:
    """The error for a tag (or filter) key that names a scope level: what it means, and how each interface says it."""
    example = _SCOPE_EXAMPLE[key]
    return InvalidInput(
        f"{what} key {key!r} names a scope level, not a tag: a fact belongs to a {key} through its scope, which every "
        f"interface shares: store.scope({key}={example!r}) in Python, --{key} {example} on the command line, "
        f"`evermind mcp --{key} {example}` for an MCP server. If it is only a label, call the tag something else "
        f"(e.g. 'person')."
    )


def _tag_items(tags: object, what: str, expected: str, scope_names: bool = False) -> Iterator[tuple[str, object]]:
    """(key, value) of a tags mapping whose size and keys are checked; values are the caller's to check. A key
    naming a scope level is refused unless scope_names (tags an earlier version stored, rewritten as they are)."""
    if not isinstance(tags, Mapping):
        raise InvalidInput(f"{what} expected a dict of {expected}, got {type(tags).__name__}.")
    if len(tags) > MAX_TAGS:
        raise InvalidInput(f"{what} expected at most {MAX_TAGS} tags, got {len(tags)}.")
    for key, value in tags.items():
        if not isinstance(key, str) or not TAG_KEY_RE.fullmatch(key):
            raise InvalidInput(
                f"{what} keys must match [A-Za-z0-9_][A-Za-z0-9_.:-]{{0,63}} (e.g. 'topic', 'topic.sub'), got "
                f"{key!r:.80}."
            )
        if key in SCOPE_LEVELS and not scope_names:
            raise scope_name_refused(key, what)
        yield key, value


def check_tags(tags: object, what: str = "tags") -> dict[str, str]:
    """Tags: None or a mapping of short keys ([A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}) to str values.

    Returns:
        a plain dict (a copy), {} for None.
    Raises:
        InvalidInput: not a mapping, too many, bad key, non-str or oversized value.
    """
    if tags is None:
        return {}
    out: dict[str, str] = {}
    for key, value in _tag_items(tags, what, "str -> str"):
        if not isinstance(value, str):
            raise InvalidInput(f"{what}[{key!r}] expected a str value, got {type(value).__name__} {value!r:.40}.")
        if len(value) > MAX_TAG_VALUE_CHARS:
            raise InvalidInput(f"{what}[{key!r}] expected at most {MAX_TAG_VALUE_CHARS} characters, got {len(value)}.")
        plain_string(value, f"{what}[{key!r}]")
        out[key] = value
    return out


def check_typed_tags(tags: object, what: str = "tags", *,
                     scope_names: bool = False) -> dict[str, str | int | float | bool]:
    """Typed tags: None or a mapping of short keys to str, int, float or bool values.

    Args:
        scope_names: accept keys that name a scope level (namespace, user, agent, run): only for tags already
            stored (an earlier version wrote them), never for a caller's.
    Returns:
        a plain dict (a copy), {} for None.
    Raises:
        InvalidInput: not a mapping, too many, a bad key (one naming a scope level, too), a bad value (see
            `check_tag_value`).
    """
    if tags is None:
        return {}
    return {key: check_tag_value(value, f"{what}[{key!r}]")
            for key, value in _tag_items(tags, what, "str -> str, int, float or bool", scope_names)}


def check_tag_patch(tags: object, what: str = "tags") -> dict[str, str | int | float | bool | None]:
    """Tags to merge into a fact's tags (update's default): as check_typed_tags, and a None value removes that tag.

    Raises:
        InvalidInput: as check_typed_tags.
    """
    out: dict[str, TagValue | None] = {}
    for key, value in _tag_items(tags, what, "str -> str, int, float, bool, or None to remove the tag", True):
        if value is None:  # (a tag named like a scope level that an earlier version stored may be removed)
            out[key] = None
        elif key in SCOPE_LEVELS:
            raise scope_name_refused(key, what)
        else:
            out[key] = check_tag_value(value, f"{what}[{key!r}]")
    return out


def merge_tags(old: Mapping[str, TagValue], patch: Mapping[str, TagValue | None],
               method: str = "update") -> dict[str, TagValue]:
    """`old` with `patch` merged in (a None value removes its key), checked against MAX_TAGS.

    Raises:
        InvalidInput: the merged tags would exceed MAX_TAGS.
    """
    merged: dict[str, TagValue] = dict(old)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    if len(merged) > MAX_TAGS:
        raise InvalidInput(f"{method}() would leave the fact with {len(merged)} tags, more than {MAX_TAGS}; remove "
                           "some (a None value removes a tag) or pass replace_tags=True.")
    return merged


def value_type(value: object) -> str:
    """The type a tag or filter value compares as: "bool", "number", "str" or "time" ("" for anything else)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, datetime):
        return "time"
    return ""


def show_value(value: object) -> str:
    """A value as an error message shows it: its repr (cut short) and its type."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def check_tag_value(value: object, what: str) -> str | int | float | bool:
    """One typed tag value: a str (<= MAX_TAG_VALUE_CHARS, no NUL), an int within +-MAX_SAFE_INT, a finite
    float, or a bool. Ints are capped so that every number compares exactly as a double in any database.

    Raises:
        InvalidInput: another type, a NaN or infinite float, an int too large to compare exactly, a bad string.
    """
    kind = value_type(value)
    if isinstance(value, str):
        if len(value) > MAX_TAG_VALUE_CHARS:
            raise InvalidInput(f"{what} expects a string of at most {MAX_TAG_VALUE_CHARS} characters, got "
                               f"{len(value)}.")
        plain_string(value, what)
        return value
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInput(f"{what} expects a finite number, got {value!r}; NaN and infinities cannot be compared.")
        if isinstance(value, int) and abs(value) > MAX_SAFE_INT:
            raise InvalidInput(
                f"{what} expects an int within +-(2**53 - 1) (exact as a double in every database), got {value}; "
                "store larger numbers as strings."
            )
        return value if type(value) in (int, float) else (int(value) if isinstance(value, int) else float(value))
    hint = " Store times in tags as ISO 8601 strings (they order as strings)." if kind == "time" else ""
    raise InvalidInput(f"{what} expects a str, int, float or bool, got {show_value(value)}.{hint}")


def check_source(source: object) -> str | None:
    """source: None or a short label (1..256 characters, not only whitespace) saying where a fact came from.

    Raises:
        InvalidInput: not a str, empty, only whitespace, too long, NUL or lone surrogates.
    """
    if source is None:
        return None
    if not isinstance(source, str):
        raise InvalidInput(f"source expected a str or None, got {type(source).__name__}.")
    if not 1 <= len(source) <= MAX_SOURCE_CHARS:
        raise InvalidInput(f"source expected 1 to {MAX_SOURCE_CHARS} characters, got {len(source)}.")
    if not source.strip():  # str.strip(): every Unicode space, tab, U+00A0, U+2028, U+3000 ...
        raise InvalidInput(f"source expected a visible label such as 'chat' or None, got only whitespace "
                           f"{source!r:.40}.")
    plain_string(source, "source")
    return source


def check_id(fact_id: object) -> str:
    """A fact id: a str of 1..128 characters, not only whitespace (ids are opaque; a well-formed unknown id is
    FactNotFound).

    Raises:
        InvalidInput: not a str, empty, only whitespace, too long, NUL or lone surrogates.
    """
    if not isinstance(fact_id, str):
        raise InvalidInput(f"fact id expected a str, got {type(fact_id).__name__} {fact_id!r:.40}.")
    if not 1 <= len(fact_id) <= MAX_ID_CHARS:
        raise InvalidInput(f"fact id expected 1 to {MAX_ID_CHARS} characters, got {len(fact_id)}.")
    if not fact_id.strip():  # reads and check() take a row with a blank id for a damaged one
        raise InvalidInput(f"fact id expected some visible characters, got only whitespace {fact_id!r:.40}.")
    plain_string(fact_id, "fact id")
    return fact_id


def check_int(value: object, name: str, low: int, high: int, method: str) -> int:
    """An int (not a bool) in [low, high].

    Raises:
        InvalidInput: a bool, a non-int or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{method}() expected {name} to be an int, got {type(value).__name__} {value!r:.40}.")
    if value < low:
        raise InvalidInput(f"{method}() expected {name} >= {low}, got {name}={value}.")
    if value > high:
        raise InvalidInput(f"{method}() expected {name} <= {high}, got {name}={value}.")
    return value


def check_k(k: object) -> int:
    """recall's k: an int in [1, K_MAX]."""
    return check_int(k, "k", 1, K_MAX, "recall")


def check_min_score(min_score: object) -> float | None:
    """None or a finite real number.

    Raises:
        InvalidInput: a bool, a non-number, NaN or infinite.
    """
    if min_score is None:
        return None
    if isinstance(min_score, bool) or not isinstance(min_score, (int, float)):
        raise InvalidInput(f"recall() expected min_score to be a float or None, got {type(min_score).__name__}.")
    if not math.isfinite(min_score):
        raise InvalidInput(f"recall() expected a finite min_score, got {min_score!r}.")
    return float(min_score)


def check_relevance(value: object) -> float | None:
    """None or a number in [0, 1] (recall's min_relevance).

    Raises:
        InvalidInput: anything else (a bool, NaN, outside [0, 1]).
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0.0 <= value <= 1.0):
        raise InvalidInput(f"recall() expected min_relevance to be a number in [0, 1] or None, got {value!r:.40}.")
    return None if value is None else float(value)


def check_flag(value: object, name: str, method: str) -> bool:
    """A bool argument (not 0/1, not a string).

    Raises:
        InvalidInput: anything else.
    """
    if not isinstance(value, bool):
        raise InvalidInput(f"{method}() expected {name} to be True or False, got {value!r:.40}.")
    return value


def check_choice(value: object, name: str, choices: tuple[str, ...], method: str) -> str:
    """One of a few strings.

    Raises:
        InvalidInput: anything else.
    """
    if not isinstance(value, str) or value not in choices:
        raise InvalidInput(f"{method}() expected {name} to be one of {', '.join(map(repr, choices))}, got "
                           f"{value!r:.40}.")
    return value


def check_path(value: object, name: str, method: str) -> str:
    """A file path argument: a str or os.PathLike naming a non-empty text path, without NUL.

    Returns:
        the path as text.
    Raises:
        InvalidInput: None, a number, bytes (or a PathLike giving bytes), an empty path or one with NUL.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise InvalidInput(f"{method}() expected {name} to be a str or os.PathLike path, got {show_value(value)}.")
    text = os.fspath(value)
    if not isinstance(text, str):
        raise InvalidInput(f"{method}() expected {name} to be a text path, got {show_value(text)}; decode it first, "
                           "e.g. os.fsdecode(path).")
    if not text:
        raise InvalidInput(f"{method}() expected {name} to be a path, got an empty string.")
    if "\x00" in text:
        raise InvalidInput(f"{method}() expected {name} to be a path without NUL characters, got {text!r:.80}.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        pass  # undecodable bytes of a real file name (surrogateescape): the OS takes them back as they were
    return text


def check_open_args(path: object, durability: object, on_mismatch: object, lock_timeout: object, busy_timeout: object,
                    read_only: object, background_embedding: object) -> str:
    """MemoryStore()'s plain arguments; returns the path as text (index_config and namespace are checked there).

    Raises:
        InvalidInput: a path that is not a non-empty text path; a bad durability, on_mismatch, timeout or flag.
    """
    path = check_path(path, "path", "MemoryStore")
    check_choice(durability, "durability", ("normal", "full"), "MemoryStore")
    check_choice(on_mismatch, "on_mismatch", ("reembed", "raise"), "MemoryStore")
    for name, value in (("lock_timeout", lock_timeout), ("busy_timeout", busy_timeout)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 86_400:
            raise InvalidInput(f"MemoryStore() expected 0 <= {name} <= 86400 seconds, got {value!r}.")
    for name, flag in (("read_only", read_only), ("background_embedding", background_embedding)):
        if not isinstance(flag, bool):
            raise InvalidInput(f"MemoryStore() expected {name} to be a bool, got {flag!r}.")
    return path
