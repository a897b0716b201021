"""The docs are tested: README.md and docs/*.md.

- Every ```python block runs, in order, one namespace per file, in a scratch directory. A block that needs
  something a test machine may lack says so on the line just above its fence, and is skipped with that reason
  shown: `<!-- test: needs MODULE -->` (skipped when MODULE cannot be imported) or `<!-- test: skip REASON -->`
  (always skipped; for what no test machine has, e.g. a PostgreSQL server at the URL shown). docs/development.md
  documents the convention.
- Every `evermind ...` command of a ```bash block parses with the CLI's own parser, and every ```json block is JSON.
- docs/cli.md documents every subcommand and option of `evermind`, and nothing that does not exist; docs/mcp.md
  every MCP tool with its arguments, and nothing more (as sqlite-utils' test_docs does for its CLI).
- Every relative link and every repository path in backticks resolves; no absolute machine path, no reference to
  something outside the repository (an issue number, a design note), and every R-rule the docs or the code cite is
  defined in docs/reliability.md.
- The README's test command is the one .ci/run runs.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

from evermind_memory import cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
MARK = re.compile(r"<!--\s*test:\s*(needs|skip)\s+(.+?)\s*-->\s*$")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def blocks(kind: str) -> list[tuple[Path, int, str, tuple[str, str] | None]]:
    """(file, line, code, (mark, argument) or None) of every ```kind block in the docs, in order."""
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) != kind:
                continue
            line = text.count("\n", 0, m.start()) + 1
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = MARK.search(before)
            out.append((path, line, m.group(2), (mark.group(1), mark.group(2)) if mark else None))
    return out


PYTHON = blocks("python")


# ---- python blocks run -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Per docs file: its scratch directory and the namespace its blocks share."""
    return {path: (tmp_path_factory.mktemp(path.stem), {"__name__": "__main__"}) for path in DOCS}


@pytest.mark.parametrize("path,line,code,mark", PYTHON, ids=[f"{_rel(p)}:{n}" for p, n, _, _ in PYTHON])
def test_a_python_block_runs(path, line, code, mark, sessions, monkeypatch, capsys) -> None:
    if mark is not None:
        kind, arg = mark
        if kind == "skip":
            pytest.skip(arg)
        if importlib.util.find_spec(arg.split(".")[0]) is None or importlib.util.find_spec(arg) is None:
            pytest.skip(f"needs {arg}, which is not installed (pip install -e '.[test]' has it)")
    directory, namespace = sessions[path]
    monkeypatch.chdir(directory)
    exec(compile(code, f"{_rel(path)}:{line}", "exec"), namespace)  # noqa: S102 (our own docs)
    capsys.readouterr()


def test_every_docs_file_has_a_runnable_python_block_or_says_why_not() -> None:
    with_code = {p for p, _, _, _ in PYTHON}
    assert REPO / "README.md" in with_code
    for name in ("usage", "filters-and-scopes", "integrations"):
        assert REPO / "docs" / f"{name}.md" in with_code


# ---- shell commands and JSON -------------------------------------------------------------------------------------
def _evermind_commands(code: str) -> list[list[str]]:
    """Each `evermind ...` invocation of a bash block (also after &&, | or ;), split as the shell would."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.commenters = "#"
        lexer.whitespace_split = True
        command: list[str] = []
        for token in [*lexer, ";"]:
            if token in ("&&", "||", "|", ";", "&", ">", ">>", "<"):
                if command and Path(command[0]).name == "evermind":
                    out.append(command[1:])
                command = [] if token not in (">", ">>", "<") else ["(redirect)"]
            else:
                command.append(token)
    return out


BASH = [(p, n, argv) for p, n, code, _ in blocks("bash") for argv in _evermind_commands(code)]


@pytest.mark.parametrize("path,line,argv", BASH, ids=[f"{_rel(p)}:{n}:{' '.join(a)[:40]}" for p, n, a in BASH])
def test_a_documented_command_line_parses(path, line, argv) -> None:
    argv = [a for a in argv if a not in ("--version",)]
    try:
        cli.build_parser().parse_args(argv)
    except cli.UsageError as exc:
        pytest.fail(f"{_rel(path)}:{line}: `evermind {shlex.join(argv)}`: {exc}")


@pytest.mark.parametrize("path,line,code", [(p, n, c) for p, n, c, _ in blocks("json")],
                         ids=[f"{_rel(p)}:{n}" for p, n, _, _ in blocks("json")])
def test_a_json_block_is_json(path, line, code) -> None:
    json.loads(code)


def test_the_readme_test_command_is_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    bash = [m.group(2).strip() for m in FENCE.finditer(readme) if m.group(1) == "bash"]
    tests = [code for code in bash if "pytest" in code]
    assert tests and tests[0] in ci, "the README's test command must be the line .ci/run runs verbatim"
    assert any(code.endswith("evermind demo") for code in bash)


def test_the_readme_demo_excerpt_is_what_the_demo_prints() -> None:
    """The excerpt under "an excerpt of what it prints": each recall's hits, in order, with their scores (to
    within the last printed digit, for BLAS rounding across machines)."""
    import io

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    excerpt = readme.split("an excerpt of what it prints", 1)[1]
    block = FENCE.search(excerpt).group(2)
    shown: dict[str, list[tuple[float, str]]] = {}
    for part in block.strip().split("\n\n"):
        head, *lines = part.splitlines()
        query = re.fullmatch(r"recall\('(.*)', k=2\)", head).group(1)
        shown[query] = [(float(line.split()[0]), line.split(None, 1)[1]) for line in lines]
    out = io.StringIO()
    assert cli.main(["demo", "--json"], out=out) == 0
    printed = {r["query"]: r["hits"] for r in json.loads(out.getvalue())["recalls"] if "scope" not in r}
    assert shown and set(shown) <= set(printed)
    for query, hits in shown.items():
        assert [text for _, text in hits] == [h["text"] for h in printed[query]], query
        assert [score for score, _ in hits] == pytest.approx([h["score"] for h in printed[query]], abs=0.011)


# ---- the CLI and docs/cli.md -------------------------------------------------------------------------------------
COMMON = {"--db", "--json", "--model", "--tokenizer", "--durability", "--namespace", "--user", "--agent", "--run",
          "-h", "--help"}
OPTION = re.compile(r"`(--?[a-z][a-z-]*)")
HEADING = re.compile(r"^### `evermind ([a-z]+)([^`]*)`", re.M)


