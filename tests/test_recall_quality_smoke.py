"""Tiny-scale runs of benchmarks/recall_quality.py (both modes) and recipe/calibrate_fusion.py, so the code paths
stay working, and the fitting pieces checked against hand-made cases.

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
from evermind_memory.store.fusion import CandidatePool, load_params  # noqa: E402

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


def _pool(lex: list[tuple[int, float]], vec: list[tuple[int, float]]) -> CandidatePool:
    ids = {c for c, _ in lex} | {c for c, _ in vec}
    return CandidatePool.build(lex, vec, {}, {c: 100 for c in ids}, [1, 2], 50)


def test_stack_ranks_follow_the_store_order_and_ties() -> None:
    pools = [_pool([(3, 2.0), (1, 1.0)], [(1, 0.9), (2, 0.1)]), _pool([(5, 1.0)], [(6, 0.2)]), _pool([], [(7, 0.5)])]
    st = cf.Stack(pools, np.array([1, 5, 9]), ["lex", "cos"], 50)
    assert st.has.tolist() == [True, True, False]
    # query 0: doc 3 lex 1.0, doc 1 lex 0.5 + w 0.9; at w=0 doc 3 first, at w=1 doc 1 first
    assert st.ranks(st.X @ np.array([1.0, 0.0])).tolist() == [1, 0, -1]
    assert st.ranks(st.X @ np.array([1.0, 1.0])).tolist() == [0, 0, -1]
    # at w = 5/9 they tie (doc 3: 1.0, doc 1: 0.5 + 5/9 x 0.9 = 1.0): the lower id wins
    assert st.ranks(st.X @ np.array([1.0, 5 / 9]))[0] == 0
    assert cf.ndcg(np.array([0, 1, -1, 12])) == pytest.approx((1 + 1 / np.log2(3)) / 4)


def test_grid_fit_keeps_no_harm_on_every_fitting_source() -> None:
    # source a: the lexical first hit is right (vectors mislead); source b: vectors are right and BM25 ties.
    a = [_pool([(i * 10, 2.0), (i * 10 + 1, 1.0)], [(i * 10 + 1, 0.9), (i * 10, 0.2)]) for i in range(6)]
    b = [_pool([(i * 10, 1.0), (i * 10 + 1, 1.0)], [(i * 10 + 1, 0.8), (i * 10, 0.1)]) for i in range(6)]
    gold_a, gold_b = np.arange(6) * 10, np.arange(6) * 10 + 1
    rule = cf.Rule("w", ("lex", "cos"), 50, "grid", ((0.1, 0.5, 3.0),))
    stacks = {"a": cf.Stack(a, gold_a, rule.features, 50), "b": cf.Stack(b, gold_b, rule.features, 50)}
    floors = {"a": 1.0, "b": 1.0}  # lexical alone is perfect on a; vector alone on b
    fits = cf.RuleFits(rule, stacks, floors)
    assert fits.tables["a"].tolist()[2] < 1.0 and fits.tables["b"].tolist()[0] == 1.0  # w=3 harms a; w>0 fixes b
    assert fits.weights(["a", "b"]).tolist() == [1.0, 0.1]  # the only cell perfect on both
    chosen, summary = cf.select_rule({"w": fits}, ["a", "b"], floors)
    assert chosen == "w" and summary["w"]["qualifies"]


def test_softmax_fit_recovers_a_planted_direction() -> None:
    rng = np.random.default_rng(0)
    pools, gold = [], []
    for q in range(300):
        bm, cs = rng.random(8), rng.random(8)
        score = 1.0 * bm / bm.max() + 2.0 * cs + rng.normal(0, 0.05, 8)
        order = np.argsort(-bm)
        ids = list(range(q * 8, q * 8 + 8))
        pools.append(_pool([(ids[i], float(bm[i])) for i in order], [(ids[i], float(cs[i])) for i in np.argsort(-cs)]))
        gold.append(ids[int(np.argmax(score))])
    w = cf.fit_softmax([cf.Stack(pools, np.array(gold), ["lex", "cos"], 50)], l2=1e-4)
    assert w[1] / w[0] == pytest.approx(2.0, rel=0.15)


def test_auc_and_reliability_by_hand() -> None:
    assert cf.auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)
    assert cf.auc(np.array([0.5, 0.5]), np.array([0, 1])) == pytest.approx(0.5)
    rel = cf.reliability(np.array([0.1, 0.1, 0.9, 0.9]), np.array([0.0, 1.0, 1.0, 1.0]), np.ones(4), bins=2)
    assert rel["ece"] == pytest.approx(0.5 * 0.4 + 0.5 * 0.1)


def test_size_weights_balance_each_store_size_by_hand() -> None:
    """A sizes source with 2 answerable and 6 unanswerable asks among 5 facts and 6 / 2 among 1,000: each size
    weighs its share of the asks (8 of 16 each), split answerable / unanswerable by SHARES within it."""
    from types import SimpleNamespace

    d = {"source": SimpleNamespace(shapes=["5 scoped"] * 2 + ["1000 all"] * 6),
         "foreign_shapes": ["5 scoped"] * 6 + ["1000 all"] * 2}
    ans = cf.size_weights(d, "answerable", cf.SHARES["answerable"])
    removed = cf.size_weights(d, "removed", cf.SHARES["removed"])
    foreign = cf.size_weights(d, "foreign", cf.SHARES["foreign"])
    assert [w.sum() for w in (ans, removed, foreign)] == pytest.approx([0.5, 0.25, 0.25])
    five = ans[:2].sum(), removed[:2].sum() + foreign[:6].sum()  # answerable, unanswerable mass among 5 facts
    thousand = ans[2:].sum(), removed[2:].sum() + foreign[6:].sum()
    assert five[0] == pytest.approx(five[1]) and thousand[0] == pytest.approx(thousand[1])
    assert sum(five) == pytest.approx(sum(thousand)) == pytest.approx(0.5)
    assert cf.size_weights({"source": SimpleNamespace(shapes=["x"])}, "answerable", 0.5) is None  # not by size


def _dev_folder(root: Path) -> Path:
    """Three tiny dev sources in build_devsets.py's format: queries share a rare word with their doc only."""
    dev = root / "dev"
    dev.mkdir()
    for k, name in enumerate(("alpha", "beta", "gamma")):
        rows = _rows(name[:2], 14, k)
        with open(dev / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps({**r, "shape": "name", "key": str(i)}) + "\n" for i, r in enumerate(rows))
        with open(dev / f"{name}.docs.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps({"doc": f"distractor {name} {w} text", "source": name, "key": f"d{i}"}) + "\n"
                          for i, w in enumerate(WORDS))
    return dev


