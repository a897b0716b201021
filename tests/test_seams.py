"""The seams between the store's modules, counted from the source (issue 33 item 2): no module reaches into
MemoryStore's private attributes. The front builds its parts (store/parts.py) and passes them to the modules that
work on them, so closing.py, maintenance.py and search.py never read `store._db`, `owner._sweep_expired()` and
the like.

A reach is `x._name` (or `getattr(x, "_name")`) where x is a name other than `self` and `cls` and `_name` is a
private attribute or method of MemoryStore (set on self or defined in memory_store*.py), unless the module's own
classes define `_name` too and x is not called `store` (async_store.py's views have a `_root` of their own, the
sweeper's thread reads its own `_owner`). The front's own files are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable

import evermind_memory

ROOT = Path(evermind_memory.__file__).resolve().parent
FRONT = ("memory_store.py", "memory_store_maintenance.py", "memory_store_adaptation.py")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_privates(tree: ast.AST) -> set[str]:
    """Private names a module's classes define: `self._x = ...`, `_x: T` in a class body, `def _x`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) \
                and node.value.id == "self" and _private(node.attr):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and _private(item.target.id):
                    names.add(item.target.id)
    return names


def store_privates() -> set[str]:
    names: set[str] = set()
    for name in FRONT:
        names |= own_privates(ast.parse((ROOT / "store" / name).read_text(encoding="utf-8")))
    return names


def reaches(tree: ast.AST, privates: set[str]) -> list[tuple[int, str]]:
    """(line, "x._name") for each reach into `privates` in a module."""
    own = own_privates(tree)

    def counts(receiver: ast.expr, name: object) -> bool:
        return isinstance(receiver, ast.Name) and receiver.id not in ("self", "cls") and name in privates and (
            name not in own or receiver.id == "store")

    return attribute_reaches(tree, counts)


def attribute_reaches(tree: ast.AST, counts: Callable[[ast.expr, object], bool]) -> list[tuple[int, str]]:
    """(line, text) for each `x._name` and `getattr(x, "_name")` / `hasattr(...)` that `counts(x, name)` accepts."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and counts(node.value, node.attr):
            found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and counts(node.args[0], node.args[1].value):
            found.append((node.lineno, f"{node.func.id}({ast.unparse(node.args[0])}, {node.args[1].value!r})"))
    return sorted(found)


def store_reaches() -> dict[str, list[tuple[int, str]]]:
    """module path -> its reaches into MemoryStore's privates (modules with none left out)."""
    privates = store_privates()
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path.parent.name == "store" and path.name in FRONT:
            continue
        found = reaches(ast.parse(path.read_text(encoding="utf-8")), privates)
        if found:
            out[str(path.relative_to(ROOT))] = found
    return out


def test_the_counter_sees_a_reach():
    privates = {"_db", "_closed", "_root"}
    code = ast.parse("class V:\n    def f(self, view):\n        self._root = 1\n        view._root = 2\n"
                     "def g(store):\n    store._db.close()\n    getattr(store, '_closed', True)\n    store._root\n")
    assert reaches(code, privates) == [(6, "store._db"), (7, "getattr(store, '_closed')"), (8, "store._root")]
    assert {"_parts", "_scope", "_check_usable"} <= store_privates()


def test_no_module_reaches_into_memory_store_privates():
    found = store_reaches()
    assert not found, f"reaches into MemoryStore's private attributes: {found}"


# ---- the whole package: no module imports another's private names or reaches into another's private attributes
#
# Issue 33 counted 74 private names imported across modules (58 of them inside gpu/ops/, from `_dispatch`) and 64
# private attributes reached. A private import is `from x import _name`. A reach is `x._name` (or
# `getattr(x, "_name")`) where x is anything but a bare `self` or `cls` and the module's own classes do not define
# `_name` (a module reading its own objects' privates, such as async_store.py's views, is not a reach). A module
# named `_x.py` is private to the package, not to one module: its public names are for the package to import.
#
# Not counted: namedtuple's public API, which carries an underscore so as not to clash with field names
# (`_make`, `_replace`, `_fields`, `_asdict`), and `os._exit`, the standard library's documented hard exit.

NAMEDTUPLE_API = {"_make", "_replace", "_fields", "_asdict", "_field_defaults"}
STDLIB = {"os._exit"}

# What can't move yet, each with its reason (none now). An entry that no longer matches fails the test: take it out.
ALLOWED: dict[tuple[str, str], str] = {}


def own_names(tree: ast.AST) -> set[str]:
    """own_privates, plus private names assigned in a class body (`_fields = (...)`)."""
    names = own_privates(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.Assign):
                    names |= {t.id for t in item.targets if isinstance(t, ast.Name) and _private(t.id)}
    return names


def crossings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) for each private import and each reach into another module's private attribute."""
    own = own_names(tree)

    def counts(receiver: ast.expr, name: object) -> bool:
        if not isinstance(name, str) or not _private(name) or name in own or name in NAMEDTUPLE_API:
            return False
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            return False
        return f"{ast.unparse(receiver)}.{name}" not in STDLIB

    imports = [(node.lineno, f"from {'.' * node.level}{node.module or ''} import {alias.name}")
               for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for alias in node.names if _private(alias.name)]
    return sorted(imports + attribute_reaches(tree, counts))


def package_crossings() -> dict[tuple[str, str], list[int]]:
    """(module path, text) -> the lines where it occurs, over the whole package."""
    out: dict[tuple[str, str], list[int]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for line, text in crossings(ast.parse(path.read_text(encoding="utf-8"))):
            out.setdefault((rel, text), []).append(line)
    return out


def test_the_package_counter_sees_imports_and_reaches():
    code = ast.parse(
        "import os\nfrom .a import _helper, public\nfrom . import _module\n"
        "class Row(NamedTuple):\n    x: int\n"
        "class Own:\n    _fields = ('a',)\n    def f(self, other):\n        self._mine = 1\n        other._mine\n"
        "        other._theirs\n        self.gpu._layout\n        getattr(other, '_hidden', None)\n"
        "        Row._make((1,))._replace(x=2)\n        os._exit(0)\n        Own._fields\n")
    assert crossings(code) == [
        (2, "from .a import _helper"), (3, "from . import _module"), (11, "other._theirs"), (12, "self.gpu._layout"),
        (13, "getattr(other, '_hidden')")]


def test_no_module_crosses_into_another_modules_privates():
    found = package_crossings()
    unexpected = {key: lines for key, lines in found.items() if key not in ALLOWED}
    assert not unexpected, f"private imports or reaches across modules (give the name a public spelling): {unexpected}"
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"allowed crossings that no longer occur; take them out of ALLOWED: {stale}"
