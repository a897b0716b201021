"""`import evermind_memory` (and AsyncMemoryStore, and the integrations package) load no framework: LangChain and
LangGraph are imported only by the modules that wrap them, and those load no model code until a model is used."""

from __future__ import annotations

import subprocess
import sys

from extras import require

FRAMEWORKS = ("langchain", "langchain_core", "langgraph", "langsmith", "pydantic")
HEAVY = ("evermind_memory.lm.model", "evermind_memory.embedder.lm_embedder", "evermind_memory.training",
         "evermind_memory.adaptation", "evermind_memory.gpu", "wgpu")


def loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sys.modules))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())


def test_the_package_and_the_async_store_import_no_framework() -> None:
    loaded = loaded_after("import evermind_memory, evermind_memory.integrations\n"
                          "from evermind_memory import AsyncMemoryStore")
    assert "evermind_memory.integrations.async_store" in loaded
    assert sorted(m for m in loaded if m.split(".")[0] in FRAMEWORKS) == []


def test_the_framework_modules_load_no_model_code() -> None:
    require("langchain_core", "langchain")
    require("langgraph.store.base", "langgraph")
    loaded = loaded_after("import evermind_memory.integrations.langchain, evermind_memory.integrations.langgraph")
    assert {"langchain_core", "langgraph"} <= loaded
    assert sorted(m for m in loaded if m in HEAVY) == []
