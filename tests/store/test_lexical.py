"""Lexical recall on large-store terms: the words FTS5 matches are pruned by document frequency and, past a
postings budget, the rows holding every word are tried first. Checked through MemoryStore against FTS5 run
directly on the store's file (the full OR query: the ranking before any pruning)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from evermind_memory import MemoryStore
from evermind_memory.store import lexical
from evermind_memory.store.lexical import document_frequencies, phrase_query, query_names, query_words

CONTENT = "tea coffee river garden paris tokyo report budget python sqlite zebra violin".split()


def _facts(n: int, seed: int) -> list[str]:
    """Every fact holds "the" and "and" (in all rows: idf <= 0); content words are drawn at random."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = rng.choice(CONTENT, size=int(rng.integers(2, 6)))
        out.append(f"the {' and '.join(words)} note{i}")
    return out


def _full_or(db: Path, query: str, k: int) -> list[tuple[str, float]]:
    """(fact id, -bm25) of FTS5's own OR over every word of the query, best first (ties by rid)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT f.id, r.rank FROM (SELECT rowid, rank FROM facts_fts WHERE facts_fts MATCH ? ORDER BY rank LIMIT "
            "?) r JOIN facts f ON f.rid = r.rowid ORDER BY r.rank, f.rid", [phrase_query(query_words(query)), k],
        ).fetchall()
    return [(fid, -rank) for fid, rank in rows]


@pytest.fixture
def filled(db_path: Path, embedder) -> MemoryStore:
    with MemoryStore(db_path, embedder) as store:
        store.remember_many(_facts(300, seed=1))
        yield store


QUERIES = ["the zebra and the violin", "what about the tea and python", "the budget", "and the river garden tokyo"]


def test_common_words_are_dropped_without_changing_the_ranking(filled: MemoryStore, db_path: Path):
    for query in QUERIES:
        got = [(h.id, h.score) for h in filled.recall(query, k=5, mode="lexical")]
        want = _full_or(db_path, query, 5)
        assert [fid for fid, _ in got] == [fid for fid, _ in want], query
        assert np.allclose([s for _, s in got], [s for _, s in want], rtol=1e-4), query


def test_only_common_words_still_match(filled: MemoryStore, db_path: Path):
    got = [h.id for h in filled.recall("the and", k=5, mode="lexical")]
    assert got == [fid for fid, _ in _full_or(db_path, "the and", 5)] and len(got) == 5


def test_all_words_first_past_the_budget(filled: MemoryStore, db_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(lexical, "OR_BUDGET", 0)  # as if the store were large: every query takes the AND tier
    texts = {f.id: set(query_words(f.text)) for f in filled.list(limit=1000)}
    both_filled = neither_filled = 0
    for query in ["tea coffee", "zebra violin python", "tea coffee river garden paris", "the tea"]:
        got = [(h.id, h.score) for h in filled.recall(query, k=5, mode="lexical")]
        words = {w for w in query_words(query) if w not in ("the", "and")}
        holding_all = [fid for fid, ws in texts.items() if words <= ws]
        full = dict(_full_or(db_path, query, 1000))
        assert all(np.isclose(score, full[fid], rtol=1e-4) for fid, score in got), query  # bm25 as under OR
        if len(holding_all) >= 5:  # answered by the AND tier: every hit holds every (kept) word
            both_filled += 1
            assert len(got) == 5 and all(fid in holding_all for fid, _ in got), query
        else:  # too few hold them all: the OR query answers, exactly as before
            neither_filled += 1
            assert [fid for fid, _ in got] == [fid for fid, _ in _full_or(db_path, query, 5)], query
    assert both_filled and neither_filled  # both branches ran


def test_document_frequencies_match_fts5_counts(filled: MemoryStore, db_path: Path):
    filled.remember("She was running marathons in Zürich on foo_bar day")
    victim = filled.list(limit=1)[0]  # a fact with "the": one of 300, the new one has none
    filled.forget(victim.id)  # the vocabulary follows deletes
    words = ["the", "running", "runs", "zurich", "zürich", "foo_bar", "tea", "absent", "note7"]
    with sqlite3.connect(db_path) as conn:
        got = document_frequencies(conn, words)
        for word, df in zip(words, got):
            count = conn.execute("SELECT count(*) FROM facts_fts WHERE facts_fts MATCH ?",
                                 [phrase_query([word])]).fetchone()[0]
            if word == "foo_bar":  # two terms: the rarer term's count bounds the phrase's
                assert df >= count == 1
            else:
                assert df == count, word
    assert got[0] == len(filled) - 1 and got[words.index("absent")] == 0 and got[words.index("runs")] == 1


def test_lexical_works_on_a_reader_and_in_memory(filled: MemoryStore, db_path: Path, embedder):
    want = [fid for fid, _ in _full_or(db_path, "the zebra", 3)]
    with MemoryStore(db_path, read_only=True, embedder=embedder) as reader:  # temp vocab table on a read-only file
        assert [h.id for h in reader.recall("the zebra", k=3, mode="lexical")] == want
    with MemoryStore(":memory:", embedder) as mem:
        ids = mem.remember_many(["the zebra plays", "the tea is hot", "the cat"])
        assert [h.id for h in mem.recall("the zebra", mode="lexical")] == [ids[0]]


def test_identifier_queries_also_match_their_parts():
    assert query_words("zipfile.ZipFile") == ["zipfile", "zip", "file"]
    assert query_words("HTTPServer Qt5Core") == ["httpserver", "qt5core", "http", "server", "qt5", "core"]
    assert query_words("parser.buffer_size") == ["parser", "buffer_size", "buffer", "size"]
    assert query_words("Straße_Nord") == ["straße_nord", "straße", "nord"]
    assert query_words("mp3 player x86") == ["mp3", "player", "x86"]  # no case change, no underscore: one word
    assert query_words("get_item getItem", max_terms=3) == ["get_item", "getitem", "get"]  # whole words come first


def test_function_words_are_left_out_unless_nothing_else_is_left():
    assert query_words("travel plans to Portugal") == ["travel", "plans", "portugal"]
    assert query_words("When does the machine reboot?") == ["machine", "reboot"]
    assert query_words("to be or not") == ["not"]
    assert query_words("The Who") == ["the", "who"]  # all function words: kept, or nothing would match


def test_a_function_word_is_no_evidence_in_a_small_store(db_path: Path, embedder):
    with MemoryStore(db_path, embedder) as store:
        store.remember("Bob is allergic to peanuts.")
        trip = store.remember("Our flight leaves to Lisbon on Friday.")
        assert [h.id for h in store.recall("flight to Portugal", k=2, mode="lexical")] == [trip]


def test_pronouns_possessives_and_contractions_are_function_words_too():
    assert query_words("who is Yuki's spouse?") == ["yuki", "spouse"]
    assert query_words("what are my hobbies?") == ["hobbies"]
    assert query_words("what shouldn't we cook for her?") == ["cook"]
    assert query_words("I'm here") == ["i", "m", "here"]  # nothing else: kept


def test_in_one_persons_scope_a_possessive_is_no_evidence(db_path: Path, embedder):
    """In Yuki's scope "yuki" is in every fact and the "s" of "Yuki's" in only one: counted as a word, it made that
    fact the lexical match of every question in the possessive."""
    with MemoryStore(db_path, embedder) as store:
        yuki = store.scope(user="yuki")
        yuki.remember_many(["Yuki's daughters start school in September.", "Yuki and Bram got married in 2003.",
                            "Yuki plays chess on Saturdays."])
        hits = yuki.recall("who is Yuki's spouse?", mode="lexical")
        assert len(hits) == 3 and max(h.score for h in hits) < 1e-3  # "yuki" alone: in all three, no evidence
        assert yuki.recall("Yuki's chess", mode="lexical")[0].text == "Yuki plays chess on Saturdays."


def test_a_capitalised_word_that_starts_a_sentence_is_no_name_unless_possessive():
    assert query_names("what does Ada drink?") == ["ada"]
    assert query_names("Returns the inverse of a matrix.") == []
    assert query_names("Computes the FFT. Then Bob's list") == ["fft", "bob"]
    assert query_names("Ada's tea") == ["ada"]
    assert query_names("Ada\u2019s tea") == ["ada"]
    assert query_names("When does Mei fly to Tbilisi?") == ["mei", "tbilisi"]


def test_an_identifier_finds_the_prose_that_describes_it(db_path: Path, embedder):
    with MemoryStore(db_path, embedder) as store:
        zip_id = store.remember("The class for reading and writing ZIP files.")
        size_id = store.remember("The size of the buffer used when text is collected.")
        store.remember("A garden by the river in Paris.")
        assert [h.id for h in store.recall("zipfile.ZipFile", k=3, mode="lexical")][:1] == [zip_id]
        assert [h.id for h in store.recall("xmlparser.buffer_size", k=3, mode="lexical")][:1] == [size_id]
    # FTS5 on the whole words alone matches neither: "ZipFile" is one term, "buffer_size" a phrase no fact holds
    with sqlite3.connect(db_path) as conn:
        for query in ('"zipfile"', '"xmlparser" OR "buffer_size"'):
            assert conn.execute("SELECT count(*) FROM facts_fts WHERE facts_fts MATCH ?", [query]).fetchone() == (0,)


def test_the_stem_cache_starts_afresh_without_losing_the_words_asked_for():
    """When a call would overflow the cache, the cache is cleared and every word of that call stemmed again (it once
    cleared the words it had just found cached, and raised KeyError)."""
    stemmer = lexical._Stemmer(max_words=4)
    assert stemmer.terms(["running", "cats"]) == [("run",), ("cat",)]
    assert stemmer.terms(["running", "cats", "gardens", "walked"]) == [("run",), ("cat",), ("garden",), ("walk",)]
    assert stemmer.terms(["walked", "trees"]) == [("walk",), ("tree",)]
