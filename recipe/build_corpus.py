"""Build the shipped model's training and evaluation corpus from offline Debian sources (stdlib only).

Fetches packages (`apt-get download` + `dpkg-deb -x`, no install), reads Translation-en lists and stdlib
docstrings, and writes query<->doc pairs, passages, held-out eval pairs disjoint from training, a manifest.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath

__all__ = [
    "build_corpus",
    "clean_debian_description",
    "extract_html_page",
    "main",
    "parse_dictd",
    "parse_translation",
    "parse_wordnet_data",
    "split_passages",
    "write_toy_inputs",
]

DOC_MAX_CHARS = 1000          # pair docs are clipped to this many characters
DOC_MIN_CHARS = 20            # shorter pair docs are dropped
EVAL_DOC_MIN_CHARS = 50       # eval docs must say enough to be findable
PASSAGE_MIN, PASSAGE_TARGET, PASSAGE_MAX = 100, 200, 600
SHINGLE = 8                   # word n-gram used to detect eval text inside training text
LEAK_FRACTION = 0.3           # a training text that covers this share of an eval doc's n-grams is dropped
APT_LISTS = Path("/var/lib/apt/lists")
TOY_STDLIB_MODULES = ["json", "textwrap", "colorsys"]

# Never read these: reserved for independent evaluation (see shared/CORPUS.md).
_FORBIDDEN_PATH = re.compile(r"(^|/)(man|usr/share/man)(/|$)|manpages")


def _log(msg: str) -> None:
    print(f"[build_corpus] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- text


_WS = re.compile(r"\s+")
_WORD = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\betc\.)(?<=[.!?])\s+(?=[\"'(\[A-Z0-9])")
_CLIP_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)[.!?](?=\s)")
_CODEISH = re.compile(r"[/_=<>{}\\]|\(\)")


def _collapse(text: str) -> str:
    return _WS.sub(" ", text.replace("\u00ad", "").replace("\u200b", "")).strip()


def _join_paragraphs(paragraphs) -> str:
    return "\n".join(p for p in (_collapse(p) for p in paragraphs) if p)


def _clip(text: str, limit: int) -> str:
    """Cut text to at most `limit` chars, at a sentence end if one is late enough, else at a space."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    ends = [m.start() for m in _CLIP_END.finditer(head)]
    cut = ends[-1] if ends else -1
    if cut >= limit * 0.6:
        return head[: cut + 1].rstrip()
    space = head.rfind(" ")
    return (head[:space] if space > limit * 0.6 else head).rstrip()


def _norm_key(text: str) -> str:
    return _collapse(text).lower()


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _seeded_rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode("utf-8")).hexdigest()


def _is_prose(text: str, min_ratio: float = 0.8) -> bool:
    """True when text is mostly letters and spaces and few identifier-like tokens (drops code, file lists)."""
    if not text:
        return False
    good = sum(1 for ch in text if ch.isalpha() or ch == " ")
    tokens = text.split()
    codeish = sum(1 for t in tokens if _CODEISH.search(t))
    return good / len(text) >= min_ratio and codeish <= 0.25 * len(tokens)


def split_passages(paragraphs: list[str], *, min_chars: int = PASSAGE_MIN,
                   target: int = PASSAGE_TARGET, max_chars: int = PASSAGE_MAX) -> list[str]:
    """Pack consecutive paragraphs into passages of about `target`..`max_chars` characters.

    Args:
        paragraphs: paragraphs of one section, in reading order.
        min_chars: a final piece shorter than this is dropped.
        target: a passage is closed once it reaches this length and the next piece would overflow.
        max_chars: no passage is longer; long paragraphs are split at sentence ends (or spaces).
    Returns:
        The passages, paragraphs joined by newlines.
    """
    pieces: list[str] = []
    for para in paragraphs:
        para = _collapse(para)
        if len(para) <= max_chars:
            if para:
                pieces.append(para)
            continue
        for sentence in _SENTENCE_END.split(para):
            while len(sentence) > max_chars:
                part = _clip(sentence, max_chars)
                pieces.append(part)
                sentence = sentence[len(part):].strip()
            if sentence:
                pieces.append(sentence)
    passages: list[str] = []
    current: list[str] = []
    size = 0
    for piece in pieces:
        if current and size + 1 + len(piece) > max_chars:
            if size >= min_chars:
                passages.append("\n".join(current))
                current, size = [], 0
            else:
                current, size = [], 0   # too short to stand alone and too long to merge
        current.append(piece)
        size = size + (1 if size else 0) + len(piece)
    if current and size >= min_chars:
        passages.append("\n".join(current))
    return passages


# ------------------------------------------------------------------------------------- Debian lists


_BULLET = re.compile(r"^[*+\-o\u2022]\s")


def clean_debian_description(lines: list[str]) -> str:
    """Turn the continuation lines of a Debian Description field into natural text.

    Args:
        lines: the field's lines after the first (each starts with one space; " ." separates paragraphs).
    Returns:
        Paragraphs joined by newlines; bullet items start new lines; whitespace collapsed.
    """
    paragraphs: list[list[str]] = [[]]
    for raw in lines:
        line = raw[1:] if raw.startswith(" ") else raw
        if line.strip() == ".":
            paragraphs.append([])
            continue
        stripped = line.strip()
        if not stripped:
            continue
        current = paragraphs[-1]
        if not current or _BULLET.match(stripped):
            current.append(stripped)
        else:
            current[-1] = current[-1] + " " + stripped
    return "\n".join(_collapse(line) for para in paragraphs for line in para if line.strip())


def parse_translation(text: str) -> list[tuple[str, str, str]]:
    """Parse a Debian Translation-en list.

    Args:
        text: the decompressed list (records of Package / Description-md5 / Description-en).
    Returns:
        (package, short description, cleaned long description) per record with a long description.
    """
    out: list[tuple[str, str, str]] = []
    for record in re.split(r"\n\s*\n", text):
        package, short, long_lines, in_desc = "", "", [], False
        for line in record.split("\n"):
            if line.startswith("Package:"):
                package, in_desc = line.split(":", 1)[1].strip(), False
            elif line.startswith("Description-en:"):
                short, in_desc = line.split(":", 1)[1].strip(), True
            elif line.startswith((" ", "\t")) and in_desc:
                long_lines.append(line)
            else:
                in_desc = False
        long = clean_debian_description(long_lines)
        if package and short and long:
            out.append((package, short, long))
    return out


# ------------------------------------------------------------------------------------------ WordNet


_WN_MARKER = re.compile(r"\([a-z]+\)$")


def parse_wordnet_data(text: str) -> list[tuple[str, str, str]]:
    """Parse a WordNet 3.0 `data.<pos>` file.

    Args:
        text: the file's text (licence header lines start with two spaces and are skipped).
    Returns:
        (synset key "offset-pos", words joined by ", ", definition without example sentences).
    """
    out = []
    for line in text.split("\n"):
        if not line or line.startswith("  ") or " | " not in line:
            continue
        data, gloss = line.split(" | ", 1)
        fields = data.split()
        try:
            count = int(fields[3], 16)
        except (IndexError, ValueError):
            continue
        words: list[str] = []
        for raw in fields[4:4 + 2 * count:2]:
            word = _WN_MARKER.sub("", raw).replace("_", " ")
            if word not in words:
                words.append(word)
        definition = re.split(r';\s*"', gloss, maxsplit=1)[0].strip().rstrip(";").strip()
        if words and definition:
            out.append((f"{fields[0]}-{fields[2]}", ", ".join(words[:6]), definition))
    return out


# ------------------------------------------------------------------------------------------- dictd


_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def _b64_number(text: str) -> int:
    value = 0
    for ch in text:
        value = value * 64 + _B64[ch]
    return value


def parse_dictd(index_text: str, data: bytes) -> list[tuple[str, str]]:
    """Read every entry of a dictd dictionary (FOLDOC, Jargon) as (term, definition).

    Args:
        index_text: the `.index` file (headword TAB base64 offset TAB base64 length).
        data: the uncompressed `.dict` bytes (gunzip a `.dict.dz` first).
    Returns:
        One (term, cleaned definition) per distinct entry; aliases pointing at one entry count once.
    """
    out, seen = [], set()
    for line in index_text.split("\n"):
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
            continue
        try:
            span = (_b64_number(parts[1]), _b64_number(parts[2]))
        except KeyError:
            continue
        if span in seen:
            continue
        seen.add(span)
        entry = data[span[0]:span[0] + span[1]].decode("utf-8", "replace")
        term, definition = _clean_dict_entry(entry)
        if term and definition:
            out.append((term, definition))
    return out


def _clean_dict_entry(entry: str) -> tuple[str, str]:
    lines = entry.strip("\n").split("\n")
    term = lines[0].strip() if lines else ""
    body = lines[1:]
    while body and body[0].strip():          # aliases, pronunciation, part of speech
        body = body[1:]
    paragraphs = [p for p in re.split(r"\n\s*\n", "\n".join(body)) if p.strip()]
    cleaned = []
    for i, para in enumerate(paragraphs):
        text = _collapse(para)
        if re.fullmatch(r"\(\d{4}-\d{2}-\d{2}\)", text):
            continue
        if i == 0:
            text = re.sub(r"^<[^<>]{1,80}>\s*", "", text)        # FOLDOC category tag
            text = re.sub(r"^\[[^\[\]]{0,300}\]\s*", "", text)    # Jargon etymology
        for _ in range(2):
            text = re.sub(r"\{([^{}]*)\}", r"\1", text)
        if text:
            cleaned.append(text)
    return term, "\n".join(cleaned)


