"""Build the recall dev sets: query -> one long document, from offline manuals the shipped model never trained on.

Each source is a Debian documentation package that recipe/build_corpus.py does not read for the shipped model
(statsmodels is read by the newer corpus build: its dev pages go to exclude.jsonl, see below). A source's pages
are cut into units (a function or directive entry, or a section under a non-generic heading); each unit is one
document of the source's store, and up to --queries units also give a query, in one of four shapes:

    summary   the first sentence of the unit (or an Apache directive's "Description:" line) -> the unit without
              that sentence (a one-line description -> a long technical document)
    name      the entry's name ("balance", "fs.readFile", "HashMap::with_capacity", "RewriteBase") -> the entry
              without its signature lines
    title     a non-generic section heading ("Aligning objects") -> the section body, heading removed
    question  a task heading turned into a question offline, "Inserting a Table" / "To Insert a Table" ->
              "how do I insert a table?", heading removed from the document (the verb's base form from
              WordNet's verb index and exception list, read as a lemmatiser only)

Documents keep their length up to --doc-max-chars (default 4000: long, as real manuals are; the shipped model's
vectors see the first 128 tokens). A query that two units share is dropped (its documents stay), so every query
has exactly one relevant document. Everything is seeded (sha256 of seed + key), stdlib only.

Writes <out>/<source>.jsonl ({"query", "doc", "source", "shape", "key"}: one row per query),
<out>/<source>.docs.jsonl ({"doc", "source", "key"}: the documents without a query, stored as distractors),
<out>/exclude.jsonl (every dev text, plus the statsmodels pairs build_corpus.py makes from the dev pages and, with
--corpus, that corpus's passages holding a paragraph of them, in the {"query", "doc"} form `train_embedder.py
--exclude` reads) and <out>/manifest.json.

    python recipe/build_devsets.py --out /work/data/dev --work-dir /work/corpus_work [--corpus /work/corpus]
        [--sources octave,...] [--queries 800] [--docs 2500] [--doc-max-chars 4000] [--seed 0]

Never reads manual pages (any /man/ path, *-manpages) nor pages generated from them: Apache's programs/ pages
(apachectl, htpasswd, ... are its man pages) are skipped; no Erlang reference pages are read.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_corpus import (  # noqa: E402
    _FORBIDDEN_PATH, DOC_MAX_CHARS, _clip, _collapse, _is_prose, _norm_key, _seeded_rank, extract_html_page,
    fetch_package, read_license,
)

__all__ = ["SOURCES", "Unit", "build", "gerund_question", "main", "units_of"]

DEV_DOC_MAX = 4000      # documents are clipped here (at a sentence end when one is late enough)
DOC_MIN = 120           # a document must say this much
SUMMARY_MIN, SUMMARY_MAX = 25, 220
PRE_MAX = 400           # a code block keeps at most this many characters
BOILERPLATE_PAGES = 3   # a paragraph on this many pages of a source is navigation or a template: dropped
GENERIC_REPEAT = 5      # a heading seen this often in a source does not start a unit
SHAPE_WEIGHT = {"question": 4, "summary": 3, "name": 2, "title": 1}
GENERIC_HEADINGS = {
    "note", "notes", "tip", "tips", "warning", "caution", "important", "see also", "example", "examples",
    "description", "synopsis", "overview", "introduction", "options", "parameters", "returns", "return value",
    "errors", "panics", "safety", "implementations", "usage", "details", "summary", "references", "attributes",
    "methods", "properties", "events", "contents", "related topics", "activating the filter",
    "activating the command", "activating the tool", "activate the command", "activating the dialog",
    "known issues", "selected snippets", "internals reference", "predefined commands", "notes and references",
}
_SIG_RE = {
    "octave": re.compile(r"^: (?P<sig>.+?)\s*\u00b6$"),
    "maxima": re.compile(r"^(?:Function|Macro|Special operator|Operator|Option variable|System variable|"
                         r"Global variable|Property|Special symbol|Constant|Declaration|Keyword|Object|"
                         r"Plot option|Graphic option|Scene option|Package|Variable|Special form): "
                         r"(?P<sig>.+?)\s*\u00b6$"),
}
_TITLE_TAIL = re.compile(r"\s*\((?:GNU Octave|Maxima) .*\)\s*$")
_IDENT = re.compile(r"[A-Za-z_%$][\w.:$%]*")
_SENT_SPLIT = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\betc\.)(?<=[.!?])\s+(?=[\"'(\[A-Z0-9])")


@dataclass(frozen=True)
class SourceSpec:
    """A Debian documentation package and where its pages are."""

    package: str
    root: str                      # folder inside the unpacked package
    kind: str                      # the reader: texinfo | nodejs | rust | apache | sections | statsmodels
    include: str = r"\.html$"      # regex on the path relative to root
    exclude: tuple = ()            # regexes on the path relative to root
    licence_prefer: str = ""


SOURCES = {
    "octave": SourceSpec("octave-doc", "usr/share/doc/octave/octave.html", "texinfo",
                         exclude=(r"(^|/)index\.html$", r"Index\.html$")),
    "maxima": SourceSpec("maxima-doc", "usr/share/doc/maxima-doc/html", "texinfo",
                         exclude=(r"(^|/)index\.html$", r"maxima_toc", r"maxima_singlepage", r"Index\.html$")),
    "nodejs": SourceSpec("nodejs-doc", "usr/share/doc/nodejs/api", "nodejs", include=r"\.json\.gz$",
                         exclude=(r"^all\.json", r"^index\.json")),
    "rust": SourceSpec("rust-doc", "usr/share/doc/rust-doc/html/std", "rust",
                       include=r"(^|/)(struct|enum|trait|fn|macro|primitive|keyword|union|type)\.[^/]+\.html$",
                       exclude=(r"^(arch|os|simd|intrinsics|prelude)/",)),
    "apache": SourceSpec("apache2-doc", "usr/share/doc/apache2-doc/manual/en", "apache",
                         exclude=(r"^programs/", r"(^|/)index\.html$", r"(^|/)sitemap\.html$",
                                  r"(^|/)quickreference\.html$", r"(^|/)directives\.html$",
                                  r"(^|/)glossary\.html$", r"^mod/module-dict\.html$", r"^mod/directive-dict\.html$",
                                  r"^new_features", r"^upgrading", r"^license")),
    "gimp": SourceSpec("gimp-help-en", "usr/share/gimp/2.0/help/en", "sections",
                       exclude=(r"^gfdl", r"^bibliography", r"^apcs")),
    "libreoffice": SourceSpec("libreoffice-help-en-us", "usr/share/libreoffice/help/en-US", "sections",
                              include=r"^text/.*\.html$"),
    "lilypond": SourceSpec("lilypond-doc-html", "usr/share/doc/lilypond/html/Documentation", "sections",
                           include=r"^(notation|learning|usage|music-glossary)/[^/]+\.html$",
                           exclude=(r"(^|/)index\.html$", r"(^|/)(lily-|.*-index\.html$)")),
    "statsmodels": SourceSpec("python-statsmodels-doc", "usr/share/doc/python-statsmodels-doc/html", "statsmodels",
                              include=r"^generated/[^/]+\.html$"),
}


@dataclass
class Unit:
    """One document of a source: a definition entry or a section."""

    key: str                                     # page path + position: unique within the source
    heading: str                                 # the heading or the entry's first signature ("" if none)
    name: str = ""                               # for entries: the name a user would type
    signatures: list = field(default_factory=list)
    blocks: list = field(default_factory=list)   # (kind "p" | "pre", text)
    summary: str = ""                            # a given one-line description (Apache), else from the body
    entry: bool = False                          # a definition entry (function, directive, method)


# ----------------------------------------------------------------------------------------------- readers


def _page(path: Path, rel: str):
    return extract_html_page(path.read_text(encoding="utf-8", errors="replace"), rel)


def _files(base: Path, spec: SourceSpec) -> list[tuple[Path, str]]:
    inc, exc = re.compile(spec.include), [re.compile(p) for p in spec.exclude]
    out = []
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(base).as_posix()
        if not path.is_file() or _FORBIDDEN_PATH.search(path.as_posix()) or not inc.search(rel):
            continue
        if any(p.search(rel) for p in exc):
            continue
        out.append((path, rel))
    return out


def _entry_name(sig: str) -> str:
    """The called name in a signature: "[q, r] = deconv (y, a)" -> "deconv", "abs (z)" -> "abs"."""
    sig = sig.split("=", 1)[1] if re.match(r"^\s*[\[\w, ~\]]+\s*=[^=]", sig) else sig
    m = _IDENT.search(sig)
    return m.group(0) if m else ""


def _texinfo_units(source: str, base: Path, spec: SourceSpec) -> list[Unit]:
    sig_re = _SIG_RE[source]
    units: list[Unit] = []
    for path, rel in _files(base, spec):
        page = _page(path, rel)
        cur: Unit | None = None
        for i, (kind, text) in enumerate(page.blocks):
            m = sig_re.match(text) if kind == "p" else None
            if m:
                sig = m.group("sig").strip()
                if cur is not None and cur.entry and not cur.blocks:
                    cur.signatures.append(sig)
                    continue
                cur = Unit(f"{rel}#{i}", sig, _entry_name(sig), [sig], entry=True)
                units.append(cur)
            elif kind.startswith("h"):
                cur = Unit(f"{rel}#{i}", _TITLE_TAIL.sub("", text).strip())
                units.append(cur)
            elif cur is not None and kind in ("p", "pre") and not text.startswith("Categories:"):
                cur.blocks.append((kind, text))
    return units


def _nodejs_units(base: Path, spec: SourceSpec) -> list[Unit]:
    units: list[Unit] = []

    def walk(node, rel: str, path: str) -> None:
        if isinstance(node, dict):
            raw = node.get("textRaw")
            if isinstance(raw, str) and isinstance(node.get("desc"), str):
                heading = _collapse(raw.replace("`", ""))
                page = extract_html_page(f"<html><body><main>{node['desc']}</main></body></html>", rel)
                blocks = [(k, t) for k, t in page.blocks if k in ("p", "pre", "api")]
                blocks = [("p" if k == "api" else k, t) for k, t in blocks]
                entry = node.get("type") in ("method", "class", "classMethod", "ctor") or (
                    node.get("type") is None and re.match(r"^[\w.\[\]'\"]+$", heading) is not None)
                name = re.sub(r"^(Class:|Static method:|new)\s+", "", heading).split("(")[0].strip() if entry else ""
                units.append(Unit(f"{rel}#{path}", heading, name, [heading] if entry else [], blocks, entry=entry))
            for k, v in node.items():
                if isinstance(v, list):
                    for j, child in enumerate(v):
                        walk(child, rel, f"{path}/{k}{j}")

    for path, rel in _files(base, spec):
        walk(json.loads(gzip.decompress(path.read_bytes())), rel, "")
    return units


_RUST_STOP = {"Trait Implementations", "Auto Trait Implementations", "Blanket Implementations",
              "Implementors", "Required Methods", "Provided Methods", "Implementations on Foreign Types",
              "Trait Implementations for", "Methods from Deref"}


def _rust_units(base: Path, spec: SourceSpec) -> list[Unit]:
    units: list[Unit] = []
    for path, rel in _files(base, spec):
        page = _page(path, rel)
        item = ""
        cur: Unit | None = None
        for i, (kind, text) in enumerate(page.blocks):
            if kind == "h1" and not item:
                full = re.sub(r"^(Struct|Enum|Trait|Function|Macro|Primitive Type|Keyword|Union|Type Definition)\s+",
                              "", text).strip()
                item = full.rsplit("::", 1)[-1]
                cur = Unit(f"{rel}#{i}", text, full, [], entry=True)
                units.append(cur)
            elif kind.startswith("h"):
                if any(text.startswith(s) for s in _RUST_STOP):
                    break
                m = re.match(r"^pub (?:const )?(?:unsafe )?(?:async )?fn (\w+)", text)
                if m and item:
                    cur = Unit(f"{rel}#{i}", text, f"{item}::{m.group(1)}", [text], entry=True)
                    units.append(cur)
                elif text.startswith("impl") or text == "Implementations":
                    cur = None
                elif cur is not None and kind in ("h2", "h3", "h5"):
                    continue          # Examples, Panics, Errors ... stay inside the item
                else:
                    cur = None
            elif cur is not None and kind in ("p", "pre"):
                if cur.blocks or kind == "p":
                    cur.blocks.append((kind, text))
    return units


def _apache_units(base: Path, spec: SourceSpec) -> list[Unit]:
    units: list[Unit] = []
    labels = {"Description:", "Syntax:", "Default:", "Context:", "Override:", "Status:", "Module:",
              "Compatibility:"}
    for path, rel in _files(base, spec):
        page = _page(path, rel)
        cur: Unit | None = None
        blocks = page.blocks
        i = 0
        while i < len(blocks):
            kind, text = blocks[i]
            if kind.startswith("h"):
                heading = text.rstrip(" \u00b6").strip()
                m = re.match(r"^(<?[\w:]+>?) Directive$", heading)
                cur = Unit(f"{rel}#{i}", heading, m.group(1) if m else "", entry=bool(m))
                units.append(cur)
            elif cur is not None and kind == "p" and text in labels and i + 1 < len(blocks):
                value = blocks[i + 1][1]
                if text == "Description:":
                    cur.summary = value
                else:
                    cur.signatures.append(f"{text} {value}")
                i += 2
                continue
            elif cur is not None and kind in ("p", "pre"):
                cur.blocks.append((kind, text))
            i += 1
    return units


def _section_units(base: Path, spec: SourceSpec) -> list[Unit]:
    units: list[Unit] = []
    for path, rel in _files(base, spec):
        page = _page(path, rel)
        cur: Unit | None = None
        for i, (kind, text) in enumerate(page.blocks):
            if kind.startswith("h"):
                cur = Unit(f"{rel}#{i}", text.rstrip(" \u00b6").strip())
                units.append(cur)
            elif cur is not None and kind in ("p", "pre"):
                cur.blocks.append((kind, text))
    return units


def _statsmodels_units(base: Path, spec: SourceSpec) -> list[Unit]:
    units: list[Unit] = []
    for path, rel in _files(base, spec):
        for j, (name, desc, _kind) in enumerate(_page(path, rel).api_pairs):
            if name and desc:
                units.append(Unit(f"{rel}#{j}", name, name, [], [("p", t) for t in desc.split("\n")], entry=True))
    return units


def units_of(source: str, root: Path) -> list[Unit]:
    """Every unit of `source` under the unpacked package `root`, boilerplate paragraphs dropped.

    Args:
        source: a key of SOURCES.
        root: where the package was unpacked.
    Returns:
        units in page order; generic headings (GENERIC_HEADINGS, or one seen GENERIC_REPEAT times) merged into
        the unit before them.
    """
    spec = SOURCES[source]
    base = root / spec.root
    reader = {"texinfo": lambda: _texinfo_units(source, base, spec), "nodejs": lambda: _nodejs_units(base, spec),
              "rust": lambda: _rust_units(base, spec), "apache": lambda: _apache_units(base, spec),
              "sections": lambda: _section_units(base, spec),
              "statsmodels": lambda: _statsmodels_units(base, spec)}[spec.kind]
    units = reader()
    # navigation, templates and "Run"/"source" labels: a paragraph on several pages says nothing about one unit
    pages_of: dict[str, set] = defaultdict(set)
    for u in units:
        for _, t in u.blocks:
            pages_of[_norm_key(t)].add(u.key.split("#")[0])
    heading_count = Counter(_norm_key(u.heading) for u in units if not u.entry)
    merged: list[Unit] = []
    for u in units:
        u.blocks = [(k, t) for k, t in u.blocks if len(pages_of[_norm_key(t)]) < BOILERPLATE_PAGES
                    and not re.fullmatch(r"\[.*\]", t)]
        generic = not u.entry and (_norm_key(u.heading) in GENERIC_HEADINGS
                                   or heading_count[_norm_key(u.heading)] >= GENERIC_REPEAT
                                   or not u.heading)
        if generic and merged and merged[-1].key.split("#")[0] == u.key.split("#")[0]:
            merged[-1].blocks.extend(u.blocks)
        elif not generic:
            merged.append(u)
    return merged


# ----------------------------------------------------------------------------------------------- shapes


class Lemmatiser:
    """Gerund -> base verb from WordNet's index.verb (tagged sense counts break ties) and verb.exc."""

    def __init__(self, wordnet_dir: Path) -> None:
        self.count: dict[str, int] = {}
        for line in (wordnet_dir / "index.verb").read_text(encoding="utf-8", errors="replace").split("\n"):
            parts = line.split()
            if len(parts) > 4 and not line.startswith(" "):
                try:
                    n_ptr = int(parts[3])
                    self.count[parts[0]] = int(parts[4 + n_ptr + 1]) + 1
                except (ValueError, IndexError):
                    continue
        self.exc: dict[str, str] = {}
        for line in (wordnet_dir / "verb.exc").read_text(encoding="utf-8", errors="replace").split("\n"):
            parts = line.split()
            if len(parts) >= 2:
                self.exc.setdefault(parts[0], parts[1])

    def base(self, gerund: str) -> str | None:
        """The base form of a present participle ("setting" -> "set"), or None when it is not one."""
        word = gerund.lower()
        if not word.endswith("ing") or len(word) < 5:
            return None
        if word in self.exc:
            return self.exc[word]
        stem = word[:-3]
        options = [stem, stem + "e"]
        if len(stem) > 2 and stem[-1] == stem[-2]:
            options.insert(0, stem[:-1])
        if stem.endswith("y"):
            options.append(stem[:-1] + "ie")
        found = [w for w in options if w in self.count]
        return max(found, key=lambda w: self.count[w]) if found else None


