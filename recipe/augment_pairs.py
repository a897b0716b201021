"""More query shapes from the training corpus itself (train_embedder.py --augment).

The left-out dev sources ask four kinds of query: a name, a bare section title, a summary sentence and a
question. The corpus pairs are mostly names (Debian, WordNet, FOLDOC, API names) and "page: heading" titles, so
the model rarely sees the other shapes. This adds, from training rows only (never a dev or eval text: the
corpus was packed without them):

- aug-title: a heading pair's query without its "page title: " prefix ("Binding: Listen" -> "Listen");
- aug-summary: a doc or passage's first sentence -> the rest of it (both sides long enough to mean something);
- aug-question: "what is X?" for FOLDOC/Jargon terms, "what does X mean?" for WordNet words, "what does X do?"
  for API names: fixed templates of our own. The dev set's questions ("how do I / how would I ...", made from
  gerund headings) were seen before these were written; these are deliberately other forms, so a gain on the
  dev questions is not a template match.

Capped per kind and sampled with the seed, so the sampler's sqrt weighting gives each a modest share.
"""

from __future__ import annotations

import random
import re

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'`])")
CAPS = {"aug-title": 40_000, "aug-summary": 60_000, "aug-question": 30_000}


def first_sentence(text: str) -> tuple[str, str]:
    """(first sentence, the rest) of a text, split at the first sentence end followed by a capital."""
    flat = " ".join(text.split())
    m = _SENTENCE_END.search(flat)
    if m is None:
        return flat, ""
    return flat[: m.start()].strip(), flat[m.end():].strip()


def _question(query: str, source: str) -> str | None:
    term = query.strip()
    if not term or len(term) > 60:
        return None
    if source in ("foldoc", "jargon"):
        return f"what is {term}?"
    if source == "wordnet":
        return f"what does {term} mean?"
    if source.endswith("-api"):
        return f"what does {term} do?"
    return None


def augment(pairs: list[dict], passages: list[dict], seed: int = 0) -> list[dict]:
    """New {"query", "doc", "source"} rows built from the given training rows (see the module docstring)."""
    rng = random.Random(seed)
    made: dict[str, list[dict]] = {kind: [] for kind in CAPS}
    for p in pairs:
        if p["source"].endswith("-heading") and ": " in p["query"]:
            bare = p["query"].split(": ", 1)[1].strip()
            if len(bare) >= 3:
                made["aug-title"].append({"query": bare, "doc": p["doc"], "source": "aug-title"})
        q = _question(p["query"], p["source"])
        if q is not None:
            made["aug-question"].append({"query": q, "doc": p["doc"], "source": "aug-question"})
    seen = set()
    bodies = [p["doc"] for p in pairs if p["source"] != "wordnet"] + [
        p["text"] for p in passages if p["source"] not in ("fortunes",)]
    for text in bodies:
        if text in seen:
            continue
        seen.add(text)
        first, rest = first_sentence(text)
        if 30 <= len(first) <= 250 and len(rest) >= 80:
            made["aug-summary"].append({"query": first, "doc": rest, "source": "aug-summary"})
    out = []
    for kind, rows in made.items():
        rng.shuffle(rows)
        out += rows[: CAPS[kind]]
    return out
