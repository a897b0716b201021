"""`import evermind_memory` (and AsyncMemoryStore, and the integrations package) load no framework: LangChain and
LangGraph are imported only by the modules that wrap them."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("langchain", "langchain_core", "langgraph", "langsmith", "pydantic")


def loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sys.modules))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())


def test_the_package_and_the_async_store_import_no_framework() -> None:
    loaded = loaded_after("import evermind_memory, evermind_memory.integrations\n"
                          "from evermind_memory import AsyncMemoryStore")
    assert "evermind_memory.integrations.async_store" in loaded
    assert sorted(m for m in loaded if m.split(".")[0] in FRAMEWORKS) == []
