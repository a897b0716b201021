"""The `evermind` CLI: every subcommand, --json output, --db placement, and errors as one clean line."""

from __future__ import annotations

import io
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from evermind_memory import cli
from evermind_memory.embedder import LMEmbedder
from evermind_memory.lm.model import EvermindLM, LMConfig
from evermind_memory.lm.tokenizer import BPETokenizer
from poisoned_embedder import PoisonedEmbedder

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def embedder() -> LMEmbedder:
    tok = BPETokenizer.train(["Ada prefers green tea", "Bob drinks coffee", "the cat sat on the mat"] * 5, 300)
    return LMEmbedder(EvermindLM(LMConfig(vocab_size=len(tok), d_model=16, n_layers=1, hidden_dim=32), seed=0), tok)


def run(embedder, db: Path, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main([*argv, "--db", str(db)], embedder=embedder, out=out)
    return code, out.getvalue()


def test_forget_of_several_ids_is_all_or_nothing(embedder, tmp_path: Path, capsys):
    """An unknown id among several forgets none of them (it once forgot those before it and then failed), and a
    repeated id counts once."""
    db = tmp_path / "forget.db"
    a, b = (run(embedder, db, "remember", text)[1].strip() for text in ("fact one", "fact two"))
    for ids in ([a, "0" * 32], ["0" * 32, a], [a, b, "f" * 32]):
        code, _ = run(embedder, db, "forget", *ids)
        assert code == cli.EXIT_NOT_FOUND and "nothing was forgotten" in capsys.readouterr().err
        assert run(embedder, db, "count")[1].strip() == "2"
    assert run(embedder, db, "forget", b, b, a) == (0, "forgot 2 facts\n")
    assert run(embedder, db, "count")[1].strip() == "0"


def test_whole_store_commands_refuse_a_scope(embedder, tmp_path: Path, capsys):
    """migrate under --user once copied every user's facts; the others refused in Python's words."""
    db = tmp_path / "whole.db"
    run(embedder, db, "--user", "ada", "remember", "Ada's fact")
    run(embedder, db, "--user", "bob", "remember", "Bob's fact")
    for argv in (["migrate", "--from", str(db), "--to", str(tmp_path / "copy.db")], ["backup", str(tmp_path / "b.db")],
                 ["check"], ["compact"], ["rebuild"], ["reembed"], ["repair"]):
        assert run(embedder, db, "--user", "ada", *argv)[0] == cli.EXIT_USAGE
        assert f"`evermind {argv[0]}` works on the whole store" in capsys.readouterr().err
    assert not (tmp_path / "copy.db").exists() and not (tmp_path / "b.db").exists()
    assert run(embedder, db, "count")[1].strip() == "2"


def test_export_refuses_an_existing_file_and_both_ways_take_a_dash(embedder, tmp_path: Path, capsys, monkeypatch):
    db, copy, kept = tmp_path / "src.db", tmp_path / "copy.db", tmp_path / "precious.txt"
    run(embedder, db, "remember", "Ada prefers green tea", "--tag", "person=ada")
    run(embedder, db, "--user", "bob", "remember", "Bob drinks coffee")
    kept.write_text("precious\n")
    assert run(embedder, db, "export", str(kept))[0] == cli.EXIT_USAGE and "--force" in capsys.readouterr().err
    assert kept.read_text() == "precious\n"
    assert run(embedder, db, "export", str(kept), "--force") == (0, f"exported 2 facts to {kept}\n")
    code, lines = run(embedder, db, "export", "-")
    assert code == 0 and lines == kept.read_text() and "exported 2 facts" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(lines.encode("utf-8")), encoding="utf-8"))
    assert run(embedder, copy, "import", "-") == (0, "imported 2 facts\n")
    assert run(embedder, copy, "export", "-")[1] == lines


