"""Import hygiene of the store and adaptation (issue 17): `import evermind_memory.store` stays light (no model, no
training, no GPU), opening a store and the commands that need no model never import the model code nor read its
weights, adaptation never imports the store, and each module imports on its own in a fresh interpreter. Import
cycles (also through imports inside functions) are test_import_graph.py's, for the whole package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import evermind_memory
from evermind_memory import MemoryStore

PACKAGE = Path(evermind_memory.__file__).parent
HEAVY = ("evermind_memory.training", "evermind_memory.adaptation", "evermind_memory.lm.model", "evermind_memory.gpu",
         "wgpu")
# Imports each named module in a child forked from an interpreter that has loaded only third-party libraries (a
# fresh set of our modules each time, without paying start-up and numpy per module); prints the ones that failed.
FORK_EACH = """
import os, sys, traceback
import numpy, regex, sqlite_utils, usearch.index
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


# In a fresh interpreter that records every file it opens: the public API opens the store and reads from it, then
# the CLI runs the commands that need no model (forget last: a writer), and the child prints what it loaded.
MODEL_FREE = """
import io, json, os, sys
opened = []
sys.addaudithook(lambda event, args: opened.append(os.fsdecode(args[0]))
                 if event == "open" and isinstance(args[0], (str, bytes)) else None)
from evermind_memory import MemoryStore
from evermind_memory.cli import main
from evermind_memory.embedder import default_embedder

db, first, second, export = sys.argv[1:]
with MemoryStore(db) as store:
    got = {"get": store.get(first).text, "listed": len(store.list()), "count": store.count()}
codes = {}
for command in (["list"], ["get", first], ["history", first], ["count"], ["info"], ["stats"], ["check"],
                ["export", export], ["forget", second], ["list", "--json"]):
    out = io.StringIO()
    codes[command[0]] = main(["--db", db, *command], out=out)
got["cli_list"] = [fact["id"] for fact in json.loads(out.getvalue())]
print(json.dumps({"got": got, "codes": codes, "loaded": sorted(sys.modules), "opened": opened,
                  "weights_read": default_embedder().loaded}))
"""


def test_opening_a_store_and_model_free_commands_read_no_weights(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    with MemoryStore(db) as store:  # the shipped model, as every user gets it
        ids = store.remember_many(["Ada's flight is on Tuesday", "Bob drinks black coffee", "the server restarts at 3"])
    run = subprocess.run([sys.executable, "-c", MODEL_FREE, str(db), ids[0], ids[1], str(tmp_path / "out.jsonl")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["got"] == {"get": "Ada's flight is on Tuesday", "listed": 3, "count": 3,
                             "cli_list": [ids[0], ids[2]]}  # the commands did run: forget removed ids[1]
    assert set(result["codes"].values()) == {0}, result["codes"]
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3
    # sqlite_utils: only to create a new store's schema; the PostgreSQL backend: only for a server URL; numpy.ma
    # (~20 ms, which np.unique imports) and importlib.resources (~15 ms; the shipped files are plain paths): nothing
    # on the open path may need them (issue 19, start-up under 0.3 s). `check` reads the vector graph, and the graph
    # library (usearch.index) imports tqdm, whose version lookup loads importlib.resources: only with it.
    heavy = HEAVY + ("evermind_memory.lm", "sqlite_utils", "evermind_memory.store.backend.postgres",
                     "numpy.ma.")  # (numpy.ma with the dot: numpy.matrixlib is not it)
    assert sorted(m for m in result["loaded"] if m.startswith(heavy)) == []
    assert "importlib.resources" not in result["loaded"] or "usearch.index" in result["loaded"]
    model_files = {"model.evlm", "tokenizer.json"}
    assert [p for p in result["opened"] if Path(p).name in model_files] == []
    assert any(Path(p).name == "model.json" for p in result["opened"])  # the card: what the model is, no weights
    assert result["weights_read"] is False


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


# The commands that read rows only: they must not import numpy or usearch (~0.1-0.2 s of start-up), nor read the
# index snapshot; the first vector recall of the same process then loads both and answers (issue 19).
ROW_ONLY = """
import io, json, os, sys
opened = []
sys.addaudithook(lambda event, args: opened.append(os.fsdecode(args[0]))
                 if event == "open" and isinstance(args[0], (str, bytes)) else None)
from evermind_memory.cli import main

db, first, export = sys.argv[1:]
codes, outs = {}, {}
for name, command in (("get", ["get", first]), ("list", ["list"]), ("history", ["history", first]),
                      ("count", ["count"]), ("stats", ["stats"]), ("export", ["export", export]),
                      ("recall", ["recall", "flight Tuesday", "--mode", "lexical", "--json"]),
                      ("scoped get", ["get", first, "--user", "ada"])):
    out = io.StringIO()
    codes[name] = main(["--db", db, *command], out=out)
    outs[name] = out.getvalue()
row_only = {"numpy": "numpy" in sys.modules, "usearch": "usearch" in sys.modules,
            "snapshot_read": [p for p in opened if p.endswith((".usearch", ".db.json"))]}
out = io.StringIO()
codes["recall vector"] = main(["--db", db, "recall", "flight Tuesday", "--mode", "vector", "--json"], out=out)
print(json.dumps({"codes": codes, "lexical": json.loads(outs["recall"]), "count": outs["count"].strip(),
                  "row_only": row_only, "vector": json.loads(out.getvalue()),
                  "after_vector": {"numpy": "numpy" in sys.modules, "usearch": "usearch" in sys.modules}}))
"""


def test_row_only_commands_import_no_numpy_nor_the_graph(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    with MemoryStore(db) as store:
        ids = store.remember_many(["Ada's flight is on Tuesday", "Bob drinks black coffee", "the server restarts at 3"])
    assert list(tmp_path.glob("m.db.*.usearch")), "the writer left an index snapshot"
    run = subprocess.run([sys.executable, "-c", ROW_ONLY, str(db), ids[0], str(tmp_path / "out.jsonl")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    # every command ran and answered (the scoped get: no fact of user ada -> not found, exit 3)
    assert result["codes"] == {"get": 0, "list": 0, "history": 0, "count": 0, "stats": 0, "export": 0, "recall": 0,
                               "scoped get": 3, "recall vector": 0}
    assert result["count"] == "3" and result["lexical"][0]["id"] == ids[0]
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3
    assert result["row_only"] == {"numpy": False, "usearch": False, "snapshot_read": []}
    # the first vector recall of the same process loads the index (and numpy, usearch) and finds the fact
    assert result["vector"][0]["id"] == ids[0] and result["after_vector"] == {"numpy": True, "usearch": True}


def test_a_module_another_thread_is_still_importing_is_not_handed_out_half_made(tmp_path: Path, monkeypatch) -> None:
    # The model loads in a thread of its own while the first vector recall imports what it needs: a lazy numpy
    # taken while the other thread was inside numpy's import read attributes numpy had not defined yet.
    import threading
    import time

    from evermind_memory._lazy import lazy_import

    (tmp_path / "evermind_slow_module.py").write_text("import time\ntime.sleep(0.5)\nvalue = 42\ninteger = int\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "evermind_slow_module", raising=False)
    importer = threading.Thread(target=__import__, args=("evermind_slow_module",))
    importer.start()
    deadline = time.monotonic() + 10
    while "evermind_slow_module" not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.001)
    module = lazy_import("evermind_slow_module", {}, "slow")
    assert module.value == 42  # waited for the other thread's import instead of handing out a half-made module
    assert module is sys.modules["evermind_slow_module"]
    importer.join()
    monkeypatch.delitem(sys.modules, "evermind_slow_module")