def test_calibrate_and_loso_table_end_to_end(tmp_path: Path, embedder: LMEmbedder, monkeypatch) -> None:
    import dev_pools

    monkeypatch.setattr(dev_pools, "CACHE_DIR", tmp_path / "cache")
    dev = _dev_folder(tmp_path)
    embedder.model.save(tmp_path / "m.evlm")
    embedder.tokenizer.save(tmp_path / "t.json")
    model = ["--model", str(tmp_path / "m.evlm"), "--tokenizer", str(tmp_path / "t.json")]
    out = cf.main(model + ["--dev", str(dev), "--corpus", "", "--no-personal", "--out", str(tmp_path / "fusion.json")])
    params = load_params(tmp_path / "fusion.json")
    assert params.fingerprint == embedder.fingerprint and params.relevance_features == cf.relevance_features("trees")
    assert params.relevance_trees is not None and not params.relevance_weights
    assert set(out["loso"]["sources"]) == {"alpha", "beta", "gamma"}
    for res in out["loso"]["sources"].values():  # the rare word finds every doc: lexical is perfect, so is hybrid
        assert res["ndcg@10"] == pytest.approx(1.0)
    table = rq.main(model + ["--loso", "--dev", str(dev), "--corpus", "", "--no-minilm", "--no-personal", "--json",
                             str(tmp_path / "table.json")])
    assert json.loads((tmp_path / "table.json").read_text()) == json.loads(json.dumps(table))
    for res in table["sources"].values():
        assert res["systems"]["lexical (ours)"] == pytest.approx(1.0) == res["systems"]["FTS5 BM25"]
        assert res["no_harm_margin"] == pytest.approx(0.0) and 0 <= res["systems"]["vector (ours)"] <= 1
    assert table["targets"]["worst_no_harm_margin"] == pytest.approx(0.0)


