"""Personal and conversational training text: facts about people, the questions asked about them, chat turns.

    python recipe/personal_corpus.py --wordnet /work/corpus_work/x/wordnet-base/usr/share/wordnet \
        --out /work/corpus_personal [--people 40000] [--seed 0] [--dump-vocab vocab.json]
    python recipe/personal_corpus.py --vocab vocab.json --out /tmp/corpus_personal   # the same corpus, offline

What agents store is facts about the people they serve ("Marek's flight to Lisbon leaves Tuesday"), the user's own
words ("I can't eat shellfish") and turns of conversation; what they are asked shares few words with it ("when is
Marek going to Portugal?"). The corpus the shipped model was distilled on holds none of that. This writes, in the
corpus layout that `pack_corpus.py --add-corpus` reads (every source starts with `personal-`):

- `personal-qa` pairs: a question about a person <-> the fact that answers it (third person, first person, an
  agent's note about "the user"; questions with and without the name, keyword queries), labelled with the person
  (a number) and the kind of fact, so that a trainer can take the person's other facts as negatives that are
  surely not the answer (`train_reranker.py --labelled`);
- `personal-para` pairs: the same fact in two wordings (paraphrase);
- `personal-chat` pairs: a question about what was said <-> the chat turn that said it (labelled as above), and a
  turn <-> the reply;
- passages: every fact and turn, and the English dialogue lines of PyPI `chatterbot-corpus` (BSD-3-Clause), for
  distillation (the teacher's vectors need no labels).

Values come from WordNet (cities with their countries by part holonym, dishes, drinks, dog breeds, instruments,
sports, languages, ...), Faker's person names over many locales and its job titles, and lists here. Nothing of the
personal dev set may appear: every name and value of benchmarks/personal_data.py (`reserved_words`) and of the
paraphrase probe (tests/data/paraphrase_probe.jsonl) is dropped, and the templates here are written apart from the
dev set's (no question or fact template is the same as one of the dev set's once names and values are blanked).
Seeded; no network at run time.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

# ---------------------------------------------------------------------------------------------- vocabulary

FAKER_LOCALES = ("en_US", "en_GB", "en_IN", "en_AU", "de_DE", "es_ES", "es_MX", "fr_FR", "it_IT", "pt_BR", "pt_PT",
                 "nl_NL", "pl_PL", "sv_SE", "da_DK", "fi_FI", "tr_TR", "cs_CZ", "hu_HU", "ro_RO", "id_ID", "en_NZ",
                 "no_NO", "en_IE", "ga_IE", "sw", "yo_NG", "tw_GH", "zu_ZA")
DRINKS = ("green tea", "black coffee", "an americano", "a latte", "earl grey", "jasmine tea", "a smoothie",
          "orange juice", "kombucha", "a cappuccino", "an espresso macchiato", "matcha", "lemonade", "ginger beer",
          "chamomile tea", "a mocha", "oat milk coffee", "fresh mint tea", "cold brew", "cola", "decaf coffee",
          "coconut water", "a glass of red wine", "pale ale", "apple cider", "yerba mate", "barley tea", "kefir")
ALLERGENS = ("peanuts", "almonds", "cashews", "hazelnuts", "milk", "wheat", "gluten", "fish", "prawns", "crab",
             "celery", "lupin", "pollen", "cats", "dust mites", "bee stings", "latex", "penicillin", "aspirin",
             "tomatoes", "bananas", "avocado", "garlic", "pine nuts", "oats", "chickpeas", "lobster", "mussels")
HOBBIES = ("gardening", "photography", "painting", "fishing", "cycling", "swimming", "yoga", "hiking", "baking",
           "crocheting", "surfing", "skateboarding", "calligraphy", "origami", "stamp collecting", "archery",
           "fencing", "bouldering", "sailing", "scuba diving", "board games", "jigsaw puzzles", "embroidery",
           "beekeeping", "astronomy", "model trains", "ballroom dancing", "tap dancing", "karaoke", "poetry writing",
           "podcasting", "video games", "quilting", "foraging", "orienteering", "volunteering at the food bank",
           "running marathons", "playing tennis", "playing golf", "judo", "pilates", "cross-country skiing")
CONDITIONS = (("diabetes", "insulin"), ("epilepsy", "anticonvulsants"), ("arthritis", "anti-inflammatories"),
              ("eczema", "a steroid cream"), ("insomnia", "melatonin"), ("anxiety", "therapy every other week"),
              ("coeliac disease", "a gluten-free diet"), ("a heart murmur", "yearly check-ups"),
              ("back pain", "physiotherapy"), ("gout", "allopurinol"), ("depression", "antidepressants"),
              ("a thyroid condition", "levothyroxine"), ("lactose intolerance", "lactase tablets"),
              ("sleep apnoea", "a CPAP machine"), ("glaucoma", "eye drops"), ("ADHD", "stimulant medication"),
              ("tinnitus", "a white-noise app"), ("anaemia", "iron supplements"), ("psoriasis", "light therapy"))
VEHICLES = ("a blue Toyota", "an old Land Rover", "a white van", "a motorbike", "a road bike", "an e-bike",
            "a Tesla", "a Mini Cooper", "a green Skoda", "a black SUV", "a convertible", "a minivan", "a Fiat 500",
            "a Honda Civic", "a tandem bicycle", "a moped", "a folding bike", "a pickup")
PET_NAMES = ("Max", "Bella", "Luna", "Charlie", "Milo", "Coco", "Rocky", "Daisy", "Oscar", "Poppy", "Simba",
             "Nala", "Buster", "Pepper", "Ginger", "Rufus", "Willow", "Bailey", "Shadow", "Mochi", "Tiger",
             "Olive", "Bruno", "Maple", "Socks", "Peanut", "Hazel", "Loki", "Ruby", "Dexter")
SUBJECTS = ("computer science", "nursing", "law", "architecture", "music theory", "biochemistry", "psychology",
            "journalism", "geology", "art history", "physics", "accounting", "agriculture", "film studies",
            "civil engineering", "statistics", "anthropology", "fashion design", "veterinary medicine",
            "political science", "classics", "astrophysics", "sociology", "nutrition")
AUTHORS = ("Stephen King", "J. K. Rowling", "Neil Gaiman", "Margaret Atwood", "George Orwell", "Tolkien",
           "Gabriel Garcia Marquez", "Virginia Woolf", "Kazuo Ishiguro", "Chimamanda Ngozi Adichie", "Dostoevsky",
           "Zadie Smith", "Isabel Allende", "Philip Pullman", "Octavia Butler", "John le Carre", "Sally Rooney",
           "Elena Ferrante", "Cormac McCarthy", "Hilary Mantel", "Arthur Conan Doyle", "Roald Dahl")
GENRES = ("science fiction", "crime novels", "poetry", "biographies", "fantasy", "history books", "romance novels",
          "graphic novels", "travel writing", "thrillers", "cookbooks", "philosophy")
TEAMS = ("Liverpool", "Real Madrid", "Bayern Munich", "Celtic", "Juventus", "Ajax", "Boca Juniors", "Manchester United",
         "PSG", "Arsenal", "Barcelona", "Galatasaray", "Flamengo", "Inter Milan", "Borussia Dortmund", "Chelsea")
LANGUAGE_NAMES = ("Spanish", "French", "German", "Italian", "Mandarin", "Cantonese", "Japanese", "Arabic", "Hindi",
                  "Bengali", "Urdu", "Russian", "Ukrainian", "Turkish", "Greek", "Hebrew", "Persian", "Vietnamese",
                  "Thai", "Indonesian", "Malay", "Yoruba", "Igbo", "Hausa", "Amharic", "Zulu", "Xhosa", "Afrikaans",
                  "Norwegian", "Swedish", "Danish", "Finnish", "Icelandic", "Hungarian", "Romanian", "Bulgarian",
                  "Serbian", "Croatian", "Slovak", "Lithuanian", "Latvian", "Estonian", "Irish", "Scottish Gaelic",
                  "Basque", "Catalan", "Galician", "Punjabi", "Tamil", "Telugu", "Marathi", "Gujarati", "Nepali",
                  "Sinhala", "Burmese", "Khmer", "Lao", "Mongolian", "Kazakh", "Uzbek", "Armenian", "Albanian",
                  "Maltese", "Latin", "Esperanto", "sign language", "Quechua", "Maori", "Samoan", "Hawaiian")
SPORTS = ("football", "basketball", "tennis", "badminton", "squash", "volleyball", "netball", "hockey", "ice hockey",
          "rugby", "cricket", "baseball", "softball", "handball", "water polo", "table tennis", "golf", "rowing",
          "canoeing", "cycling", "triathlon", "boxing", "karate", "taekwondo", "wrestling", "fencing", "lacrosse",
          "ultimate frisbee", "darts", "bowling", "curling", "snooker", "padel", "climbing", "athletics",
          "gymnastics", "skiing", "snowboarding", "windsurfing", "kitesurfing", "polo", "field hockey")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
RELATIONS = ("mother", "father", "sister", "brother", "aunt", "uncle", "grandmother", "grandfather", "niece",
             "nephew", "son", "daughter", "best friend", "flatmate", "colleague", "neighbour", "boss", "godson")
DISLIKES = ("spiders", "olives", "jazz", "rainy weekends", "small talk", "mushrooms", "reality TV", "early meetings",
            "long phone calls", "spicy food", "camping", "roller coasters", "musicals", "cold showers", "snow")
MEALS = ("pad thai", "lasagne", "tacos", "ramen", "paella", "biryani", "moussaka", "pierogi", "pho", "goulash",
         "shakshuka", "falafel", "risotto", "sushi", "jollof rice", "bibimbap", "fish and chips", "pancakes",
         "dim sum", "chili con carne", "ratatouille", "tagine", "couscous", "dumplings", "curry")
APPOINTMENTS = (("the dentist", "dental"), ("the GP", "doctor's"), ("the physio", "physiotherapy"),
                ("the hairdresser", "haircut"), ("the vet", "vet"), ("a job interview", "interview"),
                ("the bank", "bank"), ("the mechanic", "car service"), ("the optometrist", "eye"))
EVENTS = (("wedding", "getting married"), ("graduation", "graduating"), ("housewarming", "moving house"),
          ("retirement party", "retiring"), ("baby shower", "having a baby"), ("fiftieth birthday", "turning fifty"),
          ("marathon", "running the race"), ("piano recital", "performing"), ("thesis defence", "finishing the PhD"))


class WordNet:
    """Noun synsets of WordNet 3.0 with hypernym, instance and part-holonym links (data.noun)."""

    def __init__(self, root: Path) -> None:
        self.words: dict[str, list[str]] = {}
        self.gloss: dict[str, str] = {}
        self.hypo: dict[str, list[str]] = collections.defaultdict(list)
        self.part: dict[str, list[str]] = collections.defaultdict(list)
        for line in open(root / "data.noun", encoding="utf-8", errors="replace"):
            if line.startswith("  ") or " | " not in line:
                continue
            data, gloss = line.split(" | ", 1)
            f = data.split()
            n = int(f[3], 16)
            off = f[0]
            self.words[off] = [w.replace("_", " ") for w in f[4: 4 + 2 * n: 2]]
            self.gloss[off] = gloss.split(";")[0].strip()
            base = 5 + 2 * n
            for i in range(int(f[4 + 2 * n])):
                sym, target, pos = f[base + 4 * i: base + 4 * i + 3]
                if pos == "n" and sym in ("@", "@i"):
                    self.hypo[target].append(off)
                elif pos == "n" and sym == "#p":
                    self.part[off].append(target)

    def find(self, lemma: str, gloss_part: str = "") -> str:
        for off, words in self.words.items():
            if lemma in words and gloss_part in self.gloss[off]:
                return off
        raise KeyError(f"no WordNet noun {lemma!r} with {gloss_part!r} in its gloss")

    def below(self, off: str, depth: int = 8) -> set[str]:
        out, frontier = set(), [off]
        for _ in range(depth):
            frontier = [c for x in frontier for c in self.hypo[x] if c not in out]
            out.update(frontier)
        return out

    def lemmas(self, root: str, gloss_part: str = "", depth: int = 8, max_words: int = 3) -> list[str]:
        """First lemma of every synset below `root`, lower-case common nouns of at most max_words words."""
        out = []
        for off in sorted(self.below(self.find(root, gloss_part), depth)):
            w = self.words[off][0]
            if w[0].islower() and len(w.split()) <= max_words and "(" not in w:
                out.append(w)
        return sorted(set(out))

    def names(self, root: str, gloss_part: str = "", depth: int = 4, max_words: int = 3) -> list[str]:
        """Proper names below `root` (instances such as a writer, or capitalised kinds such as a language): the
        synset's full name where it has one ("Charles Dickens" before "Dickens"), of at most max_words words."""
        out = []
        for off in sorted(self.below(self.find(root, gloss_part), depth)):
            cands = [w for w in self.words[off] if w[:1].isupper() and "(" not in w and len(w.split()) <= max_words]
            if cands:
                out.append(max(cands, key=lambda w: (len(w.split()), -self.words[off].index(w))))
        return sorted(set(out))

    def cities(self) -> list[tuple[str, str]]:
        """(city, country) for cities, capitals and ports whose part holonym is a country (by its gloss)."""
        country = re.compile(r"\b(republic|kingdom|country|monarchy|nation|principality|sultanate|emirate)\b")
        out = []
        for kind, part in (("city", "large and densely"), ("national capital", ""), ("port", "coastal")):
            try:
                cities = self.below(self.find(kind, part), 2)
            except KeyError:
                continue
            for c in cities:
                for holder in self.part.get(c, []):
                    if country.search(self.gloss[holder]) and self.words[holder][0][:1].isupper():
                        out.append((self.words[c][0], self.words[holder][0]))
                        break
        return sorted(set(out))


