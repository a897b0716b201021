"""Duplicate facts without an LLM: a new fact is a duplicate of a stored one when it is close in meaning (cosine of
the embedder's vectors), shares most of its content words, and differs in none of the words that change a fact.

"Ada's flight is Tuesday" and "ada's flight is on Tuesday." are duplicates; "Ada's flight is Wednesday" is not,
however close its vector: a differing number, date or time word, unit, negation, name or identifier, a direction
word (to / from, before / after, with / without) or an antonym blocks, and so do the same words in an order
that swaps roles ("Ada owes Bob" / "Bob owes Ada"). The rule is directional: a new fact that only adds words to
a stored one ("Kyle drives a blue electric car" after "... a blue car") is not its duplicate, since returning the
stored id would drop them; a new fact that says less than a stored one is.

Pure functions over texts and vectors, linear in the text length; the store chooses the candidates (the nearest
stored facts in the same scope) and calls `find_duplicate`. English-centric: other languages get no blockers
beyond numbers, names and identifiers, so their thresholds do most of the work. The thresholds were fitted on
the dev half of tests/data/duplicates.jsonl for precision first (a false duplicate loses a fact) and are measured
on the held-out pairs by benchmarks/dedup_quality.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Sequence, TypeVar

from .._lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

# Fitted on the dev split by benchmarks/dedup_quality.py (it prints the fit next to these): min_cosine is the 99th
# percentile of the cosine between unrelated facts, min_overlap the widest margin at dev precision 1.0.
Key = TypeVar("Key")  # a candidate's id, handed back as given

MIN_COSINE = 0.28
MIN_OVERLAP = 0.73
NEIGHBOURS = 8  # the nearest stored facts (same scope, tags and source) the store compares a new fact with

# Words that carry no fact: function words and the filler people put around a fact ("FYI", "just so you know").
STOPWORDS = frozenset("""
a an the is are was were be been being has have had having do does did doing will would shall should can could
might must of in on at by for as it its it's this that these those there here and or so such then than
i me my we us our you your he him his she her they them their who whom which what
just also very really currently quite about roughly approximately around basically actually indeed simply
note noted fyi btw reminder remember important update heads record keep mind know mentioned fun fact confirm
please ok okay hey hi well way oclock o'clock get gets got getting
""".split())
NEGATORS = frozenset("not no never none nobody nothing neither nor without cannot except unless but only".split())
RELATIONS = frozenset("""
to from before after with without over under above below into onto out off up down more less most least
max maximum min minimum between against toward towards within
""".split())
DATE_WORDS = frozenset("""
monday tuesday wednesday thursday friday saturday sunday weekday weekend
january february march april may june july august september october november december
today tomorrow yesterday tonight morning afternoon evening night noon midnight am pm
next last previous this week month year day hour minute second daily weekly monthly yearly nightly hourly
annually quarterly once twice spring summer autumn fall winter
""".split())
UNITS = {
    "s": "second", "sec": "second", "secs": "second", "second": "second", "seconds": "second",
    "ms": "millisecond", "millisecond": "millisecond", "milliseconds": "millisecond",
    "min": "minute", "mins": "minute", "minute": "minute", "minutes": "minute",
    "h": "hour", "hr": "hour", "hrs": "hour", "hour": "hour", "hours": "hour",
    "day": "day", "days": "day", "week": "week", "weeks": "week", "wk": "week", "month": "month", "months": "month",
    "year": "year", "years": "year", "yr": "year", "yrs": "year",
    "km": "km", "kilometre": "km", "kilometres": "km", "kilometer": "km", "kilometers": "km",
    "mi": "mile", "mile": "mile", "miles": "mile", "m": "metre", "metre": "metre", "metres": "metre",
    "meter": "metre", "meters": "metre", "cm": "cm", "mm": "mm", "ft": "foot", "foot": "foot", "feet": "foot",
    "in": "inch", "inch": "inch", "inches": "inch",
    "kg": "kg", "kilo": "kg", "kilos": "kg", "kilogram": "kg", "kilograms": "kg", "g": "gram", "gram": "gram",
    "grams": "gram", "lb": "pound", "lbs": "pound", "pound": "pound", "pounds": "pound",
    "b": "byte", "byte": "byte", "bytes": "byte", "kb": "kb", "mb": "mb", "gb": "gb", "tb": "tb",
    "kib": "kb", "mib": "mb", "gib": "gb", "tib": "tb",
    "eur": "eur", "euro": "eur", "euros": "eur", "€": "eur", "usd": "usd", "dollar": "usd", "dollars": "usd",
    "$": "usd", "gbp": "gbp", "£": "gbp", "%": "percent", "percent": "percent", "pct": "percent",
    "c": "celsius", "celsius": "celsius", "f": "fahrenheit", "fahrenheit": "fahrenheit", "degree": "degree",
    "degrees": "degree", "°": "degree", "°c": "celsius", "°f": "fahrenheit",
}
_SHORT_UNITS = frozenset(k for k in UNITS if len(k) <= 2)  # "s", "m", "in", "c": units only after a number
NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
NUMBER_WORDS.update({"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80",
                     "ninety": "90", "hundred": "100", "thousand": "1000", "million": "1000000", "dozen": "12"})
NUMBER_WORDS.update({w: str(i + 1) for i, w in enumerate(
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth".split())})
del NUMBER_WORDS["second"]  # a unit of time as often as an ordinal; "2nd" still reads as 2
ABBREVIATIONS = {
    "mon": "monday", "tue": "tuesday", "tues": "tuesday", "wed": "wednesday", "thu": "thursday", "thur": "thursday",
    "thurs": "thursday", "fri": "friday", "jan": "january", "feb": "february", "apr": "april", "jun": "june",
    "jul": "july", "aug": "august", "sep": "september", "sept": "september", "oct": "october", "nov": "november",
    "dec": "december", "a.m": "am", "p.m": "pm", "colour": "color", "favourite": "favorite", "grey": "gray",
    "centre": "center", "licence": "license", "cancelled": "canceled", "organise": "organize", "realise": "realize",
}
ANTONYMS = [("increase", "decrease"), ("add", "remove"), ("accept", "reject"), ("allow", "deny"), ("allow", "block"),
            ("open", "close"), ("start", "stop"), ("buy", "sell"), ("win", "lose"), ("pass", "fail"),
            ("true", "false"), ("old", "young"), ("oldest", "youngest"), ("light", "dark"),
            ("left", "right"), ("high", "low"), ("early", "late"), ("hot", "cold"), ("love", "hate"), ("like", "hate"),
            ("best", "worst"), ("big", "small"), ("long", "short"), ("public", "private"), ("required", "optional"),
            ("input", "output"), ("read", "write"), ("push", "pull"), ("upload", "download"),
            ("import", "export"), ("include", "exclude"), ("internal", "external"), ("enable", "disable"),
            ("many", "few"), ("remote", "office"), ("inside", "outside"), ("new", "old")]
_NEGATING_PREFIXES = ("un", "dis", "in", "im", "ir", "il", "non")
_EDGE = "\"'“”‘’()[]{}<>,;:!?.…*"
_NUM_RE = re.compile(r"[-+]?\d+(?:[.,:/-]\d+)*")
_NUM_UNIT_RE = re.compile(r"([-+]?\d+(?:[.,:/-]\d+)*)(st|nd|rd|th|[a-z%°€$£]+)")
_CURRENCY_NUM_RE = re.compile(r"([$€£])([-+]?\d+(?:[.,]\d+)*)")
# Filler phrases holding a word that would otherwise block ("up", "to"): dropped before tokenising.
_FILLER_RE = re.compile(r"\b(?:heads[- ]up|just to (?:confirm|recap|clarify)|to be (?:clear|sure))\b", re.IGNORECASE)


class Token(NamedTuple):
    """One normalised word of a fact, with what the blockers need to know about it."""

    norm: str  # lower case, contractions and number words resolved, lightly stemmed
    capital: bool  # written with a capital (or all caps), i.e. maybe a name


@dataclass(frozen=True)
class Decision:
    """Whether a new fact duplicates a stored one, and why.

    Attributes:
        dup: True: the new fact adds nothing; return the stored id.
        cosine: cosine of the two vectors.
        overlap: Jaccard overlap of the content words (0..1).
        reason: "duplicate", or what ruled it out (e.g. "differs in a date or time: 'tuesday' / 'wednesday'").
    """

    dup: bool
    cosine: float
    overlap: float
    reason: str


def _stem(word: str) -> str:
    """A crude English stemmer: enough to match prefer / prefers / preferred, not a linguist."""
    if not word.isalpha() or len(word) <= 3:
        return word
    for suffix, repl in (("ies", "y"), ("sses", "ss"), ("ing", ""), ("ed", ""), ("es", "e"), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not (suffix == "s"
                                                                           and word.endswith(("ss", "us", "is"))):
            word = word[: len(word) - len(suffix)] + repl
            break
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz":
        word = word[:-1]  # shipped -> shipp -> ship
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def _pieces(chunk: str) -> list[str]:
    """Split one whitespace-separated chunk (lower case) into word pieces: contractions and glued units apart."""
    chunk = chunk.strip(_EDGE).replace("’", "'")
    if not any(ch.isalnum() for ch in chunk) and chunk not in UNITS:  # a dash or other punctuation on its own
        return []
    if chunk.endswith("'s") or chunk.endswith("s'"):
        chunk = chunk[:-2] if chunk.endswith("'s") else chunk[:-1]
    if chunk in ("can't", "cannot"):
        return ["can", "not"]
    if chunk == "won't":
        return ["will", "not"]
    if chunk.endswith("n't"):
        return [chunk[:-3], "not"]
    for suffix in ("'re", "'ll", "'ve", "'d", "'m"):
        if chunk.endswith(suffix):
            return [chunk[: -len(suffix)]]
    m = _CURRENCY_NUM_RE.fullmatch(chunk)
    if m:
        return [m.group(2), m.group(1)]
    m = _NUM_UNIT_RE.fullmatch(chunk)
    if m:
        return [m.group(1)] if m.group(2) in ("st", "nd", "rd", "th") else [m.group(1), m.group(2)]
    parts = chunk.split("-")
    if len(parts) > 1 and all(p.isalpha() for p in parts):  # meeting-room == meeting room
        return parts
    return [chunk]


def tokens(text: str) -> list[Token]:
    """The normalised words of a text, in order (stop words and filler kept; `content` drops them)."""
    out: list[Token] = []
    prev_number = False
    for raw in _FILLER_RE.sub(" ", text).split():
        capital = any(ch.isupper() for ch in raw)
        for piece in _pieces(raw.lower()):
            word = ABBREVIATIONS.get(piece, piece)
            if word in NUMBER_WORDS:
                word = NUMBER_WORDS[word]
            elif word in UNITS and (prev_number or word not in _SHORT_UNITS):
                word = UNITS[word]
            elif word not in STOPWORDS and word not in DATE_WORDS:
                word = _stem(word)
            out.append(Token(word, capital))
            prev_number = bool(_NUM_RE.fullmatch(word))
    return out


def content(toks: Sequence[Token]) -> list[Token]:
    """The tokens that carry the fact: stop words and filler dropped."""
    return [t for t in toks if t.norm not in STOPWORDS]


def _kind(word: str, capital: bool) -> str | None:
    """Why a word that only one of the two facts has changes the fact (None: it merely lowers the overlap)."""
    if any(ch.isdigit() for ch in word):
        return "a number"
    if word in NEGATORS:
        return "negation"
    if word in DATE_WORDS:
        return "a date or time"
    if word in UNITS.values():
        return "a unit"
    if word in RELATIONS:
        return "a relation word"
    if capital:
        return "a name"
    if not word.replace("'", "").isalpha():
        return "an identifier"
    return None


def _antonym_pair(only_a: set[str], only_b: set[str]) -> tuple[str, str] | None:
    """A word of one fact and its opposite in the other (a listed antonym or a negating prefix), if any."""
    for x in sorted(only_a):
        for y in _OPPOSITES.get(x, ()):
            if y in only_b:
                return x, y
        for p in _NEGATING_PREFIXES:
            if p + x in only_b:
                return x, p + x
            if x.startswith(p) and x[len(p):] in only_b:
                return x, x[len(p):]
    return None


_OPPOSITES: dict[str, set[str]] = {}
for _a, _b in ANTONYMS:
    for _x, _y in ((_a, _b), (_stem(_a), _stem(_b))):
        _OPPOSITES.setdefault(_x, set()).add(_y)
        _OPPOSITES.setdefault(_y, set()).add(_x)


def _moved_block(a: list[str], b: list[str]) -> bool:
    """Whether b is a with one contiguous block moved elsewhere (a clause fronted), or a itself."""
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[-1 - j] == b[-1 - j]:
        j += 1
    mid_a, mid_b = a[i : len(a) - j], b[i : len(b) - j]
    if len(mid_a) != len(mid_b):
        return False
    if not mid_a:
        return True
    k = mid_a.index(mid_b[0]) if mid_b[0] in mid_a else -1  # the words are distinct: one place to cut
    return k >= 0 and mid_a[k:] + mid_a[:k] == mid_b  # mid_b is mid_a rotated: two adjacent blocks swapped


def _order(toks: list[Token], shared: set[str]) -> list[str]:
    """The shared content words in the order of their first appearance."""
    seen: set[str] = set()
    out = []
    for t in toks:
        if t.norm in shared and t.norm not in seen:
            seen.add(t.norm)
            out.append(t.norm)
    return out


def _differ(added: list[str], dropped: list[str]) -> str:
    new = ", ".join(map(repr, added)) or "nothing"
    old = ", ".join(map(repr, dropped)) or "nothing"
    return f"{new} in the new fact, {old} in the stored one"


def cosine(u: np.ndarray, v: np.ndarray) -> float:
    """Cosine of two vectors (the store's vectors are unit length; this does not assume it)."""
    u = np.asarray(u, dtype=np.float32).ravel()  # (D,)
    v = np.asarray(v, dtype=np.float32).ravel()  # (D,)
    denom = float(np.linalg.norm(u)) * float(np.linalg.norm(v))
    return float(u @ v) / denom if denom > 0 else 0.0


def is_duplicate(new_text: str, new_vec: np.ndarray, old_text: str, old_vec: np.ndarray, *,
                 min_cosine: float = MIN_COSINE, min_overlap: float = MIN_OVERLAP) -> Decision:
    """Decide whether `new_text` repeats `old_text` (see the module docstring for the rule).

        is_duplicate("Ada's flight is Tuesday", v1, "ada's flight is on tuesday.", v2).dup  # True

    Args:
        new_text, old_text: the two facts.
        new_vec, old_vec: their vectors from one embedder (D,).
        min_cosine, min_overlap: the thresholds (defaults fitted on the dev split).
    Returns:
        a Decision; `dup` is True only when every test passes.
    """
    cos = cosine(new_vec, old_vec)
    ta, tb = tokens(new_text), tokens(old_text)
    if [t.norm for t in ta] == [t.norm for t in tb]:  # same words in the same order: case, punctuation, spacing
        return Decision(True, cos, 1.0, "duplicate (the same words)")
    ca, cb = content(ta), content(tb)
    sa, sb = {t.norm for t in ca}, {t.norm for t in cb}
    union = sa | sb
    overlap = len(sa & sb) / len(union) if union else 0.0
    capital = {t.norm for t in ca + cb if t.capital}
    added, dropped = sorted(sa - sb), sorted(sb - sa)
    for word in sorted(sa ^ sb):
        kind = _kind(word, word in capital)
        if kind is not None:
            return Decision(False, cos, overlap, f"differs in {kind}: {_differ(added, dropped)}")
    pair = _antonym_pair(sa - sb, sb - sa)
    if pair is not None:
        return Decision(False, cos, overlap, f"differs in an opposite: {pair[0]!r} / {pair[1]!r}")
    if added and not dropped:  # the stored fact says less: returning its id would lose these words
        return Decision(False, cos, overlap, f"the new fact adds {', '.join(map(repr, added))}")
    if overlap < min_overlap:
        return Decision(False, cos, overlap, f"shares too few words: overlap {overlap:.2f} < {min_overlap:.2f}")
    if cos < min_cosine:
        return Decision(False, cos, overlap, f"not close enough in meaning: cosine {cos:.2f} < {min_cosine:.2f}")
    shared = sa & sb
    if not _moved_block(_order(ca, shared), _order(cb, shared)):
        return Decision(False, cos, overlap, "the same words in an order that changes who does what")
    return Decision(True, cos, overlap, "duplicate")


def find_duplicate(new_text: str, new_vec: np.ndarray, candidates: Sequence[tuple[Key, str, np.ndarray]], *,
                   min_cosine: float = MIN_COSINE, min_overlap: float = MIN_OVERLAP) -> tuple[Key, Decision] | None:
    """The stored fact that `new_text` duplicates, if any: the best of the candidates that pass `is_duplicate`.

    Args:
        new_text, new_vec: the fact about to be remembered and its vector.
        candidates: (id, text, vector) of stored facts, e.g. the nearest few by vector in the same scope.
        min_cosine, min_overlap: as in is_duplicate.
    Returns:
        (id, Decision) of the duplicate with the highest (overlap, cosine), or None.
    """
    best: tuple[Key, Decision] | None = None
    for cid, text, vec in candidates:
        d = is_duplicate(new_text, new_vec, text, vec, min_cosine=min_cosine, min_overlap=min_overlap)
        if d.dup and (best is None or (d.overlap, d.cosine) > (best[1].overlap, best[1].cosine)):
            best = (cid, d)
    return best
