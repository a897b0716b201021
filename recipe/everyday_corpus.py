"""Everyday-language pairs and passages from WordNet 3.0 (Debian `wordnet-base`), for `pack_corpus.py --add-corpus`.

    python recipe/everyday_corpus.py --wordnet /work/corpus_work/x/wordnet-base/usr/share/wordnet \
        --out /work/corpus_everyday

The shipped corpus reads WordNet as "words <-> definition" only and drops the 48k example sentences. Those are
the everyday sentences the paraphrase probe asks about ("she drinks her coffee black"), so this adds:

- `everyday-example` pairs: an example sentence <-> the definition of the sense it uses (the sentence names
  the thing, the definition describes it in other words: "Bob starts every day with a double espresso" is
  the kind of match this teaches);
- `everyday-relation` pairs: a synset's words <-> its hypernym's, instance hypernym's or part holonym's words
  and definition ("Lisbon" <-> "Portugal, Portuguese Republic: a republic in southwestern Europe ...");
- `everyday-example` passages: each example sentence, and each definition with its examples, for distillation.

Every row's source starts with `everyday-`. Written as <out>/pairs.jsonl and <out>/passages.jsonl (the
corpus layout) and <out>/manifest.json (package, licence, counts). Seeded; no network.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections import Counter
from pathlib import Path

POS_FILES = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}
RELATIONS = {"@": "hypernym", "@i": "instance hypernym", "#p": "part holonym"}
_MARKER = re.compile(r"\([a-z]+\)$")  # adjective position markers such as "(p)"
_EXAMPLE = re.compile(r'"([^"]+)"')


def parse_synsets(text: str, pos_file: str) -> dict[tuple[str, str], dict]:
    """Synsets of one `data.<pos>` file: (offset, pos) -> words, definition, examples, relation targets."""
    out = {}
    for line in text.split("\n"):
        if not line or line.startswith("  ") or " | " not in line:
            continue
        data, gloss = line.split(" | ", 1)
        fields = data.split()
        try:
            count = int(fields[3], 16)
            n_ptr = int(fields[4 + 2 * count])
        except (IndexError, ValueError):
            continue
        words: list[str] = []
        for raw in fields[4:4 + 2 * count:2]:
            word = _MARKER.sub("", raw).replace("_", " ")
            if word not in words:
                words.append(word)
        ptrs = []
        base = 5 + 2 * count
        for i in range(n_ptr):
            sym, off, pos = fields[base + 4 * i: base + 4 * i + 3]
            if sym in RELATIONS:
                ptrs.append((off, "a" if pos == "s" else pos))
        definition, _, rest = gloss.partition('; "')
        examples = _EXAMPLE.findall('"' + rest) if rest else []
        definition = definition.strip().rstrip(";").strip()
        pos = "a" if fields[2] == "s" else fields[2]
        if words and definition:
            out[(fields[0], pos)] = {"words": words, "definition": definition,
                                     "examples": [e.strip() for e in examples if len(e.split()) >= 4],
                                     "targets": ptrs}
    return out


def _rank(seed: int, key: str) -> str:
    return hashlib.sha1(f"{seed}:{key}".encode()).hexdigest()


def build(wordnet: Path, seed: int = 0, max_relations: int = 40000) -> tuple[list[dict], list[dict], Counter]:
    synsets: dict[tuple[str, str], dict] = {}
    for name, _ in POS_FILES.items():
        path = wordnet / f"data.{name}"
        synsets.update(parse_synsets(path.read_text(encoding="utf-8", errors="replace"), name))
    pairs, passages, counts = [], [], Counter()
    for s in synsets.values():
        for ex in s["examples"]:
            pairs.append({"query": ex, "doc": s["definition"], "source": "everyday-example"})
            passages.append({"text": ex, "source": "everyday-example"})
        if s["examples"]:
            passages.append({"text": s["definition"] + "; " + "; ".join(s["examples"]), "source": "everyday-example"})
    relations = []
    for s in synsets.values():
        for target in s["targets"]:
            t = synsets.get(target)
            if t is not None:
                relations.append({"query": ", ".join(s["words"][:3]),
                                  "doc": ", ".join(t["words"][:3]) + ": " + t["definition"],
                                  "source": "everyday-relation"})
    relations.sort(key=lambda r: _rank(seed, r["query"] + "\t" + r["doc"]))
    pairs.extend(relations[:max_relations])
    counts["synsets"] = len(synsets)
    counts["relations available"] = len(relations)
    counts.update(Counter("pairs " + p["source"] for p in pairs))
    counts.update(Counter("passages " + p["source"] for p in passages))
    return pairs, passages, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wordnet", type=Path, required=True, help="the unpacked usr/share/wordnet of wordnet-base")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-relations", type=int, default=40000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    pairs, passages, counts = build(args.wordnet, args.seed, args.max_relations)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("pairs.jsonl", pairs), ("passages.jsonl", passages)):
        with open(args.out / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    manifest = {"package": "wordnet-base", "license": "WordNet3.0", "counts": dict(counts)}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(json.dumps(manifest["counts"], indent=1))


if __name__ == "__main__":
    main()
