"""The personal-memory dev protocol's data: facts about people and the questions people ask about them.

What agents store is mostly facts about the people they talk to ("Ingrid's flight to Porto leaves Friday") and what
was said in conversation; what they are asked shares few words with it ("when is Ingrid going to Portugal?"). The
manual sources never test that, so this module builds a dev set of it, three parts:

- generated: DEV_PEOPLE people, each with facts drawn from the CATEGORIES below (one value per category,
  seeded), some written in the first person as an agent stores what a user said of themself ("I can't eat
  sesame"), and one question per fact whose words, but for the person's name, miss the fact. Two unanswerable
  questions per person ask about a category that person has no fact of (relevance must say "nothing here").
- distractors: DISTRACTOR_PEOPLE more people with facts of the same kinds and no questions, plus NOTES that are
  about no one, stored outside every user's scope.
- hand-written: benchmarks/data/personal_hand.jsonl, people and questions written by hand, not by a template.

Every question is asked twice: in the person's scope (`store.scope(user=...)`) and across the whole store (a
first-person fact only in its scope: "what am I allergic to?" names no one).

Separation from training: recipe/personal_corpus.py generates the training text with its own templates, names and
values, and drops every name and value listed here (`reserved_words`), so this set measures what the model
learned of the meaning, not the templates. Nothing here is fitted on: every choice made with it is made with the
source left out (benchmarks/recall_quality.py --loso, recipe/calibrate_fusion.py).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

HAND_FILE = Path(__file__).resolve().parent / "data" / "personal_hand.jsonl"
VALIDATION_FILE = Path(__file__).resolve().parent / "data" / "personal_val.jsonl"
# Thirty more hand-written people in two files by two writers, for the relevance model to be fitted on in stores
# of every size (benchmarks/personal_sizes.py); like the validation set, never trained on.
FIT_FILES = {part: Path(__file__).resolve().parent / "data" / f"personal_fit_{part}.jsonl" for part in ("a", "b")}
# Test sets: read by benchmarks/relevance_heldout.py only (never fitted, chosen or trained on). The first judged
# the relevance model fitted without FIT_FILES and was read twice; the second, written with them and read by
# nothing before it, judges the model fitted with it.
TEST_FILE = Path(__file__).resolve().parent / "data" / "personal_test.jsonl"
TEST2_FILE = Path(__file__).resolve().parent / "data" / "personal_test2.jsonl"
# The third, written for the fit that weighs every store size alike and adds stores of two and three of a person's
# facts; read by nothing before that fit was chosen.
TEST3_FILE = Path(__file__).resolve().parent / "data" / "personal_test3.jsonl"

DEV_PEOPLE = (
    "Ingrid", "Tomasz", "Priya", "Mateo", "Yuki", "Olusegun", "Freya", "Rafael", "Amara", "Henrik", "Leilani",
    "Dmitri", "Zainab", "Callum", "Beatriz", "Kwame", "Sofia", "Arjun", "Niamh", "Hiroshi", "Esther", "Lucas",
    "Mei", "Tariq", "Greta", "Ibrahim", "Paloma", "Sven",
)
DISTRACTOR_PEOPLE = ("Aisha", "Jonas", "Renata", "Malik", "Clara", "Vikram", "Oskar", "Leah", "Tobias", "Marisol",
                     "Anders", "Nadia")
FIRST_PERSON_EVERY = 4  # every 4th person's facts are in the first person (an agent's notes about its user)

# Values of the slots. Each category draws its own; the training generator may use none of these.
CITIES = (("Porto", "Portugal"), ("Kyoto", "Japan"), ("Marrakesh", "Morocco"), ("Cusco", "Peru"),
          ("Reykjavik", "Iceland"), ("Naples", "Italy"), ("Hanoi", "Vietnam"), ("Cape Town", "South Africa"),
          ("Krakow", "Poland"), ("Oaxaca", "Mexico"), ("Tbilisi", "Georgia"), ("Bergen", "Norway"))
HOME_CITIES = ("Leeds", "Rotterdam", "Lyon", "Gothenburg", "Valencia", "Montreal", "Adelaide", "Dublin", "Graz",
               "Bilbao", "Quebec City", "Brno")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
DRINKS = ("oolong tea", "a flat white", "hot chocolate", "sparkling water with lemon", "rooibos", "iced coffee",
          "a mango lassi", "a chai latte", "peppermint tea", "a cortado")
ALLERGENS = ("sesame", "shellfish", "kiwi", "eggs", "walnuts", "soy", "mustard", "strawberries")
JOBS = (("pharmacist", "a hospital pharmacy"), ("civil engineer", "a bridge-building firm"),
        ("primary school teacher", "a village school"), ("airline pilot", "a regional airline"),
        ("paramedic", "the ambulance service"), ("architect", "a small design studio"),
        ("accountant", "a tax advisory office"), ("veterinarian", "a clinic for farm animals"),
        ("translator", "a publishing house"), ("electrician", "a solar installer"))
PETS = (("beagle", "dog"), ("Siamese cat", "cat"), ("grey parrot", "parrot"), ("lop-eared rabbit", "rabbit"),
        ("tortoise", "tortoise"), ("pair of goldfish", "fish"), ("border collie", "dog"), ("hamster", "hamster"))
PET_NAMES = ("Biscuit", "Miso", "Captain", "Juniper", "Pretzel", "Noodle", "Ziggy", "Clover")
HOBBIES = ("rock climbing", "pottery", "birdwatching", "salsa dancing", "chess", "sourdough baking",
           "trail running", "knitting", "woodworking", "kayaking")
CONDITIONS = (("asthma", "an inhaler"), ("migraines", "prescription tablets"), ("high blood pressure", "daily pills"),
              ("type 1 diabetes", "an insulin pump"), ("hay fever", "antihistamines"), ("an underactive thyroid",
                                                                                         "a morning tablet"))
VEHICLES = ("a red pickup truck", "a silver hybrid hatchback", "a vintage Vespa", "an electric scooter",
            "a campervan", "a second-hand Volvo estate", "a cargo bike")
INSTRUMENTS = ("violin", "drums", "ukulele", "saxophone", "harp", "trumpet", "accordion", "bass guitar")
LANGUAGES = ("Portuguese", "Tagalog", "Swahili", "Dutch", "Korean", "Farsi", "Czech", "Welsh")
SPORTS = (("goalkeeper", "a Sunday football league"), ("point guard", "a basketball club"),
          ("wing", "a rugby team"), ("setter", "a volleyball squad"), ("bowler", "the village cricket side"))
SUBJECTS = ("marine biology", "medieval history", "mechanical engineering", "economics", "linguistics",
            "graphic design", "chemistry", "philosophy")
AUTHORS = ("Agatha Christie", "Terry Pratchett", "Toni Morrison", "Haruki Murakami", "Jane Austen", "Ursula K. Le Guin")
RELATIVES = ("brother", "sister", "cousin")
RELATIVE_NAMES = ("Tamsin", "Joaquin", "Ruth", "Anton", "Yasmin", "Felix", "Ilse", "Dario")
RELATIVE_JOBS = ("a firefighter", "a nurse", "a baker", "a lawyer", "a plumber", "a radio presenter")
PARTNER_NAMES = ("Eduardo", "Miriam", "Sunil", "Colette", "Bram", "Lucia", "Kenji", "Harriet")
CHILD_NAMES = ("Elsie", "Rohan", "Maya", "Theo", "Ines", "Kai", "Nora", "Luca")
DISLIKES = (("horror films", "what films does {N} avoid?"),
            ("crowded beaches", "where does {N} not like to go on holiday?"),
            ("coriander", "which herb does {N} hate?"),
            ("loud restaurants", "what kind of place does {N} dislike eating in?"))
SEATS = ("the aisle seat", "the window seat")

# A category: fact templates (third person, then first person) and question templates (third person, then first
# person). {N} is the person's name; the other fields are filled by the category's `fill`. A question names the
# kind of thing asked for, never the value.
CATEGORIES: dict[str, dict] = {
    "travel": {
        "facts": ("{N}'s flight to {city} leaves on {day} morning.", "{N} has booked a week in {city} for {month}."),
        "facts1": ("My flight to {city} leaves on {day} morning.", "I've booked a week in {city} for {month}."),
        "questions": ("when is {N} going to {country}?", "what are {N}'s holiday plans?"),
        "questions1": ("when am I going to {country}?", "where am I going on holiday?"),
    },
    "home": {
        "facts": ("{N} moved into a flat in {home} last year.", "{N} rents a small house on the edge of {home}."),
        "facts1": ("I moved into a flat in {home} last year.", "I rent a small house on the edge of {home}."),
        "questions": ("where does {N} live now?", "which town is {N} based in?"),
        "questions1": ("where do I live?", "which town am I based in?"),
    },
    "drink": {
        "facts": ("{N} orders {drink} every time we meet at the café.", "{N}'s usual morning cup is {drink}."),
        "facts1": ("I always order {drink} at the café.", "My usual morning cup is {drink}."),
        "questions": ("what does {N} like to drink?", "what should I get {N} from the coffee shop?"),
        "questions1": ("what do I like to drink?", "what's my usual order at the coffee shop?"),
    },
    "allergy": {
        "facts": ("{N} breaks out in a rash after eating {allergen}.",
                  "{N} can't have anything that contains {allergen}."),
        "facts1": ("I break out in a rash after eating {allergen}.", "I can't have anything that contains {allergen}."),
        "questions": ("does {N} have any food allergies?", "what should we avoid cooking for {N}?"),
        "questions1": ("what am I allergic to?", "which foods should I stay away from?"),
    },
    "job": {
        "facts": ("{N} has worked as a {job} at {workplace} for six years.", "{N} is a {job} at {workplace}."),
        "facts1": ("I've worked as a {job} at {workplace} for six years.", "I'm a {job} at {workplace}."),
        "questions": ("what does {N} do for a living?", "what is {N}'s profession?"),
        "questions1": ("what is my job?", "what do I do for a living?"),
    },
    "pet": {
        "facts": ("{N} adopted a {pet} called {petname} last winter.",
                  "{N} takes {petname} the {pet} to the vet on Fridays."),
        "facts1": ("I adopted a {pet} called {petname} last winter.",
                   "I take {petname}, my {pet}, to the vet on Fridays."),
        "questions": ("does {N} have any animals at home?", "what is the name of {N}'s {kind}?"),
        "questions1": ("what animal do I have?", "what is my {kind} called?"),
    },
    "hobby": {
        "facts": ("{N} spends Saturday mornings at a {hobby} class.", "{N} joined a {hobby} club in {month}."),
        "facts1": ("I spend Saturday mornings at a {hobby} class.", "I joined a {hobby} club in {month}."),
        "questions": ("what does {N} do for fun?", "how does {N} spend the weekend?"),
        "questions1": ("what do I do for fun?", "what are my hobbies?"),
    },
    "health": {
        "facts": ("{N} uses {treatment} for {condition}.", "{N} was diagnosed with {condition} as a teenager."),
        "facts1": ("I use {treatment} for {condition}.", "I was diagnosed with {condition} as a teenager."),
        "questions": ("does {N} have any medical conditions?", "is {N} on any medication?"),
        "questions1": ("what health problems do I have?", "what medicine do I take?"),
    },
    "vehicle": {
        "facts": ("{N} drives {vehicle} to the office.", "{N} just bought {vehicle}."),
        "facts1": ("I ride {vehicle} to the office.", "I just bought {vehicle}."),
        "questions": ("what does {N} get around in?", "how does {N} commute?"),
        "questions1": ("how do I commute?", "what do I get around in?"),
    },
    "music": {
        "facts": ("{N} has taken {instrument} lessons since childhood.", "{N} plays {instrument} in a jazz band."),
        "facts1": ("I've taken {instrument} lessons since childhood.", "I play {instrument} in a jazz band."),
        "questions": ("does {N} play any music?", "which instrument does {N} play?"),
        "questions1": ("what instrument do I play?", "am I musical?"),
    },
    "birthday": {
        "facts": ("{N} turns forty on the {date} of {month}.", "Cake for {N} on {month} {date}, every year."),
        "facts1": ("I turn forty on the {date} of {month}.", "My big day is {month} {date}."),
        "questions": ("when is {N}'s birthday?", "when was {N} born?"),
        "questions1": ("when is my birthday?", "when was I born?"),
    },
    "language": {
        "facts": ("{N} grew up speaking {lang} at home.", "{N} is fluent in {lang}."),
        "facts1": ("I grew up speaking {lang} at home.", "I'm fluent in {lang}."),
        "questions": ("what languages does {N} know?", "which language did {N} learn as a child?"),
        "questions1": ("what languages do I speak?", "what was my first language?"),
    },
    "sport": {
        "facts": ("{N} plays {position} in {team}.", "{N} trains twice a week as {position} for {team}."),
        "facts1": ("I play {position} in {team}.", "I train twice a week as {position} for {team}."),
        "questions": ("what sport does {N} play?", "is {N} on a team?"),
        "questions1": ("which sport do I play?", "what team am I on?"),
    },
    "study": {
        "facts": ("{N} has a degree in {subject} from a university in {home}.", "{N} studied {subject} at college."),
        "facts1": ("I have a degree in {subject}.", "I studied {subject} at college."),
        "questions": ("what did {N} major in?", "what was {N}'s subject at university?"),
        "questions1": ("what did I major in?", "what did I study?"),
    },
    "reading": {
        "facts": ("{N} has read every novel by {author}.", "{N} keeps a shelf of {author} first editions."),
        "facts1": ("I've read every novel by {author}.", "I keep a shelf of {author} first editions."),
        "questions": ("who is {N}'s favourite writer?", "what books does {N} enjoy?"),
        "questions1": ("who is my favourite writer?", "what kind of books do I enjoy?"),
    },
    "family": {
        "facts": ("{N}'s {relative} {relname} is {reljob} in {home}.",
                  "{N} visits {relname}, {N}'s {relative}, every Easter."),
        "facts1": ("My {relative} {relname} is {reljob} in {home}.", "I visit my {relative} {relname} every Easter."),
        "questions": ("does {N} have any siblings or cousins?", "who in {N}'s family should we invite?"),
        "questions1": ("who is in my family?", "what does my {relative} do?"),
    },
    "partner": {
        "facts": ("{N} and {partner} got married {years} years ago.", "{N}'s partner {partner} runs a bakery."),
        "facts1": ("{partner} and I got married {years} years ago.", "My partner {partner} runs a bakery."),
        "questions": ("is {N} married?", "who is {N}'s spouse?"),
        "questions1": ("who is my spouse?", "how long have I been married?"),
    },
    "children": {
        "facts": ("{N} has two kids, {child1} and {child2}.",
                  "{N}'s daughters {child1} and {child2} start school in September."),
        "facts1": ("I have two kids, {child1} and {child2}.",
                   "My daughters {child1} and {child2} start school in September."),
        "questions": ("does {N} have children?", "what are the names of {N}'s kids?"),
        "questions1": ("what are my children called?", "how many kids do I have?"),
    },
    "appointment": {
        "facts": ("{N} has a teeth cleaning booked for {day} at 3 pm.", "{N} sees the optician next {day} afternoon."),
        "facts1": ("I get my teeth cleaned on {day} at 3 pm.", "I see the optician next {day} afternoon."),
        "questions": ("when is {N}'s dental checkup?", "when is {N}'s eye test?"),
        "questions1": ("when is my dental checkup?", "when is my eye test?"),
        "paired": True,  # question i asks about fact i only
    },
    "dislike": {
        "facts": ("{N} can't stand {dislike}.", "{N} refuses to go anywhere near {dislike}."),
        "facts1": ("I can't stand {dislike}.", "I refuse to go anywhere near {dislike}."),
        "questions": ("{dislike_q}",),
        "questions1": ("what do I hate?",),
    },
    "seat": {
        "facts": ("{N} always books {seat} on long flights.", "On a plane {N} insists on {seat}."),
        "facts1": ("I always book {seat} on long flights.", "On a plane I insist on {seat}."),
        "questions": ("where does {N} like to sit when flying?",),
        "questions1": ("where do I like to sit when flying?",),
    },
}

NOTES = (  # about no one: stored outside every user's scope
    "The team standup moved to ten o'clock starting next week.",
    "Renew the office parking permit before the end of the month.",
    "The wifi password for the cabin is taped under the router.",
    "Recycling is collected on alternate Wednesdays.",
    "The quarterly report is due to the board on the 15th.",
    "The boiler service is booked for the first Monday of December.",
    "Spare keys to the shed are in the blue tin by the back door.",
    "The projector in meeting room B needs an HDMI adapter.",
    "The neighbour's cat is fed by whoever is home on Sundays.",
    "Book club meets at the library, second Tuesday of every month.",
    "The printer on the third floor jams with recycled paper.",
    "Invoices over 500 euros need a second signature.",
    "The garden tap was switched off for the winter.",
    "Conference call dial-in numbers changed in the new system.",
    "The fire drill is scheduled for Thursday at eleven.",
    "Library books are due back on the 20th.",
)


@dataclass(frozen=True)
class Fact:
    text: str
    user: str | None  # the scope's user (None: outside every user's scope)
    category: str
    person: str | None


@dataclass(frozen=True)
class Question:
    text: str
    user: str
    fact: int | None  # index into PersonalSet.facts; None: unanswerable
    category: str
    first_person: bool
    part: str  # "generated" or "hand"


@dataclass
class PersonalSet:
    facts: list[Fact] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)

    def digest(self) -> str:
        h = hashlib.sha256()
        for f in self.facts:
            h.update(f"{f.text}\x00{f.user}\x00".encode("utf-8"))
        for q in self.questions:
            h.update(f"{q.text}\x00{q.user}\x00{q.fact}\x00".encode("utf-8"))
        return h.hexdigest()[:16]

    def users(self) -> list[str]:
        return sorted({f.user for f in self.facts if f.user})


def _fill(rng: random.Random, name: str) -> dict[str, str]:
    """One person's slot values (each drawn independently)."""
    city, country = rng.choice(CITIES)
    job, workplace = rng.choice(JOBS)
    pet, kind = rng.choice(PETS)
    condition, treatment = rng.choice(CONDITIONS)
    position, team = rng.choice(SPORTS)
    dislike, dislike_q = rng.choice(DISLIKES)
    child1, child2 = rng.sample(CHILD_NAMES, 2)
    day = rng.randint(2, 28)
    return {
        "N": name, "city": city, "country": country, "home": rng.choice(HOME_CITIES), "day": rng.choice(WEEKDAYS),
        "month": rng.choice(MONTHS), "drink": rng.choice(DRINKS), "allergen": rng.choice(ALLERGENS), "job": job,
        "workplace": workplace, "pet": pet, "kind": kind, "petname": rng.choice(PET_NAMES),
        "hobby": rng.choice(HOBBIES), "condition": condition, "treatment": treatment,
        "vehicle": rng.choice(VEHICLES), "instrument": rng.choice(INSTRUMENTS), "lang": rng.choice(LANGUAGES),
        "position": position, "team": team, "subject": rng.choice(SUBJECTS), "author": rng.choice(AUTHORS),
        "relative": rng.choice(RELATIVES), "relname": rng.choice(RELATIVE_NAMES), "reljob": rng.choice(RELATIVE_JOBS),
        "partner": rng.choice(PARTNER_NAMES), "years": str(rng.randint(3, 25)), "child1": child1, "child2": child2,
        "dislike": dislike, "dislike_q": dislike_q.format(N=name), "seat": rng.choice(SEATS),
        "date": f"{day}{'th' if 10 <= day % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th')}",
    }


