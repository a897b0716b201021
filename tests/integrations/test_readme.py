"""The README's snippets for the async store, LangChain and LangGraph run as written (in a scratch directory)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest
from extras import require

README = Path(__file__).resolve().parents[2] / "README.md"


def snippets() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Async, LangChain and LangGraph", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_section_has_three_snippets() -> None:
    assert len(snippets()) == 3


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_readme_snippet_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture) -> None:
    if index:
        require(("langchain_core", "langgraph.store.base")[index - 1], ("langchain", "langgraph")[index - 1])
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "snippet.py"
    script.write_text(snippets()[index], encoding="utf-8")
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert ("green tea" in out) and ("Ada" in out)
