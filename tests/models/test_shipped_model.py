"""The shipped default model: its files, its identity, its golden vectors and its recall sanity."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from evermind_memory import MemoryStore, default_embedder
from evermind_memory.lm.lexicon import Lexicon
from evermind_memory.lm.model import load_model
from evermind_memory.embedder import LMEmbedder, card, load_embedder

DATA = Path(__file__).resolve().parents[1] / "data"


def test_shipped_files_load_pass_their_crc_and_fit_the_size_budget():
    meta = card()
    root = resources.files("evermind_memory.models")
    sizes = {name: root.joinpath(meta[name]).stat().st_size if hasattr(root.joinpath(meta[name]), "stat")
             else len(root.joinpath(meta[name]).read_bytes())
             for name in ("model_file", "tokenizer_file", "lexicon_file")}
    assert sum(sizes.values()) <= 36 * 2**20, sizes
    with resources.as_file(root.joinpath(meta["model_file"])) as path:
        config, params = load_model(path)  # validates magic, header, shapes and the CRC trailer
    assert config.to_dict() == meta["config"]
    assert all(np.isfinite(p).all() for p in params.values())
    with resources.as_file(root.joinpath(meta["lexicon_file"])) as path:
        lexicon = Lexicon.load(path)  # validates magic, header, shapes, words and the CRC trailer
    emb = default_embedder()
    assert emb.dimensions == config.d_model + lexicon.dims == meta["dimensions"]
    assert emb.hybrid_weight == pytest.approx(meta["hybrid_weight"])


def test_the_cards_fingerprint_is_the_loaded_models():
    meta = card()
    root = resources.files("evermind_memory.models")
    with resources.as_file(root.joinpath(meta["model_file"])) as model_path, \
            resources.as_file(root.joinpath(meta["tokenizer_file"])) as tok_path, \
            resources.as_file(root.joinpath(meta["lexicon_file"])) as lex_path:
        loaded = load_embedder(model_path, tok_path, max_tokens=meta["max_tokens"],
                               max_chunks=meta.get("max_chunks", 1),
                               first_chunk_weight=meta.get("first_chunk_weight", 1.0), lexicon=lex_path,
                               lexicon_weight=meta["lexicon_weight"])
    assert loaded.fingerprint == meta["fingerprint"]
    assert loaded.dimensions == meta["dimensions"]


def test_default_embedder_reads_the_weights_only_at_the_first_embed_in_a_fresh_process():
    code = ("from evermind_memory import default_embedder; e = default_embedder(); "
            "print(e.fingerprint, e.dimensions, e.loaded); v = e.embed('tea'); "
            "print(e.load().fingerprint, v.shape[0], e.loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    announced, dim, before = out[0].split()
    loaded, got_dim, after = out[1].split()
    assert (before, after) == ("False", "True")
    assert announced == loaded == card()["fingerprint"] == default_embedder().fingerprint
    assert int(dim) == int(got_dim) == card()["dimensions"]
    assert announced.startswith("evermind-lm/")


def test_numpy_model_reproduces_the_training_mirror_golden_vectors():
    golden = json.loads((DATA / "golden_embeddings.json").read_text(encoding="utf-8"))
    emb = default_embedder()
    # the golden vectors are the model's on texts truncated at golden["max_tokens"]: they name the truncating
    # embedder of these weights (the shipped one may read long texts in several windows, another fingerprint)
    truncating = LMEmbedder(emb.model, emb.tokenizer, max_tokens=golden["max_tokens"])
    assert golden["fingerprint"] == truncating.fingerprint, "tests/data/golden_embeddings.json is for another model"
    ids = [emb.tokenizer.encode(t)[: golden["max_tokens"]] for t in golden["texts"]]
    ours = emb.model.embed_batch(ids)
    np.testing.assert_allclose(ours, np.array(golden["vectors"], dtype=np.float32), rtol=0, atol=1e-5)


def test_a_paraphrase_ranks_above_unrelated_facts(tmp_path):
    facts = [
        "Ada prefers green tea in the morning.",
        "The server restarts every night at two o'clock.",
        "Bob is allergic to peanuts.",
        "The quarterly report is due at the end of March.",
        "Our flight to Lisbon leaves on Friday morning.",
        "The printer on the second floor is out of paper.",
    ]
    probes = {
        "What does Ada like to drink?": 0,
        "When does the machine reboot?": 1,
        "Which foods must Bob avoid?": 2,
        "deadline for the financial summary": 3,
        "travel plans to Portugal": 4,
    }
    with MemoryStore(tmp_path / "m.db") as store:  # no embedder: the shipped model
        ids = store.remember_many(facts)
        ranks = {}
        for mode in ("vector", "hybrid"):
            for query, want in probes.items():
                hit_ids = [h.id for h in store.recall(query, k=len(facts), mode=mode)]
                ranks[mode, query] = hit_ids.index(ids[want]) + 1
    # Most probes share no content word with their fact ("machine reboot" vs "server restarts"), so this
    # is semantic, not lexical. Chance would put the fact at rank 3.5 of 6. Floors measured on the shipped
    # model (vector: 4 of 5 first, "Which foods must Bob avoid?" puts the peanut allergy 4th, its cosine
    # 0.07 against 0.12 for the best; hybrid: 5 of 5 first), kept as a regression check. The previous model
    # had vector 3 of 5 first, all in the top 2, and hybrid 4 of 5.
    vector = [r for (mode, _), r in ranks.items() if mode == "vector"]
    hybrid = [r for (mode, _), r in ranks.items() if mode == "hybrid"]
    assert max(vector) <= 4 and vector.count(1) >= 4, ranks
    assert hybrid.count(1) >= 5, ranks


SMALL_STORE = [
    "Ada drinks green tea every morning.",
    "Bob is allergic to peanuts.",
    "Ada's flight to Lisbon leaves Tuesday.",
    "The office wifi password is hunter2.",
    "Bob drinks black coffee.",
    "Chen's cat is called Miso.",
    "The team meeting moved to Thursday at 10.",
    "Dana lives in Oslo.",
]
# docs/recall-quality.md "Relevance": keeps 95% of right top hits (documents), drops ~half of no-match ones
SAFE_MIN_RELEVANCE = 0.1


def test_relevance_puts_a_no_match_query_far_below_real_matches(tmp_path):
    with MemoryStore(tmp_path / "m.db") as store:  # the shipped model and its fitted fusion.json
        ids = store.remember_many(SMALL_STORE)
        nonsense = store.recall("asdfghjkl", k=3, explain=True)
        assert nonsense and all(0.0 <= h.relevance <= 1.0 for h in nonsense)
        worst_noise = max(h.relevance for h in nonsense)
        for query, want in {"what does Ada drink?": 0, "who is allergic to nuts?": 1}.items():
            top = store.recall(query, k=1, explain=True)[0]
            assert top.id == ids[want], query
            # measured: 0.83 and 0.84 against at most 0.07 for the nonsense query (0.29 and 0.34 against 0.009
            # before the relevance model was fitted on thirty more hand-written people in stores of every size)
            assert top.relevance >= SAFE_MIN_RELEVANCE and top.relevance >= 10 * worst_noise, (query, top, nonsense)
            assert top.explain.rule == "learned" and top.explain.lexical > 0 and top.explain.vector > 0
        assert store.recall("asdfghjkl", min_relevance=SAFE_MIN_RELEVANCE) == []
        assert store.recall("what does Ada drink?", min_relevance=SAFE_MIN_RELEVANCE)[0].id == ids[0]


PROBE_HYBRID_FLOOR = 38  # right fact first for 39 of 50 with the shipped model and its lexicon (vector mode 39,
# lexical 8); one question of slack for a tie that another BLAS breaks the other way. 41 while the "s" of a
# possessive counted as a query word: "Igor's car" found "Igor's sedan" and "Kofi's shoe size" "Kofi's trainers"
# by it, the only fact of their person in the possessive; on the personal protocol the same word cost more than it
# won (store/lexical.py STOPWORDS). (37 before the lexicon; 19, 16 and 11 with the models before.)


def test_paraphrase_probe_stays_at_its_floor(tmp_path):
    """tests/data/paraphrase_probe.jsonl: 50 hand-written question/fact pairs sharing little more than a name (four
    facts per name), all 50 facts in one store. Nothing is fitted on it; this keeps the figure from sliding."""
    pairs = [json.loads(line) for line in (DATA / "paraphrase_probe.jsonl").read_text(encoding="utf-8").splitlines()]
    with MemoryStore(tmp_path / "m.db") as store:
        ids = store.remember_many([p["fact"] for p in pairs])
        first = sum(store.recall(p["question"], k=1)[0].id == ids[i] for i, p in enumerate(pairs))
    assert first >= PROBE_HYBRID_FLOOR, first