TREATMENTS = ("medication", "regular check-ups", "a specialist's care", "physiotherapy", "a strict diet",
              "daily tablets", "an inhaler", "rest and fluids")


def broad_values(wn: WordNet) -> dict[str, list]:
    """More values for the kinds of fact whose questions name a category and whose facts name a member of it
    (sports, illnesses, writers, languages, things people dislike): every member WordNet lists, so the student
    learns the category from many members instead of a few dozen (benchmarks/results/personal/personal_kinds.txt:
    the kinds the shipped model loses most on are exactly those with the shortest value lists)."""
    illness = [w
               for w in wn.lemmas("disease", "impairment of health", 3)
               + wn.lemmas("illness", "impairment of normal", 3)
               if len(w) < 28]
    rng = random.Random(0)
    return {
        "sport": [w for w in wn.lemmas("sport", "active diversion", 4) if len(w) < 24],
        "condition": [(w, rng.choice(TREATMENTS)) for w in sorted(set(illness))],
        "author": [w for r, g in (("writer", "writes (books"), ("poet", "a writer of poems"),
                                  ("novelist", "writes novels"), ("dramatist", "writes plays"))
                   for w in wn.names(r, g, 2)],
        "language": [w for w in wn.names("natural language", "human written or spoken", 3) if len(w) < 20],
        "dislike": [w
                    for r, g, d in (("herb", "plant lacking a permanent woody stem", 1),
                                    ("vegetable", "edible seeds", 2),
                                      ("insect", "small air-breathing arthropod", 2)) for w in wn.lemmas(r, g, d, 2)],
    }