def test_personal_protocol_runs_and_pools_through_a_real_store(tmp_path: Path, embedder: LMEmbedder,
                                                               monkeypatch) -> None:
    """benchmarks/personal_recall.py on three people with the tiny model: every ask is answered in every mode,
    scoped asks stay in their person's scope, and the pools it gives calibrate_fusion hold the right fact when
    lexical recall finds it."""
    import dev_pools
    import personal_data
    import personal_recall as pr

    monkeypatch.setattr(dev_pools, "CACHE_DIR", tmp_path / "cache")
    ps = personal_data.subset(personal_data.personal_set(), {"ingrid", "tomasz", "rosa"})
    res = pr.run(embedder, ps)
    assert len(res["asks"]) == len(pr.asks(ps)) and {a["scope"] for a in res["asks"]} == {"scoped", "all"}
    summary = pr.summarise(res)
    assert summary["groups"]["all answerable"]["n"] == sum(q.fact is not None for q in ps.questions) + sum(
        q.fact is not None and not q.first_person for q in ps.questions)
    kinds = summary["categories"]
    assert sum(c["n"] for c in kinds.values()) == summary["groups"]["all answerable"]["n"]
    assert all(0 <= c[m] <= c["n"] for c in kinds.values() for m in pr.MODES)
    assert "right first per kind of fact" in pr.format_table("x", summary)
    src = pr.personal_sources(embedder, ps)
    for name, d in src.items():
        assert len(d["pools"]) == len(d["gold"]) == len(d["source"].queries)
        users = [ps.questions[qi].user for qi, scope in pr.asks(ps) if scope == "scoped"]
        for pool, shape in zip(d["pools"], d["source"].shapes):
            if shape == "scoped":  # a scoped pool holds facts of one person only
                assert len({ps.facts[i].user for i in pool.ids}) <= 1
            assert pool.cover is not None and pool.names is not None
        assert users


def test_validation_set_is_apart_from_the_dev_protocol_and_pools_as_its_own_source(tmp_path: Path,
                                                                                  embedder: LMEmbedder,
                                                                                  monkeypatch) -> None:
    """The personal validation set: ten people, each with ten answered questions and two unanswerable ones, none
    of them a person of the dev protocol, all reserved from the training generator; as calibrate_fusion's
    "personal-val" source its answerable asks are pooled (scoped and, but for first-person facts, store-wide) and
    its unanswerable ones are its foreign pools."""
    import dev_pools
    import personal_data
    import personal_recall as pr

    monkeypatch.setattr(dev_pools, "CACHE_DIR", tmp_path / "cache")
    val, dev = personal_data.validation_set(), personal_data.personal_set()
    users = {f.user for f in val.facts}
    assert len(users) == 10 and len(val.facts) == 100
    assert sum(q.fact is not None for q in val.questions) == 100 and sum(q.fact is None for q in val.questions) == 20
    assert not users & {f.user for f in dev.facts if f.user} and users <= personal_data.reserved_words()
    assert not {f.text for f in val.facts} & {f.text for f in dev.facts}
    src = pr.validation_source(embedder)
    assert list(src) == ["personal-val"]
    d = src["personal-val"]
    store_wide = sum(q.fact is not None and not q.first_person for q in val.questions)
    assert len(d["pools"]) == len(d["gold"]) == 100 + store_wide and len(d["foreign"]) == 20
    assert sorted(set(d["gold"].tolist())) == list(range(100))  # every fact answers one question


