"""Recall over conversations: one memory per turn, questions about what a speaker said weeks earlier.

What agents keep of a chat is its turns, most of them small talk ("haha, same here"), a few of them facts about the
speaker said in passing ("we finally got a kitten from the shelter, she's called Pixel!"). Asked later, a question
names the speaker and paraphrases the fact ("what animal did Anneke adopt?"). The personal-memory protocol
(personal_data.py) stores facts as statements; this one stores them as they were said, among the small talk and the
other speaker's turns, with a near miss now and then (the other speaker has news of the same kind).

The conversations come from a generator of their own (seeded; its names, values and phrasings are not those of
recipe/personal_corpus.py, which writes the training text, nor of personal_data.py): CONVERSATIONS pairs of people,
SESSIONS sessions a week apart, each stored with `remember_conversation` in the pair's own scope
(`scope(user=pair)`), every question asked in that scope and across the whole store. Reported per mode: the
evidence turn first, in the top 10 (recall@10) and MRR@10, for lexical, vector, hybrid without the rerank and
recall's default (hybrid, short turns reranked: store/rerank.py). Nothing is fitted on it.

    python benchmarks/conversation_recall.py [--minilm] [--json out.json]

--minilm adds all-MiniLM-L6-v2 as the store's embedder (its rule: benchmarks/results/fusion_minilm.json): the
reference row.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Sequence

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

K = 10
CONVERSATIONS = 12
SESSIONS = 5
NEWS_PER_SESSION = 3  # facts a session brings, spread over its two speakers
PAIRS = (("Anneke", "Rui"), ("Birgit", "Emeka"), ("Caoimhe", "Dario"), ("Dagny", "Farid"), ("Elif", "Gunnar"),
         ("Fumiko", "Hamza"), ("Giedre", "Ivo"), ("Halvard", "Jaya"), ("Ilse", "Kenji"), ("Jurgita", "Lamar"),
         ("Katla", "Mehmet"), ("Liesel", "Nnamdi"))

# kind -> (what was said (first person, in passing), the question asked later, {slot: values})
NEWS: dict[str, tuple[tuple[str, ...], str, dict[str, tuple[str, ...]]]] = {
    "pet": (("we finally got a {pet} from the shelter, we called it {petname}!",
             "guess who has a {pet} now :) {petname} is asleep on my lap"),
            "what animal did {who} adopt?", {"pet": ("kitten", "puppy", "rabbit", "tortoise", "ferret", "budgie"),
                                             "petname": ("Pixel", "Mochi", "Waffles", "Pepper", "Nugget", "Biscuit")}),
    "job": (("big news, I accepted the offer to work as a {job}!", "first week as a {job} done, exhausted but happy"),
            "what is {who}'s new occupation?",
            {"job": ("dental hygienist", "air traffic controller", "sommelier", "park ranger", "court stenographer",
                     "glassblower")}),
    "trip": (("I just booked flights to {city}, leaving in three weeks", "packing for {city} tonight, so excited"),
             "which country is {who} travelling to?",
             {"city": ("Hanoi", "Lima", "Tbilisi", "Nairobi", "Reykjavik", "Montevideo")}),
    "hobby": (("I signed up for {hobby} classes on Thursday evenings", "my {hobby} teacher says I'm a natural haha"),
              "what new pastime has {who} taken up?",
              {"hobby": ("pottery", "fencing", "salsa", "woodcarving", "bouldering", "calligraphy")}),
    "health": (("the doctor says it's {condition}, so I'm stuck resting for a while",
                "still recovering from the {condition}, slowly getting better"),
               "what was {who} diagnosed with?",
               {"condition": ("pneumonia", "tonsillitis", "a slipped disc", "shingles", "a torn ligament", "anaemia")}),
    "move": (("we signed the lease on a place in {town}, moving next month", "boxes everywhere, the move to {town} is "
              "on Friday"), "where is {who} going to live?",
             {"town": ("Ghent", "Aarhus", "Ljubljana", "Tampere", "Salzburg", "Porto Alegre")}),
    "family": (("my {relative} just had a baby girl, I'm an auntie now!", "visited my {relative}'s newborn today, so "
                "tiny"), "who in {who}'s family just had a baby?",
               {"relative": ("sister", "brother", "cousin", "best friend")}),
    "diet": (("I've gone {diet}, so no more {food} for me", "day ten of being {diet}, I miss {food} so much"),
             "what way of eating is {who} trying?",
             {"diet": ("vegan", "pescatarian", "gluten-free", "keto"),
              "food": ("cheese", "steak", "bread", "burgers")}),
    "instrument": (("I bought a second-hand {instrument} and practise every night",
                    "my neighbours hate my {instrument} practice lol"),
                   "which instrument is {who} learning?",
                   {"instrument": ("cello", "banjo", "trombone", "harp", "accordion", "clarinet")}),
    "car": (("traded the old hatchback in for a {vehicle}", "the new {vehicle} is so much nicer to drive"),
            "what does {who} drive these days?",
            {"vehicle": ("pickup truck", "camper van", "electric scooter", "vintage Beetle", "minivan")}),
    "book": (("I couldn't put down {book} last night, stayed up till 3", "finished {book}, what an ending"),
             "which novel was {who} hooked on?",
             {"book": ("Middlemarch", "Dune", "Rebecca", "The Remains of the Day", "Beloved", "Kindred")}),
    "sport": (("our {sport} team won the local league on Saturday!", "sore from {sport} practice again"),
              "which game does {who} compete in?",
              {"sport": ("handball", "water polo", "ultimate frisbee", "curling", "netball", "lacrosse")}),
    "exam": (("I passed my {exam}!!", "the {exam} results came in, I passed"),
             "what test did {who} get through?",
             {"exam": ("driving test", "bar exam", "citizenship test", "pilot's licence test", "final nursing exam")}),
    "allergy": (("turns out I'm allergic to {allergen}, which explains the rashes",
                 "had to skip dessert, it had {allergen} in it"),
                "what can't {who} eat?",
                {"allergen": ("hazelnuts", "sesame", "shellfish", "celery", "lupin", "buckwheat")}),
}
REACTIONS = ("no way, congrats!", "oh wow, that's huge", "aw I'm sorry, hope it gets better", "that sounds amazing",
             "send me pictures!", "haha of course you did", "wait, really?", "good for you, honestly",
             "you never told me that", "ooh tell me more")
SMALL_TALK = ("hey! how's your week going?", "not bad, busy with work mostly", "same here, it's been a lot",
              "did you see the match last night?", "the weather has been awful lately", "haha yes",
              "anyway, I should get going", "talk soon!", "morning! did you sleep ok?", "ugh, Mondays",
              "what are you up to this weekend?", "probably just relaxing at home", "lol same",
              "I'm making pasta tonight", "have you watched anything good lately?", "not really, any tips?",
              "ok, gotta run, bye!", "miss you, we should meet up", "yes! let's plan something",
              "sorry, I was in a meeting", "no worries", "the traffic this morning was ridiculous")


@dataclass
class Conversation:
    pair: str  # the scope: "anneke-rui"
    sessions: list[list[tuple[str, str]]] = field(default_factory=list)  # [(speaker, text)] per session
    questions: list[tuple[str, tuple[int, int]]] = field(default_factory=list)  # (question, (session, turn))


def _news(rng: random.Random, who: str, kind: str) -> tuple[str, str]:
    said, question, slots = NEWS[kind]
    values = {slot: rng.choice(options) for slot, options in slots.items()}
    return rng.choice(said).format(**values), question.format(who=who)


def generate(seed: int = 0, conversations: int = CONVERSATIONS) -> list[Conversation]:
    """`conversations` conversations of SESSIONS sessions (seeded)."""
    rng = random.Random(f"conversation-dev-{seed}")
    out = []
    for a, b in PAIRS[:conversations]:
        conv = Conversation(f"{a.lower()}-{b.lower()}")
        kinds = {a: rng.sample(sorted(NEWS), SESSIONS * NEWS_PER_SESSION // 2 + 1),
                 b: rng.sample(sorted(NEWS), SESSIONS * NEWS_PER_SESSION // 2 + 1)}
        for s in range(SESSIONS):
            turns: list[tuple[str, str]] = []
            speakers = (a, b) if s % 2 == 0 else (b, a)
            turns.append((speakers[0], rng.choice(SMALL_TALK[:1] + SMALL_TALK[8:9])))
            turns.append((speakers[1], rng.choice(SMALL_TALK[1:3])))
            for n in range(NEWS_PER_SESSION):
                who = speakers[n % 2]
                other = speakers[1 - n % 2]
                kind = kinds[who].pop()
                text, question = _news(rng, who, kind)
                conv.questions.append((question, (s, len(turns))))
                turns.append((who, text))
                turns.append((other, rng.choice(REACTIONS)))
                for _ in range(rng.randint(1, 3)):
                    turns.append((rng.choice(speakers), rng.choice(SMALL_TALK)))
            turns.append((speakers[0], rng.choice(("anyway, I should get going", "ok, gotta run, bye!"))))
            turns.append((speakers[1], "talk soon!"))
            conv.sessions.append(turns)
        out.append(conv)
    return out


START = datetime(2026, 3, 2, 19, 0, tzinfo=timezone.utc)


def session_id(conv: Conversation, s: int) -> str:
    return f"{conv.pair}-{s}"


def build(path: Path, embedder: object, convs: Sequence[Conversation]):
    """A store at `path` with every conversation's sessions in its pair's scope, a week apart. Returns (store,
    {(session id, turn): fact id})."""
    from evermind_memory import MemoryStore
    from personal_conversations import store_sessions

    store = MemoryStore(path, embedder)
    return store, store_sessions(store, [(conv.pair, session_id(conv, s), START + timedelta(days=7 * s), turns)
                                 for conv in convs for s, turns in enumerate(conv.sessions)])


WAYS = {"lexical": {"mode": "lexical"}, "vector": {"mode": "vector"},
        "hybrid, no rerank": {"mode": "hybrid", "rerank": False}, "default": {}}


def run(embedder: object, convs: Sequence[Conversation]) -> dict:
    """{way: {scope: {"first", "top10", "mrr", "asks"}}} over every question, in its pair's scope and store-wide."""
    out = {way: {scope: {"first": 0, "top10": 0, "mrr": 0.0, "asks": 0} for scope in ("scoped", "store-wide")}
           for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="conversation_") as tmp:
        store, ids = build(Path(tmp) / "c.db", embedder, convs)
        try:
            for conv in convs:
                for question, (s, t) in conv.questions:
                    gold = ids[(session_id(conv, s), t)]
                    for scope, view in (("scoped", store.scope(user=conv.pair)), ("store-wide", store)):
                        for way, kw in WAYS.items():
                            found = [h.id for h in view.recall(question, k=K, **kw)]
                            row = out[way][scope]
                            row["asks"] += 1
                            if gold in found:
                                rank = found.index(gold) + 1
                                row["first"] += rank == 1
                                row["top10"] += 1
                                row["mrr"] += 1.0 / rank
        finally:
            store.close()
    return out


def table(label: str, res: dict) -> str:
    lines = [f"{label}", "| way | scoped: first / recall@10 / MRR@10 | store-wide: first / recall@10 / MRR@10 |",
             "|---|---|---|"]
    for way, by_scope in res.items():
        cells = [f"{r['first']} / {r['top10'] / r['asks']:.3f} / {r['mrr'] / r['asks']:.3f}"
                 for r in by_scope.values()]
        lines.append(f"| {way} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    from recall_quality import load_embedder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minilm", action="store_true", help="add all-MiniLM-L6-v2 in our store as the reference row")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    convs = generate(args.seed)
    turns = sum(len(t) for c in convs for t in c.sessions)
    questions = sum(len(c.questions) for c in convs)
    print(f"{len(convs)} conversations, {turns} turns, {questions} questions (each asked in its scope and store-wide)")
    embedders = [("ours", load_embedder(None, None))]
    if args.minilm:
        from personal_recall import minilm_embedder

        embedders.append(("MiniLM in our store", minilm_embedder()))
    out = {}
    for label, emb in embedders:
        res = run(emb, convs)
        out[label] = {"fingerprint": emb.fingerprint, "results": res}
        print(table(f"{label} ({emb.fingerprint})", res))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