def vocabulary(wordnet: Path, reserved: set[str], broad: bool = False) -> dict[str, list]:
    """Every slot's values: WordNet's lists, Faker's names and jobs, and the lists above; reserved words out.
    With `broad`, the kinds of `broad_values` take WordNet's members too."""
    from faker import Faker

    wn = WordNet(wordnet)

    phrases = [r for r in reserved if " " in r or "-" in r]

    def ok(v) -> bool:
        text = (v if isinstance(v, str) else " ".join(v)).lower()
        return (not any(w in reserved for w in re.findall(r"[a-z]+", text))
                and not any(ph in text for ph in phrases))

    names = set()
    jobs = set()
    for loc in FAKER_LOCALES:
        try:
            fk = Faker(loc)
        except AttributeError:
            continue
        fk.seed_instance(0)
        for _ in range(400):
            n = fk.first_name()
            if n.isascii() and n.isalpha() and 2 < len(n) < 12:
                names.add(n)
    fk = Faker("en_US")
    fk.seed_instance(0)
    for _ in range(3000):
        j = fk.job()
        if "," not in j and len(j) < 40:
            jobs.add(j.lower())
    vocab = {
        "name": sorted(names),
        "job": sorted(jobs),
        "city": wn.cities(),
        "dish": sorted(set(wn.lemmas("dish", "particular item", 3)) | set(MEALS)),
        "drink": sorted(set(DRINKS) | {w for w in wn.lemmas("beverage", "liquid", 4) if len(w) < 18}),
        "dog": [w for w in wn.lemmas("dog", "domesticated", 4) if w.endswith(("terrier", "spaniel", "retriever",
                                                                           "hound", "poodle", "collie", "shepherd"))
                or len(w.split()) == 1],
        "instrument": wn.lemmas("musical instrument", "", 3, 2),
        "language": LANGUAGE_NAMES,
        "sport": SPORTS,
        "drinks": DRINKS, "allergen": ALLERGENS, "hobby": HOBBIES, "condition": CONDITIONS, "vehicle": VEHICLES,
        "petname": PET_NAMES, "subject": SUBJECTS, "author": AUTHORS, "genre": GENRES, "team": TEAMS,
        "relation": RELATIONS, "dislike": DISLIKES, "appointment": APPOINTMENTS, "event": EVENTS,
    }
    if broad:
        for kind, more in broad_values(wn).items():
            vocab[kind] = list(dict.fromkeys([*vocab[kind], *more]))  # the lists here first, WordNet's new ones after
    return {k: [v for v in vals if ok(v)] for k, vals in vocab.items()}


