"""Conversations as memory: each turn one fact, with its speaker, session and place in the session as tags a filter
can use, and the time it was said as the fact's `created_at`; recall(..., context=N) brings each hit's N turns
before and after it, in order.

A turn is stored as "Speaker: text", so both recall modes see who said it ("what did Ada say about Lisbon?"),
with the tags {"session": ..., "turn": n, "speaker": ...} (plus the caller's). Turns are numbered in the order
given, after the highest number the session holds in this scope (read in the write transaction), so a session
remembered in several calls reads as one. No SQL here: the front's writer stores the facts and its list() finds
the neighbours.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Mapping, Sequence

from ..errors import InvalidInput
from .validate import MAX_LIST_LIMIT, check_text

if TYPE_CHECKING:
    from .memory_store import MemoryStore
    from .records import Fact, Recall

SESSION_TAG, TURN_TAG, SPEAKER_TAG = "session", "turn", "speaker"
MAX_SPEAKER_CHARS = 64
MAX_SESSION_CHARS = 128
MAX_CONTEXT = 20


def check_session(session: object) -> str:
    """A session id: 1..MAX_SESSION_CHARS characters, not blank."""
    if not isinstance(session, str) or not session.strip() or len(session) > MAX_SESSION_CHARS:
        raise InvalidInput(f"remember_conversation() expects session= a str of 1 to {MAX_SESSION_CHARS} characters "
                           f"naming the conversation (e.g. 'chat-2026-12-05'), got {session!r:.60}.")
    return session


def check_turns(turns: object) -> list[tuple[str, str, object]]:
    """[(speaker, text, at or None)] from a sequence of {"speaker", "text"[, "at"]} mappings or (speaker, text) pairs.

    Raises:
        InvalidInput: not a non-empty sequence of such turns; a blank or over-long speaker; a bad text.
    """
    if isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence) or not turns:
        raise InvalidInput("remember_conversation() expects turns= a non-empty list of {'speaker': ..., 'text': ...} "
                           f"(optionally 'at': when it was said) or (speaker, text) pairs, got {turns!r:.60}.")
    out = []
    for i, turn in enumerate(turns):
        if isinstance(turn, Mapping):
            unknown = set(turn) - {"speaker", "text", "at"}
            if unknown or "speaker" not in turn or "text" not in turn:
                raise InvalidInput(f"turns[{i}] expects the keys speaker, text and optionally at; got {sorted(turn)}.")
            speaker, text, at = turn["speaker"], turn["text"], turn.get("at")
        elif isinstance(turn, Sequence) and not isinstance(turn, (str, bytes)) and len(turn) == 2:
            (speaker, text), at = turn, None
        else:
            raise InvalidInput(f"turns[{i}] expects {{'speaker': ..., 'text': ...}} or (speaker, text), "
                               f"got {turn!r:.60}.")
        if not isinstance(speaker, str) or not speaker.strip() or len(speaker) > MAX_SPEAKER_CHARS or "\n" in speaker:
            raise InvalidInput(f"turns[{i}] expects a speaker of 1 to {MAX_SPEAKER_CHARS} characters on one line, "
                               f"got {speaker!r:.60}.")
        out.append((speaker.strip(), check_text(text, f"turns[{i}] text"), at))
    return out


def number_turns(items: list, held: list) -> list:
    """New turns (NewFact, numbered 0..) renumbered after the highest turn number of `held`, the session's facts
    already in the store (FactRow)."""
    numbers = [row.tags.get(TURN_TAG) for row in held]
    start = 1 + max((n for n in numbers if isinstance(n, int) and not isinstance(n, bool)), default=-1)
    return [item._replace(tags={**item.tags, TURN_TAG: start + i}) for i, item in enumerate(items)]


def turn_tags(tags: object, session: str, turn: int, speaker: str) -> object:
    """The caller's tags plus the turn's session, number and speaker (the caller may not set those three)."""
    tags = dict(tags or {}) if isinstance(tags, Mapping) or tags is None else tags
    if isinstance(tags, dict):
        taken = sorted({SESSION_TAG, TURN_TAG, SPEAKER_TAG} & set(tags))
        if taken:
            raise InvalidInput(f"remember_conversation() sets the tags {SESSION_TAG}, {TURN_TAG} and {SPEAKER_TAG} "
                               f"itself; drop {taken} from tags=.")
        return {**tags, SESSION_TAG: session, TURN_TAG: turn, SPEAKER_TAG: speaker}
    return tags  # not a mapping: new_fact's tag check names the error


def check_context(context: object) -> int:
    """recall(context=...) checked: 0..MAX_CONTEXT turns."""
    if isinstance(context, bool) or not isinstance(context, int) or not 0 <= context <= MAX_CONTEXT:
        raise InvalidInput(f"recall(context=...) expects a number of turns from 0 to {MAX_CONTEXT}, "
                           f"got {context!r:.40}.")
    return context


def with_context(store: MemoryStore, hits: list["Recall"], n: int) -> list["Recall"]:
    """Each hit that is a conversation turn (session and turn tags) with `context`: the turns of its session
    from n before to n after it, itself included, in order; other hits unchanged."""
    out = []
    for hit in hits:
        session, turn = hit.tags.get(SESSION_TAG), hit.tags.get(TURN_TAG)
        if not n or not isinstance(session, str) or isinstance(turn, bool) or not isinstance(turn, int):
            out.append(hit)
            continue
        # read in the hit's own scope (a parent's view also holds other scopes' sessions of the same name, which
        # once filled the window and left the hit's own turns out), then only that scope's turns
        below = {level: value for level, value in hit.scope.items() if level not in store.scoped_to}
        view = store.scope(**below) if below else store
        near: list[Fact] = view.list(limit=MAX_LIST_LIMIT, where={
            SESSION_TAG: session, TURN_TAG: {"$gte": turn - n, "$lte": turn + n}})
        near = [f for f in near if f.scope == hit.scope]
        out.append(replace(hit, context=tuple(sorted(near, key=lambda f: f.tags[TURN_TAG]))))
    return out


def recall_around(store: MemoryStore, query: str, k: int, args: dict, *, context: object, time_words: bool,
                  now: object) -> list["Recall"]:
    """recall(..., context=, time_words=, now=): the plain recall's hits (`args`: its other arguments), first
    those of the span the query's time words name when time_words (store/timewords.py), each turn hit with its
    neighbouring turns when context > 0."""
    from .timewords import recall_in_span

    n = check_context(context)
    hits = recall_in_span(store, query, k, time_words, now, args) if time_words or now is not None else \
        store.recall(query, k, **args)
    return with_context(store, hits, n) if n else hits
