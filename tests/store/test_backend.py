"""The SQLite backend implements the whole interface the store is written against (store/backend/base.py),
with the same parameters, so a second backend has one list to implement and the store no hidden extras."""

from __future__ import annotations

import inspect

import pytest

from evermind_memory.store.backend import Backend, Reads, Writes, base
from evermind_memory.store.backend.postgres_session import PostgresSession
from evermind_memory.store.backend.sqlite import EXPECTED_TABLES, SQLiteBackend, created_tables
from evermind_memory.store.backend.sqlite_session import SQLiteSession


def interface(protocol: type) -> dict[str, inspect.Signature]:
    names = {n for klass in protocol.__mro__ if klass.__module__ == base.__name__  # (Reads' roles, Writes, Backend)
             for n, v in vars(klass).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return {n: inspect.signature(getattr(protocol, n)) if callable(getattr(protocol, n)) else None for n in names}


def parameters(sig: inspect.Signature | None) -> list[tuple[str, object]]:
    return [] if sig is None else [(p.name, p.kind) for p in sig.parameters.values()]


@pytest.mark.parametrize("session", [SQLiteSession, PostgresSession])
def test_each_session_implements_reads_and_writes(session: type) -> None:
    wanted = interface(Writes)
    assert set(interface(Reads)) < set(wanted) and {"insert", "lexical", "changes_after"} <= set(wanted)
    for name, sig in wanted.items():
        assert parameters(inspect.signature(getattr(session, name))) == parameters(sig), name


def test_reads_is_the_union_of_its_roles_each_method_in_one() -> None:
    roles = [k for k in Reads.__mro__[1:] if k.__module__ == base.__name__]
    assert not [n for n in vars(Reads) if not n.startswith("_") and callable(vars(Reads)[n])]
    names = [n for role in roles for n, v in vars(role).items() if not n.startswith("_") and callable(v)]
    assert len(names) == len(set(names)) and set(names) == set(interface(Reads))


def test_the_sqlite_backend_implements_backend() -> None:
    wanted = interface(Backend)
    assert {"reading", "snapshot", "transaction", "close", "closed"} <= set(wanted)
    for name, sig in wanted.items():
        got = getattr(SQLiteBackend, name)
        assert isinstance(got, property) if sig is None else parameters(inspect.signature(got)) == parameters(sig), name


def test_expected_tables_are_those_a_new_store_is_created_with() -> None:
    # Opening checks a store against the EXPECTED_TABLES literal (so an open needs no sqlite_utils); it must
    # follow the schema _create_schema makes.
    assert created_tables() == EXPECTED_TABLES
    assert {"facts", "facts_fts", "meta", "changes", "leases"} <= EXPECTED_TABLES
