"""Scopes: one store serving many users. A hypothesis state machine drives views of several scopes through the
public API and checks, after every step, that each view reads exactly the facts of its scope and those under
it, and that no view can change, upsert over, supersede, judge or clear another scope's facts."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from evermind_memory import FactNotFound, InvalidInput, MemoryStore
from store_helpers import build_embedder

EMBEDDER = build_embedder(seed=0)
# (levels, key): the root, two users, a user's agent and run, an agent with no user, a namespaced user
VIEWS = [
    ({}, ""),
    ({"user": "ada"}, "user=ada"),
    ({"user": "bob"}, "user=bob"),
    ({"user": "ada", "agent": "planner"}, "user=ada/agent=planner"),
    ({"user": "ada", "agent": "planner", "run": "r1"}, "user=ada/agent=planner/run=r1"),
    ({"agent": "planner"}, "agent=planner"),
    ({"namespace": "acme", "user": "ada"}, "namespace=acme/user=ada"),
]
words = st.sampled_from("tea coffee cat dog river fox Paris agent memory green black quick".split())
texts = st.lists(words, min_size=1, max_size=4).map(" ".join)
view_index = st.integers(0, len(VIEWS) - 1)


def sees(view_key: str, fact_key: str) -> bool:
    return not view_key or fact_key == view_key or fact_key.startswith(view_key + "/")


class ScopeMachine(RuleBasedStateMachine):
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore(":memory:", EMBEDDER)
        self.views = [self.store.scope(**levels) if levels else self.store for levels, _ in VIEWS]
        self.model: dict[str, tuple[str, str]] = {}  # id -> (scope key, text)
        self.written: dict[str, set[tuple[str, str]]] = {}  # id -> every (scope key, text) its history holds

    def write(self, fid: str, key: str, text: str) -> None:
        self.model[fid] = (key, text)
        self.written.setdefault(fid, set()).add((key, text))

    def teardown(self) -> None:
        self.store.close()

    def visible_to(self, v: int) -> set[str]:
        return {fid for fid, (key, _) in self.model.items() if sees(VIEWS[v][1], key)}

    @rule(target=ids, v=view_index, text=texts)
    def remember(self, v, text):
        fid = self.views[v].remember(text)
        self.write(fid, VIEWS[v][1], text)
        return fid

    @rule(target=ids, v=view_index, text=texts, own=st.sampled_from(["a", "b", "c"]))
    def upsert(self, v, text, own):
        key = VIEWS[v][1]
        if own in self.model and not sees(key, self.model[own][0]):
            with pytest.raises(InvalidInput, match="outside this scope"):
                self.views[v].remember(text, id=own)
        else:
            assert self.views[v].remember(text, id=own) == own
            self.write(own, self.model[own][0] if own in self.model else key, text)  # an upsert keeps its scope
        return own

    @rule(v=view_index, fid=ids, text=texts)
    def update(self, v, fid, text):
        if fid in self.visible_to(v):
            assert self.views[v].update(fid, text).text == text
            self.write(fid, self.model[fid][0], text)
        else:
            with pytest.raises(FactNotFound):
                self.views[v].update(fid, text)

    @rule(v=view_index, fid=ids)
    def forget(self, v, fid):
        if fid in self.visible_to(v):
            self.views[v].forget(fid)
            del self.model[fid]
        else:
            with pytest.raises(FactNotFound):
                self.views[v].forget(fid)

    @rule(target=ids, v=view_index, fid=ids, text=texts)
    def supersede(self, v, fid, text):
        if fid in self.visible_to(v):
            new = self.views[v].supersede(fid, text)
            self.write(new, self.model.pop(fid)[0], text)  # the replacement lives in the old fact's scope
            return new
        with pytest.raises(FactNotFound):
            self.views[v].supersede(fid, text)
        return fid

    @rule(v=view_index, fid=ids)
    def feedback(self, v, fid):
        if fid in self.visible_to(v):
            self.views[v].feedback("q", fid)
        else:
            with pytest.raises(FactNotFound):
                self.views[v].feedback("q", fid)

    @rule(v=view_index, word=words)
    def forget_where(self, v, word):
        doomed = {fid for fid in self.visible_to(v) if self.model[fid][1].split()[0] == word}
        # (the first word, as a tag would be: filter on the text through a where on source is not possible, so tag)
        for fid in doomed:
            self.views[v].update(fid, tags={"first": word})
        assert self.views[v].forget_where(tags={"first": word}) == len(doomed)
        for fid in doomed:
            del self.model[fid]

    @rule(v=st.integers(1, len(VIEWS) - 1))
    def clear(self, v):
        doomed = self.visible_to(v)
        assert self.views[v].clear(confirm=True) == len(doomed)
        for fid in doomed:
            del self.model[fid]

    @invariant()
    def every_view_reads_its_own_scope_only(self):
        every = set(self.model)
        for v, view in enumerate(self.views):
            mine = self.visible_to(v)
            assert {f.id for f in view.list(limit=1000)} == mine
            assert view.count() == len(view) == len(mine)
            for f in view.list(limit=1000):
                assert f.text == self.model[f.id][1] and sees(VIEWS[v][1],
                                                              "/".join(f"{k}={x}" for k, x in f.scope.items()))
            for fid in every - mine:
                with pytest.raises(FactNotFound):
                    view.get(fid)
            for fid, written in self.written.items():  # a history shows only what was written in this scope
                seen = {text for key, text in written if sees(VIEWS[v][1], key)}
                if not seen:
                    with pytest.raises(FactNotFound):
                        view.history(fid)
                else:
                    assert {c.text for c in view.history(fid) if c.text is not None} == seen
            for word in ("tea", "cat"):
                assert {h.id for h in view.recall(word, k=50, mode="lexical")} <= mine


ScopeMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=20, deadline=None, suppress_health_check=list(HealthCheck)
)
test_scopes_never_read_or_change_each_others_facts = ScopeMachine.TestCase


def test_vector_and_hybrid_recall_stay_in_scope(target, embedder):
    with MemoryStore(target, embedder) as store:
        ada, bob = store.scope(user="ada"), store.scope(user="bob")
        mine = {ada.remember(f"Ada's note {i} about green tea") for i in range(5)}
        bob.remember_many([f"Bob's note {i} about green tea" for i in range(50)])
        for mode in ("vector", "hybrid", "lexical"):
            assert {h.id for h in ada.recall("green tea", k=10, mode=mode)} == mine
        assert {h.scope["user"] for h in store.recall("green tea", k=60)} == {"ada", "bob"}  # the root sees all


def test_a_view_cannot_widen_itself_and_levels_are_checked(embedder):
    with MemoryStore(":memory:", embedder) as store:
        agent = store.scope(agent="planner")
        with pytest.raises(InvalidInput, match="would leave its scope"):
            agent.scope(user="ada")
        with pytest.raises(InvalidInput, match="would leave its scope"):
            store.scope(user="ada").scope(user="bob")
        assert store.scope(user="ada").scope(run="r1").scoped_to == {"user": "ada", "run": "r1"}
        for bad, message in [({"user": "a/b"}, "without '/'"), ({"user": ""}, "1 to 128"),
                             ({"user": 3}, "expects a str"), ({"user": " ada"}, "surrounding spaces"),
                             ({}, "at least one of")]:
            with pytest.raises(InvalidInput, match=message):
                store.scope(**bad)
        with pytest.raises(TypeError):
            store.scope(tenant="x")  # not a level: Python's own error for an unknown keyword


def test_views_refuse_whole_store_work_and_share_the_store_lifetime(tmp_path, embedder):
    store = MemoryStore(tmp_path / "m.db", embedder, namespace="acme")
    view = store.scope(user="ada")
    fid = view.remember("Ada prefers green tea")
    for call in (view.check, view.rebuild_index, view.compact, lambda: view.backup(tmp_path / "b.db")):
        with pytest.raises(InvalidInput, match="scope view"):
            call()
    with pytest.raises(InvalidInput, match="copies every fact"):
        store.backup(tmp_path / "b.db")  # a namespaced store may not copy other namespaces
    view.close()
    assert store.get(fid).scope == {"namespace": "acme", "user": "ada"}  # closing a view closes nothing else
    other = store.scope(user="bob")
    store.close()
    with pytest.raises(Exception, match="closed"):
        other.get(fid)
    with MemoryStore(tmp_path / "m.db", embedder) as root, MemoryStore(":memory:", embedder) as elsewhere:
        assert root.get(fid).scope == {"namespace": "acme", "user": "ada"} and root.scoped_to == {}
        with pytest.raises(FactNotFound):
            root.scope(namespace="other").get(fid)
        assert elsewhere.count() == 0


def test_export_and_import_keep_scopes_and_refuse_foreign_ones(tmp_path, embedder):
    with MemoryStore(tmp_path / "a.db", embedder) as store:
        ada = store.scope(user="ada")
        ada.remember("Ada's own fact", tags={"n": 1})
        ada.scope(agent="planner").remember("Ada's planner fact", ttl=3600)
        store.scope(user="bob").remember("Bob's fact")
        assert ada.export(tmp_path / "ada.jsonl") == 2 and store.export(tmp_path / "all.jsonl") == 3
    with MemoryStore(tmp_path / "b.db", embedder) as other:
        assert other.scope(user="ada").import_(tmp_path / "ada.jsonl") == 2
        with pytest.raises(InvalidInput, match="outside this handle's scope"):
            other.scope(user="carol").import_(tmp_path / "all.jsonl")
        assert other.import_(tmp_path / "all.jsonl") == 1  # ids already present are skipped
        got = {f.text: (f.scope, f.tags, f.expires_at is not None) for f in other.list()}
        assert got == {"Ada's own fact": ({"user": "ada"}, {"n": 1}, False),
                       "Ada's planner fact": ({"user": "ada", "agent": "planner"}, {}, True),
                       "Bob's fact": ({"user": "bob"}, {}, False)}


KEY_PARTS = st.sampled_from(["ada", "ada-2", "adam", "ada.x", "Ada", "ad", "bob", "é", "a b", "ada=1", "~z", "!"])


@settings(max_examples=60, deadline=None)
@given(view=st.lists(st.tuples(st.sampled_from(["user", "agent"]), KEY_PARTS), max_size=2),
       facts=st.lists(st.lists(st.tuples(st.sampled_from(["user", "agent", "run"]), KEY_PARTS), max_size=3),
                      min_size=1, max_size=12))
def test_the_scope_sql_selects_exactly_the_visible_keys(view, facts):
    """The index range [K, K + "0") minus siblings (backend/filter_sql.py) against store/scope.visible."""
    import sqlite3

    from evermind_memory.store.backend.filter_sql import SQLITE, scope_condition
    from evermind_memory.store.scope import visible

    def key(parts):
        return "/".join(f"{level}={value}" for level, value in parts)

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE facts (scope TEXT NOT NULL)")
    keys = sorted({key(p) for p in facts})
    conn.executemany("INSERT INTO facts VALUES (?)", [(k,) for k in keys])
    params: list = []
    cond = scope_condition("scope", key(view), True, SQLITE, params) or "1 = 1"
    got = {r[0] for r in conn.execute(f"SELECT scope FROM facts WHERE {cond}", params)}
    assert got == {k for k in keys if visible(k, key(view))}
    exact: list = []
    assert {r[0] for r in conn.execute(
        f"SELECT scope FROM facts WHERE {scope_condition('scope', key(view), False, SQLITE, exact)}", exact)} == (
        {key(view)} & set(keys))


def test_the_postgres_compiler_carries_the_scope_and_expiry_too():
    from datetime import datetime, timezone

    from evermind_memory.store.backend import Selection
    from evermind_memory.store.backend.filter_sql import selection_postgres, selection_sql
    from evermind_memory.store.filters import parse_where

    now = datetime(2025, 5, 1, tzinfo=timezone.utc)
    sel = Selection(parse_where({"n": {"$gt": 2}}), "user=ada", now)
    pg, pg_params = selection_postgres(sel)
    lite, lite_params = selection_sql(sel)
    assert pg.count("%s") == len(pg_params) == len(lite_params) == lite.count("?")
    assert 'f.scope COLLATE "C" >= %s' in pg and "f.expires_at > %s" in pg and now in pg_params
    assert "user=ada" not in pg and lite_params[:4] == ["user=ada", "user=ada0", "user=ada", "user=ada/"]


def _scoped_store(path, embedder) -> dict[str, tuple]:
    """A store of scoped, typed-tag, expiring and pinned facts; returns id -> (scope, tags, expires?, pinned)."""
    made = {}
    with MemoryStore(path, embedder) as store:
        for i in range(60):
            view = store.scope(user=f"u{i % 3}")
            tags = {"n": i, "even": i % 2 == 0, "name": f"fact number {i} "}
            ttl, pinned = (3600, False) if i % 5 == 0 else (None, i % 7 == 0)
            fid = view.remember(f"fact number {i} about tea and cats " + "words " * 20, tags=tags, ttl=ttl,
                                pinned=pinned)
            made[fid] = ({"user": f"u{i % 3}"}, tags, ttl is not None, pinned)
    return made


def _same_as_made(store, made: dict, ids) -> None:
    for fid in ids:
        fact = store.get(fid)
        scope, tags, expires, pinned = made[fid]
        assert (fact.scope, fact.tags, fact.expires_at is not None, fact.pinned) == (scope, tags, expires, pinned)
    assert store.scope(user="u1").count(where={"n": {"$gte": 30}, "even": False}) == sum(
        1 for fid in ids if made[fid][0] == {"user": "u1"} and made[fid][1]["n"] >= 30 and made[fid][1]["n"] % 2)


def test_repair_in_place_keeps_scopes_typed_tags_and_expiry(tmp_path, embedder):
    db = tmp_path / "m.db"
    made = _scoped_store(db, embedder)
    victim = next(iter(made))
    conn = sqlite3.connect(db)
    conn.execute("UPDATE facts SET created_at = 'not a time' WHERE id = ?", (victim,))
    conn.execute("DELETE FROM fact_tags")  # the typed tag rows are derived: repair rebuilds them
    conn.commit()
    conn.close()
    with MemoryStore(db, embedder) as store:
        report = store.repair()
        assert report.ok and report.mode == "in place"
        _same_as_made(store, made, made)
        assert [c.op for c in store.scope(user="u0").history(victim)] == ["remember"]


def test_salvage_keeps_the_scopes_and_expiry_of_what_it_reads(tmp_path, embedder):
    from evermind_memory.store import repair_store
    from fault_cases import _page_of_facts

    db = tmp_path / "m.db"
    made = _scoped_store(db, embedder)
    _page_of_facts(db)
    report = repair_store(db, embedder)
    assert report.mode != "in place" and report.ok
    with MemoryStore(db, embedder) as store:
        kept = {f.id for f in store.list(limit=1000)}
        assert len(kept) >= 50  # a page of rows was lost; the change log brings most back
        changed = 0
        for fid in kept:  # every kept fact is still in its own scope (its change log names it too)
            fact = store.get(fid)
            assert fact.scope == made[fid][0] and store.scope(**fact.scope).get(fid).id == fid
            changed += ((fact.expires_at is not None), fact.pinned) != (made[fid][2], made[fid][3])
        assert changed <= report.restored  # only a fact rebuilt from the change log loses its expiry or pin


# ---- "user" has one meaning: the scope ------------------------------------------------------------------------
def test_a_scope_level_is_never_a_tag_and_the_error_says_how_to_scope(tmp_path):
    with MemoryStore(tmp_path / "u.db", EMBEDDER) as store:
        ada = store.scope(user="ada")
        fid = ada.remember("Ada prefers green tea", tags={"person": "ada"})
        refused = [lambda: store.remember("x", tags={"user": "ada"}),
                   lambda: store.remember_many(["x"], tags={"agent": "a"}),
                   lambda: store.update(fid, tags={"user": "bob"}),
                   lambda: store.update(fid, tags={"run": "r"}, replace_tags=True),
                   lambda: store.supersede(fid, "y", tags={"namespace": "n"}),
                   lambda: store.recall("tea", tags={"user": "ada"}), lambda: store.list(where={"user": "ada"}),
                   lambda: store.count(where={"$or": [{"n": 1}, {"user": "x"}]}),
                   lambda: store.forget_where(tags={"user": "ada"})]
        for call in refused:
            with pytest.raises(InvalidInput, match=r"names a scope level, not a tag: .*store\.scope\("):
                call()
        with pytest.raises(InvalidInput, match="--user ada on the command line"):
            store.recall("tea", where={"user": "ada"})
        assert [h.id for h in ada.recall("what does Ada drink?")] == [fid]
        assert store.get(fid).scope == {"user": "ada"} and store.get(fid).tags == {"person": "ada"}
        export = tmp_path / "legacy.jsonl"
        export.write_text('{"id": "L1", "text": "an exported fact", "tags": {"user": "ada"}}\n', encoding="utf-8")
        with pytest.raises(InvalidInput, match="line 1.*names a scope level"):
            store.import_(export)
        assert len(store) == 1 and store.check().ok


def test_a_user_tag_an_earlier_version_stored_stays_readable_and_writable(tmp_path):
    from evermind_memory.store.backend.filter_sql import REBUILD_TAGS_SQL

    db = tmp_path / "legacy.db"
    with MemoryStore(db, EMBEDDER) as store:
        fid = store.remember("Cy's notes", tags={"n": 3})
    conn = sqlite3.connect(db)  # as an earlier version wrote it, with its tag rows
    conn.execute("UPDATE facts SET tags = ? WHERE id = ?", ('{"n": 3, "user": "cy"}', fid))
    conn.execute("DELETE FROM fact_tags")
    conn.execute(REBUILD_TAGS_SQL)
    conn.commit()
    conn.close()
    with MemoryStore(db, EMBEDDER) as store:
        assert store.get(fid).tags == {"n": 3, "user": "cy"} and store.check().ok
        assert [f.id for f in store.list(where={"tags[user]": "cy"})] == [fid]
        assert (store.update(fid, "Cy's new notes", tags={"mood": "happy"}).tags
                == {"n": 3, "user": "cy", "mood": "happy"})
        assert store.update(fid, tags={"user": None}).tags == {"n": 3, "mood": "happy"}  # and it can be removed
        assert store.check().ok and store.repair().mode == "nothing to repair"
