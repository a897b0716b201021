"""Adaptation wired into MemoryStore (issue 7, docs/reliability.md R11/R12, tests A): a round swaps generations
with no serving gap, recalls in 4 threads never fail, empty out or mix models, hooks fire in order and can
veto, the gate drops bad candidates, rollback restores, reopening applies the adapter, and kill -9 at every
named point of a publish reopens on the old or the new generation and resumes."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from evermind_memory import MemoryStore
from evermind_memory.adaptation import AdaptationHooks, AdaptationPolicy
from evermind_memory.errors import EmbedderMismatch, EvermindError, InvalidInput
from evermind_memory.lm.adapter import LoRAWeights
from evermind_memory.store.backend import vector_blobs
from store_helpers import CHILD_PRELUDE, PYTHON, child_env, recall_at_k, stored_rows

WHO = ["Ada", "Bob", "Cyd", "Dee", "Eve", "Fay"]
WHAT = ["green tea", "river foxes", "Paris trains", "SQLite pages", "black cats", "lazy dogs", "news at eight"]
FACTS = [f"{w} keeps notes on {t} number {i}" for i, (w, t) in enumerate((w, t) for w in WHO for t in WHAT)]
QUERIES = ["Ada green tea", "river foxes", "SQLite pages number", "Eve black cats", "news at eight"]
# Mechanics tests want the candidate through the gate whatever the tiny untrained model learns.
FAST = AdaptationPolicy(steps=6, batch_size=8, lr=5e-3, gate_tolerance=1.0, require_gain=False, min_probe=4,
                        max_probe=6, gate_corpus=16, reembed_batch=8, min_facts=8)


def fingerprints(db) -> set[str]:
    """The fingerprints of the stored vectors (an SQLite file or a PostgreSQL URL)."""
    return {r[0]
            for r in stored_rows(db,
                                 "SELECT DISTINCT p.fingerprint FROM facts f LEFT JOIN fingerprints p ON p.id = "
                                 "f.fingerprint_id")}


def vector_ids(store: MemoryStore, queries=QUERIES, k: int = 5) -> list[list[str]]:
    return [[h.id for h in store.recall(q, k=k, mode="vector")] for q in queries]


@pytest.fixture
def filled(db_path: Path, embedder):
    with MemoryStore(db_path, embedder) as s:
        s.remember_many(FACTS)
        yield s


def test_round_swaps_to_a_new_generation(filled: MemoryStore, db_path: Path, embedder) -> None:
    before = filled.fingerprint
    report = filled.adapt_now(FAST)
    assert report.status == "swapped" and report.kind == "round" and report.adapter_id == "0001"
    assert filled.fingerprint == report.fingerprint_after != before
    assert report.fingerprint_before == before == report.base_fingerprint == embedder.fingerprint
    assert fingerprints(db_path) == {filled.fingerprint}
    assert filled.check().ok
    assert recall_at_k(filled, db_path, QUERIES) >= 0.95
    assert filled.info()["adapter"] == "0001" and not filled.info()["adaptation_pending"]
    (entry,) = filled.adapter_history()
    assert entry["active"] and entry["status"] == "published" and entry["fingerprint"] == filled.fingerprint
    assert (db_path.parent / "memory.db.adapters" / "0001.lora").is_file()
    assert report.steps == FAST.steps and report.gate.passed and report.total_seconds > 0
    # a second round builds on the first adapter and gets its own file and fingerprint
    second = filled.adapt_now(FAST)
    assert second.status == "swapped" and second.adapter_id == "0002"
    assert filled.fingerprint not in (before, report.fingerprint_after)


def test_hooks_fire_in_order_and_veto_keeps_the_model(filled: MemoryStore, db_path: Path) -> None:
    events: list[str] = []
    hooks = AdaptationHooks(
        on_round_start=lambda: events.append("start"),
        on_adapted=lambda r: events.append(f"adapted:{r.gate.passed}"),
        before_swap=lambda r: events.append(f"before_swap:{r.status}") or False,
        on_reindexed=lambda r: events.append(f"reindexed:{r.status}"),
    )
    before, ids = filled.fingerprint, vector_ids(filled)
    vetoed = filled.adapt_now(FAST, hooks)
    assert events == ["start", "adapted:True", "before_swap:running"]
    assert vetoed.status == "vetoed" and filled.fingerprint == before and fingerprints(db_path) == {before}
    assert vector_ids(filled) == ids and filled.check().ok
    assert filled.adapter_history()[0]["status"] == "vetoed" and not filled.adapter_history()[0]["active"]
    events.clear()
    hooks.before_swap = lambda r: events.append("before_swap") or True
    assert filled.adapt_now(FAST, hooks).status == "swapped"
    assert events == ["start", "adapted:True", "before_swap", "reindexed:swapped"]


def test_gate_refuses_a_broken_candidate(filled: MemoryStore, db_path: Path, embedder) -> None:
    seen = []
    rank, dim = 2, embedder.dimensions
    vocab = embedder.model.config.vocab_size
    huge = LoRAWeights(rank, 2.0,
                       {"emb": (np.full((rank, dim), 1e19, np.float32), np.full((vocab, rank), 1e19, np.float32))})
    before, ids = filled.fingerprint, vector_ids(filled)
    report = filled.adapt_now(FAST, {"on_adapted": seen.append, "before_swap": lambda r: pytest.fail("swap reached")},
                              adapter=huge)
    assert report.status == "refused" and not report.gate.passed and seen == [report]
    assert filled.fingerprint == before and fingerprints(db_path) == {before} and vector_ids(filled) == ids
    assert filled.adapter_history() == []  # a refused candidate is dropped, not written


def test_gate_refuses_a_tie_and_says_why(filled: MemoryStore, db_path: Path, embedder) -> None:
    """A candidate no better than the serving model (a zero adapter: the same vectors) is refused, not swapped
    in; the report carries the gate's figures."""
    rank, dim, vocab = 2, embedder.dimensions, embedder.model.config.vocab_size
    zero = LoRAWeights(rank, 2.0, {"emb": (np.ones((rank, dim), np.float32), np.zeros((vocab, rank), np.float32))})
    before, ids = filled.fingerprint, vector_ids(filled)
    report = filled.adapt_now(AdaptationPolicy(min_facts=8), {"before_swap": lambda r: pytest.fail("swap reached")},
                              adapter=zero)
    gate = report.to_dict()["gate"]
    assert report.status == "refused" and "not better" in report.reason and gate["passed"] is False
    assert gate["mrr_gain"] == 0.0 and gate["queries"] >= 64 and gate["mrr_current"] == gate["mrr_candidate"]
    assert filled.fingerprint == before and fingerprints(db_path) == {before} and vector_ids(filled) == ids
    assert filled.adapter_history() == [] and filled.check().ok