def _commands() -> dict:
    return cli.build_parser()._subparsers._group_actions[0].choices  # argparse has no public list of subparsers


def _sections() -> dict[str, tuple[str, str]]:
    """docs/cli.md: command -> (the rest of its heading, its section's text up to the next heading of level 2-3)."""
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    out = {}
    for m in HEADING.finditer(text):
        following = re.search(r"^#{2,3} ", text[m.end():], re.M)
        section = text[m.end(): m.end() + following.start()] if following else text[m.end():]
        assert m.group(1) not in out, f"docs/cli.md documents `evermind {m.group(1)}` twice"
        out[m.group(1)] = (m.group(2), section)
    return out


def test_cli_md_documents_every_command_and_nothing_else() -> None:
    assert set(_sections()) == set(_commands())


@pytest.mark.parametrize("name", sorted(_commands()))
def test_cli_md_documents_each_option_of_a_command_and_no_other(name: str) -> None:
    sub = _commands()[name]
    heading, section = _sections()[name]
    real = {s for a in sub._actions for s in a.option_strings} - COMMON
    documented = set(OPTION.findall(section))
    assert real <= documented, f"`evermind {name}` options missing from docs/cli.md: {sorted(real - documented)}"
    assert documented <= real | COMMON, (f"docs/cli.md documents options `evermind {name}` lacks: "
                                         f"{sorted(documented - real - COMMON)}")
    positionals = {(a.metavar or a.dest).upper() for a in sub._actions if not a.option_strings}
    assert set(re.findall(r"[A-Z][A-Z_]+", heading)) == positionals, f"heading of `evermind {name}`: {heading!r}"


def test_cli_md_documents_the_options_of_every_command() -> None:
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    common = text.split("## Options of every command", 1)[1].split("\n## ", 1)[0]
    real = {s for a in cli.build_parser()._actions for s in a.option_strings}
    assert set(OPTION.findall(common)) == real
    for code in cli.EXIT_CODES:
        assert re.search(rf"^\| {code} \|", text, re.M), f"exit code {code} is not in docs/cli.md's table"


# ---- MCP tools and docs/mcp.md -----------------------------------------------------------------------------------
TOOL_ROW = re.compile(r"^\| `([a-z_]+)\(([^)]*)\)`", re.M)


