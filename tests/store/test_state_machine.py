"""docs/reliability.md, tests E: a hypothesis state machine drives a MemoryStore against a dict + exact-search model:
remember, update, forget, recall, flush, reopen, rebuild, drop or corrupt the index, swap the embedder.
The store runs in the default mode (background embedding)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from evermind_memory import FactNotFound, MemoryStore
from evermind_memory.store.backend import vector_blobs
from store_helpers import build_embedder

EMBEDDERS = {}


def embedder(seed: int):
    if seed not in EMBEDDERS:
        EMBEDDERS[seed] = build_embedder(seed=seed)
    return EMBEDDERS[seed]


words = st.sampled_from("tea coffee cat dog river fox Paris agent memory green black quick".split())
texts = st.lists(words, min_size=1, max_size=5).map(" ".join)
tags = st.sampled_from([None, {"person": "ada"}, {"person": "bob"}, {"person": "ada", "topic": "x"}])


class StoreMachine(RuleBasedStateMachine):
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="evm-sm-"))
        self.db = self.dir / "m.db"
        self.seed = 0
        self.store = MemoryStore(self.db, embedder(self.seed))
        self.model: dict[str, tuple[str, dict]] = {}

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def reopen(self) -> None:
        self.store.close()
        self.store = MemoryStore(self.db, embedder(self.seed))

    @rule(target=ids, text=texts, tag=tags)
    def remember(self, text, tag):
        fid = self.store.remember(text, tags=tag)
        self.model[fid] = (text, tag or {})
        return fid

    @rule(target=ids, batch=st.lists(texts, min_size=1, max_size=4))
    def remember_many(self, batch):
        new = self.store.remember_many(batch)
        for fid, text in zip(new, batch):
            self.model[fid] = (text, {})
        return new[0]

    @rule(fid=consumes(ids))
    def forget(self, fid):
        if fid in self.model:
            self.store.forget(fid)
            del self.model[fid]
        else:
            try:
                self.store.forget(fid)
                raise AssertionError("forget of a forgotten id succeeded")
            except FactNotFound:
                pass

    @rule(fid=ids, text=texts)
    def update(self, fid, text):
        if fid not in self.model:
            return
        self.store.update(fid, text)
        self.model[fid] = (text, self.model[fid][1])

    @rule(query=texts, k=st.integers(1, 12), tag=tags)
    def recall_vector(self, query, k, tag):
        hits = self.store.recall(query, k=k, mode="vector", tags=tag)
        allowed = {fid for fid, (_, t) in self.model.items() if not tag or all(t.get(a) == b for a, b in tag.items())}
        assert {h.id for h in hits} <= allowed
        assert len(hits) == min(k, len(allowed))
        if allowed:
            ids_ = sorted(allowed)
            emb = embedder(self.seed)
            # the model's facts as a row stores them (int8, backend/vector_blobs.py): the store scores those
            stored = vector_blobs.as_stored(emb.embed_many([self.model[i][0] for i in ids_]))
            exact = stored @ emb.embed(query)
            kth = np.sort(exact)[::-1][: len(hits)][-1]
            assert all(h.score >= kth - 1e-4 for h in hits)  # exactly the best (ties allowed)
            assert abs(hits[0].score - exact.max()) < 1e-4

    @rule(query=texts)
    def recall_other_modes(self, query):
        for mode in ("lexical", "hybrid"):
            hits = self.store.recall(query, k=5, mode=mode)
            assert {h.id for h in hits} <= set(self.model)
            assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))

    @rule()
    def close_and_reopen(self):
        self.reopen()

    @rule()
    def rebuild(self):
        assert self.store.rebuild_index() == len(self.model)

    @rule(how=st.sampled_from(["delete", "garbage", "sha"]))
    def damage_index(self, how):
        self.store.close()
        manifest = self.dir / "m.db.json"
        if manifest.exists():
            if how == "delete":
                manifest.unlink()
            elif how == "garbage":
                manifest.write_bytes(b"\x00garbage")
            else:
                try:
                    m = json.loads(manifest.read_text())
                except ValueError:  # an earlier "garbage": only a process that loads the index saves it again
                    m = {}
                m["sha256"] = "0" * 64
                manifest.write_text(json.dumps(m))
        self.store = MemoryStore(self.db, embedder(self.seed))

    @rule()
    def swap_embedder(self):
        self.seed = 1 - self.seed
        self.reopen()
        assert all(f.fingerprint == embedder(self.seed).fingerprint for f in self.store.list(limit=1000))

    @rule()
    def flush(self):
        self.store.flush()  # every vector embedded and indexed (the default embeds in the background)
        fingerprints = {f.fingerprint for f in self.store.list(limit=1000)}
        assert fingerprints <= {self.store.fingerprint}
        assert self.store.info()["indexed"] == len(self.model)

    @rule()
    def check(self):
        report = self.store.check()
        assert report.ok, report.problems

    @invariant()
    def same_facts(self):
        facts = self.store.list(limit=1000)
        assert {f.id: (f.text, f.tags) for f in facts} == self.model


StoreMachine.TestCase.settings = settings(
    max_examples=20, stateful_step_count=15, deadline=None, suppress_health_check=list(HealthCheck)
)
test_store_state_machine = StoreMachine.TestCase
