"""Tiny-scale runs of benchmarks/recall_quality.py and recipe/calibrate_fusion.py, so both code paths stay working.

An untrained tiny EvermindLM and a BPE tokenizer trained on the test's own texts stand in for the shipped
model; lexical recall is exact on the data built here, which makes the metric checks able to fail.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "recipe"))

import calibrate_fusion as cf  # noqa: E402
import recall_quality as rq  # noqa: E402

from evermind_memory.embedder import LMEmbedder  # noqa: E402
from evermind_memory.lm.model import EvermindLM, LMConfig  # noqa: E402
from evermind_memory.lm.tokenizer import BPETokenizer  # noqa: E402

WORDS = "package library tool python module server client file data text image audio network parse read write".split()
# Queries with FTS5 syntax in them: quotes, operators, prefix stars, columns, NEAR, carets, brackets.
NOISE = ['"', " AND ", " OR NOT ", " NEAR(", "*", " col:", "^", " (", ") ", " -", " {x}"]


def _rows(prefix: str, n: int, seed: int) -> list[dict]:
    """Each doc holds a rare word `<prefix>kw<i>` that only its query shares (besides FTS5 noise)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        filler = " ".join(rng.choice(WORDS, size=8))
        noise = NOISE[i % len(NOISE)]
        rows.append({"query": f"{prefix}kw{i}{noise}zzq", "doc": f"{filler} {prefix}kw{i} {filler}.", "source": prefix})
    return rows


@pytest.fixture(scope="module")
def embedder() -> LMEmbedder:
    texts = [r["query"] + " " + r["doc"] for r in _rows("deb", 12, 0) + _rows("py", 12, 1)]
    tok = BPETokenizer.train(texts, 300)
    cfg = LMConfig(vocab_size=len(tok), d_model=16, n_layers=1, conv_kernel=2, hidden_dim=16, n_experts=2, top_k=1)
    return LMEmbedder(EvermindLM(cfg, seed=0), tok, hybrid_weight=0.5)


def test_rank_metrics_by_hand() -> None:
    gold = np.array([0, 1, 2, 3])  # (4,)
    rankings = [[0, 5], [7, 1], [9, 8], []]  # rank 1, rank 2, missed, nothing returned
    m = rq.rank_metrics(rankings, gold)
    assert m["recall@1"] == pytest.approx(0.25)
    assert m["recall@10"] == pytest.approx(0.5)
    assert m["mrr@10"] == pytest.approx((1 + 0.5) / 4)
    assert m["ndcg@10"] == pytest.approx((1 + 1 / np.log2(3)) / 4)


def test_exact_and_rrf_rankings_break_ties_by_doc_id() -> None:
    d = np.array([[1, 0], [1, 0], [0, 1]], dtype=np.float32)  # (3, 2) docs 0 and 1 tie for the query
    q = np.array([[1, 0]], dtype=np.float32)  # (1, 2)
    assert rq.exact_rankings(q, d, 3) == [[0, 1, 2]]
    # doc 4 is first in one list and doc 2 first in the other: equal fused scores, lower id first
    assert rq.rrf_rankings([[4, 3]], [[2, 3]], 3) == [[3, 2, 4]]


def test_eval_limit_is_a_seeded_sample_with_consistent_gold() -> None:
    rows = _rows("deb", 30, 0)
    es = rq.eval_set_from_rows("deb", rows, limit=7, seed=3)
    assert len(es.queries) == 7 and len(es.docs) == 7
    assert es.queries != [r["query"] for r in rows[:7]]  # not the head of the file
    by_query = {r["query"]: r["doc"] for r in rows}
    assert all(es.docs[g] == by_query[q] for q, g in zip(es.queries, es.gold))
    again = rq.eval_set_from_rows("deb", rows, limit=7, seed=3)
    assert again.queries == es.queries and again.docs == es.docs and np.array_equal(again.gold, es.gold)


def test_benchmark_cli_runs_every_store_mode(tmp_path: Path, embedder: LMEmbedder) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "eval").mkdir(parents=True)
    for name, seed in (("debian", 0), ("pyapi", 1)):
        with open(corpus / "eval" / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in _rows(name[:3], 12, seed))
    embedder.model.save(tmp_path / "m.evlm")
    embedder.tokenizer.save(tmp_path / "t.json")
    out = rq.main(["--corpus", str(corpus), "--sources", "debian,pyapi", "--model", str(tmp_path / "m.evlm"),
                   "--tokenizer", str(tmp_path / "t.json"), "--hybrid-weight", "0.25", "--no-minilm",
                   "--speed-docs", "5", "--limit", "10", "--json", str(tmp_path / "r.json")])
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(json.dumps(out))
    assert set(out["sources"]) == {"debian", "pyapi"}
    for res in out["sources"].values():
        assert res["queries"] == 10 and res["hybrid_weight"] == 0.25
        assert set(res["systems"]) == {"vector", "lexical (BM25)", "hybrid", "hybrid rrf", "FTS5 BM25"}
        assert res["systems"]["FTS5 BM25"]["recall@1"] == 1.0
        assert res["systems"]["lexical (BM25)"]["recall@1"] == 1.0  # the rare word finds its doc despite the noise
        assert res["systems"]["hybrid"]["recall@10"] == 1.0  # BM25's first hit is in the fused pool
        for met in res["systems"].values():
            assert all(0.0 <= v <= 1.0 for v in met.values())
        assert res["docs_per_s"]["ours"] > 0
    assert out["mean"]["systems"]["lexical (BM25)"]["ndcg@10"] == 1.0
    assert "hybrid_minus_bm25" in out["targets"]