_QUESTION_FORMS = ("how do I {}?", "how can I {}?", "how to {}", "how would I {}?")


def _lower_title(words: list[str]) -> str:
    """Lower-case title-cased words ("Insert", "Table") but keep acronyms and inner capitals ("PDF", "LibreOffice")."""
    return " ".join(w.lower() if w[:1].isupper() and w[1:].islower() or len(w) == 1 else w for w in words)


def gerund_question(heading: str, lemma: Lemmatiser, seed: int, key: str) -> str | None:
    """A task heading as a question: "Inserting a Table" / "To Insert a Table" -> "how do I insert a table?".

    Returns None for headings that are not tasks (no leading gerund or "To <verb>", fewer than two words).
    """
    words = re.sub(r"[.:]$", "", heading.strip()).split()
    if len(words) < 2 or not re.fullmatch(r"[A-Za-z][\w\-' ,/()]*", " ".join(words)):
        return None
    if words[0].lower() == "to":
        if words[1].lower() not in lemma.count:
            return None
        task = [words[1].lower()] + words[2:]
    elif words[0].lower() == "how" and words[1].lower() == "to" and len(words) > 2:
        task = [words[2].lower()] + words[3:]
    else:
        verb = lemma.base(words[0])
        if verb is None:
            return None
        task = [verb] + words[1:]
    form = _QUESTION_FORMS[int(_seeded_rank(seed, "form:" + key), 16) % len(_QUESTION_FORMS)]
    return form.format(_lower_title(task))