@pytest.mark.parametrize("facts", [5, 20, 30, 31])
def test_a_store_too_small_to_judge_is_refused_at_once_with_the_sizes(db_path: Path, embedder, facts: int) -> None:
    """Too few held-out memories for the gate to tell a gain from noise: known from the store's size, so the round
    is refused before training (a 30-fact store used to train 66 s, then be refused by the gate)."""
    with MemoryStore(db_path, embedder) as s:
        s.remember_many([f"Ada keeps notes on green tea, page {i}" for i in range(facts)])
        before = s.fingerprint
        report = s.adapt_now()  # the default policy: min_probe_queries=128, 8 views per held-out memory
        held_out = min(16, facts // 2)
        assert report.status == "skipped" and report.reason.startswith(
            f"too small to judge: {facts} memories hold out {held_out} for the gate, {held_out * 8} probe queries")
        assert "min_probe_queries=128; a store needs at least 32 memories" in report.reason
        assert report.steps == 0 and report.train_seconds == 0 and report.gate is None
        assert s.fingerprint == before and fingerprints(db_path) == {before} and s.adapter_history() == []


def test_rollback_restores_fingerprint_and_results(filled: MemoryStore, db_path: Path) -> None:
    base_fp, base_ids = filled.fingerprint, vector_ids(filled)
    first = filled.adapt_now(FAST)
    first_fp, first_ids = filled.fingerprint, vector_ids(filled)
    filled.adapt_now(FAST)
    assert filled.fingerprint not in (base_fp, first_fp)
    back = filled.rollback_adapter(first.adapter_id)
    assert back.status == "swapped" and back.kind == "rollback"
    assert filled.fingerprint == first_fp and vector_ids(filled) == first_ids
    assert [e["active"] for e in filled.adapter_history()] == [True, False]
    assert filled.rollback_adapter("base").status == "swapped"
    assert filled.fingerprint == base_fp and fingerprints(db_path) == {base_fp}
    assert vector_ids(filled) == base_ids and filled.check().ok and filled.info()["adapter"] is None
    assert filled.rollback_adapter(None).status == "unchanged"
    with pytest.raises(InvalidInput):
        filled.rollback_adapter("0042")


def test_reopen_applies_the_adapter_and_other_embedders_follow_mismatch_rules(
        db_path: Path, embedder, other_embedder) -> None:
    with MemoryStore(db_path, embedder) as s:
        ids = s.remember_many(FACTS)
        s.adapt_now(FAST)
        adapted_fp, results = s.fingerprint, vector_ids(s)
    with MemoryStore(db_path, embedder) as s:  # the base model: base + active adapter serves, nothing re-embedded
        assert s.fingerprint == adapted_fp and s.info()["index_status"].startswith("loaded")
        assert vector_ids(s) == results and [c.op for c in s.history(ids[0])] == ["remember"]
    with MemoryStore(db_path, embedder, read_only=True) as r:
        assert r.fingerprint == adapted_fp and vector_ids(r) == results
        with MemoryStore(db_path, embedder) as w:  # the writer rolls back while the reader is open
            w.rollback_adapter("base")
            base_results = vector_ids(w)
        assert vector_ids(r) == base_results and r.fingerprint == embedder.fingerprint
        with MemoryStore(db_path, embedder) as w:
            w.rollback_adapter("0001")
        assert vector_ids(r) == results and r.fingerprint == adapted_fp
    adapter_file = db_path.parent / "memory.db.adapters" / "0001.lora"
    adapter_file.rename(adapter_file.with_suffix(".gone"))
    with pytest.raises(EmbedderMismatch, match="adapter"):
        MemoryStore(db_path, embedder, on_mismatch="raise")
    adapter_file.with_suffix(".gone").rename(adapter_file)
    with MemoryStore(db_path, other_embedder) as s:  # an unrelated model: re-embedded, the adapter lapses
        assert s.fingerprint == other_embedder.fingerprint and fingerprints(db_path) == {s.fingerprint}
        assert s.info()["adapter"] is None and s.check().ok
        with pytest.raises(InvalidInput):
            s.rollback_adapter("0001")  # fitted on another base


def test_recalls_in_four_threads_during_a_round(filled: MemoryStore, db_path: Path, embedder) -> None:
    base_fp = filled.fingerprint
    texts = list(FACTS)
    done = threading.Event()
    errors: list[BaseException] = []
    records: list[tuple[str, list[tuple[str, float]]]] = []
    written: list[str] = []

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            after = 0  # recalls made after the round returned (the new model), so the swap is straddled
            while not done.is_set() or len(records) < 40 or after < 5:
                after += done.is_set()
                text = texts[int(rng.integers(len(texts)))]
                hits = filled.recall(text, k=5, mode="vector")
                hybrid = filled.recall(text, k=5)
                if not hits or not hybrid or text not in [h.text for h in hybrid]:
                    raise AssertionError(f"recall of a stored fact came back without it: {text!r}")
                records.append((text, [(h.text, h.score) for h in hits]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def writer() -> None:
        i = 0
        try:
            while not done.is_set() and i < 300:  # remember() no longer waits for the model: bound the writes
                written.append(filled.remember(f"written during the round {i} about {WHAT[i % len(WHAT)]}"))
                i += 1
                time.sleep(0.001)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)] + [threading.Thread(target=writer)]
    for t in threads:
        t.start()
    try:
        report = filled.adapt_now(AdaptationPolicy(**{**FAST.__dict__, "steps": 20, "reembed_batch": 4}))
    finally:
        done.set()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors[:3]
    assert report.status == "swapped" and filled.fingerprint != base_fp and written
    filled.flush()  # the last facts written may still wait for their vectors (background embedding)
    # every fact, including those written during the round, is served by the new generation only
    assert fingerprints(db_path) == {filled.fingerprint} and filled.check().ok
    assert recall_at_k(filled, db_path, QUERIES + [f"written during the round {len(written) - 1}"]) >= 0.95
    # each recall's scores are cosines under one model: the old one or the new one, never a mix
    old, new = embedder, filled.embedder
    models_seen = set()
    for query, hits in records:
        scores = np.array([s for _, s in hits])
        matches = []
        for name, model in (("old", old), ("new", new)):
            cos = vector_blobs.as_stored(model.embed_many([t for t, _ in hits])) @ model.embed(query)  # as stored
            if np.allclose(cos, scores, atol=2e-4):
                matches.append(name)
        assert matches, f"recall of {query!r} matches neither model: {hits}"
        models_seen.update(matches)
    assert models_seen == {"old", "new"}  # the recalls did straddle the swap


def test_background_thread_rounds_status_and_stop(filled: MemoryStore) -> None:
    swapped = threading.Event()
    policy = AdaptationPolicy(**{**FAST.__dict__, "min_new_facts": 10, "min_interval_s": 0.0, "poll_seconds": 0.02})
    adaptation = filled.start_adaptation(policy, {"on_reindexed": lambda r: swapped.set()})
    assert swapped.wait(timeout=120), adaptation.status()
    with pytest.raises(InvalidInput):
        filled.start_adaptation(policy)
    adaptation.stop()
    adaptation.join(timeout=120)
    status = adaptation.status()
    assert not status["running"] and status["rounds"] >= 1 and status["swaps"] >= 1 and status["error"] is None
    assert status["last_swap"]["fingerprint"] == filled.fingerprint and status["losses"]
    assert status["gates"][0]["passed"] and status["pending"] is None


def test_thread_error_goes_to_on_error_and_join(filled: MemoryStore) -> None:
    seen: list[BaseException] = []

    def boom() -> None:
        raise RuntimeError("agent hook failed")

    policy = AdaptationPolicy(**{**FAST.__dict__, "min_new_facts": 1, "min_interval_s": 0.0, "poll_seconds": 0.01})
    adaptation = filled.start_adaptation(policy, {"on_round_start": boom, "on_error": seen.append})
    with pytest.raises(RuntimeError, match="agent hook failed"):
        adaptation.join(timeout=60)
    assert len(seen) == 1 and "agent hook failed" in adaptation.status()["error"]


def test_adaptation_refused_where_it_cannot_work(db_path: Path, embedder, filled: MemoryStore) -> None:
    with MemoryStore(":memory:", embedder) as mem:
        with pytest.raises(InvalidInput):
            mem.adapt_now(FAST)
    with MemoryStore(db_path, embedder, read_only=True) as r:
        with pytest.raises(EvermindError):
            r.adapt_now(FAST)
    with pytest.raises(InvalidInput):
        filled.adapt_now(policy={"steps": 3})
    small = filled.adapt_now(AdaptationPolicy(min_facts=10_000))
    assert small.status == "skipped"


# ---- kill -9 at the named points of a publish (child processes) ------------------------------------------
ADAPT_CHILD = CHILD_PRELUDE + """
from evermind_memory.adaptation import AdaptationPolicy
policy = AdaptationPolicy(steps=4, batch_size=8, gate_tolerance=1.0, require_gain=False, min_probe=4, max_probe=4,
                          gate_corpus=8, reembed_batch=8, min_facts=8)
with MemoryStore(db, emb) as store:
    print("open", flush=True)
    report = store.adapt_now(policy)
    print("done", report.status, flush=True)
"""

# point -> (which generation serves after the crash, whether a publish is left to resume)
CRASH_POINTS = {
    "adapt.adapter_written:1": ("old", False),
    "adapt.pending_recorded:1": ("old", True),
    "adapt.reembed.batch:3": ("old", True),
    "adapt.index_built:1": ("old", True),
    "adapt.swap.before_commit:1": ("old", True),
    "adapt.swap.after_commit:1": ("new", False),
    "index.save.written:1": ("new", False),
}


@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_kill9_during_publish_reopens_consistent_and_resumes(point: str, model_files, db_path: Path, embedder) -> None:
    with MemoryStore(db_path, embedder) as s:
        ids = s.remember_many(FACTS)
        old_fp = s.fingerprint
    env = child_env()
    env["EVERMIND_CRASH_AT"] = point
    proc = subprocess.run([PYTHON, "-c", ADAPT_CHILD, str(model_files[0]), str(model_files[1]), str(db_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr[-2000:]
    serving, pending = CRASH_POINTS[point]
    with MemoryStore(db_path, embedder) as s:
        new_fp = s.adapter_history()[-1]["fingerprint"]
        assert s.fingerprint == (old_fp if serving == "old" else new_fp)
        assert fingerprints(db_path) == {s.fingerprint}  # never a mix
        assert {f.id for f in s.list(limit=1000)} == set(ids)
        assert s.check().ok and recall_at_k(s, db_path, QUERIES) >= 0.95
        assert s.info()["adaptation_pending"] == pending
        with sqlite3.connect(db_path) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        report = s.adapt_now(FAST)
        if pending:
            assert report.kind == "resume" and report.resumed and report.status == "swapped"
            assert s.fingerprint == new_fp
            if point.startswith("adapt.reembed.batch"):
                assert 0 < report.reembedded < len(FACTS) - 8  # only what the crash left undone
        else:
            assert report.kind == "round" and report.status == "swapped"
        assert fingerprints(db_path) == {s.fingerprint} and s.check().ok
        assert recall_at_k(s, db_path, QUERIES) >= 0.95
        assert not s.info()["adaptation_pending"]


def test_cli_adapt_history_and_rollback(filled: MemoryStore, db_path: Path, embedder) -> None:
    import io
    import json

    from evermind_memory.cli import main

    base_fp = filled.fingerprint
    filled.close()
    out = io.StringIO()
    assert main(["adapt", "--db", str(db_path), "--json", "--steps", "3", "--seed", "2"], embedder=embedder,
                out=out) == 0
    report = json.loads(out.getvalue())
    assert report["steps"] == 3 and report["status"] in ("swapped", "refused") and report["gate"]["probes"] >= 1
    out = io.StringIO()
    assert main(["adapt", "--db", str(db_path), "--history"], embedder=embedder, out=out) == 0
    assert ("0001" in out.getvalue()) == (report["status"] == "swapped")
    out = io.StringIO()
    assert main(["adapt", "--db", str(db_path), "--rollback", "base"], embedder=embedder, out=out) == 0
    assert base_fp in out.getvalue()
    with MemoryStore(db_path, embedder) as s:
        assert s.fingerprint == base_fp


WAITING_CHILD = CHILD_PRELUDE + """
import os, signal
s = MemoryStore(db, emb)
s.remember("a fact still waiting for its vector while another process swaps models")
print("remembered", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # alive, its background vector not written: a busy writer's state
"""


def test_a_swap_while_another_writers_fact_waits_for_its_vector(db_path: Path, model_files, embedder) -> None:
    """The swap gave every row the new fingerprint, those still waiting for a vector (no label) too: every other
    process's recall and check(), and a fresh open's, then raised TypeError until some process embedded them."""
    with MemoryStore(db_path, embedder) as s:
        s.remember_many(FACTS)
    child = None
    try:
        for _ in range(5):  # the writer's worker may embed before it stops: try again
            child = subprocess.Popen([PYTHON, "-c", WAITING_CHILD, *map(str, model_files), str(db_path)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
            assert child.stdout.readline().strip() == "remembered", child.stderr.read()[-2000:]
            with MemoryStore(db_path, embedder, read_only=True) as r:
                if r.info()["waiting_vectors"]:
                    break
            child.kill()
            child.wait()
        else:
            pytest.skip("the writer's vector was written before it stopped, five times")
        with MemoryStore(db_path, embedder) as reader, MemoryStore(db_path, embedder) as adapter:
            assert reader.recall("Ada green tea", k=3)
            assert adapter.adapt_now(FAST).status == "swapped"
            for store in (reader, adapter):
                assert store.recall("Ada green tea", k=3) and store.recall("river foxes", k=3, mode="lexical")
                assert store.check().waiting_vectors == 1
        with MemoryStore(db_path, embedder, read_only=True) as fresh:
            assert fresh.recall("Ada green tea", k=3) and fresh.check().waiting_vectors == 1
    finally:
        if child is not None:
            child.kill()
            child.wait()
    with MemoryStore(db_path, embedder) as s:  # the stopped writer is gone: its fact is adopted and embedded
        s.flush()
        assert s.check().ok and s.count() == len(FACTS) + 1


def test_a_handle_that_only_writes_follows_a_swap_made_elsewhere(db_path: Path, embedder) -> None:
    """Every embedded write of a handle that had not recalled since another handle swapped models raised
    EmbedderMismatch ("recall once to follow the swap"); the write now follows the swap itself."""
    with MemoryStore(db_path, embedder) as writer, MemoryStore(db_path, embedder) as adapter:
        writer.remember_many(FACTS)
        fid = writer.remember("Ada keeps a note on oolong", dedup=True)
        assert adapter.adapt_now(FAST).status == "swapped"
        swapped = adapter.fingerprint
        assert writer.remember_many(["a fact written after the swap elsewhere"])
        assert writer.fingerprint == swapped
        assert adapter.adapt_now(FAST).status == "swapped"  # and again, through each embedded write
        writer.update(fid, "Ada keeps a note on jasmine tea")
        writer.remember("Ada keeps a note on jasmine tea", dedup=True)
        writer.supersede(fid, "Ada keeps a note on white tea")
        writer.remember("own id", id="own-1")
        writer.scope(user="ada").remember_conversation([("Ada", "hello")], session="s")
        assert writer.fingerprint == adapter.fingerprint and writer.check().ok


def test_a_round_started_from_a_hook_is_refused_not_hung(filled: MemoryStore) -> None:
    """The round lock was a plain Lock: adapt_now from an on_reindexed hook waited for itself forever."""
    inner: list[BaseException] = []

    def again(report) -> None:
        try:
            filled.adapt_now(FAST)
        except InvalidInput as exc:
            inner.append(exc)

    assert filled.adapt_now(FAST, {"on_reindexed": again}).status == "swapped"
    assert len(inner) == 1 and "from inside one" in str(inner[0])
    assert filled.adapt_now(FAST).status == "swapped" and filled.check().ok  # the lock was released