def test_mcp_md_documents_every_tool_with_its_arguments_and_nothing_else() -> None:
    pytest.importorskip("mcp.server", reason="the MCP SDK is the 'mcp' extra: pip install -e '.[test]'")
    import anyio

    from evermind_memory import MemoryStore
    from evermind_memory.mcp import build_server

    with MemoryStore(":memory:") as store:
        tools = anyio.run(build_server(store).list_tools)
    real = {t.name: (set(t.input_schema["properties"]), set(t.input_schema.get("required", []))) for t in tools}
    text = (REPO / "docs" / "mcp.md").read_text(encoding="utf-8")
    documented = {}
    for name, args in TOOL_ROW.findall(text):
        parts = [a.strip() for a in args.split(",") if a.strip()]
        documented[name] = ({re.split(r"[?=]", a)[0] for a in parts},
                            {a for a in parts if "?" not in a and "=" not in a})
    assert set(documented) == set(real)
    for name, (args, required) in real.items():
        assert documented[name][0] == args, f"docs/mcp.md's {name}({', '.join(sorted(documented[name][0]))}); " \
                                            f"the tool takes {sorted(args)}"
        assert documented[name][1] == required, f"{name}: required {sorted(required)} (the others need ? or =)"
    assert "memory://stats" in text


# ---- links, paths and references ---------------------------------------------------------------------------------
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
TICKED = re.compile(r"`([^`\s]+)`")
PATHLIKE = re.compile(r"^[\w.-]+(/[\w.*-]+)*/?$")
MACHINE = re.compile(r"(?<![\w.:])/(work|home|root|tmp|Users|mnt|opt)/")
OUTSIDE = re.compile(r"(?i:\bissues? #?\d+)|\bRELIABILITY\b|\b(DESIGN|STYLE|USERS|CORPUS)\.md\b")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def broken_references(text: str, base: Path) -> list[str]:
    """The relative links (with their #anchors) and backticked repository paths of a markdown text, written in
    directory `base`, that do not resolve; code blocks are left out."""
    prose = FENCE.sub("", text)
    broken = []
    for target in LINK.findall(prose):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (base / file).resolve() if file else None
        if dest is not None and not dest.exists():
            broken.append(f"link {target}")
        elif anchor and (dest is None or dest.suffix == ".md") and anchor not in (
                {_slug(h) for h in re.findall(r"^#+ (.+)$", prose, re.M)} if dest is None else _anchors(dest)):
            broken.append(f"link {target} (no such heading)")
    for token in TICKED.findall(prose):
        token = token.rstrip(".,:;")
        if "/" not in token or "://" in token or token.startswith(("/", "./", "~", "$", "-", ".venv")) \
                or not PATHLIKE.match(token) or not re.search(r"\.\w+$|/$", token):
            continue
        if not glob.glob(str(REPO / token)):
            broken.append(f"path `{token}`")
    return broken


@pytest.mark.parametrize("path", DOCS, ids=_rel)
def test_links_and_paths_resolve(path: Path) -> None:
    broken = broken_references(path.read_text(encoding="utf-8"), path.parent)
    assert not broken, f"{_rel(path)}: {broken}"


def test_the_checkers_catch_what_they_are_for() -> None:
    text = ("# Top\n\nSee [a](usage.md), [b](nowhere.md), [c](usage.md#no-such-heading), [d](#top), "
            "`evermind_memory/store/filters.py`, `evermind_memory/store/gone.py`, `store/filters.py`.\n")
    assert broken_references(text, REPO / "docs") == [
        "link nowhere.md", "link usage.md#no-such-heading (no such heading)", "path `evermind_memory/store/gone.py`",
        "path `store/filters.py`"]
    assert MACHINE.search("data in /work/data/dev") and OUTSIDE.search("as issue 16 says")
    assert not OUTSIDE.search("docs/reliability.md") and not MACHINE.search("`/mcp` and `~/.pgpass`")
    assert _evermind_commands("x > f && .venv/bin/evermind --user ada recall 'a b' | head  # evermind demo") == [
        ["--user", "ada", "recall", "a b"]]


@pytest.mark.parametrize("path", DOCS, ids=_rel)
def test_no_machine_paths_or_outside_references(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert not MACHINE.search(text), f"{_rel(path)}: a machine path: {MACHINE.search(text).group(0)!r}"
    assert not OUTSIDE.search(text), f"{_rel(path)}: refers outside the repository: {OUTSIDE.search(text).group(0)!r}"


def test_every_cited_reliability_rule_is_defined() -> None:
    defined = set(re.findall(r"^\*\*R(\d+)\b", (REPO / "docs" / "reliability.md").read_text(encoding="utf-8"), re.M))
    cited: dict[str, str] = {}
    sources = DOCS + sorted((REPO / "evermind_memory").rglob("*.py"))
    for path in sources:
        for number in re.findall(r"(?<![\w-])R(\d{1,2})\b", path.read_text(encoding="utf-8")):
            cited.setdefault(number, _rel(path))
    missing = {f"R{n}": where for n, where in cited.items() if n not in defined}
    assert not missing, f"cited but not defined in docs/reliability.md: {missing}"
