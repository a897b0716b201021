"""recipe/build_devsets.py on small hand-made inputs: units, query shapes, one relevant doc per query."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "recipe"))

import build_devsets as bd  # noqa: E402


@pytest.fixture(scope="module")
def lemma(tmp_path_factory) -> bd.Lemmatiser:
    wn = tmp_path_factory.mktemp("wordnet")
    # lemma pos synset_cnt p_cnt [ptrs] sense_cnt tagsense_cnt offsets: tagged counts break ties
    (wn / "index.verb").write_text(
        "  1 licence header line\n"
        "insert v 4 3 @ ~ + 4 3 01421640 00187526 01389794 01025620  \n"
        "create v 6 4 @ ~ $ + 6 3 01617210 01753806 01685331 02476385 01640225 01621573  \n"
        "cod v 2 2 @ ~ 2 0 00854922 00850519  \n"
        "code v 2 2 @ + 2 1 01589741 00994094  \n"
        "set v 2 1 @ 2 14 01494328 00699833  \n"
        "move v 2 1 @ 2 9 01494329 00699834  \n")
    (wn / "verb.exc").write_text("running run\n")
    return bd.Lemmatiser(wn)


def test_gerunds_become_base_verbs(lemma: bd.Lemmatiser) -> None:
    assert lemma.base("Inserting") == "insert"
    assert lemma.base("creating") == "create"      # the e comes back
    assert lemma.base("setting") == "set"          # the doubled consonant goes
    assert lemma.base("coding") == "code"          # "cod" is a verb too, but "code" has more tagged senses
    assert lemma.base("running") == "run"          # the exception list
    assert lemma.base("string") is None and lemma.base("ping") is None


def test_task_headings_become_questions_and_others_do_not(lemma: bd.Lemmatiser) -> None:
    forms = {bd.gerund_question("Inserting a Table in LibreOffice", lemma, s, "k") for s in range(12)}
    assert forms <= {"how do I insert a table in LibreOffice?", "how can I insert a table in LibreOffice?",
                     "how to insert a table in LibreOffice", "how would I insert a table in LibreOffice?"}
    assert len(forms) > 1  # the form is seeded per heading
    q = bd.gerund_question("To Move a Heading Up or Down", lemma, 0, "k")
    assert q is not None and q.endswith("move a heading up or down?") or q.endswith("move a heading up or down")
    assert bd.gerund_question("Options", lemma, 0, "k") is None
    assert bd.gerund_question("String formatting", lemma, 0, "k") is None
    assert bd.gerund_question("To PDF", lemma, 0, "k") is None


def test_each_shape_takes_its_query_out_of_the_document(lemma: bd.Lemmatiser) -> None:
    body = [("p", "Compute the bandwidth of a matrix A. The type argument selects the lower or upper bandwidth "
                  "and the result is a number of diagonals with nonzero entries, which callers may compare.")]
    entry = bd.Unit("p.html#1", "bw = bandwidth (A, type)", "bandwidth", ["bw = bandwidth (A, type)"], body, entry=True)
    got = bd.candidates(entry, lemma, 0, 4000)
    assert got["summary"][0] == "Compute the bandwidth of a matrix A."
    assert "Compute the bandwidth" not in got["summary"][1] and got["summary"][1].startswith("bw = bandwidth")
    assert got["name"][0] == "bandwidth" and "bw = bandwidth" not in got["name"][1]
    section = bd.Unit("g.html#3", "Creating a New Image", blocks=body)
    got = bd.candidates(section, lemma, 0, 4000)
    assert "question" in got and "Creating a New Image" not in got["question"][1]
    directive = bd.Unit("mod.html#4", "RewriteBase Directive", "RewriteBase", ["Syntax: RewriteBase URL-path"], body,
                        summary="Sets the base URL for per-directory rewrites", entry=True)
    got = bd.candidates(directive, lemma, 0, 4000)
    assert got["summary"][0] == "Sets the base URL for per-directory rewrites"
    assert "Sets the base URL" not in got["summary"][1] and got["name"][1].startswith("Sets the base URL")


def test_build_source_keeps_one_relevant_doc_per_query(lemma: bd.Lemmatiser) -> None:
    def unit(i: int, heading: str, text: str) -> bd.Unit:
        return bd.Unit(f"p{i}.html#0", heading, blocks=[("p", text * 3)])

    units = [unit(i, f"Widget number {i} settings", f"Widget {i} has its own long explanation here. ")
             for i in range(20)]
    units += [unit(20, "Shared heading here", "First text about one thing entirely, at some length. "),
              unit(21, "Shared heading here", "Second text about another thing entirely, at length. "),
              unit(22, "Widget number 0 settings copy", "Widget 0 has its own long explanation here. ")]
    rows, extra, stats = bd.build_source("toy", units, lemma, queries=100, docs=100, seed=0, limit=4000)
    queries = [r["query"] for r in rows]
    assert len(queries) == len(set(queries)) and "Shared heading here" not in queries
    docs = [r["doc"] for r in rows] + [r["doc"] for r in extra]
    assert len(docs) == len(set(docs))  # unit 22 repeats unit 0's body: stored once
    assert any("First text" in d for d in docs) and any("Second text" in d for d in docs)  # kept as distractors
    assert stats["queries"] == len(rows) and all(r["source"] == "toy" and r["shape"] for r in rows)
    small, _, _ = bd.build_source("toy", units, lemma, queries=5, docs=8, seed=0, limit=4000)
    again, _, _ = bd.build_source("toy", units, lemma, queries=5, docs=8, seed=0, limit=4000)
    assert len(small) == 5 and small == again


def test_sections_drop_boilerplate_and_merge_generic_headings(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "pkg"
    base = root / "doc"
    base.mkdir(parents=True)
    for i in range(4):
        (base / f"page{i}.html").write_text(
            f"<html><body><main><h1>Topic {i} explained</h1><p>Navigation bar text on every page.</p>"
            f"<p>Topic {i} is described at length in this paragraph for readers.</p>"
            f"<h2>Options</h2><p>Option text for topic {i} with details.</p></main></body></html>")
    monkeypatch.setitem(bd.SOURCES, "toy", bd.SourceSpec("toy-doc", "doc", "sections"))
    units = bd.units_of("toy", root)
    assert [u.heading for u in units] == [f"Topic {i} explained" for i in range(4)]
    texts = [t for _, t in units[0].blocks]
    assert texts == ["Topic 0 is described at length in this paragraph for readers.",
                     "Option text for topic 0 with details."]
    assert json.dumps(units[0].key) == '"page0.html#0"'