def _pairs() -> tuple[list[dict], set[str], set[str]]:
    pairs = [{"query": f"pkg{i} short", "doc": f"Package pkg{i} has a long description that says enough.",
              "source": "debian"} for i in range(30)]
    pairs += [{"query": f"mod{i % 4}.fn{i}", "doc": f"Function fn{i} returns the value of the thing it computes.",
               "source": "python-api"} for i in range(30)]
    pairs += [{"query": f"term{i}", "doc": f"In computing, term{i} names a thing that glossaries define at length.",
               "source": "foldoc"} for i in range(20)]
    pairs += [{"query": "PyDict_New", "doc": "A C API function that returns a new empty dictionary.", "source": "python-api"},
              {"query": "dup a", "doc": "A doc that two different pairs share, so training saw it twice.", "source": "debian"},
              {"query": "dup b", "doc": "A doc that two different pairs share, so training saw it twice.", "source": "debian"},
              {"query": "short", "doc": "too short", "source": "debian"},
              {"query": "w", "doc": "A wordnet gloss that is long enough to be a dev doc otherwise.", "source": "wordnet"}]
    exclude = {"pkg3 short"}
    passages = {pairs[4]["doc"]}
    return pairs, exclude, passages


def test_dev_sets_keep_only_eligible_rows() -> None:
    pairs, exclude, passages = _pairs()
    dev = cf.dev_sets(pairs, exclude=exclude, passages=passages, per_source=100, seed=0)
    assert set(dev) == {"debian", "python-api", "foldoc"}
    assert {r["query"] for r in dev["foldoc"]} == {f"term{i}" for i in range(20)}
    deb = {r["query"] for r in dev["debian"]}
    assert deb == {f"pkg{i} short" for i in range(30)} - {"pkg3 short", "pkg4 short"}
    assert {r["query"] for r in dev["python-api"]} == {f"mod{i % 4}.fn{i}" for i in range(30)}
    small = cf.dev_sets(pairs, exclude=exclude, passages=passages, per_source=10, seed=0)
    assert len(small["debian"]) == 10 and len(small["python-api"]) == 10
    modules = [r["query"].split(".")[0] for r in small["python-api"]]
    assert len(set(modules[:7])) == 1  # whole modules (7 or 8 APIs each) enter together
    assert cf.dev_sets(pairs, exclude=exclude, passages=passages, per_source=10, seed=1) != small


def test_choose_weight_respects_the_floor() -> None:
    def res(lex: float, vec: float, hyb: dict) -> dict:
        return {"lexical": {"ndcg@10": lex}, "vector": {"ndcg@10": vec},
                "hybrid": {w: {"ndcg@10": v} for w, v in hyb.items()}}

    # w=4 has the best mean but falls below lexical on source a; w=1 meets the floor on both
    results = {"a": res(0.8, 0.5, {0.5: 0.81, 1.0: 0.82, 4.0: 0.70}), "b": res(0.4, 0.6, {0.5: 0.60, 1.0: 0.62, 4.0: 0.99})}
    choice = cf.choose_weight(results)
    assert choice["hybrid_weight"] == 1.0 and choice["constraint"] == "per-source"
    # nothing meets the floor anywhere: the best mean, flagged
    results = {"a": res(0.9, 0.9, {0.5: 0.5, 1.0: 0.6})}
    assert cf.choose_weight(results) == {"hybrid_weight": 1.0, "constraint": "none", "mean": {0.5: 0.5, 1.0: 0.6},
                                         "floor": 0.9}


def test_calibrate_cli_writes_a_weight_from_the_grid(tmp_path: Path, embedder: LMEmbedder) -> None:
    pairs, exclude, passages = _pairs()
    corpus = tmp_path / "corpus"
    (corpus / "eval").mkdir(parents=True)
    (corpus / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    (corpus / "passages.jsonl").write_text("".join(json.dumps({"text": t, "source": "x"}) + "\n" for t in passages))
    (corpus / "eval" / "debian.jsonl").write_text(
        "".join(json.dumps({"query": q, "doc": "an eval doc long enough to count as one", "source": "debian"}) + "\n"
                for q in exclude))
    embedder.model.save(tmp_path / "m.evlm")
    embedder.tokenizer.save(tmp_path / "t.json")
    out = cf.main(["--corpus", str(corpus), "--model", str(tmp_path / "m.evlm"), "--tokenizer", str(tmp_path / "t.json"),
                   "--out", str(tmp_path / "fusion.json"), "--weights", "0,0.5,3", "--per-source", "12",
                   "--write-dev", str(tmp_path / "dev.jsonl")])
    written = json.loads((tmp_path / "fusion.json").read_text())
    assert written["hybrid_weight"] in (0.0, 0.5, 3.0) and written == json.loads(json.dumps(out))
    assert written["dev"]["rows"] == {"debian": 12, "python-api": 12, "foldoc": 12}
    assert set(written["sweep"]["debian"]["hybrid"]) == {"0", "0.5", "3"}
    # each query's rare word is in its doc only: BM25 finds it first, and so does hybrid at w = 0 (BM25 alone)
    for sweep in written["sweep"].values():
        assert sweep["lexical"]["recall@1"] == 1.0 and sweep["hybrid"]["0"]["recall@1"] == 1.0
    assert written["hybrid_weight"] == 0.0 or written["mean_ndcg@10"][f"{written['hybrid_weight']:g}"] == 1.0
    assert len((tmp_path / "dev.jsonl").read_text().splitlines()) == 36
    assert rq.load_embedder(str(tmp_path / "m.evlm"), str(tmp_path / "t.json"),
                            str(tmp_path / "fusion.json")).hybrid_weight == written["hybrid_weight"]