# -------------------------------------------------------------------------------------------- HTML


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
         "track", "wbr"}
_SIBLINGS = {"li": {"li"}, "dt": {"dt", "dd"}, "dd": {"dt", "dd"}, "tr": {"tr", "td", "th"},
             "td": {"td", "th"}, "th": {"td", "th"}, "option": {"option"}}
_STOPS = {"table", "tbody", "thead", "tfoot", "ul", "ol", "dl", "div", "section", "body", "html",
          "blockquote", "#root"}
_BLOCK = {"p", "div", "li", "dt", "dd", "td", "th", "tr", "ul", "ol", "dl", "table", "section", "article",
          "blockquote", "caption", "figure", "figcaption", "main", "body", "hr", "h1", "h2", "h3", "h4",
          "h5", "h6", "pre", "aside", "details", "summary", "center",
          # Mallard (gnome help) elements
          "page", "item", "note", "steps", "list", "terms", "tree", "quote", "comment", "title", "subtitle",
          "synopsis", "example", "figure"}
_SKIP_TAGS = {"script", "style", "head", "nav", "header", "footer", "form", "noscript", "svg", "button",
              "select", "input", "textarea", "iframe", "object", "map"}
_MALLARD_SKIP = {"info", "links", "media", "credit", "revision"}
_MALLARD_PRE = {"code", "screen", "synopsis"}
_SKIP_CLASSES = {"sphinxsidebar", "sphinxsidebarwrapper", "related", "navheader", "navfooter", "toc",
                 "docnav", "nav", "breadcrumbs", "breadcrumb", "headerlink", "fancy-toc1", "fancy-toc2",
                 "fancy-toc3", "searchmenu", "submenu", "menu", "toctree-wrapper", "contents",
                 "footer", "header", "nosearch"}
_SKIP_IDS = {"sidebar", "hd", "ft", "global-nav", "banner", "searchbox", "searchmenu", "submenu",
             "breadcrumbs", "nav", "navigation"}
_SKIP_ROLES = {"navigation", "search", "banner", "contentinfo"}
_NUMBERING = re.compile(r"^(?:(?:Chapter|Appendix|Part)\s+[A-Z0-9IVX]+\.|(?:[A-Z]\.)?\d+(?:\.\d+)*\.?|"
                        r"[A-Z]\.|[IVX]+\.)\s+")
_GENERIC_HEADINGS = {"note", "notes", "tip", "warning", "caution", "important", "see also", "example",
                     "examples", "description", "synopsis", "overview", "introduction"}


class _Node:
    __slots__ = ("tag", "attrs", "children")

    def __init__(self, tag: str, attrs: dict):
        self.tag = tag
        self.attrs = attrs
        self.children: list = []