def _first_sentence(text: str) -> tuple[str, str]:
    parts = _SENT_SPLIT.split(text, maxsplit=1)
    return (parts[0].strip(), parts[1].strip() if len(parts) > 1 else "")


def _body(blocks: list[tuple[str, str]]) -> list[str]:
    out = []
    for kind, text in blocks:
        text = _collapse(text)
        if not text:
            continue
        out.append(_clip(text, PRE_MAX) if kind == "pre" else text)
    return out


def _doc(lines: list[str], limit: int) -> str:
    return _clip("\n".join(line for line in lines if line), limit)


def _is_identifier(heading: str) -> bool:
    return len(heading.split()) == 1 and bool(re.search(r"[._:()\[\]]|[a-z][A-Z]|\w_\w", heading))


def candidates(unit: Unit, lemma: Lemmatiser, seed: int, limit: int) -> dict[str, tuple[str, str]]:
    """The (query, doc) each shape would give for `unit` (only the shapes it supports)."""
    body = _body(unit.blocks)
    out: dict[str, tuple[str, str]] = {}
    if not body:
        return out
    sig_lines = list(unit.signatures)
    full = _doc(sig_lines + body, limit)
    if unit.summary:
        if len(unit.summary.split()) >= 3:
            out["summary"] = (unit.summary, full)
    else:
        first, rest = _first_sentence(body[0])
        if (SUMMARY_MIN <= len(first) <= SUMMARY_MAX and len(first.split()) >= 4 and first[-1:] in ".!?"
                and _is_prose(first, 0.75)):
            out["summary"] = (first, _doc(sig_lines + ([rest] if rest else []) + body[1:], limit))
    if unit.entry and unit.name and len(unit.name) >= 2:
        out["name"] = (unit.name, _doc(([unit.summary] if unit.summary else []) + body, limit))
    elif not unit.entry:
        question = gerund_question(unit.heading, lemma, seed, unit.key)
        if question:
            out["question"] = (question, _doc(body, limit))
        elif _is_identifier(unit.heading) and len(unit.heading) >= 2:
            out["name"] = (unit.heading, _doc(body, limit))
        elif 2 <= len(unit.heading.split()) <= 12 and re.search(r"[A-Za-z]{3}", unit.heading):
            out["title"] = (unit.heading, _doc(body, limit))
    return {s: (q, d) for s, (q, d) in out.items() if len(d) >= DOC_MIN and _norm_key(q) != _norm_key(d)}


