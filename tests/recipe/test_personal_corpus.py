"""recipe/personal_corpus.py's WordNet reader: the members of a category, common nouns and proper names."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "recipe" / "personal_corpus.py"
_spec = importlib.util.spec_from_file_location("personal_corpus", SCRIPT)
pc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pc)

# data.noun lines: offset lex_file n word_count (word lex_id)... pointer_count (symbol offset pos source)... | gloss
SYNSETS = [
    ("00000001", ["sport"], [], "an active diversion requiring physical exertion and competition"),
    ("00000002", ["water_polo"], [("@", "00000001")], "a game played in water"),
    ("00000003", ["team_sport"], [("@", "00000001")], "a sport played by teams"),
    ("00000004", ["netball"], [("@", "00000003")], "a game like basketball"),
    ("00000005", ["Olympics"], [("@", "00000001")], "a capitalised kind is not a common noun"),
    ("00000010", ["writer", "author"], [], "writes (books or stories or articles or the like) professionally"),
    ("00000011", ["Dickens", "Charles_Dickens"], [("@i", "00000010")], "English novelist"),
    ("00000012", ["Austen", "Jane_Austen"], [("@i", "00000010")], "English novelist"),
    ("00000013", ["essayist"], [("@", "00000010")], "a writer of essays"),
]


def write_wordnet(root: Path) -> Path:
    lines = ["  1 This is a licence header line that the reader skips"]
    for off, words, ptrs, gloss in SYNSETS:
        w = " ".join(f"{x} 0" for x in words)
        p = " ".join(f"{sym} {target} n 0000" for sym, target in ptrs)
        lines.append(f"{off} 05 n {len(words):02x} {w} {len(ptrs):03d} {p} | {gloss}".replace("  ", " "))
    (root / "data.noun").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_lemmas_are_the_lower_case_members_at_every_depth(tmp_path: Path):
    wn = pc.WordNet(write_wordnet(tmp_path))
    assert wn.lemmas("sport", "active diversion") == ["netball", "team sport", "water polo"]
    assert wn.lemmas("sport", "active diversion", depth=1) == ["team sport", "water polo"]


def test_names_are_the_proper_members_by_their_full_name(tmp_path: Path):
    wn = pc.WordNet(write_wordnet(tmp_path))
    assert wn.names("writer", "writes (books") == ["Charles Dickens", "Jane Austen"]
    assert wn.names("sport", "active diversion") == ["Olympics"]


def test_question_pairs_carry_their_person_and_kind():
    vocab = {key: [f"{key}{i}" for i in range(6)] for key in (
        "name", "job", "dish", "drink", "dog", "instrument", "language", "sport", "allergen", "hobby", "vehicle",
        "petname", "subject", "author", "genre", "team", "relation", "dislike")}
    for key in ("city", "condition", "appointment", "event"):
        vocab[key] = [(f"{key}{i}", f"{key}-b{i}") for i in range(6)]
    pairs, _, _ = pc.build(vocab, people=40, seed=0)
    labelled = [p for p in pairs if "person" in p]
    assert {p["source"] for p in labelled} == {"personal-qa", "personal-chat"}
    assert all(p["kind"] in pc.KINDS for p in labelled)
    assert all("person" in p for p in pairs if p["source"] == "personal-qa")
    assert not any("person" in p for p in pairs if p["source"] == "personal-para")
    # a person's facts of different kinds are different texts: one of them is never the answer to another's question
    by_person: dict[int, dict[str, set[str]]] = {}
    for p in labelled:
        by_person.setdefault(p["person"], {}).setdefault(p["kind"], set()).add(p["doc"])
    assert len(by_person) > 20
    for kinds in by_person.values():
        docs = list(kinds.values())
        assert all(not (a & b) for i, a in enumerate(docs) for b in docs[i + 1:])