def test_human_output_escapes_control_characters(embedder, tmp_path: Path):
    """A stored newline keeps its fact on one line, and stored escape sequences never reach the terminal."""
    db = tmp_path / "ctl.db"
    text = "first line\nsecond \x1b[31mred\x1b[0m \u202eevil"
    fid = run(embedder, db, "remember", text)[1].strip()
    for argv in (["list"], ["get", fid], ["history", fid], ["recall", "second", "--mode", "lexical"]):
        out = run(embedder, db, *argv)[1]
        assert "\\n" in out and "\\x1b[31m" in out and "\\u202e" in out, argv
        assert not any(c in out for c in "\x1b\u202e")
        assert [line for line in out.splitlines() if "second" in line][0].count("first line") == 1
    assert json.loads(run(embedder, db, "--json", "get", fid)[1])["text"] == text  # --json stays exact


def test_a_tag_filter_that_finds_nothing_points_to_where_for_typed_values(embedder, tmp_path: Path, capsys):
    db = tmp_path / "typed.db"
    run(embedder, db, "remember", "Bob's flight", "--tags", '{"priority": 2, "done": false}')
    capsys.readouterr()
    assert run(embedder, db, "count", "--tag", "priority=2") == (0, "0\n")
    assert """--where '{"priority": 2}'""" in capsys.readouterr().err
    assert run(embedder, db, "list", "--tag", "done=False")[1] == ""
    assert """--where '{"done": false}'""" in capsys.readouterr().err
    assert run(embedder, db, "count", "--where", '{"priority": 2}') == (0, "1\n")
    assert run(embedder, db, "count", "--tag", "who=ada") == (0, "0\n") and capsys.readouterr().err == ""


