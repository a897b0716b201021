"""The two engines' sessions share their common code (issue 33 item 3): a query that differs between SQLite and
PostgreSQL only in spelling lives once, in backend/session.py, over the engine's Dialect. Counted from the
source: no method that both engine sessions define is 80% or more the same text once psycopg's `%s` reads as `?`
and the sessions' ways of running a statement read alike, except those named below with the reason."""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

import evermind_memory

BACKEND = Path(evermind_memory.__file__).resolve().parent / "store" / "backend"
ALIKE = 0.8
EXPECTED_ALIKE = {
    "_run": "running one statement: each engine's own call",
    "_many": "running one statement many times: each engine's own call",
    "generation_drop": "SQLite drops the table it creates per build; PostgreSQL's schema keeps it and empties it",
}


def methods(module: str, cls: str) -> dict[str, str]:
    source = (BACKEND / module).read_text(encoding="utf-8")
    tree = ast.parse(source)
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {f.name: ast.get_source_segment(source, f) or "" for f in klass.body if isinstance(f, ast.FunctionDef)}


def normalised(text: str) -> str:
    text = re.sub(r"\bself\._(all|one|scalar)\b", "self.conn.execute", text.replace("%s", "?"))
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def alike() -> dict[str, float]:
    """Method name -> how alike the two engines' texts of it are (difflib's ratio), for the methods both define."""
    sqlite = methods("sqlite_session.py", "SQLiteSession")
    postgres = methods("postgres_session.py", "PostgresSession")
    return {name: difflib.SequenceMatcher(None, normalised(sqlite[name]), normalised(postgres[name])).ratio()
            for name in sorted(set(sqlite) & set(postgres))}


def test_no_query_is_written_twice_for_the_two_engines() -> None:
    twins = {name for name, ratio in alike().items() if ratio >= ALIKE}
    assert twins <= set(EXPECTED_ALIKE), sorted(twins - set(EXPECTED_ALIKE))


def test_the_shared_session_holds_the_common_queries() -> None:
    shared = methods("session.py", "Session")
    assert {"meta", "fetch_where", "list_rows", "history", "stale", "update", "delete", "prune_history", "vectors",
            "memory_texts", "generation_rows"} <= set(shared)
    assert all("%s" not in text for text in shared.values())  # written with `?`; the Dialect says what travels
