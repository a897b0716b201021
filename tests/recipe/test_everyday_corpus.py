"""recipe/everyday_corpus.py on a two-synset WordNet fixture: examples, relations and the corpus layout."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "recipe" / "everyday_corpus.py"
spec = importlib.util.spec_from_file_location("everyday_corpus", SCRIPT)
ec = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ec)

NOUN = ("  1 This software and database is being provided to you, the LICENSEE\n"
        "07929519 13 n 02 coffee 0 java 0 001 ~ 07929837 n 0000 | a beverage consisting of an infusion of ground "
        'coffee beans; "he ordered a cup of coffee"  \n'
        "07929837 13 n 01 espresso 0 001 @ 07929519 n 0000 | strong black coffee brewed by forcing hot water "
        'under pressure through finely ground coffee beans; "a quick espresso"; '
        '"she drinks a double espresso every morning"  \n')


def test_parse_synsets_reads_examples_and_relation_targets_only():
    synsets = ec.parse_synsets(NOUN, "noun")
    espresso = synsets[("07929837", "n")]
    assert espresso["words"] == ["espresso"]
    assert espresso["definition"].startswith("strong black coffee brewed")
    # the three-word example is too short to be a sentence; the hyponym pointer (~) of coffee is not a relation
    assert espresso["examples"] == ["she drinks a double espresso every morning"]
    assert espresso["targets"] == [("07929519", "n")]
    assert synsets[("07929519", "n")]["targets"] == []


def test_cli_writes_pairs_and_passages_with_the_everyday_prefix(tmp_path):
    wn = tmp_path / "wordnet"
    wn.mkdir()
    for pos in ("noun", "verb", "adj", "adv"):
        (wn / f"data.{pos}").write_text(NOUN if pos == "noun" else "  1 header\n", encoding="utf-8")
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(SCRIPT), "--wordnet", str(wn), "--out", str(out)], check=True,
                   capture_output=True)
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    passages = [json.loads(line) for line in (out / "passages.jsonl").read_text().splitlines()]
    assert {"query": "she drinks a double espresso every morning",
            "doc": ec.parse_synsets(NOUN, "noun")[("07929837", "n")]["definition"],
            "source": "everyday-example"} in pairs
    relation = [p for p in pairs if p["source"] == "everyday-relation"]
    assert relation == [{"query": "espresso",
                         "doc": "coffee, java: a beverage consisting of an infusion of ground coffee beans",
                         "source": "everyday-relation"}]
    assert all(p["source"].startswith("everyday-") for p in pairs + passages)
    assert {"text": "he ordered a cup of coffee", "source": "everyday-example"} in passages