# ---------------------------------------------------------------------------------------------- templates
# Each kind: facts (third person, {P} the person), own (first person), note (an agent's note about the user),
# asks (questions; {P} the name, or "they"/"the user" when asked in the person's scope), asks_own (the user asking
# about themself), keys (keyword queries). {X} and other fields are the kind's values.

KINDS = {
    "trip": {
        "facts": ("{P} is flying to {city} on {day}.", "{P} will spend two weeks in {city} this {season}.",
                  "{P}'s train to {city} departs at {hour} on {day}.",
                  "{P} is off to {city} for a conference in {month}.",
                  "Next {month} {P} heads to {city} to visit old friends."),
        "own": ("I'm flying to {city} on {day}.", "I'll be in {city} for two weeks this {season}.",
                "I'm off to {city} for a conference in {month}."),
        "note": ("The user is travelling to {city} in {month}.", "User has a trip to {city} coming up on {day}."),
        "asks": ("when does {P} leave for {country}?", "is {P} travelling anywhere soon?",
                 "where is {P} going in {month}?", "which country is {P} visiting?", "what trip does {P} have planned?",
                 "is {P} going abroad?"),
        "asks_own": ("when do I leave for {country}?", "where am I travelling next?", "what are my travel plans?"),
        "keys": ("{P} trip {country}", "{P} travel plans"),
    },
    "residence": {
        "facts": ("{P} lives in {city}.", "{P} recently relocated to {city}.",
                  "{P} has an apartment in the centre of {city}.", "{P} bought a house near {city} last {season}."),
        "own": ("I live in {city}.", "I recently moved to {city}.", "My apartment is in the centre of {city}."),
        "note": ("The user lives in {city}.", "User is based in {city}."),
        "asks": ("where is {P}'s home?", "what city is {P} from?", "where does {P} stay these days?",
                 "which country does {P} live in?", "where is {P} located?"),
        "asks_own": ("where is my home?", "what city do I live in?"),
        "keys": ("{P} address", "{P} home town"),
    },
    "drink": {
        "facts": ("{P} drinks {drink} every morning.", "{P} always asks for {drink}.",
                  "{P} can't start the day without {drink}.", "{P}'s favourite drink is {drink}.",
                  "When we meet, {P} usually has {drink}."),
        "own": ("I drink {drink} every morning.", "I can't start my day without {drink}.",
                "My favourite drink is {drink}."),
        "note": ("The user likes {drink}.", "User's preferred drink: {drink}."),
        "asks": ("what does {P} drink?", "what is {P}'s usual order?", "how does {P} take their coffee?",
                 "what can I bring {P} from the café?", "what beverage does {P} prefer?", "tea or coffee for {P}?"),
        "asks_own": ("what do I usually drink?", "what's my favourite beverage?"),
        "keys": ("{P} drink", "{P} coffee order"),
    },
    "allergy": {
        "facts": ("{P} is allergic to {allergen}.", "{P} has a severe {allergen} allergy.",
                  "{P} reacts badly to {allergen}.", "{P} must never be given {allergen}.",
                  "{P} carries an EpiPen because of {allergen}."),
        "own": ("I'm allergic to {allergen}.", "I have a severe {allergen} allergy.", "I react badly to {allergen}."),
        "note": ("The user is allergic to {allergen}.", "Allergy noted for the user: {allergen}."),
        "asks": ("what is {P} allergic to?", "does {P} have any allergies?", "what foods are unsafe for {P}?",
                 "is there anything {P} can't eat?", "what should the caterer know about {P}?"),
        "asks_own": ("what are my allergies?", "is there anything I can't eat?", "what am I sensitive to?"),
        "keys": ("{P} allergies", "{P} dietary restrictions"),
    },
    "work": {
        "facts": ("{P} is a {job}.", "{P} works as a {job}.", "{P} got a job as a {job} in {month}.",
                  "{P} has been a {job} for ten years.", "{P} recently retrained as a {job}."),
        "own": ("I'm a {job}.", "I work as a {job}.", "I started a new job as a {job} in {month}."),
        "note": ("The user works as a {job}.", "User's occupation: {job}."),
        "asks": ("what is {P}'s job?", "what does {P} do?", "how does {P} earn a living?",
                 "what line of work is {P} in?", "what is {P}'s occupation?", "where is {P} employed?"),
        "asks_own": ("what's my job?", "what do I do for work?", "what is my occupation?"),
        "keys": ("{P} job", "{P} career"),
    },
    "dog": {
        "facts": ("{P} has a {dog} named {petname}.", "{P}'s dog {petname} is a {dog}.",
                  "{P} walks {petname}, a {dog}, every evening.", "{P} got a {dog} puppy called {petname}."),
        "own": ("I have a {dog} named {petname}.", "My dog {petname} is a {dog}.",
                "I walk {petname}, my {dog}, every evening."),
        "note": ("The user owns a {dog} called {petname}.", "User's dog: {petname} ({dog})."),
        "asks": ("does {P} have a dog?", "what breed is {P}'s dog?", "what is {P}'s pet called?",
                 "does {P} own any pets?", "what kind of animal does {P} have?"),
        "asks_own": ("what's my dog's name?", "what breed is my dog?", "do I have pets?"),
        "keys": ("{P} pet", "{P} dog name"),
    },
    "pastime": {
        "facts": ("{P} loves {hobby}.", "{P} took up {hobby} last year.", "{P} spends most weekends {hobby_ing}.",
                  "{P} is really into {hobby} these days.", "{P} goes {hobby_ing} with friends on Sundays."),
        "own": ("I love {hobby}.", "I took up {hobby} last year.", "I'm really into {hobby} these days."),
        "note": ("The user enjoys {hobby}.", "User's hobby: {hobby}."),
        "asks": ("what are {P}'s interests?", "what does {P} enjoy doing?", "what does {P} do in their free time?",
                 "any hobbies for {P}?", "what keeps {P} busy outside work?", "what is {P} passionate about?"),
        "asks_own": ("what do I like doing in my free time?", "what are my interests?"),
        "keys": ("{P} hobbies", "{P} free time"),
    },
    "health": {
        "facts": ("{P} has {condition}.", "{P} manages {condition} with {treatment}.",
                  "{P} takes {treatment} for {condition}.", "{P} was diagnosed with {condition} in {month}."),
        "own": ("I have {condition}.", "I manage my {condition} with {treatment}.",
                "I was diagnosed with {condition} in {month}."),
        "note": ("The user has {condition}.", "Health note: the user takes {treatment}."),
        "asks": ("does {P} have any health issues?", "what medication is {P} on?", "is {P} ill?",
                 "what condition does {P} have?", "is {P} taking anything for their health?"),
        "asks_own": ("what medication am I on?", "what condition do I have?", "what are my health problems?"),
        "keys": ("{P} medical", "{P} medication"),
    },
    "transport": {
        "facts": ("{P} drives {vehicle}.", "{P} owns {vehicle}.", "{P} gets to work on {vehicle}.",
                  "{P} traded in the old car for {vehicle}."),
        "own": ("I drive {vehicle}.", "I own {vehicle}.", "I get to work on {vehicle}."),
        "note": ("The user drives {vehicle}.", "User's vehicle: {vehicle}."),
        "asks": ("what car does {P} have?", "how does {P} travel to work?", "what vehicle does {P} own?",
                 "does {P} have a car?", "how does {P} get around town?"),
        "asks_own": ("what car do I have?", "how do I get to work?"),
        "keys": ("{P} car", "{P} commute"),
    },
    "instrument": {
        "facts": ("{P} plays the {instrument}.", "{P} is learning the {instrument}.",
                  "{P} practises {instrument} every night.", "{P} performs on the {instrument} in a local orchestra."),
        "own": ("I play the {instrument}.", "I'm learning the {instrument}.",
                "I practise the {instrument} every night."),
        "note": ("The user plays the {instrument}.", "User is learning {instrument}."),
        "asks": ("is {P} musical?", "what does {P} play?", "does {P} play an instrument?", "what music does {P} make?"),
        "asks_own": ("what instrument am I learning?", "do I play music?"),
        "keys": ("{P} instrument", "{P} music"),
    },
    "birthday": {
        "facts": ("{P}'s birthday is on {month} {date}.", "{P} was born on the {date} of {month}.",
                  "{P} celebrates turning thirty on {month} {date}.", "{P} will be sixty on {date} {month}."),
        "own": ("My birthday is on {month} {date}.", "I was born on the {date} of {month}."),
        "note": ("The user's birthday: {month} {date}.", "User was born {date} {month}."),
        "asks": ("which day is {P}'s birthday?", "when does {P} celebrate their birthday?",
                 "what is {P}'s date of birth?", "when should we send {P} a card?", "how old is {P} turning and when?"),
        "asks_own": ("which day is my birthday?", "what's my date of birth?"),
        "keys": ("{P} birthday", "{P} birth date"),
    },
    "language": {
        "facts": ("{P} speaks {language}.", "{P} is a native {language} speaker.", "{P} is taking {language} classes.",
                  "{P} grew up bilingual in English and {language}."),
        "own": ("I speak {language}.", "I'm a native {language} speaker.", "I'm taking {language} classes."),
        "note": ("The user speaks {language}.", "User is learning {language}."),
        "asks": ("what languages does {P} speak?", "is {P} bilingual?", "which language is {P} learning?",
                 "what is {P}'s mother tongue?"),
        "asks_own": ("what languages do I know?", "which language am I learning?"),
        "keys": ("{P} languages",),
    },
    "sport": {
        "facts": ("{P} plays {sport} every week.", "{P} is on a {sport} team.", "{P} coaches a youth {sport} team.",
                  "{P} has played {sport} since school."),
        "own": ("I play {sport} every week.", "I'm on a {sport} team.", "I've played {sport} since school."),
        "note": ("The user plays {sport}.", "User's sport: {sport}."),
        "asks": ("does {P} do any sport?", "what sport is {P} into?", "how does {P} keep fit?", "is {P} athletic?"),
        "asks_own": ("what sport do I play?", "how do I stay fit?"),
        "keys": ("{P} sport", "{P} exercise"),
    },
    "fan": {
        "facts": ("{P} is a huge {team} fan.", "{P} has a season ticket for {team}.",
                  "{P} never misses a {team} game."),
        "own": ("I'm a huge {team} fan.", "I have a season ticket for {team}."),
        "note": ("The user supports {team}.",),
        "asks": ("who does {P} support?", "which team is {P} a fan of?", "what club does {P} follow?"),
        "asks_own": ("which team do I support?",),
        "keys": ("{P} team",),
    },
    "education": {
        "facts": ("{P} studied {subject}.", "{P} has a master's degree in {subject}.",
                  "{P} is doing a PhD in {subject}.", "{P} teaches {subject} at the university."),
        "own": ("I studied {subject}.", "I have a master's degree in {subject}.", "I'm doing a PhD in {subject}."),
        "note": ("The user studied {subject}.", "User's degree: {subject}."),
        "asks": ("what did {P} study?", "what is {P}'s background?", "what degree does {P} have?",
                 "what did {P} go to university for?", "what is {P}'s field?"),
        "asks_own": ("what was my major?", "what is my degree in?"),
        "keys": ("{P} education", "{P} degree"),
    },
    "books": {
        "facts": ("{P} loves books by {author}.", "{P} is reading a novel by {author}.", "{P} mostly reads {genre}.",
                  "{P}'s favourite author is {author}."),
        "own": ("I love books by {author}.", "I'm reading a novel by {author}.", "I mostly read {genre}."),
        "note": ("The user likes {genre}.", "User's favourite author: {author}."),
        "asks": ("what does {P} like to read?", "what book should I give {P}?", "who does {P} read?",
                 "what is {P} reading at the moment?", "what kind of stories does {P} like?"),
        "asks_own": ("what do I like to read?", "who is my favourite author?"),
        "keys": ("{P} books", "{P} reading"),
    },
    "relative": {
        "facts": ("{P}'s {relation} {rname} lives in {city}.", "{P}'s {relation} is called {rname}.",
                  "{P} is visiting their {relation} {rname} next {day}.", "{P}'s {relation} {rname} works as a {job}."),
        "own": ("My {relation} {rname} lives in {city}.", "My {relation} is called {rname}.",
                "I'm visiting my {relation} {rname} next {day}."),
        "note": ("The user's {relation} is {rname}.", "User mentioned their {relation}, {rname}."),
        "asks": ("who is {rname}?", "who is {P}'s {relation}?", "does {P} have family nearby?",
                 "who is {P} visiting on {day}?", "what is {P}'s {relation} called?"),
        "asks_own": ("who is my {relation}?", "who am I visiting on {day}?"),
        "keys": ("{P} family", "{P} {relation}"),
    },
    "kids": {
        "facts": ("{P} has a son called {rname}.", "{P}'s daughter {rname} just started school.",
                  "{P} is a father of three.", "{P} has a toddler named {rname}."),
        "own": ("I have a son called {rname}.", "My daughter {rname} just started school.",
                "I have a toddler named {rname}."),
        "note": ("The user has a child named {rname}.",),
        "asks": ("does {P} have kids?", "what are {P}'s children called?", "is {P} a parent?",
                 "how old is {P}'s child?"),
        "asks_own": ("what is my kid's name?", "how many children do I have?"),
        "keys": ("{P} children",),
    },
    "appointment": {
        "facts": ("{P} has an appointment with {appt} on {day} at {hour}.", "{P} sees {appt} next {day}.",
                  "{P} booked {appt} for {day} morning."),
        "own": ("I have an appointment with {appt} on {day} at {hour}.", "I'm seeing {appt} next {day}."),
        "note": ("Reminder: the user sees {appt} on {day}.",),
        "asks": ("when is {P}'s {appt_kind} appointment?", "is {P} busy on {day}?",
                 "what is on {P}'s calendar this week?", "when does {P} have the {appt_kind} visit?"),
        "asks_own": ("when is my {appt_kind} appointment?", "what do I have on {day}?"),
        "keys": ("{P} appointment {day}", "{P} schedule"),
    },
    "event": {
        "facts": ("{P}'s {event} is on {month} {date}.", "{P} is {event_ing} in {month}.",
                  "The {event} for {P} will be held in {city}."),
        "own": ("My {event} is on {month} {date}.", "I'm {event_ing} in {month}."),
        "note": ("The user has a {event} coming up in {month}.",),
        "asks": ("what is {P} celebrating?", "when is {P}'s big day?", "what is happening for {P} in {month}?",
                 "where is {P}'s {event}?"),
        "asks_own": ("what am I celebrating in {month}?", "when is my big day?"),
        "keys": ("{P} {event}",),
    },
    "food": {
        "facts": ("{P}'s favourite meal is {dish}.", "{P} could eat {dish} every day.", "{P} makes a great {dish}.",
                  "{P} always orders {dish} when we eat out.", "{P} is vegetarian.", "{P} doesn't eat red meat."),
        "own": ("My favourite meal is {dish}.", "I could eat {dish} every day.", "I'm vegetarian.",
                "I don't eat red meat."),
        "note": ("The user's favourite food is {dish}.", "User follows a vegetarian diet."),
        "asks": ("what does {P} like to eat?", "what should I cook for {P}?", "what is {P}'s favourite food?",
                 "does {P} eat meat?", "where should we take {P} for dinner?"),
        "asks_own": ("what's my favourite food?", "what should I cook tonight?"),
        "keys": ("{P} food", "{P} diet"),
    },
    "dislike": {
        "facts": ("{P} hates {dislike}.", "{P} really dislikes {dislike}.", "{P} is terrified of {dislike}.",
                  "{P} would rather avoid {dislike}."),
        "own": ("I hate {dislike}.", "I really dislike {dislike}.", "I'd rather avoid {dislike}."),
        "note": ("The user dislikes {dislike}.", "Avoid {dislike} with the user."),
        "asks": ("what does {P} not like?", "what should we avoid when {P} is around?", "what annoys {P}?",
                 "is there anything {P} can't stand?"),
        "asks_own": ("what do I dislike?", "what can't I stand?"),
        "keys": ("{P} dislikes",),
    },
}
SEASONS = ("spring", "summer", "autumn", "winter")
HOURS = ("8 am", "9:30", "noon", "half past two", "4 pm", "six in the evening", "7:15", "10 o'clock")
THEY_FORMS = ("they", "the user", "this person", "he", "she")
CHAT_OPENERS = ("How was your weekend?", "Any plans for the holidays?", "How's the new job going?",
                "What are you up to this week?", "How's your family doing?", "Did you get a chance to relax?",
                "What's new with you?", "How are you feeling today?", "Anything exciting coming up?")