def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path):
    """`evermind list | head -1`: the reader leaves early; the CLI printed "error: [Errno 32] Broken pipe" (and
    Python a flush error at exit); it now ends as a Unix tool does, with nothing on stderr."""
    db = tmp_path / "pipe.db"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    facts = "\n".join(json.dumps({"text": f"fact number {i} about tea"}) for i in range(4000))
    subprocess.run([sys.executable, "-m", "evermind_memory", "--db", str(db), "import", "-"], input=facts,
                   text=True, env=env, check=True, capture_output=True, timeout=300)
    proc = subprocess.Popen([sys.executable, "-m", "evermind_memory", "--db", str(db), "list", "--limit", "4000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.readline()
    proc.stdout.close()  # the reader leaves while most of the output is still to come
    assert proc.wait(timeout=120) == cli.EXIT_SIGPIPE
    assert proc.stderr.read() == b""


def test_run_before_installing_says_how_to_install(tmp_path: Path):
    """`python3 -m evermind_memory` from a checkout with no dependencies said "internal error ... please report
    it" (and the demo "not available in this build"); it now names the missing package and the install command.
    -S leaves site-packages out: numpy and the rest are missing, as before an install."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for argv in (["demo"], ["--db", str(tmp_path / "x.db"), "remember", "hi"]):
        proc = subprocess.run([sys.executable, "-S", "-m", "evermind_memory", *argv], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == cli.EXIT_FAILED, proc.stderr
        assert "is not installed" in proc.stderr and "pip install -e ." in proc.stderr, proc.stderr
        assert "internal error" not in proc.stderr and "not available" not in proc.stderr


def test_mcp_at_a_terminal_says_what_it_waits_for(tmp_path: Path):
    """Pasted from the README at a prompt, `evermind mcp` waited on stdin in silence."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "evermind_memory", "--db", str(tmp_path / "m.db"), "mcp"],
                            stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = proc.stderr.readline()
        assert "serving MCP on stdin/stdout" in line and "Ctrl-C" in line
    finally:
        proc.kill()
        proc.wait()
        os.close(leader)
        os.close(follower)


def test_remember_recall_get_history_forget(embedder, tmp_path: Path, capsys):
    db = tmp_path / "cli.db"
    code, out = run(embedder, db, "remember", "Ada prefers green tea", "--tag", "person=ada", "--source", "chat")
    assert code == 0
    fid = out.strip()
    code, out = run(embedder, db, "--json", "remember", "Bob drinks coffee")
    assert json.loads(out)["id"]
    code, out = run(embedder, db, "recall", "green tea", "-k", "1", "--mode", "lexical")
    assert code == 0 and fid in out and "person=ada" in out and "(from chat)" in out
    code, out = run(embedder, db, "recall", "green tea", "--json", "--tag", "person=ada")
    hits = json.loads(out)
    assert [h["id"] for h in hits] == [fid] and hits[0]["tags"] == {"person": "ada"} and "score" in hits[0]
    code, out = run(embedder, db, "get", fid, "--json")
    assert json.loads(out)["text"] == "Ada prefers green tea"
    assert run(embedder, db, "forget", fid)[1].strip() == "forgot 1 fact"
    code, out = run(embedder, db, "history", fid, "--json")
    assert [c["op"] for c in json.loads(out)] == ["remember", "forget"]
    code, _ = run(embedder, db, "get", fid)
    assert code == cli.EXIT_NOT_FOUND and "no fact with id" in capsys.readouterr().err


def test_recall_explains_and_refuses_min_relevance_without_a_fitted_rule(embedder, tmp_path: Path, capsys):
    db = tmp_path / "cli.db"
    run(embedder, db, "remember", "Ada prefers green tea")
    code, out = run(embedder, db, "recall", "green tea", "-k", "1", "--explain")
    assert code == 0 and "weight: lexical " in out.splitlines()[1] and "bm25 " in out  # no fitted rule here
    hit = json.loads(run(embedder, db, "recall", "green tea", "--json", "--explain")[1])[0]
    assert hit["relevance"] is None and hit["explain"]["fused"] == pytest.approx(hit["score"])
    code, _ = run(embedder, db, "recall", "green tea", "--min-relevance", "0.1")
    assert code == cli.EXIT_USAGE and "fitted fusion rule" in capsys.readouterr().err
    code, _ = run(embedder, db, "recall", "green tea", "--rerank")  # the test model has no lexicon to read
    assert code == cli.EXIT_USAGE and "lexicon" in capsys.readouterr().err


def test_recall_reranks_short_notes_by_default_and_says_so_under_explain(tmp_path: Path):
    from evermind_memory import default_embedder

    shipped, db = default_embedder(), tmp_path / "cli.db"
    for text in ("Ada gets migraines every spring", "Ada plays squash on Fridays", "Ada drinks green tea"):
        assert run(shipped, db, "remember", text)[0] == 0
    code, out = run(shipped, db, "recall", "what gives Ada headaches?", "-k", "1", "--explain")
    assert code == 0 and "migraines" in out.splitlines()[0] and "reranked, word match " in out
    code, out = run(shipped, db, "recall", "what gives Ada headaches?", "-k", "1", "--explain", "--no-rerank")
    assert code == 0 and "learned: lexical " in out and "reranked" not in out


def test_remember_leaves_the_vector_embedded_and_indexed(embedder, tmp_path: Path):
    db = tmp_path / "cli.db"
    fid = run(embedder, db, "remember", "Ada prefers green tea")[1].strip()
    with sqlite3.connect(db) as conn:
        vector, fingerprint = conn.execute("SELECT f.vector, p.fingerprint FROM facts f LEFT JOIN fingerprints p ON "
                                           "p.id = f.fingerprint_id "
                                                 "WHERE f.id = ?", (fid,)).fetchone()
        top = conn.execute("SELECT MAX(seq) FROM changes").fetchone()[0]
    assert vector is not None and fingerprint == embedder.fingerprint
    manifest = json.loads((tmp_path / "cli.db.json").read_text())  # the saved index holds it
    assert manifest["watermark"] == top and manifest["count"] == 1


def test_remember_reports_a_bad_vector(embedder, tmp_path: Path, capsys):
    db = tmp_path / "cli.db"
    code, out = run(PoisonedEmbedder(embedder), db, "remember", "a poison fact")
    err = capsys.readouterr().err
    assert code == cli.EXIT_MODEL and out == "" and ("evermind: error: flush(): the embedder failed on a "
                                                     "remembered fact") in err
    assert "non-finite" in err
    fid = err.split("first ")[1].split()[0]  # the fact is kept, lexical-only, and check says so
    assert json.loads(run(embedder, db, "recall", "poison", "--mode", "lexical", "--json")[1])[0]["id"] == fid
    code, out = run(PoisonedEmbedder(embedder), db, "check")
    assert code == 1 and "1 fact has no vector" in out
    assert run(embedder, db, "check")[0] == 0  # a working embedder embeds it at the next open


def test_feedback_is_recorded_and_reported(embedder, tmp_path: Path, capsys):
    db = tmp_path / "cli.db"
    fid = run(embedder, db, "remember", "Ada prefers green tea")[1].strip()
    code, out = run(embedder, db, "feedback", "what does Ada drink", fid)
    assert code == 0 and fid in out and "useful" in out
    code, out = run(embedder, db, "--json", "feedback", "coffee", fid, "--not-useful")
    assert code == 0 and json.loads(out) == {"id": fid, "useful": False}
    code, out = run(embedder, db, "--json", "info")
    assert json.loads(out)["feedback"] == 2
    code, _ = run(embedder, db, "feedback", "tea", "0" * 32)
    assert code != 0 and "no fact" in capsys.readouterr().err


def test_list_check_info_reembed_rebuild(embedder, tmp_path: Path):
    db = tmp_path / "cli.db"
    for i in range(5):
        run(embedder, db, "remember", f"fact {i}", "--tag", f"n={i % 2}")
    code, out = run(embedder, db, "list", "--json", "--limit", "3")
    assert [f["text"] for f in json.loads(out)] == ["fact 0", "fact 1", "fact 2"]
    assert len(json.loads(run(embedder, db, "list", "--json", "--tag", "n=1")[1])) == 2
    code, out = run(embedder, db, "check")
    assert code == 0 and out.startswith("ok: 5 facts, 5 indexed")
    assert json.loads(run(embedder, db, "info", "--json")[1])["facts"] == 5
    assert json.loads(run(embedder, db, "reembed", "--force", "--json")[1]) == {"reembedded": 5}
    assert json.loads(run(embedder, db, "rebuild", "--json")[1]) == {"indexed": 5}
    assert json.loads(run(embedder, db, "forget", "--tag", "n=0", "--json")[1]) == {"forgotten": 3}


def test_export_import_backup(embedder, tmp_path: Path):
    db, other = tmp_path / "a.db", tmp_path / "b.db"
    run(embedder, db, "remember", "exported fact")
    assert run(embedder, db, "export", str(tmp_path / "x.jsonl"))[0] == 0
    assert json.loads(run(embedder, other, "import", str(tmp_path / "x.jsonl"), "--json")[1]) == {"imported": 1}
    assert run(embedder, db, "backup", str(tmp_path / "copy.db"))[0] == 0
    assert (tmp_path / "copy.db").exists()


def test_errors_are_one_line(embedder, tmp_path: Path, capsys):
    db = tmp_path / "e.db"
    assert run(embedder, db, "list")[0] == cli.EXIT_USAGE
    assert "no store at" in capsys.readouterr().err
    run(embedder, db, "remember", "x")
    assert run(embedder, db, "recall", "x", "-k", "0")[0] == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("evermind: error: recall() expected k >= 1") and err.count("\n") == 1
    assert cli.main(["remember", "x", "--tag", "novalue"], embedder=embedder) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: evermind remember") and "expected KEY=VALUE, got 'novalue'" in err


def test_default_db_path_is_in_user_data_dir():
    assert cli.default_db_path().name == "memory.db" and "evermind" in str(cli.default_db_path())


def test_real_entry_point_with_model_files(embedder, tmp_path: Path):
    embedder.model.save(tmp_path / "m.evl")
    embedder.tokenizer.save(tmp_path / "t.json")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "evermind_memory.cli", "--db", str(tmp_path / "s.db"),
            "--model", str(tmp_path / "m.evl"), "--tokenizer", str(tmp_path / "t.json")]
    p = subprocess.run([*base, "remember", "-"], input="from stdin\n", capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([*base, "--json", "recall", "stdin"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout)[0]["text"] == "from stdin"


def test_update_text_tags_and_source(embedder, tmp_path: Path, capsys, monkeypatch):
    db = tmp_path / "u.db"
    fid = run(embedder, db, "remember", "Cy likes tea", "--tags", '{"n": 3, "who": "cy"}')[1].strip()
    code, out = run(embedder, db, "update", fid, "Cy likes green tea", "--json")
    fact = json.loads(out)
    assert code == 0 and fact["text"] == "Cy likes green tea" and fact["tags"] == {"n": 3, "who": "cy"}
    monkeypatch.setattr("sys.stdin", io.StringIO("Cy likes oolong\n"))
    assert json.loads(run(embedder, db, "update", fid, "-", "--json")[1])["text"] == "Cy likes oolong"
    # tags merge by default: the fact stays in every who=cy filter
    fact = json.loads(run(embedder, db, "update", fid, "--tag", "mood=happy", "--source", "chat", "--json")[1])
    assert fact["tags"] == {"n": 3, "who": "cy", "mood": "happy"} and fact["source"] == "chat"
    assert run(embedder, db, "count", "--tag", "who=cy")[1].strip() == "1"
    fact = json.loads(run(embedder, db, "update", fid, "--untag", "mood", "--tags", '{"n": 4}', "--json")[1])
    assert fact["tags"] == {"n": 4, "who": "cy"}
    fact = json.loads(run(embedder, db, "update", fid, "--tag", "who=cy", "--replace-tags", "--json")[1])
    assert fact["tags"] == {"who": "cy"}
    assert json.loads(run(embedder, db, "update", fid, "--clear-tags", "--json")[1])["tags"] == {}
    ops = [c["op"] for c in json.loads(run(embedder, db, "history", fid, "--json")[1])]
    assert ops == ["remember"] + ["update"] * 6
    assert run(embedder, db, "update", fid)[0] == cli.EXIT_USAGE  # nothing to change
    assert "expected at least one of text, tags or source" in capsys.readouterr().err
    assert run(embedder, db, "update", fid, "--clear-tags", "--tag", "a=b")[0] == cli.EXIT_USAGE
    assert run(embedder, db, "update", "0" * 32, "x")[0] == cli.EXIT_NOT_FOUND


def test_json_errors_are_one_object_on_stderr(embedder, tmp_path: Path, capsys):
    db = tmp_path / "j.db"
    run(embedder, db, "remember", "x")
    capsys.readouterr()
    code, out = run(embedder, db, "--json", "get", "0" * 32)
    err = json.loads(capsys.readouterr().err)
    assert code == 3 and out == "" and err["error"] == "FactNotFound" and err["exit_code"] == 3
    assert "no fact with id" in err["message"]
    assert cli.main(["recall", "x", "-k", "many", "--json"]) == cli.EXIT_USAGE  # argparse's own errors too
    err = json.loads(capsys.readouterr().err)
    assert err == {"error": "UsageError", "message": "argument -k: invalid int value: 'many'", "exit_code": 2}


def test_exit_code_per_error_class():
    from evermind_memory.errors import (CheckpointError, EmbedderMismatch, EmbedderOutputInvalid, EvermindError,
                                        FactNotFound, InvalidInput, RowDamaged, StorageError, StoreCorrupt,
                                        StoreLocked)

    assert [cli.exit_code(e) for e in (EvermindError("x"), InvalidInput("x"), FactNotFound("x"), StoreLocked("x"),
                                       EmbedderMismatch("x"), EmbedderOutputInvalid("x"), CheckpointError("x"),
                                       PermissionError("x"), StorageError("x"), StoreCorrupt("x"), RowDamaged("x"),
                                       KeyboardInterrupt())] == [1, 2, 3, 4, 5, 5, 5, 6, 6, 7, 7, 130]
    assert set(cli.EXIT_CODES) == {0, 1, 2, 3, 4, 5, 6, 7, 130, 141}
    assert all(f"{code:>3}  " in cli.build_parser().format_help() for code in cli.EXIT_CODES)  # documented in --help


def test_version_and_help_on_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == "evermind 0.1.0"
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices  # argparse keeps no public list of subparsers
    assert {"update", "rebuild", "backup", "mcp", "demo"} <= set(commands)
    for name, sub in [("evermind", parser), *commands.items()]:
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help text"


def test_paths_expand_tilde_and_the_default_db_follows_evermind_db(embedder, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    out = io.StringIO()
    assert cli.main(["remember", "in home", "--db", "~/home.db"], embedder=embedder, out=out) == 0
    assert (tmp_path / "home.db").exists()
    assert cli.main(["backup", "~/copy.db", "--db", "~/home.db"], embedder=embedder, out=out) == 0
    assert (tmp_path / "copy.db").exists()
    monkeypatch.setenv("EVERMIND_DB", "~/env.db")
    assert cli.default_db_path() == tmp_path / "env.db"
    assert cli.main(["remember", "via env"], embedder=embedder, out=out) == 0 and (tmp_path / "env.db").exists()


def test_importing_the_cli_loads_no_heavy_code():
    code = ("import sys, evermind_memory.cli as c; c.build_parser().parse_args(['list']); "
            "print(sorted(m for m in ('numpy', 'usearch', 'wgpu', 'mcp', 'sqlite_utils', 'evermind_memory.store', "
            "'evermind_memory.lm', 'evermind_memory.training', 'evermind_memory.embedder') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_demo_json_is_one_object(capsys):
    out = io.StringIO()
    assert cli.main(["demo", "--json"], out=out) == 0
    result = json.loads(out.getvalue())
    assert result["model"] == "shipped" and result["check"]["ok"] and result["remembered"] == 8
    assert len(result["recalls"]) == 6 and all(r["hits"] for r in result["recalls"])
    first = result["recalls"][0]
    assert first["query"] == "what does Ada drink?" and any("Ada" in h["text"] for h in first["hits"][:2])


def test_demo_keep_run_twice_keeps_eight_facts(tmp_path: Path, monkeypatch):
    """--keep leaves ./evermind-demo.db; a second run replaces the demo's facts by id instead of adding eight more."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert cli.main(["demo", "--keep", "--json"], out=io.StringIO()) == 0
    assert run(None, tmp_path / "evermind-demo.db", "count")[1].strip() == "8"


def test_the_demo_answers_what_ada_drinks_first():
    """In the demo's eight facts "drink" (one fact, Bob's) is rarer than "Ada" (three): the rule for stores of short
    notes weighs which query words and names a fact holds, and the vectors, so Ada's tea comes before Bob's coffee."""
    from evermind_memory import MemoryStore
    from evermind_memory.demo import FACTS

    with MemoryStore(":memory:") as store:
        store.remember_many([text for text, _ in FACTS])
        assert "Ada" in store.recall("what does Ada drink?", k=1)[0].text


def test_python_m_evermind_memory_runs_the_cli():
    p = subprocess.run([sys.executable, "-m", "evermind_memory", "--version"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0 and p.stdout.strip() == "evermind 0.1.0"


def test_filters_scopes_ids_expiry_and_duplicates(embedder, tmp_path: Path, capsys):
    db = tmp_path / "cli.db"
    ada = run(embedder, db, "remember", "Ada prefers green tea", "--user", "ada", "--tags",
              '{"n": 3, "ok": true}')[1].strip()
    run(embedder, db, "--user", "bob", "remember", "Bob drinks coffee", "--tag", "n=3")
    assert run(embedder, db, "remember", "own id", "--id", "note-1", "--ttl", "3600")[1].strip() == "note-1"
    assert run(embedder, db, "remember", "own id, replaced", "--id", "note-1", "--pinned")[1].strip() == "note-1"
    code, out = run(embedder, db, "--json", "list", "--where", '{"n": {"$gte": 2}}')
    assert code == 0 and [f["id"] for f in json.loads(out)] == [ada]  # Bob's "3" is a string
    assert json.loads(run(embedder, db, "--json", "count", "--user", "ada")[1]) == {"count": 1}
    assert run(embedder, db, "count")[1].strip() == "3"
    code, out = run(embedder, db, "--json", "recall", "drinks", "--mode", "lexical", "--user", "ada")
    assert json.loads(out) == []  # Bob's fact is out of Ada's scope
    code, out = run(embedder, db, "--json", "get", "note-1")
    got = json.loads(out)
    assert got["text"] == "own id, replaced" and got["pinned"] is True and got["expires_at"] is None
    dup = run(embedder, db, "remember", "ada prefers green tea.", "--user", "ada", "--tags", '{"n": 3, "ok": true}',
              "--dedup")[1].strip()
    assert dup == ada
    code, out = run(embedder, db, "--json", "remember", "ada prefers green tea.", "--user", "ada", "--tags",
                    '{"n": 3, "ok": true}', "--dedup")
    assert json.loads(out) == {"id": ada, "duplicate": True}
    run(embedder, db, "remember", "ada prefers green tea!", "--user", "ada", "--tags", '{"n": 3, "ok": true}')
    code, out = run(embedder, db, "--json", "duplicates")
    assert code == 0 and [p["keep"] for p in json.loads(out)] == [ada]
    new = run(embedder, db, "supersede", ada, "Ada prefers black tea")[1].strip()
    assert [c["replaced_by"] for c in json.loads(run(embedder, db, "--json", "history", ada)[1])][-1] == new
    code, _ = run(embedder, db, "clear")
    assert code == cli.EXIT_USAGE and "add --yes" in capsys.readouterr().err
    # errors name the command line's options, not Python's arguments
    for argv, said in ((["forget"], "evermind clear --yes"), (["recall", "x", "--now", "2026-01-01T00:00:00Z"],
                                                              "add --time-words"),
                       (["recall", "x", "--mode", "lexical", "--min-relevance", "0.2"], "use --min-score")):
        assert run(embedder, db, *argv)[0] == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert said in err and "=True" not in err and "min_score" not in err, err
    assert json.loads(run(embedder, db, "--json", "clear", "--yes", "--user", "bob")[1]) == {"forgotten": 1}
    code, _ = run(embedder, db, "list", "--where", "{not json")
    assert code == cli.EXIT_USAGE and "JSON object" in capsys.readouterr().err
    code, _ = run(embedder, db, "recall", "x", "--where", '{"n": {"$gt": true}}')
    assert code == cli.EXIT_USAGE and "bools have no order" in capsys.readouterr().err


def test_stats_sweep_and_compact(embedder, tmp_path: Path):
    db = tmp_path / "cli.db"
    run(embedder, db, "remember", "gone soon", "--ttl", "0.05")
    fid = run(embedder, db, "remember", "forgotten")[1].strip()
    run(embedder, db, "forget", fid)
    import time

    time.sleep(0.1)
    assert json.loads(run(embedder, db, "--json", "stats")[1])["expired"] == 1
    assert json.loads(run(embedder, db, "--json", "sweep")[1]) == {"swept": 1}
    code, out = run(embedder, db, "--json", "compact", "--keep-history-days", "0")
    stats = json.loads(out)
    assert code == 0 and stats["facts"] == 0 and stats["free_bytes"] == 0


def _printed_commands(message: str) -> list[list[str]]:
    """The `evermind ...` commands a message tells the user to run, split as a shell would."""
    import re
    import shlex

    return [shlex.split(cmd) for cmd in re.findall(r"`(evermind [^`]+)`", message)]


def test_the_commands_a_damaged_store_error_prints_run_as_printed(tmp_path: Path, capsys):
    from evermind_memory import MemoryStore

    db = tmp_path / "my store.db"  # a space: the printed path must be quoted for the shell
    with MemoryStore(db) as s:  # the shipped model, which a pasted command uses too
        s.remember_many(["tea in the morning", "coffee after lunch"])
    data = bytearray(db.read_bytes())
    data[3] ^= 0xFF  # the header's magic
    db.write_bytes(bytes(data))
    assert cli.main(["list", "--db", str(db)]) == cli.EXIT_DAMAGED
    commands = _printed_commands(capsys.readouterr().err)
    assert commands and commands[0] == ["evermind", "repair", str(db)]
    for argv in commands:
        assert cli.main(argv[1:], out=io.StringIO()) == 0, (argv, capsys.readouterr().err)
    assert cli.main(["check", str(db)], out=io.StringIO()) == 0  # `evermind check PATH` too
    with MemoryStore(db, read_only=True) as s:
        assert {f.text for f in s.list()} == {"tea in the morning", "coffee after lunch"}
    assert cli.main(["repair", str(db), "--db", str(tmp_path / "other.db")]) == cli.EXIT_USAGE
    assert "got two stores" in capsys.readouterr().err
    assert cli.main(["check", str(tmp_path / "typo.db")]) == cli.EXIT_USAGE  # not a new, empty store that is "ok"
    assert "no store at" in capsys.readouterr().err and not (tmp_path / "typo.db").exists()


def test_the_command_a_missing_store_error_prints_runs_as_printed(embedder, tmp_path: Path, capsys):
    db = tmp_path / "new store.db"
    assert run(embedder, db, "list")[0] == cli.EXIT_USAGE
    [argv] = _printed_commands(capsys.readouterr().err)
    assert cli.main(argv[1:], embedder=embedder, out=io.StringIO()) == 0
    assert run(embedder, db, "count")[1].strip() == "1"


def test_a_printed_command_runs_as_printed_from_a_venv_not_on_path(tmp_path: Path):
    """Errors quoted `evermind ...`, which a shell without the venv on PATH does not find (bash: command not found);
    they now quote the program as it was run: the script's path, or this interpreter with -m."""
    script = Path(sys.executable).with_name("evermind")
    if not script.is_file():
        pytest.skip("the evermind console script is not installed beside this interpreter")
    env = {**os.environ, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    for i, ran in enumerate(([str(script)], [sys.executable, "-m", "evermind_memory"])):
        db = tmp_path / f"new store {i}.db"
        err = subprocess.run([*ran, "--db", str(db), "list"], capture_output=True, text=True, env=env,
                             timeout=60).stderr
        printed = re.search(r"`([^`]+ remember TEXT)`", err).group(1)
        assert not printed.startswith("evermind "), printed
        done = subprocess.run(["bash", "-c", printed], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        assert subprocess.run([*ran, "--db", str(db), "count"], capture_output=True, text=True, env=env,
                              timeout=60).stdout.strip() == "1"
        # and a command quoted after a pipe (the iconv advice for text that is not UTF-8)
        err = subprocess.run([*ran, "--db", str(db), "remember", "-"], input=b"caf\xe9 au lait", capture_output=True,
                             env=env, timeout=60).stderr.decode()
        assert f"| {printed.split(' --db ')[0]} --db " in err, err


def test_text_that_is_not_utf8_gets_shell_advice(embedder, tmp_path: Path, capsys, monkeypatch):
    db = tmp_path / "latin.db"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9 au lait\n")))
    assert run(embedder, db, "remember", "-")[0] == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "stdin is not UTF-8 text: byte 0xe9 at offset 3" in err and "iconv -f latin1 -t utf-8" in err
    assert "errors=" not in err and run(embedder, db, "count")[1].strip() == "0"
    advice = re.search(r"`(iconv [^`]+)`", err).group(1)  # the user's own command behind iconv: run it so
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 au lait\n")
    pasted = advice.replace("FILE", str(tmp_path / "latin1.txt")).replace(str(db), str(tmp_path / "pasted.db"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-c", pasted], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr  # (the real entry point: the shipped model)
    from evermind_memory import MemoryStore

    with MemoryStore(tmp_path / "pasted.db", read_only=True) as pasted_store:
        assert [f.text for f in pasted_store.list()] == ["café au lait"]
    arg = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of such bytes in argv
    assert run(embedder, db, "remember", arg)[0] == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "is not UTF-8 text: the byte 0xe9 at position 3" in err and "iconv -f latin1 -t utf-8" in err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("\ufeffcafé crème\r\n".encode())))
    assert run(embedder, db, "remember", "-")[0] == 0  # UTF-8 (a BOM and CRLF are dropped)
    assert run(embedder, db, "list")[1].split("  ")[1].strip() == "café crème"


def test_user_is_a_scope_on_the_command_line_as_in_python(embedder, tmp_path: Path, capsys):
    db = tmp_path / "users.db"
    assert run(embedder, db, "remember", "Ada's Portugal trip is in June", "--tag", "user=ada")[0] == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "names a scope level, not a tag" in err and "--user ada on the command line" in err
    fid = run(embedder, db, "--user", "ada", "remember", "Ada's Portugal trip is in June")[1].strip()
    run(embedder, db, "--user", "bob", "remember", "Bob's Portugal trip is in May")
    hits = json.loads(run(embedder, db, "--user", "ada", "--json", "recall", "Portugal trip")[1])
    assert [h["id"] for h in hits] == [fid] and hits[0]["scope"] == {"user": "ada"}
    assert run(embedder, db, "recall", "Portugal trip", "--where", '{"user": "ada"}')[0] == cli.EXIT_USAGE