def test_fit_and_test_people_are_apart_and_laid_out_in_stores_of_every_size(tmp_path: Path, embedder: LMEmbedder,
                                                                           monkeypatch) -> None:
    """The relevance fit's thirty hand-written people (two files) and the second and third test sets' twelve each: no
    person or fact shared with each other or with any other personal set, all reserved from the training generator,
    each person with ten answered questions and four (fit) or three (test) unanswerable ones. The layout puts a
    person's five facts, the person alone, a group and the group beside others in stores of their own (a question
    whose fact a store lacks is unanswerable there); as calibrate_fusion's source its asks are pooled through real
    stores and it is marked for the relevance fit only."""
    import dev_pools
    import personal_data as pd
    import personal_sizes

    monkeypatch.setattr(dev_pools, "CACHE_DIR", tmp_path / "cache")
    fits, test2, test3 = pd.fit_sets(), pd.hand_written(pd.TEST2_FILE), pd.hand_written(pd.TEST3_FILE)
    others = [pd.personal_set(), pd.validation_set(), pd.hand_written(pd.TEST_FILE)]
    sets = [*fits.values(), test2, test3]
    for i, ps in enumerate(sets):
        users = set(ps.users())
        per = 4 if i < len(fits) else 3
        assert len(users) == (15 if i < len(fits) else 12) and len(ps.facts) == 10 * len(users)
        assert sum(q.fact is None for q in ps.questions) == per * len(users)
        assert sorted(q.fact for q in ps.questions if q.fact is not None) == list(range(len(ps.facts)))
        assert users <= pd.reserved_words()
        for other in [*sets[:i], *sets[i + 1:], *others]:
            assert not users & set(other.users()) and not {f.text for f in ps.facts} & {f.text for f in other.facts}

    ps = pd.subset(fits["a"], set(fits["a"].users()[:3]))
    stores = personal_sizes.layout(ps, group=2, large=(40,), seed_tag="t", other_seeds=(0,))
    assert [st.label for st in stores] == ["5", "10"] * 3 + ["20", "40", "10", "40"]
    five = stores[0]
    assert {q.user for q in five.ps.questions} == {five.ps.facts[0].user}
    assert sum(q.fact is None for q in five.ps.questions) == 5 + 4  # the five left out and the four unanswerable
    assert all(scoped for _, scoped in five.asks) and len(five.asks) == 14
    group = stores[6]
    assert len({f.user for f in group.ps.facts}) == 2
    assert sum(not scoped for _, scoped in group.asks) == sum(not q.first_person for q in group.ps.questions)

    src = personal_sizes.sizes_source(embedder, ps, "personal-sizes-t", group=2, large=(40,))
    d = src["personal-sizes-t"]
    answerable = sum(st.ps.questions[qi].fact is not None for st in stores for qi, _ in st.asks)
    assert len(d["pools"]) == len(d["gold"]) == len(d["source"].shapes) == answerable
    assert len(d["foreign"]) == len(d["foreign_shapes"]) == sum(len(st.asks) for st in stores) - answerable
    assert d["ranking"] is False
    for pool, gold in zip(d["pools"], d["gold"]):  # an answerable ask's fact is among its store's candidates
        assert gold in pool.ids
    assert all(d["source"].docs[g] in {f.text for f in ps.facts} for g in d["gold"])


