"""Toy-scale tests of recipe/build_corpus.py: parsers, the eval split's disjointness, exclusions, manifest.

Everything runs on small fixture inputs written here (no network, no apt); the full build is a manual step.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

SCRIPT = Path(__file__).resolve().parents[2] / "recipe" / "build_corpus.py"
_spec = importlib.util.spec_from_file_location("build_corpus", SCRIPT)
bc = importlib.util.module_from_spec(_spec)
sys.modules["build_corpus"] = bc
_spec.loader.exec_module(bc)

SENTINELS = ["NAVSENTINEL", "SIDEBARSENTINEL", "GENINDEXSENTINEL", "SOURCESSENTINEL", "MANPAGESENTINEL",
             "SQLPAGESENTINEL", "APPPAGESENTINEL", "DJANGOADMINSENTINEL", "CODESENTINEL"]
TOPICS = ["audio", "image", "network", "database", "editor", "compiler", "game", "font", "shell", "mail",
          "printer", "camera"]


def _reserved_page(sentinel: str) -> str:
    """A page long enough to yield passages and heading pairs, were it ever read."""
    body = " ".join([sentinel, _sentence(sentinel + "1", 30), _sentence(sentinel + "2", 30)])
    return (f"<html><head><title>{sentinel} title</title></head><body><h1>{sentinel} page</h1>"
            f"<h2>{sentinel} section</h2><p>{body}</p><p>{body.lower()}</p></body></html>")


def _put(root: Path, rel: str, data) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))


def _b64(value: int) -> str:
    return bc._b64_encode(value)


VOCAB = ("apply return value list file path string number table record stream buffer socket thread lock "
         "queue cache index key field row column parse format encode decode compare merge split join sort "
         "filter count open close read write flush seek fetch store").split()


def _sentence(seed: str, n: int = 14) -> str:
    """Distinct wording per seed, so unrelated fixture docs share no 8-word runs."""
    return " ".join(random.Random(seed).sample(VOCAB, n)).capitalize() + "."


def _python_page(mod: str) -> str:
    entries = "".join(
        f'<dl class="py function"><dt class="sig" id="{mod}.op{i}">{mod}.op{i}(x)'
        f'<a class="headerlink" href="#">\u00b6</a></dt><dd><p>{_sentence(mod + str(i))}</p>'
        f'<pre>CODESENTINEL = {i}</pre></dd></dl>'
        for i in range(4))
    return (f'<html><head><title>{mod} \u2014 helpers \u2014 Python docs</title></head><body>'
            f'<div class="related" role="navigation">NAVSENTINEL index modules</div>'
            f'<div class="body" role="main"><section><h1>{mod} \u2014 helpers</h1>'
            f'<p>The {mod} module offers helpers for {mod} processing in everyday scripts and larger '
            f'programs, with careful attention to correctness and speed.</p>'
            f'<h2>Using the {mod} helpers</h2><p>Start with the simplest helper and combine several of '
            f'them when a task needs more; each helper documents what it expects from {mod} input.</p>'
            f'{entries}</section></div>'
            f'<div class="sphinxsidebar" role="navigation"><p>SIDEBARSENTINEL table of contents</p></div>'
            f'</body></html>')


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    records = []
    for i in range(40):
        t = TOPICS[i % len(TOPICS)]
        long = (f" {_sentence(f'deb{i}a', 12)}\n {_sentence(f'deb{i}b', 10)}\n .\n"
                f" Highlights of release {i}:\n  * quick start for {t} item {i}\n")
        records.append(f"Package: pkg-{t}-{i}\nDescription-md5: {i:032x}\nDescription-en: {t} helper {i}\n{long}")
        # a -doc sibling whose description contains the main one: it must never train on a held-out doc
        records.append(f"Package: pkg-{t}-{i}-doc\nDescription-en: {t} helper {i} (documentation)\n{long}"
                       f" .\n This package contains the manual of helper {i}.\n")
    # a family of 25 packages sharing an intro paragraph (a template), one with only the intro
    intro = f" {_sentence('family-intro', 16)}\n"
    records.append(f"Package: fam-base\nDescription-en: family base package\n{intro}")
    for k in range(25):
        records.append(f"Package: fam-{k}\nDescription-en: family member {k}\n{intro} .\n"
                       f" {_sentence(f'family-{k}', 9)}\n")
    # two packages sharing one long description: the pair must stay together
    shared = " A shared long description used by two twin packages for the grouping test only.\n"
    records.append(f"Package: twin-a\nDescription-en: twin package A\n{shared}")
    records.append(f"Package: twin-b\nDescription-en: twin package B\n{shared}")
    _put(root, "translations/Translation-en", "\n".join(records) + "\n")

    wn = "  1 This software and database is being provided to you, the LICENSEE\n"
    for i in range(40):
        wn += (f"{i:08d} 03 n 02 widget_{i} 0 gadget_{i}(a) 0 001 @ 00001740 n 0000 | a small device "
               f"of type {i} used for holding {TOPICS[i % 12]} parts; \"the widget {i} broke\"  \n")
    _put(root, "pkgs/wordnet-base/usr/share/wordnet/data.noun", wn)
    _put(root, "pkgs/wordnet-base/VERSION", "1:3.0-test")
    _put(root, "pkgs/wordnet-base/usr/share/doc/wordnet-base/copyright",
         "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
         "Files: *\nCopyright: Princeton University\nLicense: WordNet3.0\n\n"
         "Files: debian/*\nCopyright: someone\nLicense: GPL-2+\n")

    body, index = b"", []
    for i in range(40):
        entry = (f"term {i}\nalias {i}\n\n   <jargon> The {{term {i}}} is a {TOPICS[i % 12]} notion "
                 f"number {i} that programmers reach for when case {i * 11} happens.\n\n   (1999-01-01)\n\n")
        data = entry.encode("utf-8")
        index.append(f"term {i}\t{_b64(len(body))}\t{_b64(len(data))}")
        index.append(f"alias {i}\t{_b64(len(body))}\t{_b64(len(data))}")
        body += data
    _put(root, "pkgs/dict-foldoc/usr/share/dictd/foldoc.index", "\n".join(index) + "\n")
    _put(root, "pkgs/dict-foldoc/usr/share/dictd/foldoc.dict.dz", gzip.compress(body))

    html_root = "pkgs/python3.11-doc/usr/share/doc/python3.11/html"
    for mod in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta"):
        _put(root, f"{html_root}/library/{mod}.html", _python_page(mod))
    _put(root, f"{html_root}/genindex.html", _reserved_page("GENINDEXSENTINEL"))
    _put(root, f"{html_root}/_sources/library/alpha.html", _reserved_page("SOURCESSENTINEL"))
    _put(root, f"{html_root}/man/alpha.html",
         _reserved_page("MANPAGESENTINEL"))

    pg = "pkgs/postgresql-doc-15/usr/share/doc/postgresql-doc-15/html"
    _put(root, f"{pg}/indexes-types.html",
         '<html><head><title>11.2. Index Types</title></head><body><div class="navheader">NAVSENTINEL</div>'
         '<h2>11.2. Index Types</h2><p>PostgreSQL provides several index types, each suited to different '
         'kinds of queries, so choosing the right one matters for speed.</p>'
         '<h3>11.2.1. B-Tree</h3><p>B-trees handle equality and range queries on data that can be sorted '
         'into some ordering, which covers most everyday columns.</p></body></html>')
    _put(root, f"{pg}/sql-select.html",
         _reserved_page("SQLPAGESENTINEL"))
    _put(root, f"{pg}/app-psql.html",
         _reserved_page("APPPAGESENTINEL"))
    dj = "pkgs/python-django-doc/usr/share/doc/python-django-doc/html"
    _put(root, f"{dj}/ref/django-admin.html",
         _reserved_page("DJANGOADMINSENTINEL"))
    _put(root, f"{dj}/topics/models.html",
         '<html><body><div id="sidebar">SIDEBARSENTINEL</div><div role="main"><h1>Models</h1>'
         '<p>A model is the single, definitive source of information about your data, holding the '
         'essential fields and behaviours of what you store.</p></div></body></html>')
    _put(root, "pkgs/fortunes/usr/share/games/fortunes/computers",
         "A computer lets you make more mistakes faster than any invention in human history.\n%\n"
         "Real programmers do not comment their code; if it was hard to write, it should be hard to read.\n%\n")
    return root


def _run(inputs: Path, out: Path, *extra: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--toy", "--inputs", str(inputs), "--out", str(out),
         "--eval-debian", "8", "--eval-pyapi", "4", "--eval-foldoc", "5", *extra],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "manifest.json").read_text())


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def built(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    return out, _run(inputs, out, "--seed", "3")


# ------------------------------------------------------------------------------------------ parsers


def test_parse_translation_cleans_paragraphs_and_bullets():
    text = ("Package: foo\nDescription-md5: 0\nDescription-en: frobnicate things\n"
            " Foo frobnicates things\n quickly and safely.\n .\n Features:\n  * one\n  * two\n\n"
            "Package: bar\nDescription-en: no long text\n")
    assert bc.parse_translation(text) == [
        ("foo", "frobnicate things", "Foo frobnicates things quickly and safely.\nFeatures:\n* one\n* two")]


def test_parse_wordnet_data_keeps_words_and_definition_only():
    line = ('00982852 04 n 02 signals_intelligence 0 SIGINT 0 001 @ 00981830 n 0000 | intelligence gathered '
            'from communications; "an example sentence"  \n')
    assert bc.parse_wordnet_data("  1 licence header\n" + line) == [
        ("00982852-n", "signals intelligence, SIGINT", "intelligence gathered from communications")]


def test_parse_dictd_reads_each_entry_once_and_strips_markup():
    entry = b"COTS\n\n   <software> commercial off-the-shelf.  See {commercial software}.\n\n   (2007-02-08)\n\n"
    index = f"COTS\tA\t{_b64(len(entry))}\ncots alias\tA\t{_b64(len(entry))}\n00-database-info\tA\tB\n"
    assert bc.parse_dictd(index, entry) == [("COTS", "commercial off-the-shelf. See commercial software.")]


def test_extract_html_page_pairs_dt_dd_and_skips_navigation():
    page = bc.extract_html_page(_python_page("alpha"), "library/alpha.html")
    assert page.title == "alpha \u2014 helpers"
    names = [name for name, _, _ in page.api_pairs]
    assert names == ["alpha.op0", "alpha.op1", "alpha.op2", "alpha.op3"]
    assert page.api_pairs[0][1] == _sentence("alpha0")
    assert "CODESENTINEL" not in page.api_pairs[0][1]
    text = " ".join(t for _, t in page.blocks)
    assert "NAVSENTINEL" not in text and "SIDEBARSENTINEL" not in text
    assert ("alpha \u2014 helpers: Using the alpha helpers",
            "Start with the simplest helper and combine several of them when a task needs more; each helper "
            "documents what it expects from alpha input.") in bc.heading_pairs(page)


def test_extract_html_page_closes_unclosed_paragraphs():
    page = bc.extract_html_page("<body><p>first paragraph<p>second paragraph<ul><li>one<li>two</ul></body>")
    assert [t for k, t in page.blocks if k == "p"] == ["first paragraph", "second paragraph", "one", "two"]


def test_vim_help_blocks_drop_examples_and_tags():
    text = ("*x.txt*\tFor Vim\n\nUse the |:edit| command to open files: >\n\t:edit foo\n<\n"
            "Then write it back.\t\t*write-tag*\n")
    blocks = bc.vim_help_blocks(text)
    assert ("p", "Use the :edit command to open files:") in blocks
    assert all(":edit foo" not in t for _, t in blocks)
    assert all("*" not in t for _, t in blocks)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abc de.\n", min_size=0, max_size=900), max_size=8),
       st.integers(40, 150), st.integers(160, 400))
def test_split_passages_respects_bounds_and_keeps_word_order(paragraphs, min_chars, max_chars):
    passages = bc.split_passages(paragraphs, min_chars=min_chars, target=min_chars, max_chars=max_chars)
    assert all(min_chars <= len(p) <= max_chars for p in passages)
    source = iter(" ".join(paragraphs).split())
    for word in " ".join(passages).split():   # each passage word appears in the input, in order
        assert any(word in w for w in source)


# ------------------------------------------------------------------------------------- whole build


def test_outputs_are_well_formed_jsonl(built):
    out, manifest = built
    pairs = _lines(out / "pairs.jsonl")
    passages = _lines(out / "passages.jsonl")
    assert pairs and passages
    assert all(set(p) == {"query", "doc", "source"} and p["query"] and p["doc"] for p in pairs)
    assert all(set(p) == {"text", "source"} and p["text"] for p in passages)
    assert all(len(p["doc"]) <= bc.DOC_MAX_CHARS for p in pairs)
    assert len({(p["query"], p["doc"]) for p in pairs}) == len(pairs)
    expected = {"debian", "wordnet", "foldoc", "stdlib-docstring", "python-api", "python-heading"}
    assert expected <= {p["source"] for p in pairs}
    assert {"python-doc", "fortunes"} <= {p["source"] for p in passages}


def test_reserved_and_navigation_text_never_reaches_outputs(built):
    out, _ = built
    for path in [out / "pairs.jsonl", out / "passages.jsonl", *sorted((out / "eval").glob("*.jsonl"))]:
        text = path.read_text(encoding="utf-8")
        for sentinel in SENTINELS:
            assert sentinel not in text, f"{sentinel} leaked into {path.name}"


def test_eval_split_is_disjoint_from_training(built):
    out, manifest = built
    evals = {p.stem: _lines(p) for p in (out / "eval").glob("*.jsonl")}
    assert set(evals) == {"debian", "pyapi", "foldoc"}
    assert all(evals[name] for name in evals)
    eval_docs = [bc._norm_key(e["doc"]) for rows in evals.values() for e in rows]
    train_texts = ([bc._norm_key(p["doc"]) for p in _lines(out / "pairs.jsonl")]
                   + [bc._norm_key(p["text"]) for p in _lines(out / "passages.jsonl")])
    for doc in eval_docs:
        assert not any(doc in text or text == doc for text in train_texts)
    held_pages = manifest["heldout_python_pages"]
    assert held_pages
    held_mods = {Path(p).stem for p in held_pages}
    train_queries = {p["query"] for p in _lines(out / "pairs.jsonl") if p["source"] == "python-api"}
    assert not any(q.split(".")[0] in held_mods for q in train_queries)
    assert all(e["query"].split(".")[0] in held_mods for e in evals["pyapi"])


def test_packages_sharing_a_long_description_stay_on_one_side(built):
    out, _ = built
    twins = "a shared long description used by two twin packages"
    in_train = [p for p in _lines(out / "pairs.jsonl") if twins in p["doc"].lower()]
    in_eval = [p for p in _lines(out / "eval" / "debian.jsonl") if twins in p["doc"].lower()]
    assert len(in_train) in (0, 2) and not (in_train and in_eval)


def test_manifest_records_versions_licences_counts_and_skips(built):
    out, manifest = built
    wordnet = manifest["sources"]["wordnet"]
    assert wordnet["version"] == "1:3.0-test"
    assert wordnet["license"] == "WordNet3.0" and wordnet["license_method"] == "dep5"
    assert manifest["sources"]["sqlite-doc"]["status"] == "skipped"
    assert "sqlite-doc" in manifest["skipped_sources"]
    assert manifest["seed"] == 3
    pairs = _lines(out / "pairs.jsonl")
    passages = _lines(out / "passages.jsonl")
    assert manifest["totals"]["pairs"] == len(pairs) == sum(manifest["pairs_by_source"].values())
    assert manifest["totals"]["passages"] == len(passages)
    assert manifest["totals"]["passage_chars"] == sum(len(p["text"]) for p in passages)
    for name, info in manifest["eval"].items():
        assert info["pairs"] == len(_lines(out / info["file"]))


def test_same_seed_rebuilds_identical_files(built, inputs, tmp_path):
    out, _ = built
    again = tmp_path / "again"
    _run(inputs, again, "--seed", "3")
    for name in ["pairs.jsonl", "passages.jsonl", "eval/debian.jsonl", "eval/pyapi.jsonl", "eval/foldoc.jsonl"]:
        assert (out / name).read_bytes() == (again / name).read_bytes(), name


def test_sources_subset_and_caps(inputs, tmp_path):
    out = tmp_path / "small"
    manifest = _run(inputs, out, "--sources", "debian,wordnet,fortunes", "--max-per-source", "10",
                    "--max-passages", "12")
    pairs = _lines(out / "pairs.jsonl")
    passages = _lines(out / "passages.jsonl")
    assert {p["source"] for p in pairs} <= {"debian", "wordnet"}
    assert all(n <= 10 for n in manifest["pairs_by_source"].values())
    assert len(passages) <= 12
    assert len({p["source"] for p in passages}) >= 2          # the cap is shared, not first-come
    assert set(manifest["sources"]) == {"debian", "wordnet", "fortunes"}


def test_unknown_source_name_is_refused():
    with pytest.raises(ValueError, match="unknown"):
        bc.build_corpus(["--toy", "--sources", "wikipedia", "--out", "/nonexistent/never-written"])


def test_bundled_toy_inputs_build_end_to_end(tmp_path):
    manifest = bc.build_corpus(["--toy", "--out", str(tmp_path / "toy")])
    assert manifest["totals"]["pairs"] > 50 and manifest["totals"]["passages"] > 5
    assert (tmp_path / "toy" / "eval" / "debian.jsonl").is_file()


def test_leak_index_catches_copies_near_copies_and_whole_template_docs():
    eval_doc = _sentence("leak-eval", 20)
    template = _sentence("leak-template", 16)
    background = [f"{template} {_sentence(f'member{k}', 8)}" for k in range(30)]
    index = bc._LeakIndex([eval_doc, template], background=background)
    assert index.leaks(f"Intro words here. {eval_doc} And a closing remark.")        # contains it
    assert index.leaks(" ".join(eval_doc.split()[:12]))                               # most of it
    assert index.leaks(background[0])              # contains the whole template-only eval doc
    assert not index.leaks(_sentence("unrelated", 20))


def _sphinx_page(title: str, seed: str) -> str:
    sections = "".join(f"<div class='section'><h2>{title} part {k}</h2><p>{_sentence(seed + str(k), 30)} "
                       f"{_sentence(seed + 'x' + str(k), 30)}</p></div>" for k in range(3))
    return f"<html><head><title>{title}</title></head><body><h1>{title}</h1>{sections}</body></html>"


def test_broad_sets_read_only_their_pages_and_label_pairs_per_set(tmp_path):
    """A broad doc set reads its own pages under its include rule, never man-page renderings or _modules/,
    and names its pairs broad-<name>-heading; 'broad' in --sources selects every broad set (missing ones
    are skipped), and the default build reads none of them."""
    root = tmp_path / "inputs"
    base = "pkgs/python-flask-doc/usr/share/doc/python-flask-doc/html"
    _put(root, f"{base}/quickstart.html", _sphinx_page("Quickstart guide", "flask-quick"))
    _put(root, f"{base}/patterns/sqlite.html", _sphinx_page("Using SQLite", "flask-sqlite"))
    _put(root, f"{base}/manpages/flask.html", _reserved_page("MANPAGESENTINEL"))
    _put(root, f"{base}/flask.1.html", _reserved_page("APPPAGESENTINEL"))
    _put(root, f"{base}/_modules/flask/app.html", _reserved_page("SOURCESSENTINEL"))
    _put(root, f"{base}/examples/tutorial.html", _reserved_page("CODESENTINEL"))
    _put(root, "pkgs/golang-1.19-doc/usr/share/doc/golang-1.19-doc/html/go_spec.html",
         _sphinx_page("The Go spec", "go-spec"))
    _put(root, "pkgs/golang-1.19-doc/usr/share/doc/golang-1.19-doc/html/other.html", _reserved_page("NAVSENTINEL"))
    (root / "translations").mkdir()
    out = tmp_path / "out"
    manifest = _run(root, out, "--sources", "broad")
    pairs, passages = _lines(out / "pairs.jsonl"), _lines(out / "passages.jsonl")
    text = json.dumps(pairs + passages)
    assert not any(s in text for s in SENTINELS)
    assert {p["source"] for p in pairs} == {"broad-flask-heading", "broad-go-heading"}
    assert any(p["query"].startswith("Using SQLite") for p in pairs)
    assert {p["source"] for p in passages} == {"broad-flask", "broad-go"}
    assert manifest["sources"]["broad-flask"]["files_read"] == 2
    assert manifest["sources"]["broad-go"]["files_read"] == 1
    assert "broad-gedit" in manifest["skipped_sources"]             # not in the inputs: skipped, not fatal
    default = _run(root, tmp_path / "default")
    assert not any(s.startswith("broad-") for s in default["sources"])