CHAT_REPLIES = ("That sounds great!", "Oh no, I'm sorry to hear that.", "Nice, enjoy it!", "Good luck with that.",
                "Let me know how it goes.", "I'll remember that.", "Thanks for telling me.", "Wow, congratulations!")


def _fields(template: str) -> set[str]:
    return set(re.findall(r"{(\w+)}", template))


def _ing(phrase: str) -> str:
    """'rock climbing' stays; 'yoga' -> 'doing yoga'; 'playing tennis' stays."""
    first = phrase.split()[0]
    return phrase if first.endswith("ing") else f"doing {phrase}"


def _fill(rng: random.Random, v: dict, name: str) -> dict[str, str]:
    city, country = rng.choice(v["city"])
    condition, treatment = rng.choice(v["condition"])
    appt, appt_kind = rng.choice(v["appointment"])
    event, event_ing = rng.choice(v["event"])
    hobby = rng.choice(v["hobby"])
    d = rng.randint(1, 28)
    return {
        "P": name, "city": city, "country": country, "day": rng.choice(DAYS), "month": rng.choice(MONTHS),
        "season": rng.choice(SEASONS), "hour": rng.choice(HOURS), "drink": rng.choice(v["drink"]),
        "allergen": rng.choice(v["allergen"]), "job": rng.choice(v["job"]), "dog": rng.choice(v["dog"]),
        "petname": rng.choice(v["petname"]), "hobby": hobby, "hobby_ing": _ing(hobby), "condition": condition,
        "treatment": treatment, "vehicle": rng.choice(v["vehicle"]), "instrument": rng.choice(v["instrument"]),
        "language": rng.choice(v["language"]), "sport": rng.choice(v["sport"]), "team": rng.choice(v["team"]),
        "subject": rng.choice(v["subject"]), "author": rng.choice(v["author"]), "genre": rng.choice(v["genre"]),
        "relation": rng.choice(v["relation"]), "rname": rng.choice(v["name"]), "appt": appt, "appt_kind": appt_kind,
        "event": event, "event_ing": event_ing, "dish": rng.choice(v["dish"]), "dislike": rng.choice(v["dislike"]),
        "date": f"{d}{'th' if 10 <= d <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(d % 10, 'th')}",
    }


