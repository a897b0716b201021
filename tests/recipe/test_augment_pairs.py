"""recipe/augment_pairs.py: the extra query shapes made from training rows, on worked examples."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "recipe" / "augment_pairs.py"
_spec = importlib.util.spec_from_file_location("augment_pairs", SCRIPT)
ap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ap)

BODY = ("The cache must be writable by the user the server runs as. It holds responses keyed by URL, and entries "
        "expire after the configured lifetime unless a later request refreshes them.")
PAIRS = [
    {"query": "Caching Guide: What Can be Cached?", "doc": BODY, "source": "apache-heading"},
    {"query": "json.dumps", "doc": "Serialize obj to a JSON formatted str.", "source": "python-api"},
    {"query": "wheel of reincarnation", "doc": "A well-known effect in computing.", "source": "foldoc"},
    {"query": "tea", "doc": "a beverage made by steeping tea leaves in water", "source": "wordnet"},
    {"query": "7-Zip file archiver", "doc": "Short.", "source": "debian"},
]


def test_first_sentence_splits_at_a_sentence_end_before_a_capital():
    assert ap.first_sentence("Use e.g. this one. Then that.\n  More  here.") == (
        "Use e.g. this one.", "Then that. More here.")
    assert ap.first_sentence("no end here") == ("no end here", "")


def test_augment_makes_each_shape_from_the_rows_it_is_given_and_nothing_else():
    out = ap.augment(PAIRS, [{"text": "Fortune cookie. Says things. " * 5, "source": "fortunes"}], seed=0)
    by_kind = {}
    for row in out:
        by_kind.setdefault(row["source"], []).append((row["query"], row["doc"]))
    assert by_kind["aug-title"] == [("What Can be Cached?", BODY)]
    assert sorted(by_kind["aug-question"]) == [
        ("what does json.dumps do?", "Serialize obj to a JSON formatted str."),
        ("what does tea mean?", "a beverage made by steeping tea leaves in water"),
        ("what is wheel of reincarnation?", "A well-known effect in computing."),
    ]
    first, rest = ap.first_sentence(BODY)
    assert by_kind["aug-summary"] == [(first, rest)]  # the short debian doc and the fortunes passage are skipped
    assert ap.augment(PAIRS, [], seed=0) == out  # seeded