def _person(rng: random.Random, name: str, n_facts: int, first: bool, ask: bool, out: PersonalSet) -> None:
    """Add `name`'s facts (and, with `ask`, one question per fact plus two unanswerable ones) to `out`."""
    slots = _fill(rng, name)
    user = name.lower()
    cats = list(CATEGORIES)
    rng.shuffle(cats)
    chosen, absent = cats[:n_facts], cats[n_facts:]
    for cat in chosen:
        spec = CATEGORIES[cat]
        which = rng.randrange(len(spec["facts"]))
        text = spec["facts1" if first else "facts"][which].format(**slots)
        text = text[0].upper() + text[1:]
        out.facts.append(Fact(text, user, cat, name))
        if ask:
            qs = spec["questions1" if first else "questions"]
            qi = which if spec.get("paired") and which < len(qs) else rng.randrange(len(qs))
            out.questions.append(Question(qs[qi].format(**slots), user, len(out.facts) - 1, cat, first, "generated"))
    if ask:
        for cat in absent[:2]:
            spec = CATEGORIES[cat]
            qs = spec["questions1" if first else "questions"]
            out.questions.append(Question(rng.choice(qs).format(**slots), user, None, cat, first, "generated"))


def generated(seed: int = 0, facts_per_person: int = 15) -> PersonalSet:
    """The generated part with its distractors and notes (seeded)."""
    rng = random.Random(f"personal-dev-{seed}")
    out = PersonalSet()
    for i, name in enumerate(DEV_PEOPLE):
        _person(rng, name, facts_per_person, first=i % FIRST_PERSON_EVERY == FIRST_PERSON_EVERY - 1, ask=True, out=out)
    for name in DISTRACTOR_PEOPLE:
        _person(rng, name, facts_per_person, first=False, ask=False, out=out)
    for note in NOTES:
        out.facts.append(Fact(note, None, "note", None))
    return out