def _cap(text: str) -> str:
    return text[0].upper() + text[1:] if text else text


def build(vocab: dict, people: int, seed: int) -> tuple[list[dict], list[dict], collections.Counter]:
    rng = random.Random(f"personal-corpus-{seed}")
    pairs, passages, counts = [], [], collections.Counter()
    kinds = list(KINDS)
    for person in range(people):
        name = rng.choice(vocab["name"])
        slots = _fill(rng, vocab, name)
        form = rng.random()  # third person 60%, first person 25%, an agent's note 15%
        facts = []
        for kind in rng.sample(kinds, rng.randint(3, 7)):
            spec = KINDS[kind]
            style = "third" if form < 0.6 else "own" if form < 0.85 else "note"
            template = rng.choice(spec[{"third": "facts", "own": "own", "note": "note"}[style]])
            fact = _cap(template.format(**slots))
            facts.append((kind, fact, style))
            passages.append({"text": fact, "source": "personal-qa"})
            # a question (by name, or scoped: "they"/"I"), sometimes a keyword query
            if style == "own":
                ask = rng.choice(spec["asks_own"]).format(**slots)
            elif rng.random() < 0.7:
                ask = rng.choice(spec["asks"]).format(**slots)
            else:
                who = "the user" if style == "note" else rng.choice(THEY_FORMS)
                ask = rng.choice(spec["asks"]).format(**{**slots, "P": who}).replace(f"{who}'s", "their")
            label = {"person": person, "kind": kind}  # another fact of this person is surely not the answer
            pairs.append({"query": ask, "doc": fact, "source": "personal-qa", **label})
            if rng.random() < 0.25:
                pairs.append({"query": rng.choice(spec["keys"]).format(**slots), "doc": fact, "source": "personal-qa",
                              **label})
            # the same fact in another wording: only templates that state the same slots say the same thing
            if rng.random() < 0.5:
                said = _fields(template) - {"P"}
                same = [t for t in spec["facts"] + spec["own"] + spec["note"]
                        if t != template and _fields(t) - {"P"} == said]
                if same:
                    other = _cap(rng.choice(same).format(**slots))
                    pairs.append({"query": other, "doc": fact, "source": "personal-para"})
        if len(facts) >= 2 and rng.random() < 0.5:  # a chat: the user tells, the agent replies
            kind, fact, style = rng.choice(facts)
            turn_text = fact if style == "own" else _cap(rng.choice(KINDS[kind]["own"]).format(**slots))
            opener = rng.choice(CHAT_OPENERS)
            turn = f"{name}: {turn_text}"
            passages.append({"text": f"Assistant: {opener}\n{turn}\nAssistant: {rng.choice(CHAT_REPLIES)}",
                             "source": "personal-chat"})
            pairs.append({"query": rng.choice(KINDS[kind]["asks"]).format(**slots), "doc": turn,
                          "source": "personal-chat", "person": person, "kind": kind})
            pairs.append({"query": opener, "doc": turn, "source": "personal-chat"})
    counts.update(p["source"] for p in pairs)
    counts["passages"] = len(passages)
    return _dedup(pairs, "query", "doc"), _dedup(passages, "text"), counts