class _TreeBuilder(HTMLParser):
    """Forgiving HTML/XML to tree: closes unclosed <p>, <li>, <td>... the way browsers roughly do."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = _Node("#root", {})
        self.stack = [self.root]

    def _autoclose(self, tag: str) -> None:
        while True:
            closed = False
            for i in range(len(self.stack) - 1, 0, -1):
                open_tag = self.stack[i].tag
                if tag in ("td", "th") and open_tag == "tr":
                    break
                if (open_tag == "p" and tag in _BLOCK) or open_tag in _SIBLINGS.get(tag, ()):
                    del self.stack[i:]
                    closed = True
                    break
                if open_tag in _STOPS:
                    break
            if not closed:
                return

    def handle_starttag(self, tag, attrs):
        self._autoclose(tag)
        node = _Node(tag, {k: (v or "") for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(_Node(tag, {k: (v or "") for k, v in attrs}))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def _skipped(node: _Node, mallard: bool) -> bool:
    if node.tag in _SKIP_TAGS or (mallard and node.tag in _MALLARD_SKIP):
        return True
    if any(c in _SKIP_CLASSES for c in node.attrs.get("class", "").split()):
        return True
    return node.attrs.get("id", "") in _SKIP_IDS or node.attrs.get("role", "") in _SKIP_ROLES


def _api_kind(node: _Node) -> str:
    if node.tag != "dl":
        return ""
    classes = node.attrs.get("class", "").split()
    if classes[:1] in (["py"], ["c"]):
        return classes[0]
    return "glossary" if "glossary" in classes else ""


def _text(node: _Node, mallard: bool) -> str:
    parts: list[str] = []

    def walk(n: _Node) -> None:
        for child in n.children:
            if isinstance(child, str):
                parts.append(child)
            elif not _skipped(child, mallard):
                if child.tag == "br":
                    parts.append(" ")
                walk(child)
    walk(node)
    return _collapse("".join(parts))


def _blocks(node: _Node, mallard: bool, skip_api: bool = False) -> list[tuple[str, str]]:
    """Flatten a subtree into (kind, text) blocks in reading order.

    Kinds: "h1".."h6" headings, "p" body text, "pre" code, "dt" API signatures and "api" text inside
    API descriptions (so heading<->body pairs can leave the API entries out).
    """
    blocks: list[tuple[str, str]] = []
    buf: list[str] = []

    def flush(kind: str) -> None:
        text = _collapse("".join(buf))
        buf.clear()
        if text:
            blocks.append((kind, text))

    def walk(n: _Node, kind: str) -> None:
        for child in n.children:
            if isinstance(child, str):
                buf.append(child)
                continue
            if _skipped(child, mallard) or (skip_api and _api_kind(child)):
                continue
            tag = child.tag
            level = 0
            if len(tag) == 2 and tag[0] == "h" and tag[1] in "123456":
                level = int(tag[1])
            elif mallard and tag == "title" and n.tag in ("page", "section"):
                level = 1 if n.tag == "page" else 2
            if level:
                flush(kind)
                text = _NUMBERING.sub("", _text(child, mallard))
                if text:
                    blocks.append((f"h{level}", text))
                continue
            if tag == "pre" or (mallard and tag in _MALLARD_PRE):
                flush(kind)
                blocks.append(("pre", _text(child, mallard)))
                continue
            if tag == "br":
                buf.append(" ")
            inner = kind
            if _api_kind(child):
                inner = "api"
            elif tag == "dt" and kind == "api":
                inner = "dt"
            block = tag in _BLOCK
            if block:
                flush(kind)
            walk(child, inner)
            if block:
                flush(inner)
    walk(node, "p")
    flush("p")
    return blocks


def _find(node: _Node, pred) -> _Node | None:
    todo = [node]
    while todo:
        n = todo.pop(0)
        if pred(n):
            return n
        todo.extend(c for c in n.children if isinstance(c, _Node))
    return None


def _find_all(node: _Node, pred) -> list[_Node]:
    found, todo = [], [node]
    while todo:
        n = todo.pop()
        if pred(n):
            found.append(n)
        todo.extend(reversed([c for c in n.children if isinstance(c, _Node)]))
    return found


@dataclass
class Page:
    """One extracted document page: its title, text blocks and API (term, description) pairs."""
    path: str
    title: str
    blocks: list = field(default_factory=list)
    api_pairs: list = field(default_factory=list)   # (name, description, kind)


def extract_html_page(text: str, path: str = "", *, mallard: bool = False) -> Page:
    """Extract title, body blocks and dt/dd API pairs from one HTML (or Mallard .page) document.

    Args:
        text: the document's markup.
        path: its path relative to the doc set root (kept on the Page).
        mallard: True for GNOME Mallard `.page` XML (skips <info>, treats <code>/<screen> as code).
    Returns:
        A Page; navigation, sidebars, scripts and headerlinks are left out.
    """
    builder = _TreeBuilder()
    try:
        builder.feed(text)
        builder.close()
    except Exception as exc:   # html.parser is lenient; anything raised here is a broken file
        _log(f"warning: could not parse {path}: {exc}")
    root = builder.root
    main_node = (_find(root, lambda n: n.attrs.get("role") == "main")
                 or _find(root, lambda n: n.tag == "main")
                 or _find(root, lambda n: n.attrs.get("id") == "yui-main")
                 or _find(root, lambda n: n.tag in ("body", "page"))
                 or root)
    blocks = _blocks(main_node, mallard)
    title = ""
    head_title = _find(root, lambda n: n.tag == "title" and not mallard)
    if head_title is not None:
        segments = re.split(r"\s+[\u2014|]\s+", _text(head_title, mallard))
        title = " \u2014 ".join(segments[:-1] if len(segments) > 1 else segments)   # drop "- Django docs"
        title = _NUMBERING.sub("", title)
    if not title:
        title = next((t for kind, t in blocks if kind.startswith("h")), "")
    api_pairs = []
    for dl in _find_all(main_node, _api_kind):
        kind = _api_kind(dl)
        names: list[str] = []
        for child in dl.children:
            if not isinstance(child, _Node):
                continue
            if child.tag == "dt":
                name = child.attrs.get("id", "") if kind in ("py", "c") else ""
                if kind == "c" and name.startswith("c."):
                    name = name[2:]
                if not name or name.startswith("index-"):
                    name = _text(child, mallard).split("(")[0].strip()
                    name = re.sub(r"^(class|exception|method|function|attribute|data|abstractmethod|"
                                  r"classmethod|staticmethod|async|awaitable|property)\s+", "", name)
                if name:
                    names.append(name)
            elif child.tag == "dd" and names:
                desc = "\n".join(t for k, t in _blocks(child, mallard, skip_api=True)
                                 if k == "p" and len(t) >= 25 and _is_prose(t, 0.75))
                api_pairs.append((names[0], desc, kind))
                names = []
    return Page(path=path, title=title, blocks=blocks, api_pairs=api_pairs)


def heading_pairs(page: Page) -> list[tuple[str, str]]:
    """(title: heading, body text) for each h1-h3 section (other than the title) with enough body text before the next
    heading."""
    out = []
    blocks = page.blocks
    for i, (kind, text) in enumerate(blocks):
        if kind not in ("h1", "h2", "h3") or text == page.title or text.lower() in _GENERIC_HEADINGS:
            continue
        body = []
        for k2, t2 in blocks[i + 1:]:
            if k2.startswith("h"):
                break
            if k2 == "p" and len(t2) >= 25 and _is_prose(t2, 0.75):
                body.append(t2)
        doc = "\n".join(body)
        if len(doc) < 40:
            continue
        query = f"{page.title}: {text}" if page.title and page.title != text else text
        out.append((query, doc))
    return out


# ---------------------------------------------------------------------------------------- vim, fortune


_VIM_TAG = re.compile(r"(?<![\w*])\*[^\s*|]+\*(?![\w*])")
_VIM_LINK = re.compile(r"\|([^\s|]+)\|")


def vim_help_blocks(text: str) -> list[tuple[str, str]]:
    """Blocks of a Vim help file: paragraphs of prose; examples (after ">") and separators dropped."""
    blocks: list[tuple[str, str]] = []
    para: list[str] = []
    in_example = False

    def flush() -> None:
        if para:
            blocks.append(("p", _collapse(" ".join(para))))
            para.clear()

    for n, line in enumerate(text.split("\n")):
        if n == 0 and line.startswith("*"):
            continue                                    # "*file.txt*  For Vim version ..." header
        if in_example:
            if line.startswith("<"):
                in_example = False
                line = line[1:]
            elif not line.strip() or line[0] in " \t":
                continue
            else:
                in_example = False
        if re.fullmatch(r"\s*[=\-]{10,}\s*", line):
            flush()
            blocks.append(("h2", ""))
            continue
        had_tag = bool(_VIM_TAG.search(line))
        line = _VIM_LINK.sub(r"\1", _VIM_TAG.sub("", line))
        if line.rstrip().endswith(" ~"):
            line = line.rstrip()[:-2]
        starts_example = line.rstrip() == ">" or line.rstrip().endswith(" >")
        if starts_example:
            line = line.rstrip()[:-1]
        if had_tag:
            flush()
        if line.strip():
            para.append(line.strip())
        else:
            flush()
        if starts_example:
            flush()
            in_example = True
    flush()
    return blocks


def fortune_texts(text: str) -> list[str]:
    """The quotes of a fortune file (separated by lines holding a single %)."""
    return [_collapse(q) for q in re.split(r"\n%\n", "\n" + text.replace("\r", "") + "\n") if q.strip()]


# --------------------------------------------------------------------------------------- packages


@dataclass
class Package:
    """A Debian package unpacked under `root`, with its version and licence."""
    name: str
    root: Path
    version: str = ""
    license: str = "unknown"
    licenses_all: list = field(default_factory=list)
    license_method: str = ""


_LICENSE_HINTS = [
    ("GNU Free Documentation License", "GFDL-1.1+"),
    ("Python Software Foundation", "PSF-2.0"),
    ("BSD copyright", "BSD-3-Clause"),
    ("Redistribution and use in source and binary forms", "BSD"),
    ("GNU General Public License", "GPL"),
    ("public domain", "public-domain"),
]


def read_license(root: Path, package: str, prefer: str = "") -> tuple[str, list[str], str]:
    """Licence short name of a package from its `usr/share/doc/PKG/copyright` file.

    Args:
        root: where the package was unpacked.
        package: its name.
        prefer: a `Files:` pattern whose licence wins over `Files: *` (e.g. "runtime/doc/*" for Vim help).
    Returns:
        (licence, every licence named in the file, how it was found: "dep5" | "text" | "missing").
    """
    path = root / "usr/share/doc" / package / "copyright"
    if not path.is_file():
        found = sorted((root / "usr/share/doc").glob("*/copyright")) if (root / "usr/share/doc").is_dir() else []
        if not found:
            return "unknown", [], "missing"
        path = found[0]
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.startswith("Format:"):
        main, preferred, names = "", "", []
        for para in re.split(r"\n\s*\n", text):
            files = re.search(r"^Files:(.*(?:\n[ \t].*)*)", para, re.M)
            lic = re.search(r"^License:[ \t]*(.*)", para, re.M)
            if not lic or not lic.group(1).strip():
                continue
            name = lic.group(1).strip()
            if files:
                patterns = files.group(1).split()
                if patterns == ["*"]:
                    main = name
                if prefer and prefer in patterns:
                    preferred = name
                if any(p.startswith("debian/") for p in patterns) and patterns != ["*"]:
                    continue
            if name not in names:
                names.append(name)
        return preferred or main or (names[0] if names else "unknown"), names, "dep5"
    for hint, name in _LICENSE_HINTS:
        if hint.lower() in text.lower():
            return name, [name], "text"
    return "unknown", [], "text"


def fetch_package(name: str, work_dir: Path) -> Package:
    """Download a Debian package with `apt-get download` and unpack it with `dpkg-deb -x` (cached).

    Args:
        name: the package name.
        work_dir: holds debs/ and x/<name>/; never inside the repository.
    Returns:
        The unpacked Package with its version.
    Raises:
        RuntimeError: the download or unpacking failed.
    """
    debs = work_dir / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob(f"{name}_*.deb"))
    if not found:
        proc = subprocess.run(["apt-get", "download", name], cwd=debs, capture_output=True, text=True)
        found = sorted(debs.glob(f"{name}_*.deb"))
        if proc.returncode != 0 or not found:
            raise RuntimeError(f"apt-get download {name} failed: {proc.stderr.strip()[-300:]}")
    deb = found[-1]
    version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True,
                             text=True, check=True).stdout.strip()
    root = work_dir / "x" / name
    marker = root / ".unpacked"
    if not marker.is_file() or marker.read_text() != version:
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, capture_output=True)
        marker.write_text(version)
    return Package(name=name, root=root, version=version)


def _input_package(name: str, inputs: Path) -> Package:
    root = inputs / "pkgs" / name
    if not root.is_dir():
        raise RuntimeError(f"{root} is missing from --inputs")
    version_file = root / "VERSION"
    version = version_file.read_text().strip() if version_file.is_file() else "toy"
    return Package(name=name, root=root, version=version)


# ----------------------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class DocSet:
    """An HTML / Mallard / text documentation tree inside a package."""
    base: str                        # directory inside the unpacked package
    suffix: str                      # ".html", ".page", ".txt" or "" (fortune files)
    exclude: tuple = ()              # regexes on the path relative to base
    reader: str = "html"             # "html" | "mallard" | "vim" | "fortune"
    api: bool = False                # read dt/dd API pairs
    headings: bool = True            # read h2/h3 heading <-> body pairs
    passage_min: int = PASSAGE_MIN
    include: tuple = ()              # if given, a path (relative to base) must match one of these regexes
    # pair sources are "<pair_prefix>-heading" / "-api" (default: the name's first word)
    pair_prefix: str = ""


_SPHINX_EXCLUDE = (r"(^|/)genindex", r"(^|/)search\.html$", r"(^|/)_[a-z]+/", r"^_",
                   r"(^|/)py-modindex\.html$", r"(^|/)modindex\.html$")

DOCSETS = {
    "python-doc": ("python3.11-doc", DocSet(
        "usr/share/doc/python3.11/html", ".html",
        _SPHINX_EXCLUDE + (r"^whatsnew/changelog\.html$", r"^contents\.html$", r"^index\.html$"), api=True)),
    "django-doc": ("python-django-doc", DocSet(
        "usr/share/doc/python-django-doc/html", ".html",
        _SPHINX_EXCLUDE + (r"^ref/django-admin\.html$", r"^contents\.html$", r"^index\.html$"), api=True)),
    # Scientific Python API references: qualified name <-> description pairs in the same shape as the
    # Python API ones, from packages whose names never collide with the held-out stdlib modules.
    **{f"{name}-doc": (f"python-{name}-doc", DocSet(
        f"usr/share/doc/python-{name}-doc/html", ".html",
        _SPHINX_EXCLUDE + (r"(^|/)release[./]", r"(^|/)(whatsnew|changelog|changes)", r"(^|/)index\.html$"),
        api=True)) for name in ("scipy", "sklearn", "pandas", "statsmodels", "astropy", "sympy")},
    "postgres-doc": ("postgresql-doc-15", DocSet(
        "usr/share/doc/postgresql-doc-15/html", ".html",
        (r"(^|/)(sql|app)-[^/]*\.html$", r"(^|/)bookindex\.html$", r"(^|/)index\.html$"))),
    "sqlite-doc": ("sqlite3-doc", DocSet(
        "usr/share/doc/sqlite3", ".html", (r"^releaselog/", r"^images/", r"(^|/)search", r"^sitemap",
                                            r"^docs\.html$", r"^index\.html$", r"^chronology\.html$"))),
    "debian-handbook": ("debian-handbook", DocSet(
        "usr/share/doc/debian-handbook/html/en-US", ".html", (r"^Common_Content/", r"^index\.html$"))),
    "gnome-help": ("gnome-user-docs", DocSet("usr/share/help/C", ".page", (r"(^|/)legal",), reader="mallard")),
    "vim-help": ("vim-runtime", DocSet(
        "usr/share/vim/vim90/doc", ".txt",
        (r"^(index|quickref|help|usr_toc|tags|version\d+)\.txt$",), reader="vim", headings=False)),
    "fortunes": ("fortunes", DocSet("usr/share/games/fortunes", "", (r"\.", r"^(ascii-)?art$"),
                                    reader="fortune", headings=False, passage_min=60)),
}

# Broad documentation (issue 16, item 4): manuals of libraries, languages, servers, Debian itself and GNOME
# applications, read from the package root with the same extractors, so that the student sees the kinds of
# text its teacher was trained on, not only the narrow mix above. Sources are "broad-<name>" and their pairs
# "broad-<name>-heading" / "-api" (recipe/pack_corpus.py --merge-pair-prefix broad- folds them into one
# sampler source). Left out on purpose: the nine dev packages of /work/data/dev (apache2-doc, gimp-help-en,
# libreoffice-help-*, lilypond-doc*, maxima-doc, nodejs-doc, octave-doc, rust-doc, python-statsmodels-doc),
# every manual page and HTML rendering of one (the _FORBIDDEN_PATH check, manpages/ folders, *.N.html, clisp.html,
# libvirt's manpages/), Erlang's per-module reference pages, and manuals of command-line tools that repeat
# their man pages (coreutils, bash, grep, sed, tar, findutils, ...): all reserved for evaluation.
_BROAD_EXCLUDE = (r"(^|/)_(modules|sources|static|images|downloads|autosummary)/", r"(^|/)genindex",
                  r"(^|/)search(index)?\.html$", r"(^|/)(py-)?modindex\.html$", r"(^|/)manpages?(/|$)",
                  r"(^|/)(releasenotes|release-notes|release_notes|changelog|changes|whatsnew|announce|history|"
                  r"news|license|copyright|authors)([./_-]|$)", r"(^|/)[^/]*\.[1-9][a-z]*\.html$",
                  r"(^|/)examples?/")


def _broad(package: str, base: str, include: tuple = (), *, reader: str = "html", api: bool = False,
           exclude: tuple = ()) -> tuple[str, DocSet]:
    suffix = ".page" if reader == "mallard" else ".html"
    return package, DocSet(base, suffix, _BROAD_EXCLUDE + exclude, reader=reader, api=api, include=include)


_SPHINX_BROAD = {  # name: (package, html directory)
    "flask": ("python-flask-doc", "usr/share/doc/python-flask-doc/html"),
    "werkzeug": ("python-werkzeug-doc", "usr/share/doc/python-werkzeug-doc/html"),
    "jinja2": ("python-jinja2-doc", "usr/share/doc/python-jinja2-doc/html"),
    "requests": ("python-requests-doc", "usr/share/doc/python-requests-doc/html"),
    "sqlalchemy": ("python-sqlalchemy-doc", "usr/share/doc/python-sqlalchemy-doc/html"),
    "lxml": ("python-lxml-doc", "usr/share/doc/python-lxml/html"),
    "pil": ("python-pil-doc", "usr/share/doc/python-pil-doc/html"),
    "docutils": ("docutils-doc", "usr/share/doc/docutils-doc/docs"),
    "babel": ("python-babel-doc", "usr/share/doc/python-babel-doc/html"),
    "cython": ("cython-doc", "usr/share/doc/cython-doc/html"),
    "h5py": ("python-h5py-doc", "usr/share/doc/python-h5py-doc/html"),
    "mpmath": ("python-mpmath-doc", "usr/share/doc/python-mpmath-doc/html"),
    "scrapy": ("python-scrapy-doc", "usr/share/doc/python-scrapy-doc/html"),
    "celery": ("python-celery-doc", "usr/share/doc/python-celery-doc/html"),
    "pytest": ("python-pytest-doc", "usr/share/doc/python-pytest-doc/html"),
    "setuptools": ("python-setuptools-doc", "usr/share/doc/python-setuptools-doc/html"),
    "psycopg2": ("python-psycopg2-doc", "usr/share/doc/python-psycopg2-doc/html"),
    "xarray": ("python-xarray-doc", "usr/share/doc/python-xarray-doc/html"),
    "nibabel": ("python-nibabel-doc", "usr/share/doc/python-nibabel-doc/html"),
    "pymongo": ("python-pymongo-doc", "usr/share/doc/python-pymongo-doc/html"),
    "dask": ("python-dask-doc", "usr/share/doc/python-dask-doc/html"),
    "sphinx": ("sphinx-doc", "usr/share/doc/sphinx-doc/html"),
    "rsyslog": ("rsyslog-doc", "usr/share/doc/rsyslog-doc/html"),
    "bind9": ("bind9-doc", "usr/share/doc/bind9-doc/arm"),
    "developers-reference": ("developers-reference", "usr/share/developers-reference"),
}
_GNOME_BROAD = {  # name: package whose usr/share/help/C/<name> holds the application's Mallard help
    "evince": "evince-common", "gedit": "gedit-common", "eog": "eog", "gnome-terminal": "gnome-terminal-data",
    "totem": "totem-common", "gnome-system-monitor": "gnome-system-monitor", "baobab": "baobab",
    "simple-scan": "simple-scan", "gnome-clocks": "gnome-clocks", "shotwell": "shotwell-common",
    "gnome-calculator": "gnome-calculator", "gnote": "gnote", "seahorse": "seahorse", "file-roller": "file-roller",
    "gnome-boxes": "gnome-boxes", "epiphany": "epiphany-browser-data", "evolution": "evolution-common",
    "pitivi": "pitivi", "brasero": "brasero-common",
}
BROAD_DOCSETS = {
    **{f"broad-{name}": _broad(pkg, base, api=True) for name, (pkg, base) in _SPHINX_BROAD.items()},
    **{f"broad-{name}": _broad(pkg, f"usr/share/help/C/{name}", reader="mallard")
       for name, pkg in _GNOME_BROAD.items()},
    "broad-debian-reference": _broad("debian-reference-en", "usr/share/debian-reference", (r"\.en\.html$",)),
    "broad-debian-policy": _broad("debian-policy", "usr/share/doc/debian-policy",
                                  (r"^policy\.html/", r"^(menu|perl)-policy\.html/", r"^[a-z-]+\.html$")),
    "broad-maint-guide": _broad("maint-guide", "usr/share/doc/maint-guide/html", (r"\.en\.html$",)),
    "broad-harden": _broad("harden-doc", "usr/share/doc/harden-doc/html/en-US"),
    "broad-r-manuals": _broad("r-doc-html", "usr/share/R/doc/manual"),
    "broad-go": _broad("golang-1.19-doc", "usr/share/doc/golang-1.19-doc/html", (r"^(go_spec|go_mem|asm)\.html$",)),
    "broad-sbcl": _broad("sbcl-doc", "usr/share/doc/sbcl"),
    "broad-clisp": _broad("clisp-doc", "usr/share/doc/clisp/doc", (r"^impnotes\.html$",)),
    "broad-swi-prolog": _broad("swi-prolog-doc", "usr/share/swi-prolog/doc"),
    "broad-gprolog": _broad("gprolog-doc", "usr/share/doc/gprolog-doc", (r"^gprolog\.html$",)),
    "broad-gap": _broad("gap-doc", "usr/share/gap/doc", (r"^(ref|tut|hpc)/chap[^/]*\.html$",)),
    "broad-libvirt": _broad("libvirt-doc", "usr/share/doc/libvirt-doc/html"),
    "broad-postgis": _broad("postgis-doc", "usr/share/doc/postgis-doc", (r"^postgis\.html$",)),
    "broad-wireshark": _broad("wireshark-doc", "usr/share/doc/wireshark", (r"^ws[ud]g_html_chunked/",)),
    "broad-exim": _broad("exim4-doc-html", "usr/share/doc/exim4-doc-html/spec_html"),
    "broad-kicad": _broad("kicad-doc-en", "usr/share/doc/kicad/help/en"),
    "broad-doxygen": _broad("doxygen-doc", "usr/share/doc/doxygen/html"),
    "broad-glib": _broad("libglib2.0-doc", "usr/share/gtk-doc/html", (r"^(glib|gio|gobject)/",)),
    "broad-gtk3": _broad("libgtk-3-doc", "usr/share/gtk-doc/html", (r"^(gtk3|gdk3)/",)),
    "broad-java": _broad("openjdk-17-doc", "usr/share/doc/openjdk-17-jre-headless/api",
                         (r"^java\.base/java/(lang|util|io|net|time|math|text|nio/file)/[A-Z][A-Za-z]*\.html$",)),
}
for _name, (_pkg, _spec) in BROAD_DOCSETS.items():
    BROAD_DOCSETS[_name] = (_pkg, DocSet(_spec.base, _spec.suffix, _spec.exclude, _spec.reader, _spec.api,
                                         _spec.headings, _spec.passage_min, _spec.include, _name))
DOCSETS.update(BROAD_DOCSETS)
DICTS = {"foldoc": "dict-foldoc", "jargon": "dict-jargon"}
LICENSE_PREFER = {"vim-runtime": "runtime/doc/*"}
DEFAULT_SOURCES = ["debian", "wordnet", "foldoc", "jargon", "stdlib", *(d for d in DOCSETS if d not in BROAD_DOCSETS)]
ALL_SOURCES = [*DEFAULT_SOURCES, *BROAD_DOCSETS]   # the broad sets are opt-in: --sources ...,broad

_STDLIB_SKIP = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "__hello__",
                "__phello__", "test", "lib2to3", "xxlimited", "xxlimited_35", "xxsubtype", "pydoc_data",
                "ensurepip", "venv", "msilib", "winreg", "winsound", "nt", "msvcrt", "_winapi"}

_DOCSTRING_CHILD = r'''
import importlib, inspect, io, json, pkgutil, sys, warnings
warnings.simplefilter("ignore")
names, skip, out_path = json.loads(sys.argv[1]), set(json.loads(sys.argv[2])), sys.argv[3]
out = open(out_path, "a", encoding="utf-8")
def emit(record):
    out.write(json.dumps(record) + "\n"); out.flush()
def document(modname, mod):
    def add(qual, obj):
        try:
            doc = inspect.getdoc(obj)
        except Exception:
            return
        if doc:
            emit({"module": modname, "name": qual, "doc": doc})
    add(modname, mod)
    for attr, obj in sorted(vars(mod).items()):
        if attr.startswith("_") or getattr(obj, "__module__", None) != modname:
            continue
        if inspect.isclass(obj):
            add(f"{modname}.{attr}", obj)
            for mattr, member in sorted(vars(obj).items()):
                if not mattr.startswith("_") and (inspect.isfunction(member) or isinstance(member, property)):
                    add(f"{modname}.{attr}.{mattr}", member)
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            add(f"{modname}.{attr}", obj)
for top in names:
    queue = [top]
    while queue:
        name = queue.pop(0)
        emit({"start": name, "top": top})
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = io.StringIO()
        try:
            mod = importlib.import_module(name)
        except BaseException:
            mod = None
        finally:
            sys.stdout, sys.stderr = saved
        if mod is None:
            continue
        try:
            document(name, mod)
        except Exception:
            pass
        if hasattr(mod, "__path__") and name == top:
            for info in pkgutil.iter_modules(mod.__path__):
                sub = info.name
                if sub.startswith("_") or "test" in sub or sub in skip:
                    continue
                queue.append(f"{name}.{sub}")
'''


def collect_docstrings(modules: list[str], timeout: float = 300.0) -> list[dict]:
    """Docstrings of stdlib modules and their public classes, functions and methods.

    Imports run in a child process (stdout/stderr swallowed); a module that hangs or crashes the child
    is skipped and the walk resumes after it.

    Args:
        modules: top-level module names to import (submodules of packages are walked one level down).
        timeout: seconds allowed to one child process.
    Returns:
        {"module", "name", "doc"} records.
    """
    records: list[dict] = []
    remaining = list(modules)
    with tempfile.TemporaryDirectory() as tmp:
        while remaining:
            out_path = Path(tmp) / "docs.jsonl"
            out_path.write_text("")
            try:
                subprocess.run([sys.executable, "-c", _DOCSTRING_CHILD, json.dumps(remaining),
                                json.dumps(sorted(_STDLIB_SKIP)), str(out_path)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=timeout, cwd=tmp, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
                failed = None
            except subprocess.TimeoutExpired:
                failed = "timeout"
            last_top = None
            clean_exit = failed is None
            for line in out_path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "start" in record:
                    last_top = record["top"]
                else:
                    records.append(record)
            if clean_exit and last_top == remaining[-1]:
                break
            if last_top is None:
                break
            _log(f"warning: docstring walk stopped in {last_top} ({failed or 'crash'}); skipping it")
            remaining = remaining[remaining.index(last_top) + 1:]
    return records


def docstring_pairs(records: list[dict]) -> list[tuple[str, str, str]]:
    """(module, first paragraph, rest) for docstrings whose rest says something."""
    out = []
    for rec in records:
        paragraphs = re.split(r"\n\s*\n", rec["doc"].strip())
        if len(paragraphs) > 1 and re.search(r"\)\s*(-+>.*)?$", _collapse(paragraphs[0])):
            paragraphs = paragraphs[1:]          # C builtins start with a signature line, not a summary
        first = _collapse(paragraphs[0])
        rest = [p for p in paragraphs[1:] if ">>>" not in p and _is_prose(_collapse(p), 0.7)]
        doc = _join_paragraphs(rest)
        if 10 <= len(first) <= 300 and len(doc) >= 40:
            out.append((rec["module"], first, doc))
    return out


# -------------------------------------------------------------------------------------------- leaks


class _LeakIndex:
    """Finds training texts that contain (most of) an eval doc, by shared word 8-grams.

    N-grams found in more than `max_df` background texts (package-family templates, licence lines) say
    little about a doc and are not counted.
    """

    def __init__(self, docs: list[str], background=(), max_df: int = 20):
        shingles_of = [self._grams(_words(doc)) for doc in docs]
        all_grams = set().union(*shingles_of) if shingles_of else set()
        sizes = {len(g) for g in all_grams}
        df: Counter = Counter()
        for grams in shingles_of:
            df.update(grams)
        for text in background:
            words = _words(text)
            for k in sizes:
                if len(words) >= k:
                    df.update(set(zip(*(words[i:] for i in range(k)))) & all_grams)
        self.owner: dict = defaultdict(list)
        self.need: list[int] = []
        self.sizes: set = set()
        self.exact = {_norm_key(d) for d in docs}
        for doc_id, grams in enumerate(shingles_of):
            kept = [g for g in grams if df[g] <= max_df]
            need = max(1, math.ceil(LEAK_FRACTION * len(kept)))
            if not kept:                 # all template: still catch a text that contains the whole doc
                kept, need = list(grams), max(1, len(grams))
            for g in kept:
                self.owner[g].append(doc_id)
                self.sizes.add(len(g))
            self.need.append(need if kept else 10 ** 9)
        self.keys = set(self.owner)

    @staticmethod
    def _grams(words: list[str]) -> set:
        k = min(SHINGLE, len(words))
        return set(zip(*(words[i:] for i in range(k)))) if k >= 4 else set()

    def leaks(self, text: str) -> bool:
        if _norm_key(text) in self.exact:
            return True
        words = _words(text)
        hits: Counter = Counter()
        for k in self.sizes:
            if len(words) >= k:
                for g in set(zip(*(words[i:] for i in range(k)))) & self.keys:
                    hits.update(self.owner[g])
        return any(count >= self.need[doc_id] for doc_id, count in hits.items())


# -------------------------------------------------------------------------------------------- build


@dataclass
class _Pair:
    query: str
    doc: str
    source: str
    key: str          # unit of holding out: package, page, headword or module


class _Builder:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed
        self.limit = args.max_per_source or 0
        self.pairs: dict[str, list[_Pair]] = defaultdict(list)
        self.pages: dict[str, list[Page]] = {}
        self.fortunes: list[str] = []
        self.report: dict[str, dict] = {}
        self.pair_origin: dict[str, str] = {}      # pair source -> source that produced it
        self.heldout_pages: set = set()
        self.heldout_modules: set = set()

    # ------------------------------------------------------------------ fetching
    def package(self, source: str, name: str) -> Package | None:
        try:
            if self.args.inputs:
                pkg = _input_package(name, Path(self.args.inputs))
            else:
                pkg = fetch_package(name, Path(self.args.work_dir))
        except Exception as exc:   # a missing package skips its source, never the build
            _log(f"warning: {source}: package {name} unavailable ({exc}); skipping")
            self.report[source] = {"package": name, "status": "skipped", "reason": str(exc)[:300]}
            return None
        pkg.license, pkg.licenses_all, pkg.license_method = read_license(
            pkg.root, name, LICENSE_PREFER.get(name, ""))
        self.report[source] = {"package": name, "version": pkg.version, "license": pkg.license,
                               "licenses_all": pkg.licenses_all, "license_method": pkg.license_method,
                               "status": "ok"}
        return pkg

    def add_pair(self, source: str, pair_source: str, query: str, doc: str, key: str) -> None:
        query, doc = _collapse(query), "\n".join(_collapse(l) for l in doc.split("\n") if l.strip())
        doc = _clip(doc, self.args.doc_max_chars)
        if len(query) < 2 or len(doc) < DOC_MIN_CHARS or _norm_key(query) == _norm_key(doc):
            return
        self.pairs[pair_source].append(_Pair(query, doc, pair_source, key))
        self.pair_origin[pair_source] = source

    # ------------------------------------------------------------------ sources
    def source_debian(self) -> None:
        if self.args.inputs:
            files = sorted((Path(self.args.inputs) / "translations").glob("*"))
        else:
            files = sorted(APT_LISTS.glob("*Translation-en*"))
        files = [f for f in files if f.is_file()]
        if not files:
            self.report["debian"] = {"package": "apt Translation-en lists", "status": "skipped",
                                     "reason": "no Translation-en list found (run apt-get update "
                                               "-o Acquire::Languages=en)"}
            _log("warning: debian: no Translation-en lists; skipping")
            return
        records = []
        for f in files:
            if f.suffix == ".lz4":
                proc = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(f)], capture_output=True)
                if proc.returncode != 0:
                    _log(f"warning: cannot decompress {f}")
                    continue
                text = proc.stdout.decode("utf-8", "replace")
            else:
                text = f.read_text(encoding="utf-8", errors="replace")
            records.extend(parse_translation(text))
        self.report["debian"] = {"package": "apt Translation-en lists", "version": ",".join(f.name for f in files),
                                 "license": "per-package (Debian archive package descriptions)",
                                 "licenses_all": [], "license_method": "n/a", "status": "ok"}
        seen = set()
        for package, short, long in records:
            if (package, short, long) in seen:
                continue
            seen.add((package, short, long))
            self.add_pair("debian", "debian", short, long, package)

    def source_wordnet(self) -> None:
        pkg = self.package("wordnet", "wordnet-base")
        if pkg is None:
            return
        for pos in ("noun", "verb", "adj", "adv"):
            path = pkg.root / "usr/share/wordnet" / f"data.{pos}"
            if not path.is_file():
                _log(f"warning: wordnet: {path} missing")
                continue
            for key, words, definition in parse_wordnet_data(path.read_text(encoding="utf-8", errors="replace")):
                self.add_pair("wordnet", "wordnet", words, definition, key)

    def source_dict(self, source: str) -> None:
        pkg = self.package(source, DICTS[source])
        if pkg is None:
            return
        base = pkg.root / "usr/share/dictd"
        index = base / f"{source}.index"
        data_path = base / f"{source}.dict.dz"
        if not data_path.is_file():
            data_path = base / f"{source}.dict"
        if not index.is_file() or not data_path.is_file():
            self.report[source].update(status="skipped", reason=f"no dictd files under {base}")
            return
        raw = data_path.read_bytes()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        for term, definition in parse_dictd(index.read_text(encoding="utf-8", errors="replace"), data):
            self.add_pair(source, source, term, definition, term.lower())

    def source_stdlib(self) -> None:
        modules = TOY_STDLIB_MODULES if self.args.toy else sorted(
            m for m in sys.stdlib_module_names if not m.startswith("_") and m not in _STDLIB_SKIP)
        records = collect_docstrings(modules)
        self.report["stdlib"] = {"package": "python stdlib (inspect.getdoc)", "version": sys.version.split()[0],
                                 "license": "PSF-2.0", "licenses_all": ["PSF-2.0"], "license_method": "known",
                                 "status": "ok", "modules": len(modules)}
        for module, first, rest in docstring_pairs(records):
            self.add_pair("stdlib", "stdlib-docstring", first, rest, module)

    def source_docset(self, source: str) -> None:
        package_name, spec = DOCSETS[source]
        pkg = self.package(source, package_name)
        if pkg is None:
            return
        base = pkg.root / spec.base
        if spec.reader == "vim" and not base.is_dir():
            found = sorted((pkg.root / "usr/share/vim").glob("vim*/doc"))
            base = found[-1] if found else base
        if not base.is_dir():
            self.report[source].update(status="skipped", reason=f"{spec.base} not in package")
            _log(f"warning: {source}: {spec.base} missing; skipping")
            return
        excludes = [re.compile(p) for p in spec.exclude]
        pages: list[Page] = []
        short = spec.pair_prefix or {"debian-handbook": "handbook"}.get(source, source.split("-")[0])
        includes = [re.compile(p) for p in spec.include]
        files = 0
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(base).as_posix()
            if not path.is_file() or _FORBIDDEN_PATH.search(path.as_posix()):
                continue
            if spec.suffix and not rel.endswith(spec.suffix):
                continue
            if any(p.search(rel) for p in excludes):
                continue
            if includes and not any(p.search(rel) for p in includes):
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            files += 1
            if spec.reader == "fortune":
                self.fortunes.extend(fortune_texts(text))
                continue
            if spec.reader == "vim":
                page = Page(path=rel, title=path.stem, blocks=vim_help_blocks(text))
            else:
                page = extract_html_page(text, rel, mallard=spec.reader == "mallard")
            pages.append(page)
            key = f"{source}/{rel}"
            if spec.api:
                for name, desc, kind in page.api_pairs:
                    self.add_pair(source, f"{short}-api", name, desc, key)
            if spec.headings:
                for query, doc in heading_pairs(page):
                    self.add_pair(source, f"{short}-heading", query, doc, key)
            if self.limit and len(pages) >= self.limit:
                break
        self.pages[source] = pages
        self.report[source]["files_read"] = files

    # ------------------------------------------------------------------ eval split
    def _eval_size(self, wanted: int, available: int) -> int:
        return min(wanted, max(1, available // 5)) if available else 0   # never hold out over 20%

    def split_debian(self) -> list[_Pair]:
        pairs = self.pairs.get("debian", [])
        if not pairs or self.args.eval_debian <= 0:
            return []
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            while parent.setdefault(x, x) != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x
        for p in pairs:   # a package and its long description are one unit; sharing either joins units
            a, b = find("p:" + p.key), find("d:" + _norm_key(p.doc))
            if a != b:
                parent[a] = b
        groups: dict[str, list[_Pair]] = defaultdict(list)
        for p in pairs:
            groups[find("p:" + p.key)].append(p)
        ranked = sorted(groups.values(), key=lambda g: _seeded_rank(self.seed, "debian:" + min(p.key for p in g)))
        distinct_docs = {_norm_key(p.doc): p.doc for p in pairs}
        n_docs = len(distinct_docs)
        paragraph_count = Counter(_norm_key(para) for doc in distinct_docs.values() for para in doc.split("\n"))
        want = self._eval_size(self.args.eval_debian, n_docs)
        held_keys: set = set()
        chosen: list[_Pair] = []
        for group in ranked:
            if len(chosen) >= want:
                break
            packages = {p.key for p in group}
            if len(packages) > 5:          # boilerplate shared by many packages makes a poor eval item
                continue
            if any(paragraph_count[_norm_key(p.doc)] > 1 for p in group):
                continue                   # the whole doc is a family's shared intro paragraph
            held_keys |= packages
            docs_seen = set()
            for p in sorted(group, key=lambda p: p.key):
                k = _norm_key(p.doc)
                if k not in docs_seen and len(p.doc) >= EVAL_DOC_MIN_CHARS:
                    docs_seen.add(k)
                    chosen.append(p)
        self.pairs["debian"] = [p for p in pairs if p.key not in held_keys]
        return chosen

    def split_pyapi(self) -> list[_Pair]:
        pairs = self.pairs.get("python-api", [])
        if not pairs or self.args.eval_pyapi <= 0:
            return []
        by_page: dict[str, list[_Pair]] = defaultdict(list)
        for p in pairs:
            if p.key.startswith("python-doc/library/"):
                by_page[p.key].append(p)
        want = self._eval_size(self.args.eval_pyapi, len(pairs))
        chosen: list[_Pair] = []
        docs_seen: set = set()
        for page in sorted(by_page, key=lambda k: _seeded_rank(self.seed, "pyapi:" + k)):
            if len(chosen) >= want:
                break
            self.heldout_pages.add(page)
            self.heldout_modules.add(PurePosixPath(page).stem)
            for p in by_page[page]:
                k = _norm_key(p.doc)
                if len(p.doc) >= EVAL_DOC_MIN_CHARS and k not in docs_seen and "." in p.query:
                    docs_seen.add(k)
                    chosen.append(p)
        for name in list(self.pairs):   # everything from a held-out page stays out of training
            if name.startswith("python-"):
                self.pairs[name] = [p for p in self.pairs[name] if p.key not in self.heldout_pages]
        if "stdlib-docstring" in self.pairs:
            self.pairs["stdlib-docstring"] = [
                p for p in self.pairs["stdlib-docstring"]
                if not any(p.key == m or p.key.startswith(m + ".") for m in self.heldout_modules)]
        return chosen

    def split_simple(self, source: str, wanted: int) -> list[_Pair]:
        pairs = self.pairs.get(source, [])
        if not pairs or wanted <= 0:
            return []
        want = self._eval_size(wanted, len(pairs))
        by_key: dict[str, list[_Pair]] = defaultdict(list)
        for p in pairs:
            by_key[p.key].append(p)
        chosen, held, docs_seen = [], set(), set()
        for key in sorted(by_key, key=lambda k: _seeded_rank(self.seed, f"{source}:{k}")):
            if len(chosen) >= want:
                break
            group = [p for p in by_key[key] if len(p.doc) >= EVAL_DOC_MIN_CHARS]
            if not group:
                continue
            held.add(key)
            for p in group:
                k = _norm_key(p.doc)
                if k not in docs_seen:
                    docs_seen.add(k)
                    chosen.append(p)
        self.pairs[source] = [p for p in pairs if p.key not in held]
        return chosen

    # ------------------------------------------------------------------ passages
    def passages(self, leak: _LeakIndex, seen_paragraphs: set) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)

        def fresh(paragraph: str) -> bool:
            key = _norm_key(paragraph)
            if key in seen_paragraphs:
                return False
            seen_paragraphs.add(key)
            return True

        def emit(source: str, paragraphs: list[str], min_chars: int) -> None:
            for text in split_passages(paragraphs, min_chars=min_chars):
                if not leak.leaks(text):
                    out[source].append(text)

        for source, pages in self.pages.items():
            spec = DOCSETS[source][1]
            for page in pages:
                if f"{source}/{page.path}" in self.heldout_pages:
                    continue
                section: list[str] = []
                for kind, text in page.blocks:
                    if kind.startswith("h"):
                        emit(source, section, spec.passage_min)
                        section = []
                    elif kind in ("p", "api") and len(text) >= 30 and _is_prose(text) and fresh(text):
                        section.append(text)
                emit(source, section, spec.passage_min)
                if self.limit and len(out[source]) >= self.limit:
                    break
        if self.fortunes:
            for quote in self.fortunes:
                if len(quote) >= 60 and fresh(quote):
                    emit("fortunes", [quote], 60)
        for pair_source, pairs in self.pairs.items():
            if self.pair_origin.get(pair_source) in DOCSETS:
                continue              # their text is already in the doc set's own passages
            for p in pairs:
                paragraphs = [para for para in p.doc.split("\n") if fresh(para)]
                if paragraphs:
                    emit(pair_source, ["\n".join(paragraphs)] if len(paragraphs) > 1 else paragraphs,
                         PASSAGE_MIN)
        return out

    # ------------------------------------------------------------------ run
    def run(self) -> dict:
        t0 = time.time()
        wanted = self.args.sources or DEFAULT_SOURCES
        for source in ALL_SOURCES:
            if source not in wanted:
                continue
            t = time.time()
            if source == "debian":
                self.source_debian()
            elif source == "wordnet":
                self.source_wordnet()
            elif source in DICTS:
                self.source_dict(source)
            elif source == "stdlib":
                self.source_stdlib()
            else:
                self.source_docset(source)
            if source in self.report:
                self.report[source]["seconds"] = round(time.time() - t, 1)
            _log(f"{source}: {time.time() - t:.1f}s")
        for name in list(self.pairs):
            self.pairs[name] = self._dedup(self.pairs[name])
            if self.limit:
                self.pairs[name] = self.pairs[name][: self.limit]

        t = time.time()
        eval_sets = {"debian": self.split_debian(), "pyapi": self.split_pyapi(),
                     "foldoc": self.split_simple("foldoc", self.args.eval_foldoc)}
        eval_sets = {k: v for k, v in eval_sets.items() if v}
        leak = _LeakIndex([p.doc for pairs in eval_sets.values() for p in pairs],
                          background=[p.doc for pairs in self.pairs.values() for p in pairs])
        dropped: Counter = Counter()
        for name in list(self.pairs):
            kept = []
            for p in self.pairs[name]:
                if leak.leaks(p.doc):
                    dropped[name] += 1
                else:
                    kept.append(p)
            self.pairs[name] = kept
        _log(f"eval split + pair leak filter: {time.time() - t:.1f}s; dropped {dict(dropped)}")

        t = time.time()
        passages = self.passages(leak, set())
        _log(f"passages: {time.time() - t:.1f}s")
        pair_lines = [json.dumps({"query": p.query, "doc": p.doc, "source": p.source}, ensure_ascii=False)
                      for name in self.pairs for p in self.pairs[name]]
        pair_bytes = sum(len(l.encode("utf-8")) + 1 for l in pair_lines)
        selected = self.cap_passages(passages, max(0, self.args.max_bytes - pair_bytes))

        out = Path(self.args.out)
        (out / "eval").mkdir(parents=True, exist_ok=True)
        for old in (out / "eval").glob("*.jsonl"):
            old.unlink()
        _write_lines(out / "pairs.jsonl", pair_lines)
        _write_lines(out / "passages.jsonl", [json.dumps({"text": t, "source": s}, ensure_ascii=False)
                                              for s, texts in selected.items() for t in texts])
        for name, pairs in eval_sets.items():
            _write_lines(out / "eval" / f"{name}.jsonl",
                         [json.dumps({"query": p.query, "doc": p.doc, "source": p.source}, ensure_ascii=False)
                          for p in pairs])
        manifest = self.manifest(passages, selected, eval_sets, dropped, time.time() - t0)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        return manifest

    @staticmethod
    def _dedup(pairs: list[_Pair]) -> list[_Pair]:
        seen, out = set(), []
        for p in pairs:
            key = (_norm_key(p.query), _norm_key(p.doc))
            if key not in seen:
                seen.add(key)
                out.append(p)
        return out

    def cap_passages(self, passages: dict[str, list[str]], budget_bytes: int) -> dict[str, list[str]]:
        """Keep at most --max-passages passages within the byte budget, evenly across sources (seeded)."""
        sizes = {s: [len(json.dumps({"text": t, "source": s}, ensure_ascii=False).encode("utf-8")) + 1
                     for t in texts] for s, texts in passages.items()}
        order = {s: sorted(range(len(texts)), key=lambda i: _seeded_rank(self.seed, f"passage:{s}:{i}"))
                 for s, texts in passages.items()}
        cap = min(self.args.max_passages, sum(len(t) for t in passages.values()))
        while True:
            quota = _water_fill({s: len(t) for s, t in passages.items()}, cap)
            chosen = {s: sorted(order[s][: quota[s]]) for s in passages}
            used = sum(sizes[s][i] for s in chosen for i in chosen[s])
            if used <= budget_bytes or cap == 0:
                return {s: [passages[s][i] for i in chosen[s]] for s in passages if chosen[s]}
            cap = int(cap * budget_bytes / used * 0.99)

    def manifest(self, passages, selected, eval_sets, dropped, seconds) -> dict:
        sources = {}
        for source, info in self.report.items():
            entry = dict(info)
            entry["pairs"] = {name: len(pairs) for name, pairs in self.pairs.items()
                              if self.pair_origin.get(name) == source}
            entry["pair_chars"] = sum(len(p.query) + len(p.doc) for name, pairs in self.pairs.items()
                                      if self.pair_origin.get(name) == source for p in pairs)
            names = [source] + list(entry["pairs"])
            entry["passages_before_cap"] = sum(len(passages.get(n, [])) for n in names)
            entry["passages"] = sum(len(selected.get(n, [])) for n in names)
            entry["passage_chars"] = sum(len(t) for n in names for t in selected.get(n, []))
            entry["pairs_dropped_as_eval_leak"] = sum(dropped.get(n, 0) for n in entry["pairs"])
            sources[source] = entry
        pairs_total = sum(len(v) for v in self.pairs.values())
        return {
            "format": "evermind-corpus 1",
            "seed": self.seed,
            "toy": bool(self.args.toy),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.args).items()},
            "sources": sources,
            "pairs_by_source": {name: len(pairs) for name, pairs in self.pairs.items()},
            "passages_by_source": {name: len(texts) for name, texts in selected.items()},
            "eval": {name: {"pairs": len(pairs), "file": f"eval/{name}.jsonl"} for name, pairs in eval_sets.items()},
            "heldout_python_pages": sorted(self.heldout_pages),
            "totals": {
                "pairs": pairs_total,
                "pair_chars": sum(len(p.query) + len(p.doc) for v in self.pairs.values() for p in v),
                "passages": sum(len(v) for v in selected.values()),
                "passages_before_cap": sum(len(v) for v in passages.values()),
                "passage_chars": sum(len(t) for v in selected.values() for t in v),
                "eval_pairs": sum(len(v) for v in eval_sets.values()),
                "seconds": round(seconds, 1),
            },
            "skipped_sources": sorted(s for s, e in self.report.items() if e.get("status") != "ok"),
        }


def _water_fill(counts: dict[str, int], total: int) -> dict[str, int]:
    """Split `total` across sources as evenly as possible, no source getting more than it has."""
    quota = {s: 0 for s in counts}
    left = [s for s in counts if counts[s] > 0]
    remaining = total
    while left and remaining > 0:
        share = max(1, remaining // len(left))
        nxt = []
        for s in sorted(left, key=lambda s: counts[s]):
            give = min(share, counts[s] - quota[s], remaining)
            quota[s] += give
            remaining -= give
            if quota[s] < counts[s]:
                nxt.append(s)
        if len(nxt) == len(left) and share == 1 and remaining <= 0:
            break
        left = nxt
    return quota


def _write_lines(path: Path, lines: list[str]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
    os.replace(tmp, path)


# -------------------------------------------------------------------------------------------- toy


def write_toy_inputs(root: Path) -> Path:
    """Write a tiny --inputs tree (every source, a few entries each) for CI runs with no network.

    Args:
        root: directory to fill (created).
    Returns:
        root.
    """
    root = Path(root)

    def put(rel: str, text: str | bytes) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))

    records = []
    topics = ["audio", "image", "network", "database", "editor", "compiler", "game", "font", "shell", "mail"]
    for i in range(40):
        t = topics[i % len(topics)]
        records.append(f"Package: toy-{t}-{i}\nDescription-md5: {i:032x}\n"
                       f"Description-en: {t} tool number {i}\n"
                       f" This {t} program number {i} helps people work with {t} files quickly.\n"
                       f" It has a command line interface and variant {i * 7} of the engine.\n .\n"
                       f" This package contains the {t} utilities for item {i}.\n")
    put("translations/Translation-en", "\n".join(records))
    wn = "  1 This software and database is being provided to you, the LICENSEE\n"
    for i in range(30):
        wn += (f"{i:08d} 03 n 02 thing_{i} 0 object_{i}(a) 0 000 | a made object number {i} with a "
               f"purpose of kind {i % 4}; \"the thing {i} was here\"  \n")
    put("pkgs/wordnet-base/usr/share/wordnet/data.noun", wn)
    put("pkgs/wordnet-base/usr/share/doc/wordnet-base/copyright",
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
        "Files: *\nCopyright: Princeton\nLicense: WordNet3.0\n")
    for name in ("foldoc", "jargon"):
        body, index = b"", []
        for i in range(30):
            entry = (f"{name} term {i}\n\n   <programming> A {name} concept number {i} used by "
                     f"{{hackers}} to describe program behaviour of class {i % 5}.\n\n   (2001-01-01)\n\n")
            data = entry.encode("utf-8")
            index.append(f"{name} term {i}\t{_b64_encode(len(body))}\t{_b64_encode(len(data))}")
            body += data
        put(f"pkgs/dict-{name}/usr/share/dictd/{name}.index", "\n".join(index) + "\n")
        put(f"pkgs/dict-{name}/usr/share/dictd/{name}.dict.dz", gzip.compress(body))
    for page, mod in (("json", "json"), ("textwrap", "textwrap"), ("csv", "csv"), ("glob", "glob")):
        dls = "".join(
            f'<dl class="py function"><dt class="sig" id="{mod}.f{i}">{mod}.f{i}(x)'
            f'<a class="headerlink" href="#">\u00b6</a></dt><dd><p>Return the {mod} value number {i} for '
            f'<em>x</em>, computed by the {mod} helper of kind {i}.</p></dd></dl>'
            for i in range(6))
        put(f"pkgs/python3.11-doc/usr/share/doc/python3.11/html/library/{page}.html",
            f'<html><head><title>{mod} \u2014 Python docs</title></head><body>'
            f'<div class="related" role="navigation"><a href="index.html">index</a> navigation bar</div>'
            f'<div class="body" role="main"><section><h1>{mod} \u2014 the {mod} module</h1>'
            f'<p>The {mod} module provides functions for working with {mod} data in ordinary programs. '
            f'It is part of the standard library and needs no installation at all.</p>'
            f'<h2>Basic usage of {mod}</h2><p>Call the functions below with your own {mod} data and '
            f'read the results; every function returns a new object and leaves its input alone.</p>'
            f'{dls}</section></div>'
            f'<div class="sphinxsidebar" role="navigation"><p>Sidebar text must not appear.</p></div>'
            f'</body></html>')
    put("pkgs/python3.11-doc/usr/share/doc/python3.11/html/genindex.html",
        "<html><body><p>Index page text must not appear anywhere in the corpus output.</p></body></html>")
    put("pkgs/postgresql-doc-15/usr/share/doc/postgresql-doc-15/html/indexes-types.html",
        '<html><body><div class="navheader">Prev Next navigation</div><div class="sect1">'
        '<h2 class="title">11.2. Index Types</h2><p>PostgreSQL provides several index types: B-tree, '
        'Hash, GiST, SP-GiST, GIN and BRIN. Each index type uses a different algorithm that is best '
        'suited to different types of indexable clauses.</p></div></body></html>')
    put("pkgs/postgresql-doc-15/usr/share/doc/postgresql-doc-15/html/sql-select.html",
        "<html><body><h2>SELECT</h2><p>Reserved reference page text must never be read by the builder.</p>"
        "</body></html>")
    put("pkgs/vim-runtime/usr/share/vim/vim90/doc/usr_05.txt",
        "*usr_05.txt*\tFor Vim version 9.0.\n\n"
        "==============================================================================\n"
        "*05.1*\tThe vimrc file\t\t\t\t\t*vimrc-intro*\n\n"
        "You probably got tired of typing commands that you use very often.  To start\n"
        "Vim with all your favorite option settings and mappings, you write them in\n"
        "what is called the |vimrc| file.  Vim executes the commands in this file when it\n"
        "starts up.  You can edit it this way: >\n\n\t:edit $MYVIMRC\n<\n"
        "The vimrc file can contain all the commands that you type after a colon, and\n"
        "the simplest of them set options to the values you like best every day.\n")
    put("pkgs/fortunes/usr/share/games/fortunes/computers",
        "A computer lets you make more mistakes faster than any invention in human history, "
        "with the possible exceptions of handguns and tequila.\n%\n"
        "Programming is like sex: one mistake and you have to support it for the rest of your life.\n%\n")
    put("pkgs/fortunes/usr/share/games/fortunes/computers.dat", b"\x00\x01binary")
    return root


def _b64_encode(value: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out = alphabet[value % 64]
    value //= 64
    while value:
        out = alphabet[value % 64] + out
        value //= 64
    return out


# --------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="corpus", help="output directory (default ./corpus)")
    ap.add_argument("--work-dir", default="/work/corpus_work", help="downloads and unpacked packages")
    ap.add_argument("--seed", type=int, default=0, help="seed of the eval split and passage sampling")
    ap.add_argument("--max-per-source", type=int, default=0, help="cap pairs and passages per source (0: none)")
    ap.add_argument("--sources", default="", help=f"comma-separated subset of: {','.join(DEFAULT_SOURCES)}; "
                    f"'broad' adds the {len(BROAD_DOCSETS)} broad documentation sets (broad-<name>; default: all "
                    "but those)")
    ap.add_argument("--toy", action="store_true", help="tiny CI run: bundled inputs unless --inputs is given")
    ap.add_argument("--inputs", default="", help="read pkgs/<package>/ and translations/ from here, no download")
    ap.add_argument("--eval-debian", type=int, default=2000, help="held-out Debian pairs")
    ap.add_argument("--eval-pyapi", type=int, default=1000, help="held-out Python API pairs")
    ap.add_argument("--eval-foldoc", type=int, default=1000, help="held-out FOLDOC pairs")
    ap.add_argument("--max-passages", type=int, default=400_000, help="passage cap")
    ap.add_argument("--max-bytes", type=int, default=150_000_000, help="pairs.jsonl + passages.jsonl budget")
    ap.add_argument("--doc-max-chars", type=int, default=DOC_MAX_CHARS, help="clip pair docs to this length")
    return ap


def build_corpus(argv: list[str] | None = None) -> dict:
    """Build the corpus as the CLI would.

    Args:
        argv: command-line arguments (see --help); None reads sys.argv.
    Returns:
        The manifest written to <out>/manifest.json.
    Raises:
        ValueError: an unknown name in --sources.
    """
    args = _parser().parse_args(argv)
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    sources = [name for s in sources for name in (BROAD_DOCSETS if s == "broad" else [s])]
    unknown = [s for s in sources if s not in ALL_SOURCES]
    if unknown:
        raise ValueError(f"--sources: unknown {unknown}; expected names from {ALL_SOURCES}")
    args.sources = sources
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
    if args.toy and not args.inputs:
        with tempfile.TemporaryDirectory() as tmp:
            args.inputs = str(write_toy_inputs(Path(tmp) / "inputs"))
            manifest = _Builder(args).run()
            manifest["args"]["inputs"] = "(bundled toy inputs)"
            (Path(args.out) / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
            return manifest
    return _Builder(args).run()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: build the corpus and print the totals."""
    manifest = build_corpus(argv)
    print(json.dumps({"pairs_by_source": manifest["pairs_by_source"],
                      "passages_by_source": manifest["passages_by_source"],
                      "eval": manifest["eval"], "totals": manifest["totals"],
                      "skipped_sources": manifest["skipped_sources"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