# ----------------------------------------------------------------------------------------------- build


def _choose_shape(options: dict, seed: int, key: str) -> str:
    total = sum(SHAPE_WEIGHT[s] for s in options)
    pick = int(_seeded_rank(seed, "shape:" + key), 16) % total
    for shape in sorted(options, key=lambda s: -SHAPE_WEIGHT[s]):
        pick -= SHAPE_WEIGHT[shape]
        if pick < 0:
            return shape
    return next(iter(options))


def build_source(source: str, units: list[Unit], lemma: Lemmatiser, *, queries: int, docs: int, seed: int,
                 limit: int) -> tuple[list[dict], list[dict], dict]:
    """The query rows and distractor docs of one source (see the module docstring).

    Returns:
        (query rows, distractor rows, stats).
    """
    chosen: list[tuple[Unit, str, str, str]] = []      # unit, shape, query, doc
    plain: list[tuple[Unit, str]] = []                 # units that only give a document
    query_count: Counter = Counter()                   # over every shape of every unit: same-titled sections count
    for unit in units:
        options = candidates(unit, lemma, seed, limit)
        query_count.update({_norm_key(q) for q, _ in options.values()})
        if not options:
            body = _doc(_body(unit.blocks), limit)
            if len(body) >= DOC_MIN:
                plain.append((unit, body))
            continue
        shape = _choose_shape(options, seed, f"{source}:{unit.key}")
        chosen.append((unit, shape, *options[shape]))
    # one relevant doc per query: drop queries two units could both give, and later copies of a document
    seen_docs: set[str] = set()
    rows, extra = [], []
    for unit, shape, query, doc in chosen:
        k = _norm_key(doc)
        if k in seen_docs:
            continue
        seen_docs.add(k)
        if query_count[_norm_key(query)] == 1:
            rows.append({"query": query, "doc": doc, "source": source, "shape": shape, "key": unit.key})
        else:
            extra.append({"doc": doc, "source": source, "key": unit.key})
    for unit, doc in plain:
        if _norm_key(doc) not in seen_docs:
            seen_docs.add(_norm_key(doc))
            extra.append({"doc": doc, "source": source, "key": unit.key})
    # balance the shapes among the kept queries: round-robin over shapes, each in seeded order
    by_shape: dict[str, list[dict]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: _seeded_rank(seed, f"q:{source}:{r['key']}")):
        by_shape[row["shape"]].append(row)
    picked: list[dict] = []
    while len(picked) < queries and any(by_shape.values()):
        for shape in sorted(by_shape):
            if by_shape[shape] and len(picked) < queries:
                picked.append(by_shape[shape].pop(0))
    left = [r for rs in by_shape.values() for r in rs]
    pool = [{"doc": r["doc"], "source": source, "key": r["key"]} for r in left] + extra
    pool.sort(key=lambda r: _seeded_rank(seed, f"d:{source}:{r['key']}"))
    distractors = pool[: max(0, docs - len(picked))]
    picked.sort(key=lambda r: r["key"])
    distractors.sort(key=lambda r: r["key"])
    stats = {"units": len(units), "queries": len(picked), "distractors": len(distractors),
             "shapes": dict(Counter(r["shape"] for r in picked)),
             "doc_chars_median": sorted(len(r["doc"])
                                        for r in picked + distractors)[(len(picked) + len(distractors)) // 2]
             if picked or distractors else 0}
    return picked, distractors, stats


def _statsmodels_corpus_rows(units: list[Unit], keys: set[str], root: Path) -> list[dict]:
    """The statsmodels pairs build_corpus.py makes from the dev pages, in its exact text, for exclude.jsonl."""
    pages = {k.split("#")[0] for k in keys}
    rows = []
    base = root / SOURCES["statsmodels"].root
    for rel in sorted(pages):
        for name, desc, _ in _page(base / rel, rel).api_pairs:
            query = _collapse(name)
            doc = _clip("\n".join(_collapse(line) for line in desc.split("\n") if line.strip()), DOC_MAX_CHARS)
            rows.append({"query": query, "doc": doc})
            for para in desc.split("\n"):   # passages are cut from the same paragraphs
                if para.strip():
                    rows.append({"query": _collapse(para), "doc": _collapse(para)})
    return rows


def _corpus_passages_holding(corpus: Path, paragraphs: set[str]) -> list[dict]:
    """exclude.jsonl rows for the passages of a build_corpus.py output that hold any of `paragraphs` (passages are
    packed from several paragraphs, so the paragraphs' own rows do not match them)."""
    rows = []
    path = corpus / "passages.jsonl"
    if not path.is_file():
        raise SystemExit(f"--corpus: expected {path} (a recipe/build_corpus.py output).")
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            text = json.loads(line)["text"]
            if any(_collapse(part) in paragraphs for part in text.split("\n")):
                rows.append({"query": text, "doc": text})
    return rows


def build(args: argparse.Namespace) -> dict:
    """Build every requested source and write the files (see the module docstring). Returns the manifest."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work_dir)
    lemma = Lemmatiser(fetch_package("wordnet-base", work).root / "usr/share/wordnet")
    manifest: dict = {"format": "evermind-devsets 1", "seed": args.seed, "doc_max_chars": args.doc_max_chars,
                      "queries_per_source": args.queries, "docs_per_source": args.docs, "sources": {}}
    exclude: list[dict] = []
    for source in args.sources:
        spec = SOURCES[source]
        pkg = fetch_package(spec.package, work)
        licence, _, method = read_license(pkg.root, spec.package, spec.licence_prefer)
        units = units_of(source, pkg.root)
        rows, distractors, stats = build_source(source, units, lemma, queries=args.queries, docs=args.docs,
                                                seed=args.seed, limit=args.doc_max_chars)
        _write(out / f"{source}.jsonl", rows)
        _write(out / f"{source}.docs.jsonl", distractors)
        exclude += [{"query": r["query"], "doc": r["doc"]} for r in rows]
        exclude += [{"query": r["doc"], "doc": r["doc"]} for r in distractors]
        if source == "statsmodels":
            corpus_rows = _statsmodels_corpus_rows(units, {r["key"] for r in rows + distractors}, pkg.root)
            exclude += corpus_rows
            if args.corpus:
                exclude += _corpus_passages_holding(Path(args.corpus), {r["doc"] for r in corpus_rows
                                                                        if r["query"] == r["doc"]})
        manifest["sources"][source] = {"package": spec.package, "version": pkg.version, "licence": licence,
                                       "licence_method": method, **stats}
        print(f"[build_devsets] {source}: {json.dumps(stats)}", file=sys.stderr, flush=True)
    _write(out / "exclude.jsonl", exclude)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def _write(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> dict:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the dev folder to write")
    ap.add_argument("--work-dir", default="/work/corpus_work", help="package downloads (shared with build_corpus)")
    ap.add_argument("--sources", default=",".join(SOURCES), help=f"comma-separated subset of {','.join(SOURCES)}")
    ap.add_argument("--queries", type=int, default=800, help="queries per source")
    ap.add_argument("--docs", type=int, default=2500, help="documents per source (queries' documents included)")
    ap.add_argument("--doc-max-chars", type=int, default=DEV_DOC_MAX, help="clip documents to this length")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus", default="", help="a build_corpus.py output: also exclude its passages that hold a "
                                                 "statsmodels dev paragraph")
    args = ap.parse_args(argv)
    args.sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = [s for s in args.sources if s not in SOURCES]
    if unknown:
        raise SystemExit(f"--sources: unknown {unknown}; expected names from {list(SOURCES)}")
    return build(args)


if __name__ == "__main__":
    main()