def test_conversation_protocol_asks_about_what_a_speaker_said(embedder: LMEmbedder) -> None:
    """benchmarks/conversation_recall.py: seeded conversations whose questions name the speaker of their evidence
    turn (a piece of news, not small talk), its names reserved from the training generator, and every question
    asked in every way, in its pair's scope and store-wide, through a real store."""
    import conversation_recall as cr
    import personal_data

    convs = cr.generate(0, conversations=2)
    assert [(c.pair, c.sessions, c.questions) for c in convs] == [(c.pair, c.sessions, c.questions)
                                                                  for c in cr.generate(0, conversations=2)]
    assert len(convs) == 2 and all(len(c.sessions) == cr.SESSIONS for c in convs)
    for conv in convs:
        assert len(conv.questions) == cr.SESSIONS * cr.NEWS_PER_SESSION
        for question, (s, t) in conv.questions:
            speaker, text = conv.sessions[s][t]
            assert speaker in question and text not in cr.SMALL_TALK + cr.REACTIONS
    assert {n.lower() for pair in cr.PAIRS for n in pair} <= personal_data.reserved_words()
    res = cr.run(embedder, convs)
    n = sum(len(c.questions) for c in convs)
    assert set(res) == set(cr.WAYS)
    for by_scope in res.values():
        for row in by_scope.values():
            assert row["asks"] == n and 0 <= row["first"] <= row["top10"] <= n and 0 <= row["mrr"] <= row["top10"]
    assert res["lexical"]["scoped"]["top10"] > 0  # the questions name their speaker, whose turns hold the name
    assert "store-wide" in cr.table("x", res)


def test_personal_conversations_reach_the_answer_turn_or_its_neighbours(embedder: LMEmbedder) -> None:
    """benchmarks/personal_conversations.py with the tiny model on three people: every question asked in every
    scope, mode and context width; a turn in the top 5 is reachable, and context=1 reaches at least as many."""
    import personal_conversations as pc

    res = pc.run(embedder, (0, 1), people=3)
    assert res["questions"] > 0 and res["turns"] > res["questions"]
    modes = ("lexical", "vector", "hybrid", "hybrid-no-rerank")
    assert set(res["results"]) == {f"{s}/{m}/context={n}" for s in ("scoped", "all") for m in modes for n in (0, 1)}
    for name, r in res["results"].items():
        assert r["of"] == res["questions"] and 0 <= r["first"] <= r["top5"] <= r["reachable"] <= r["of"]
        if name.endswith("context=0"):
            assert r["reachable"] == r["top5"]
            assert res["results"][name.replace("context=0", "context=1")]["reachable"] >= r["reachable"]
    # the tiny model has no lexicon: recall's default is plain hybrid there
    assert all(res["results"][f"{s}/hybrid/context=0"] == res["results"][f"{s}/hybrid-no-rerank/context=0"]
               for s in ("scoped", "all"))


def test_rerank_speed_times_each_shape_on_question_memory_pairs(tmp_path: Path) -> None:
    """benchmarks/rerank_speed.py with two tiny shapes: each question's batch holds its own fact first and N pairs,
    every shape and N gets a p50 <= p99, and --json writes what it printed."""
    import personal_data
    import rerank_speed as rs

    tok = BPETokenizer.load(REPO / "evermind_memory" / "models" / "tokenizer.json")
    batches = rs.pair_batches(tok, 4, 3)
    asked = [q for q in personal_data.personal_set().questions if q.fact is not None]
    assert len(batches) == 3 and all(len(b) == 4 and all(0 < len(t) <= rs.MAX_PAIR_TOKENS for t in b) for b in batches)
    assert any(tok.encode(q.text + rs.SEP)[:5] == batches[0][0][:5] for q in asked)
    out = rs.main(["--n", "2,4", "--queries", "3", "--shapes", "16,1,16;32,2,16", "--json", str(tmp_path / "r.json")])
    assert set(out["rows"]) == {"C=16 L=1 H=16", "C=32 L=2 H=16"}
    for row in out["rows"].values():
        assert set(row) == {"2", "4"} and all(0 < r["p50_ms"] <= r["p99_ms"] for r in row.values())
    assert json.loads((tmp_path / "r.json").read_text())["rows"] == out["rows"]
