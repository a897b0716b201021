"""Conversations as memory (issue: personal recall): remember(at=...), remember_conversation() and
recall(..., context=N), through MemoryStore on both engines."""

from __future__ import annotations

import threading

from datetime import datetime, timedelta, timezone

import pytest

from evermind_memory.errors import InvalidInput

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
CHAT = [
    {"speaker": "Assistant", "text": "Any plans for the week?", "at": T0},
    {"speaker": "Ada", "text": "I'm flying to Lisbon on Tuesday to see my cousin.", "at": T0 + timedelta(minutes=1)},
    ("Assistant", "Lovely, how long are you staying?"),
    ("Ada", "Just five days, back on Sunday evening."),
    ("Assistant", "Safe travels!"),
]


def test_remember_at_sets_when_a_fact_was_said(store):
    fid = store.remember("Ada moved to Porto.", at="2026-03-01T10:00:00+01:00")
    assert store.get(fid).created_at == datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
    ids = store.remember_many(["a", "b"], at=T0)
    assert {store.get(i).created_at for i in ids} == {T0}
    assert [f.id for f in store.list(since=T0 - timedelta(days=1), until=T0 + timedelta(days=1))] == ids


@pytest.mark.parametrize("at, message", [
    (datetime.now(timezone.utc) + timedelta(days=2), "at most now"),
    (datetime(2026, 1, 1), "timezone"),
    ("yesterday", "ISO 8601"),
    (12, "datetime"),
])
def test_remember_at_refuses_the_future_and_what_is_not_a_time(store, at, message):
    with pytest.raises(InvalidInput, match=message):
        store.remember("x", at=at)
    assert store.count() == 0


def test_remember_at_is_for_new_facts_only(store):
    with pytest.raises(InvalidInput, match="new fact only"):
        store.remember("x", id="note-1", at=T0)


def test_a_conversation_is_stored_turn_by_turn_with_speaker_session_and_time(store):
    ada = store.scope(user="ada")
    ids = ada.remember_conversation(CHAT, session="chat-1", tags={"channel": "app"}, source="chat")
    facts = [ada.get(i) for i in ids]
    assert [f.text for f in facts][:2] == ["Assistant: Any plans for the week?",
                                           "Ada: I'm flying to Lisbon on Tuesday to see my cousin."]
    assert [f.tags["turn"] for f in facts] == [0, 1, 2, 3, 4]
    assert {f.tags["session"] for f in facts} == {"chat-1"} and {f.tags["channel"] for f in facts} == {"app"}
    assert [f.tags["speaker"] for f in facts] == ["Assistant", "Ada", "Assistant", "Ada", "Assistant"]
    assert facts[1].created_at == T0 + timedelta(minutes=1) and facts[0].source == "chat"
    assert ada.count(where={"speaker": "Ada"}) == 2 and store.scope(user="bob").count() == 0
    more = ada.remember_conversation([("Ada", "Actually I'll stay a whole week.")], session="chat-1")
    assert ada.get(more[0]).tags["turn"] == 5  # a session remembered in two calls reads as one
    other = store.scope(user="bob").remember_conversation([("Bob", "Hi")], session="chat-1")
    assert store.get(other[0]).tags["turn"] == 0  # numbered within its own scope


@pytest.mark.parametrize("turns, session, tags, message", [
    ([], "s", None, "non-empty"),
    ("Ada: hi", "s", None, "non-empty"),
    ([{"speaker": "Ada"}], "s", None, "keys"),
    ([{"speaker": "Ada", "text": "hi", "mood": "ok"}], "s", None, "keys"),
    ([("", "hi")], "s", None, "speaker"),
    ([("Ada\nBob", "hi")], "s", None, "speaker"),
    ([("Ada", "")], "s", None, "text"),
    ([("Ada", "hi")], "", None, "session"),
    ([("Ada", "hi")], 7, None, "session"),
    ([("Ada", "hi")], "s", {"turn": 3}, "sets the tags"),
    ([{"speaker": "Ada", "text": "hi", "at": "tomorrow"}], "s", None, "ISO 8601"),
])
def test_bad_conversations_are_refused_and_nothing_is_stored(store, turns, session, tags, message):
    with pytest.raises(InvalidInput, match=message):
        store.remember_conversation(turns, session=session, tags=tags)
    assert store.count() == 0


def test_recall_with_context_returns_the_neighbouring_turns_in_order(store):
    ada = store.scope(user="ada")
    ids = ada.remember_conversation(CHAT, session="chat-1")
    ada.remember("Ada's passport number ends in 42.")
    ada.remember_conversation([("Ada", "Lisbon was wonderful.")], session="chat-2")
    hits = ada.recall("how long are you staying", k=6, mode="lexical", context=1)
    by_id = {h.id: h for h in hits}
    staying = by_id[ids[2]]
    assert [f.id for f in staying.context] == ids[1:4]
    assert all(h.context == () for h in hits if "session" not in h.tags)  # not a turn: no context
    edge = ada.recall("Any plans for the week", k=1, mode="lexical", context=2)[0]
    assert edge.id == ids[0] and [f.id for f in edge.context] == ids[0:3]  # the session's start cuts the window
    assert all(f.tags["session"] == "chat-1" for h in hits if h.tags.get("session") == "chat-1" for f in h.context)
    plain = ada.recall("how long are you staying", k=6, mode="lexical")
    assert [h.id for h in plain] == [h.id for h in hits] and all(h.context == () for h in plain)


@pytest.mark.parametrize("context", [-1, 21, 1.5, True, "2"])
def test_recall_refuses_a_bad_context(store, context):
    store.remember("x")
    with pytest.raises(InvalidInput, match="context"):
        store.recall("x", context=context)


def test_turn_numbers_never_repeat_after_a_forget_or_between_threads(store):
    """Turns were numbered by counting the session's facts outside the write: a forgotten turn, or two threads
    appending at once, gave two turns one number (and a context window the wrong neighbours)."""
    ada = store.scope(user="ada")
    ids = ada.remember_conversation([("Ada", "one apple"), ("Bot", "two bananas"), ("Ada", "three cherries")],
                                    session="s1")
    ada.forget(ids[1])
    ada.remember_conversation([("Bot", "four dates"), ("Ada", "five elderberries")], session="s1")
    assert sorted(f.tags["turn"] for f in ada.list(where={"session": "s1"})) == [0, 2, 3, 4]
    store.remember_conversation([("Root", "the root's own session of that name")], session="s1")
    assert [f.tags["turn"] for f in store.list(where={"session": "s1"}) if f.scope == {}] == [0]  # its own numbers

    def append(n: int) -> None:
        for j in range(5):
            ada.remember_conversation([("T", f"thread {n} turn {j}")], session="race")

    threads = [threading.Thread(target=append, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(f.tags["turn"] for f in ada.list(where={"session": "race"}, limit=100)) == list(range(20))


def test_context_from_a_parent_scope_reads_the_hits_own_session(store):
    """Another scope's session of the same name once filled the context window read from the parent's view."""
    store.scope(user="bob").remember_conversation([("Bob", f"bob line {i}") for i in range(5)], session="chat-1")
    store.scope(user="ada").remember_conversation([("Ada", f"ada line {i} about topic{i}") for i in range(5)],
                                                  session="chat-1")
    for view in (store, store.scope(user="ada")):
        hit = view.recall("ada line 2 about topic2", k=1, context=1)[0]
        assert [f.text for f in hit.context] == [f"Ada: ada line {i} about topic{i}" for i in (1, 2, 3)]
