"""`import evermind_memory` (and AsyncMemoryStore, and the integrations package) load no framework: LangChain and
LangGraph are imported only by the modules that wrap them, and those load no model code until a model is used."""

from __future__ import annotations

import subprocess
import sys

from extras import require

FRAMEWORKS = ("langchain", "langchain_core", "langgraph", "langsmith", "pydantic")
# embedder.lm_embedder is not here: it imports the model code only when a model is built (issue 17's lazy model)
HEAVY = ("evermind_memory.lm.model", "evermind_memory.lm.tokenizer", "evermind_memory.training",
         "evermind_memory.adaptation", "evermind_memory.gpu", "wgpu")


def loaded_after(*statements: str) -> list[set[str]]:
    """The modules loaded after each statement, run in turn in one fresh interpreter."""
    code = "import sys\n" + "".join(f"{s}\nprint(' '.join(sys.modules))\n" for s in statements)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return [set(line.split()) for line in out.splitlines()]


def test_the_package_imports_no_framework_and_the_framework_modules_no_model_code() -> None:
    require("langchain_core", "langchain")
    require("langgraph.store.base", "langgraph")
    package, frameworks = loaded_after(
        "import evermind_memory, evermind_memory.integrations\nfrom evermind_memory import AsyncMemoryStore",
        "import evermind_memory.integrations.langchain, evermind_memory.integrations.langgraph")
    assert "evermind_memory.integrations.async_store" in package
    assert sorted(m for m in package if m.split(".")[0] in FRAMEWORKS) == []
    assert {"langchain_core", "langgraph"} <= frameworks
    assert sorted(m for m in frameworks if m in HEAVY) == []