def hand_written(path: Path = HAND_FILE) -> PersonalSet:
    """The hand-written part: rows {"user", "fact"} (a fact), {"user", "fact", "question"} (a fact and a question
    about it, "first_person" when the fact is the user's own words) or {"user", "question"} (unanswerable)."""
    out = PersonalSet()
    by_text: dict[tuple[str, str], int] = {}
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    for row in rows:
        user = row["user"]
        if "fact" in row:
            key = (user, row["fact"])
            if key not in by_text:
                by_text[key] = len(out.facts)
                out.facts.append(Fact(row["fact"], user, "hand", user.capitalize()))
        if "question" in row:
            out.questions.append(Question(row["question"], user,
                                          by_text[(user, row["fact"])] if "fact" in row else None, "hand",
                                          bool(row.get("first_person")), "hand"))
    return out


def personal_set(seed: int = 0) -> PersonalSet:
    """The whole dev protocol: the generated part (with distractors and notes) and the hand-written part, one store."""
    gen, hand = generated(seed), hand_written()
    shift = len(gen.facts)
    return PersonalSet(gen.facts + hand.facts,
                       gen.questions + [Question(q.text, q.user, None if q.fact is None else q.fact + shift, q.category,
                                                 q.first_person, q.part) for q in hand.questions])


