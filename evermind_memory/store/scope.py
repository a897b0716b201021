"""Scopes: which part of a store a handle sees. `store.scope(user="ada")` and `MemoryStore(path, namespace=...)`
return handles confined to one scope; this file holds the key, its checks and the visibility rule (no SQL).

A scope is a path over four levels, always in this order: namespace, user, agent, run; each is set or not. Its
key is the set levels joined by "/": `namespace=acme/user=ada/agent=planner`. A handle sees the facts whose key
is its own or lies under it ("user=ada" sees "user=ada" and "user=ada/agent=x", never "user=bob" nor
"agent=x"); the whole store's key is "". A handle writes facts with its own key, and narrowing a handle can only
add levels below its last one, so no view can widen itself.

Why a column, not a tag: tags are the caller's data. `update(tags={})` would clear a scope tag, a where-filter
built by a caller could $or around it, and an export/import could rename it. The scope is a column set once at
remember (never by update), indexed, and ANDed into every query by the backend (backend/filter_sql.py), outside
the where-filter. Hard isolation between tenants that do not trust each other remains one store file each
(docs/reliability.md R17): a scope is isolation inside one service, against mistakes, not against code that opens the
file itself.
"""

from __future__ import annotations

import re
from typing import Mapping

from ..errors import InvalidInput
from .validate import SCOPE_LEVELS, plain_string

LEVELS = SCOPE_LEVELS  # also the tag keys every interface refuses (validate.py): "user" has one meaning
MAX_PART_CHARS = 128
_PART_RE = re.compile(r"[^\x00-\x1f\x7f/]{1,128}")


def check_part(value: object, level: str) -> str:
    """One level's value: 1..128 characters, no "/", no control characters, no surrounding spaces.

    Raises:
        InvalidInput: anything else.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"scope {level} expects a str such as 'ada' or 'user-42', got {type(value).__name__} "
                           f"{value!r:.40}.")
    if not _PART_RE.fullmatch(value) or value != value.strip():
        raise InvalidInput(
            f"scope {level} expects 1 to {MAX_PART_CHARS} characters without '/', control characters or "
            f"surrounding spaces, got {value!r:.60}."
        )
    plain_string(value, f"scope {level}")
    return value


def scope_key(parts: Mapping[str, str]) -> str:
    """The key of checked parts ({level: value}), levels in LEVELS order; "" for none."""
    return "/".join(f"{level}={parts[level]}" for level in LEVELS if parts.get(level) is not None)


def scope_parts(key: str) -> dict[str, str]:
    """{level: value} of a key ({} for the whole store)."""
    if not key:
        return {}
    return dict(part.split("=", 1) for part in key.split("/"))


def narrow(key: str, method: str, **parts: object) -> str:
    """The key of `key` narrowed by `parts` (levels set to None are left out).

    Raises:
        InvalidInput: an unknown level, a bad value, nothing to narrow by, or a level at or above one already
            set (that would widen the view or move it sideways).
    """
    given = {level: value for level, value in parts.items() if value is not None}
    unknown = sorted(set(given) - set(LEVELS))
    if unknown:
        raise InvalidInput(f"{method}() takes the scope levels {', '.join(LEVELS)}; got {', '.join(unknown)}.")
    if not given:
        raise InvalidInput(f"{method}() expected at least one of {', '.join(LEVELS)}, e.g. {method}(user='ada').")
    have = scope_parts(key)
    last = max((LEVELS.index(level) for level in have), default=-1)
    for level in given:
        if LEVELS.index(level) <= last:
            raise InvalidInput(
                f"{method}({level}=...) on a handle scoped to {key!r} would leave its scope: a view can only add "
                f"levels below its last one ({', '.join(LEVELS[last + 1:]) or 'none left'}). Open "
                f"store.scope(...) with every level from the unscoped store instead."
            )
    checked = {level: check_part(value, level) for level, value in given.items()}
    return scope_key({**have, **checked})


def visible(fact_scope: str, key: str) -> bool:
    """Whether a handle scoped to `key` sees a fact whose scope is `fact_scope`."""
    return not key or fact_scope == key or fact_scope.startswith(key + "/")


def check_record_scope(value: object, key: str, what: str) -> str:
    """The scope of an imported record ({level: value} or None, meaning the importing handle's own), which must lie
    in the importing handle's scope `key`.

    Raises:
        InvalidInput: not a dict of levels, a bad value, or a scope outside `key`.
    """
    if value is None:
        return key
    if not isinstance(value, Mapping) or set(value) - set(LEVELS):
        raise InvalidInput(f"{what} expects scope to be a dict over {', '.join(LEVELS)}, got {value!r:.60}.")
    found = scope_key({level: check_part(v, level) for level, v in value.items()})
    if not visible(found, key):
        raise InvalidInput(f"{what}: scope {found!r} is outside this handle's scope {key!r}; import it from a "
                           "handle that covers it.")
    return found