def _dedup(rows: list[dict], *keys: str) -> list[dict]:
    seen, out = set(), []
    for r in rows:
        k = tuple(r[x] for x in keys)
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def chatterbot_lines(reserved: set[str]) -> list[dict]:
    """The English conversations of chatterbot-corpus as passages (each exchange, joined), when installed."""
    try:
        import chatterbot_corpus
    except ImportError:
        return []
    root = Path(chatterbot_corpus.__file__).parent / "data" / "english"
    out = []
    for f in sorted(root.glob("*.yml")):
        convo: list[str] = []
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            m = re.match(r"^(- -|  -)\s+(.*)$", line)
            if not m:
                continue
            text = m.group(2).strip().strip("'\"")
            if m.group(1) == "- -" and convo:
                out.append(" ".join(convo))
                convo = []
            if text:
                convo.append(text)
        if convo:
            out.append(" ".join(convo))
    return [{"text": t, "source": "personal-dialogue"} for t in dict.fromkeys(out)
            if 20 <= len(t) <= 600 and not any(w in reserved for w in re.findall(r"[a-z]+", t.lower()))]


def reserved() -> set[str]:
    """The personal dev set's names and values and the paraphrase probe's capitalised words, lower-cased."""
    import personal_data

    words = personal_data.reserved_words()
    probe = REPO / "tests" / "data" / "paraphrase_probe.jsonl"
    for line in probe.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            words.update(w.lower() for w in re.findall(r"\b[A-Z][a-z]+\b", row["fact"] + " " + row["question"])
                         if w not in {"The", "At", "You", "Away", *DAYS, *MONTHS})
    return words


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wordnet", type=Path, default=None, help="the unpacked usr/share/wordnet of wordnet-base")
    ap.add_argument("--vocab", type=Path, default=None,
                    help="read the slot values (and dialogue lines) from this JSON (--dump-vocab) instead of WordNet "
                         "and Faker: how the corpus is rebuilt on a GPU machine without either")
    ap.add_argument("--dump-vocab", type=Path, default=None, help="also write the slot values and dialogue lines here")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--people", type=int, default=40000)
    ap.add_argument("--broad-values", action="store_true",
                    help="with --wordnet: sports, illnesses, writers, languages and dislikes from all of WordNet's "
                         "members (broad_values), not only the lists here (stage 4 was built without it)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if (args.wordnet is None) == (args.vocab is None):
        raise SystemExit("pass --wordnet (build the values) or --vocab (read them), not both or neither")
    res = reserved()
    if args.vocab is not None:
        vocab = json.loads(args.vocab.read_text(encoding="utf-8"))
        vocab = {k: [tuple(x) if isinstance(x, list) else x for x in v] for k, v in vocab.items()}
        dialogue = vocab.pop("dialogue", [])
    else:
        vocab = vocabulary(args.wordnet, res, broad=args.broad_values)
        dialogue = [p["text"] for p in chatterbot_lines(res)]
    if args.dump_vocab is not None:
        args.dump_vocab.write_text(json.dumps({**vocab, "dialogue": dialogue}, ensure_ascii=False), encoding="utf-8")
    pairs, passages, counts = build(vocab, args.people, args.seed)
    passages += [{"text": t, "source": "personal-dialogue"} for t in dialogue]
    counts["passages personal-dialogue"] = sum(p["source"] == "personal-dialogue" for p in passages)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("pairs.jsonl", pairs), ("passages.jsonl", passages)):
        with open(args.out / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    manifest = {"generator": "recipe/personal_corpus.py", "seed": args.seed, "people": args.people,
                "vocabulary": {k: len(v) for k, v in vocab.items()}, "dialogue_lines": len(dialogue),
                "sources": {"wordnet-base": "WordNet 3.0 licence", "faker": "MIT (PyPI faker)",
                            "chatterbot-corpus": "BSD-3-Clause (PyPI chatterbot-corpus)"},
                "reserved_words_dropped": len(res), "counts": dict(counts), "pairs": len(pairs),
                "passages": len(passages)}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