def validation_set() -> PersonalSet:
    """A selection set apart from the dev protocol: 100 hand-written facts about ten other people (the same row
    format as the hand-written part, VALIDATION_FILE), each with a question, and two unanswerable questions each.
    Choices a stage has to make between its own variants (a step count, a weight) are made on this set, so that the
    dev protocol stays a judge; it is small (100 scoped, 80 store-wide questions), so only differences of several
    questions mean anything. The fusion rule and the relevance model are also fitted on it (source "personal-val"
    of benchmarks/personal_recall.py), which a choice of vectors made on it does not depend on."""
    return hand_written(VALIDATION_FILE)


def fit_sets() -> dict[str, PersonalSet]:
    """FIT_FILES, part -> set: each 150 hand-written facts about fifteen people (three of them in the first person),
    each with a question, and four unanswerable questions each, the first two near misses (a fact's topic, not its
    answer). The relevance model is fitted on them in stores of 5 to 2,000 facts (sources "personal-sizes-a" and
    "-b", each judged left out with the other in the fit)."""
    return {part: hand_written(path) for part, path in FIT_FILES.items()}


def reserved_words() -> set[str]:
    """Every name and slot value of this dev set, lower-cased: the training generator must not use them."""
    words: set[str] = set()
    for group in (DEV_PEOPLE, DISTRACTOR_PEOPLE, PET_NAMES, RELATIVE_NAMES, PARTNER_NAMES, CHILD_NAMES, HOME_CITIES,
                  DRINKS, ALLERGENS, HOBBIES, VEHICLES, INSTRUMENTS, LANGUAGES, SUBJECTS, AUTHORS):
        words.update(g.lower() for g in group)
    for group in (CITIES, JOBS, PETS, CONDITIONS, SPORTS, DISLIKES):
        words.update(g[0].lower() for g in group)
    for path in (HAND_FILE, VALIDATION_FILE, *FIT_FILES.values(), TEST_FILE, TEST2_FILE, TEST3_FILE):
        with open(path, encoding="utf-8") as fh:
            words.update(json.loads(line)["user"] for line in fh if line.strip())
    from conversation_recall import NEWS, PAIRS  # the conversational dev set's names and values too

    words.update(name.lower() for pair in PAIRS for name in pair)
    words.update(v.lower() for _, _, slots in NEWS.values() for values in slots.values() for v in values)
    return words


def subset(ps: PersonalSet, users: set[str]) -> PersonalSet:
    """The facts of `users` (and their questions), fact indices renumbered: a small protocol for smoke tests."""
    keep = [i for i, f in enumerate(ps.facts) if f.user in users]
    new = {old: i for i, old in enumerate(keep)}
    return PersonalSet([ps.facts[i] for i in keep],
                       [Question(q.text, q.user, None if q.fact is None else new[q.fact], q.category, q.first_person,
                                 q.part) for q in ps.questions if q.user in users])
