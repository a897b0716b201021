"""Conversations as memory, measured: each turn one memory (MemoryStore.remember_conversation), questions about
what the person said, with and without recall(..., context=N).

The conversations are generated from the personal dev set's people and values (benchmarks/personal_data.py, never
trained on): for each of its people, sessions on different days in which the assistant asks about one kind of
fact ("Any trips coming up?") and the person answers in the first person ("I've booked a week in Porto for May."),
between greetings and small talk. The question asked later is the dev set's third-person question for that kind
("when is Ingrid going to Portugal?"), in the person's scope and store-wide. The answer turn shares few words with
it; often the assistant's question turn matches better, and the answer is the turn after it.

Reported: the answer turn first and in the top 5 hits, and "reachable": in the top 5 hits or, with context=N, in
their neighbouring turns. A second part asks about time: each person talks about the same kind of thing in October
and in November with different answers (two travel plans), and the question names the month ("... in
October?"): answer turn first and in the top 5, with recall(..., time_words=True) against without. Nothing is
fitted here.

    python benchmarks/personal_conversations.py [--model M.evlm --tokenizer T.json] [--context 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Sequence

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from evermind_memory import MemoryStore  # noqa: E402
from personal_data import CATEGORIES, DEV_PEOPLE, _fill  # noqa: E402

PROMPTS = {  # what the assistant asks, per kind of fact (the person's answer is the kind's first-person fact)
    "travel": "Any trips coming up?", "home": "Where are you living these days?",
    "drink": "What can I get you from the café?", "allergy": "Anything you can't eat?",
    "job": "What are you doing for work now?", "pet": "Do you have any animals?",
    "hobby": "What do you get up to at the weekend?", "health": "How's your health been?",
    "vehicle": "How do you get to the office?", "music": "Do you play anything?",
    "birthday": "When's your birthday again?", "language": "Which languages do you speak?",
    "sport": "Do you do any sport?", "study": "What did you study?", "reading": "Read anything good lately?",
    "family": "How's the family?", "partner": "Are you seeing anyone?", "children": "Do you have kids?",
    "appointment": "Anything on your calendar this week?", "dislike": "Anything you really can't stand?",
    "seat": "Window or aisle when you fly?",
}
OPENERS = ("Good morning!", "Hi, how are you today?", "Hello again!", "Hey, good to hear from you.")
CLOSERS = ("Thanks, that's helpful.", "Got it, I'll remember that.", "Great, thanks for telling me.", "Noted!")
SMALL_TALK = ("The weather has been awful this week.", "I'm a bit tired today, long week.", "Ha, fair enough.",
              "Sorry, I was on another call.", "Okay.", "Let me think for a second.")
K = 5


def conversations(seed: int = 0, people: int = 20, sessions: int = 3, per_session: int = 3):
    """(sessions, questions): sessions as (user, session id, day, turns); questions as dicts with the user, the
    question text and the (session id, turn index) of the answer turn."""
    rng = random.Random(f"personal-conversations-{seed}")
    out, questions = [], []
    day0 = datetime(2026, 10, 1, 9, 0, tzinfo=timezone.utc)
    for person in DEV_PEOPLE[:people]:
        slots = _fill(rng, person)
        kinds = rng.sample(sorted(PROMPTS), sessions * per_session)
        for s in range(sessions):
            sid = f"{person.lower()}-{s}"
            day = day0 + timedelta(days=rng.randrange(60), hours=rng.randrange(10))
            turns = [("Assistant", rng.choice(OPENERS)), (person, rng.choice(SMALL_TALK))]
            for kind in kinds[s * per_session:(s + 1) * per_session]:
                spec = CATEGORIES[kind]
                turns.append(("Assistant", PROMPTS[kind]))
                if rng.random() < 0.3:
                    turns.append((person, rng.choice(SMALL_TALK)))
                answer = rng.choice(spec["facts1"]).format(**slots)
                turns.append((person, answer[0].upper() + answer[1:]))
                questions.append({"user": person.lower(), "question": rng.choice(spec["questions"]).format(**slots),
                                  "session": sid, "turn": len(turns) - 1, "kind": kind})
                turns.append(("Assistant", rng.choice(CLOSERS)))
            out.append((person.lower(), sid, day, turns))
    return out, questions


TIME_KINDS = ("travel", "drink", "hobby", "vehicle", "reading", "home")
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)


def time_conversations(seed: int = 0, people: int = 20):
    """Sessions in October and November about the same kind of thing with different answers, and questions that
    name the month. Returns (sessions, questions) as conversations() does."""
    rng = random.Random(f"personal-conversations-time-{seed}")
    out, questions = [], []
    for person in DEV_PEOPLE[:people]:
        kind = rng.choice(TIME_KINDS)
        spec = CATEGORIES[kind]
        for month, name in ((10, "October"), (11, "November")):
            slots = _fill(rng, person)
            sid = f"{person.lower()}-{name.lower()}"
            day = datetime(2026, month, rng.randint(3, 26), 10, 0, tzinfo=timezone.utc)
            answer = rng.choice(spec["facts1"]).format(**slots)
            turns = [("Assistant", rng.choice(OPENERS)), ("Assistant", PROMPTS[kind]),
                     (person, answer[0].upper() + answer[1:]), ("Assistant", rng.choice(CLOSERS))]
            question = rng.choice(spec["questions"]).format(**slots)
            questions.append({"user": person.lower(), "question": f"{question[:-1]} in {name}?", "session": sid,
                              "turn": 2, "kind": kind})
            out.append((person.lower(), sid, day, turns))
    return out, questions


def store_sessions(store, sessions) -> dict:
    """Each session (user, session id, day, [(speaker, text)]) remembered as a conversation in the user's scope, a
    minute a turn from `day`. Returns {(session id, turn): fact id}."""
    ids = {}
    for user, sid, day, turns in sessions:
        rows = [{"speaker": sp, "text": tx, "at": day + timedelta(minutes=i)} for i, (sp, tx) in enumerate(turns)]
        for i, fid in enumerate(store.scope(user=user).remember_conversation(rows, session=sid)):
            ids[sid, i] = fid
    return ids


def run_time(embedder: object, seed: int = 0) -> dict:
    sessions, questions = time_conversations(seed)
    out = {}
    with tempfile.TemporaryDirectory(prefix="conversations_t_") as tmp, \
            MemoryStore(Path(tmp) / "t.db", embedder) as store:
        ids = store_sessions(store, sessions)
        for mode in ("lexical", "vector", "hybrid"):
            for words in (False, True):
                first = top = 0
                for q in questions:
                    hits = store.scope(user=q["user"]).recall(q["question"], k=K, mode=mode, time_words=words,
                                                             now=NOW if words else None)
                    got = [h.id for h in hits]
                    want = ids[q["session"], q["turn"]]
                    first += bool(got) and got[0] == want
                    top += want in got
                out[f"scoped/{mode}/time_words={words}"] = {"first": first, "top5": top, "of": len(questions)}
    return out


def run(embedder: object, contexts: Sequence[int], seed: int = 0, people: int = 20) -> dict:
    sessions, questions = conversations(seed, people=people)
    with tempfile.TemporaryDirectory(prefix="conversations_") as tmp, \
            MemoryStore(Path(tmp) / "c.db", embedder) as store:
        ids = store_sessions(store, sessions)
        res = {"turns": len(ids), "questions": len(questions), "results": {}}
        for scope in ("scoped", "all"):
            for mode in ("lexical", "vector", "hybrid", "hybrid-no-rerank"):  # hybrid: recall's default
                for n in contexts:
                    first = top = reach = 0
                    for q in questions:
                        view = store.scope(user=q["user"]) if scope == "scoped" else store
                        hits = view.recall(q["question"], k=K, mode=mode.split("-")[0], context=n,
                                           rerank=False if mode == "hybrid-no-rerank" else None)
                        want = ids[q["session"], q["turn"]]
                        got = [h.id for h in hits]
                        first += bool(got) and got[0] == want
                        top += want in got
                        reach += want in got or any(f.id == want for h in hits for f in h.context)
                    res["results"][f"{scope}/{mode}/context={n}"] = {
                        "first": first, "top5": top, "reachable": reach, "of": len(questions)}
    return res


def main() -> dict:
    from recall_quality import load_embedder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--context", type=int, default=1, help="the context width compared with none")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    emb = load_embedder(args.model, args.tokenizer)
    res = run(emb, (0, args.context))
    res["time"] = run_time(emb)
    res["fingerprint"] = emb.fingerprint
    print(f"conversations as memory: {res['turns']} turns, {res['questions']} questions, {emb.fingerprint}")
    print(f"  {'scope/mode/context':<28}{'first':>7}{'top 5':>7}{'reachable':>11}  (of {res['questions']})")
    for name, r in res["results"].items():
        print(f"  {name:<28}{r['first']:>7}{r['top5']:>7}{r['reachable']:>11}")
    print(f"questions naming the month of one of two sessions about the same thing (of {len(time_conversations()[1])})")
    for name, r in res["time"].items():
        print(f"  {name:<34}{r['first']:>7}{r['top5']:>7}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()
