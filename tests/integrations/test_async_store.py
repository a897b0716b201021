"""AsyncMemoryStore: every public MemoryStore method has an async twin with its signature and behaviour, calls run
in worker threads, and a cancelled await never leaves half a write nor hands its result to another call.

The shipped model everywhere; GateEmbedder wraps it to hold a call inside the embedder while a test cancels.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from pathlib import Path

import pytest

from evermind_memory import AsyncMemoryStore, EvermindError, FactNotFound, InvalidInput, MemoryStore, default_embedder


class GateEmbedder:
    """The shipped model, except that embedding a text containing "GATE" waits until `release` is set."""

    def __init__(self) -> None:
        self.inner = default_embedder()
        self.dimensions, self.fingerprint = self.inner.dimensions, self.inner.fingerprint
        self.entered, self.release = threading.Event(), threading.Event()
        self.threads: dict[str, str] = {}  # text -> the name of the thread that embedded it

    def embed(self, text):
        return self.embed_many([text])[0]

    def embed_many(self, texts):
        self.threads.update({t: threading.current_thread().name for t in texts})
        if any("GATE" in t for t in texts):
            self.entered.set()
            assert self.release.wait(30), "the test never released the gate"
        return self.inner.embed_many(texts)


def public_methods() -> list[str]:
    return [name for name in dir(MemoryStore)
            if not name.startswith("_") and inspect.isfunction(inspect.getattr_static(MemoryStore, name))]


def public_properties() -> list[str]:
    return [name for name in dir(MemoryStore)
            if not name.startswith("_") and isinstance(inspect.getattr_static(MemoryStore, name), property)]


def test_every_public_method_has_an_async_twin_with_the_same_signature() -> None:
    methods = public_methods()
    assert {"remember", "recall", "forget_where", "clear", "scope", "sweep", "compact", "close"} <= set(methods)
    for name in methods:
        twin = getattr(AsyncMemoryStore, name)
        assert inspect.signature(twin).parameters == inspect.signature(getattr(MemoryStore, name)).parameters, name
        assert inspect.iscoroutinefunction(twin) == (name != "scope"), name  # scope returns a view at once
    for name in public_properties():
        assert isinstance(inspect.getattr_static(AsyncMemoryStore, name), property), name


# One real call per public method, made through the async twin; each returns what the sync call returned (or
# raises what it raised). A method added to MemoryStore fails test_the_call_table_covers_every_method until a
# call is added here.
async def _calls(a: AsyncMemoryStore, s: MemoryStore, tmp: Path) -> dict[str, object]:
    fid = await a.remember("Ada prefers green tea", tags={"person": "ada", "n": 2}, source="chat")
    other = await a.remember("Bob's flight is on Tuesday", tags={"person": "bob"})
    out: dict[str, object] = {"remember": fid}
    out["remember_many"] = await a.remember_many(["one fact", "two facts"], tags={"batch": True})
    out["flush"] = await a.flush()
    out["get"] = (await a.get(fid)) == s.get(fid)
    out["list"] = [f.id for f in await a.list(where={"person": "ada"})] == [fid]
    out["count"] = (await a.count(), s.count())
    out["recall"] = ([h.id for h in await a.recall("what does Ada drink?", k=2)]
                     == [h.id for h in s.recall("what does Ada drink?", k=2)])
    out["update"] = (await a.update(fid, tags={"person": "ada", "n": 3})).tags["n"]
    out["history"] = [c.op for c in await a.history(fid)]
    out["feedback"] = await a.feedback("what does Ada drink?", fid)
    out["supersede"] = s.get(await a.supersede(other, "Bob's flight moved to Wednesday")).text
    out["forget"] = await a.forget(out["remember_many"][0])
    out["forget_where"] = await a.forget_where(where={"batch": True})
    out["duplicates"] = await a.duplicates()
    out["info"] = (await a.info())["facts"]
    out["stats"] = (await a.stats()).facts
    out["check"] = (await a.check()).ok
    out["rebuild_index"] = await a.rebuild_index()
    out["reembed"] = await a.reembed()
    out["sweep"] = await a.sweep()
    out["compact"] = (await a.compact(keep_history=0)).facts
    out["backup"] = (await a.backup(tmp / "backup.db")).exists()
    out["export"] = await a.export(tmp / "facts.jsonl")
    out["import_"] = await a.import_(tmp / "facts.jsonl")
    out["repair"] = type(await a.repair()).__name__
    out["adapter_history"] = await a.adapter_history()
    for name, args in (("adapt_now", ("not a policy",)), ("start_adaptation", ("not a policy",)),
                       ("rollback_adapter", ("no-such-adapter",))):
        with pytest.raises(EvermindError) as got:
            await getattr(a, name)(*args)
        with pytest.raises(type(got.value)) as want:
            getattr(s, name)(*args)
        out[name] = str(got.value) == str(want.value)
    ada = a.scope(user="ada")
    await ada.remember("Ada's own scoped fact")
    out["scope"] = (await ada.count(), s.scope(user="ada").count())
    turns = await ada.remember_conversation([("Ada", "I like oolong"), ("Assistant", "Noted")], session="s1")
    out["remember_conversation"] = [s.get(t).tags["turn"] for t in turns]
    out["clear"] = await a.clear(confirm=True)
    out["close"] = None  # closed below, through aclose's alias
    return out


def test_the_call_table_covers_every_method_and_each_twin_does_what_the_method_does(tmp_path: Path) -> None:
    async def main() -> dict[str, object]:
        a = await AsyncMemoryStore.open(tmp_path / "a.db")
        try:
            return await _calls(a, a.store, tmp_path)
        finally:
            await a.close()
            assert a.store.path.endswith("a.db")

    out = asyncio.run(main())
    assert sorted(out) == sorted(public_methods())
    assert out["get"] and out["list"] and out["recall"] and out["adapt_now"] and out["rollback_adapter"]
    assert out["count"] == (4, 4) and out["update"] == 3 and out["history"] == ["remember", "update"]
    assert out["supersede"] == "Bob's flight moved to Wednesday" and out["forget_where"] == 1
    assert out["check"] is True and out["backup"] is True and out["export"] == 2 and out["scope"] == (1, 1)
    assert out["clear"] == 5 and out["repair"] == "RepairReport" and out["remember_conversation"] == [0, 1]


def test_calls_run_in_the_worker_threads_not_the_event_loop(tmp_path: Path) -> None:
    gate = GateEmbedder()
    gate.release.set()

    async def main() -> None:
        async with AsyncMemoryStore(tmp_path / "t.db", gate, background_embedding=False) as a:
            await a.remember("a fact embedded inside the call")
            assert a.path == str(tmp_path / "t.db") and a.read_only is False and a.scoped_to == {}

    asyncio.run(main())
    assert gate.threads["a fact embedded inside the call"].startswith("evermind-async")


def _reopen(path: Path) -> MemoryStore:
    return MemoryStore(path, read_only=True)


def test_a_cancelled_remember_runs_to_its_end_and_is_stored_once(tmp_path: Path) -> None:
    gate = GateEmbedder()
    db = tmp_path / "c.db"

    async def main() -> None:
        a = AsyncMemoryStore(db, gate, background_embedding=False)
        task = asyncio.create_task(a.remember("GATE: Ada's flight is on Tuesday", tags={"person": "ada"}))
        assert await asyncio.to_thread(gate.entered.wait, 30)  # the write is inside the embedder now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release.set()
        await a.aclose()  # waits for the thread

    asyncio.run(main())
    with _reopen(db) as s:
        facts = s.list()
        assert [(f.text, f.tags) for f in facts] == [("GATE: Ada's flight is on Tuesday", {"person": "ada"})]


def test_a_call_cancelled_before_its_thread_starts_still_runs(tmp_path: Path) -> None:
    gate = GateEmbedder()
    db = tmp_path / "q.db"

    async def main() -> None:
        a = AsyncMemoryStore(db, gate, max_workers=1, background_embedding=False)
        first = asyncio.create_task(a.remember("GATE holds the only worker"))
        assert await asyncio.to_thread(gate.entered.wait, 30)
        queued = asyncio.create_task(a.remember_many(["queued one", "queued two"], tags={"q": 1}))
        await asyncio.sleep(0.05)
        queued.cancel()  # not started: its worker is busy
        with pytest.raises(asyncio.CancelledError):
            await queued
        gate.release.set()
        assert isinstance(await first, str)
        await a.aclose()

    asyncio.run(main())
    with _reopen(db) as s:
        assert sorted(f.text for f in s.list()) == ["GATE holds the only worker", "queued one", "queued two"]


def test_results_never_leak_between_calls_when_some_are_cancelled(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncMemoryStore(tmp_path / "r.db", max_workers=3) as a:
            ids = [await a.remember(f"fact number {i}", tags={"i": i}) for i in range(30)]
            tasks = [asyncio.create_task(a.get(fid)) for fid in ids]
            await asyncio.sleep(0)
            for task in tasks[::3]:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for i, (fid, got) in enumerate(zip(ids, results)):
                if isinstance(got, asyncio.CancelledError):
                    continue
                assert got.id == fid and got.tags == {"i": i}
            assert sum(not isinstance(r, asyncio.CancelledError) for r in results) >= 20

    asyncio.run(main())


def test_errors_come_through_and_closed_stores_refuse(tmp_path: Path) -> None:
    async def main() -> None:
        a = await AsyncMemoryStore.open(tmp_path / "e.db")
        with pytest.raises(FactNotFound):
            await a.get("nope")
        with pytest.raises(InvalidInput, match="expected k >= 1"):
            await a.recall("tea", k=0)
        view = a.scope(user="ada")
        await view.remember("Ada's fact")
        await view.aclose()
        with pytest.raises(EvermindError, match="closed"):
            await view.count()
        assert await a.count() == 1  # closing a view leaves the store open
        await a.aclose()
        await a.aclose()  # idempotent
        with pytest.raises(EvermindError, match="closed"):
            await a.count()
        with pytest.raises(EvermindError, match="closed"):
            a.store.count()  # the wrapped store is closed too

    asyncio.run(main())


def test_wrapping_an_open_store_and_bad_arguments(tmp_path: Path) -> None:
    with MemoryStore(tmp_path / "w.db") as s:
        with pytest.raises(InvalidInput, match="already open"):
            AsyncMemoryStore(s, durability="full")
        with pytest.raises(InvalidInput, match="max_workers"):
            AsyncMemoryStore(s, max_workers=0)

        async def main() -> None:
            a = AsyncMemoryStore(s.scope(user="ada"))
            await a.remember("scoped through the async view")
            assert (await a.list())[0].scope == {"user": "ada"}
            await a.aclose()

        asyncio.run(main())
        assert s.count() == 1  # the view's close left the store open
