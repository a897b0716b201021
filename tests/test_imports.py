"""Import hygiene of the store and adaptation (issue 17): `import evermind_memory.store` stays light (no model, no
training, no GPU), adaptation never imports the store, each module imports on its own in a fresh interpreter, and
no module-level import cycle runs through store/ or adaptation/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import evermind_memory

PACKAGE = Path(evermind_memory.__file__).parent
HEAVY = ("evermind_memory.training", "evermind_memory.adaptation", "evermind_memory.lm.model", "evermind_memory.gpu",
         "wgpu")
# Imports each named module in a child forked from an interpreter that has loaded only third-party libraries (a
# fresh set of our modules each time, without paying start-up and numpy per module); prints the ones that failed.
FORK_EACH = """
import os, sys, traceback
import hnswlib, numpy, regex, sqlite_utils
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            __import__(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        failed.append(name)
print(" ".join(failed))
"""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (PACKAGE / pkg).rglob("*.py"))


def loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sys.modules))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())


def test_importing_the_store_loads_no_model_training_or_gpu() -> None:
    loaded = loaded_after("import evermind_memory.store")
    assert "evermind_memory.store.memory_store" in loaded
    assert sorted(m for m in loaded if m.startswith(HEAVY)) == []


def test_adaptation_never_imports_the_store() -> None:
    loaded = loaded_after("import evermind_memory.adaptation")
    assert "evermind_memory.adaptation.rounds" in loaded
    assert sorted(m for m in loaded if m.startswith("evermind_memory.store")) == []


def test_training_never_imports_the_store_or_adaptation() -> None:
    loaded = loaded_after("import evermind_memory.training")
    assert "evermind_memory.training.trainer" in loaded
    assert sorted(m for m in loaded if m.startswith(("evermind_memory.store", "evermind_memory.adaptation"))) == []


def test_every_store_and_adaptation_module_imports_alone() -> None:
    names = [module_name(p) for p in modules_of("store", "adaptation")]
    assert len(names) > 20
    run = subprocess.run([sys.executable, "-c", FORK_EACH, *names], capture_output=True, text=True, check=True)
    assert run.stdout.split() == [], run.stderr[-4000:]


def _module_level_imports(path: Path, known: set[str]) -> set[str]:
    """The evermind_memory modules `path` imports when it is loaded (imports inside functions are left out):
    `from pkg import name` is an edge to the submodule pkg.name when there is one, else to pkg."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("evermind_memory"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.startswith("evermind_memory"):
                out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk of `graph` (module -> the modules it imports) meets, each as a path."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_find_cycles_finds_a_cycle() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_cycle_through_store_or_adaptation() -> None:
    files = {module_name(p): p for p in modules_of("store", "adaptation", "training", "embedder", "lm")}
    graph = {m: {d for d in _module_level_imports(p, set(files)) if d in files and d != m} for m, p in files.items()}
    assert graph["evermind_memory.store.vectors"] >= {"evermind_memory.store.backend", "evermind_memory.store.index"}
    ours = [c for c in find_cycles(graph)
            if any(m.startswith(("evermind_memory.store", "evermind_memory.adaptation")) for m in c)]
    assert ours == []
