"""Every bad input at the public boundary gives an InvalidInput-family error that names the problem,
and nothing is half-written (docs/reliability.md R19, R10)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evermind_memory import EmbedderOutputInvalid, FactNotFound, InvalidInput, MemoryStore


class BadEmbedder:
    """A user-supplied embedder returning whatever `make(n)` gives (to test R10 hygiene); with `bad_for`, only
    calls whose texts contain that word get `make(n)`, the rest get good vectors (so it passes the probe at
    open and fails on chosen facts)."""

    fingerprint = "bad-embedder/v1"

    def __init__(self, make, dimensions: int = 4, bad_for: str | None = None) -> None:
        self.make = make
        self.dimensions = dimensions
        self.bad_for = bad_for

    def _out(self, texts, n):
        if self.bad_for is None or any(self.bad_for in t for t in texts):
            return self.make(n)
        return np.ones((n, self.dimensions), dtype=np.float32)

    def embed(self, text):
        return self._out([text], 1)

    def embed_many(self, texts):
        return self._out(texts, len(texts))


GOOD = lambda n: np.ones((n, 4), dtype=np.float32)  # noqa: E731


def raising(n):
    raise RuntimeError("the model server is down")


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "non-blank"),
        ("   \n\t", "non-blank"),
        ("a\x00b", "NUL"),
        ("lone \ud800 surrogate", "lone surrogate"),
        ("x" * 100_001, "at most 100,000 characters"),
        (None, "expected a str"),
        (b"bytes", "expected a str"),
        (42, "expected a str"),
    ],
)
def test_bad_texts(store: MemoryStore, text, message):
    with pytest.raises(InvalidInput, match=message):
        store.remember(text)
    with pytest.raises(InvalidInput, match=message):
        store.recall(text)
    assert len(store) == 0


def test_bad_text_in_a_batch_stores_nothing(store: MemoryStore):
    with pytest.raises(InvalidInput, match=r"texts\[2\]"):
        store.remember_many(["fine", "also fine", "bad\x00"])
    with pytest.raises(InvalidInput, match="list of str"):
        store.remember_many("a string is not a list")
    assert len(store) == 0 and store.remember_many([]) == []


@pytest.mark.parametrize(
    "tags, message",
    [
        ("person=ada", "dict of str"),
        ({"": "x"}, "keys must match"),
        ({"has space": "x"}, "keys must match"),
        ({"k" * 65: "x"}, "keys must match"),
        ({1: "x"}, "keys must match"),
        ({"person": None}, "expects a str, int, float or bool"),
        ({"person": [1]}, "expects a str, int, float or bool"),
        ({"person": float("nan")}, "finite number"),
        ({"person": 2**60}, r"int within \+-\(2\*\*53 - 1\)"),
        ({"person": "a\x00"}, "NUL"),
        ({"person": "\udfff"}, "lone surrogate"),
        ({"person": "x" * 513}, "at most 512"),
        ({f"k{i}": "v" for i in range(33)}, "at most 32 tags"),
    ],
)
def test_bad_tags(store: MemoryStore, tags, message):
    with pytest.raises(InvalidInput, match=message):
        store.remember("fact", tags=tags)
    with pytest.raises(InvalidInput, match=message):
        store.recall("fact", tags=tags)
    with pytest.raises(InvalidInput, match=message):
        store.list(tags=tags)
    assert len(store) == 0


@pytest.mark.parametrize("source, message",
                         [("", "1 to 256"), ("s" * 257, "1 to 256"), (3, "str or None"), ("a\x00", "NUL")])
def test_bad_source(store: MemoryStore, source, message):
    with pytest.raises(InvalidInput, match=message):
        store.remember("fact", source=source)


@pytest.mark.parametrize(
    "k, message",
    [(0, "expected k >= 1, got k=0"), (-1, "expected k >= 1"), (10**9, "expected k <= 1000"),
     (True, "to be an int"), (2.0, "to be an int"), ("5", "to be an int"), (None, "to be an int")],
)
def test_bad_k(store: MemoryStore, k, message):
    store.remember("fact")
    with pytest.raises(InvalidInput, match=message):
        store.recall("fact", k=k)


@pytest.mark.parametrize("min_score", [math.nan, math.inf, -math.inf, True, "0.5"])
def test_bad_min_score(store: MemoryStore, min_score):
    with pytest.raises(InvalidInput, match="min_score"):
        store.recall("fact", min_score=min_score)


def test_bad_mode_fusion_and_list_args(store: MemoryStore):
    with pytest.raises(InvalidInput, match="mode to be one of 'hybrid', 'vector', 'lexical'"):
        store.recall("x", mode="semantic")
    with pytest.raises(InvalidInput, match="fusion"):
        store.recall("x", fusion="max")
    with pytest.raises(InvalidInput, match="limit >= 1"):
        store.list(limit=0)
    with pytest.raises(InvalidInput, match="offset"):
        store.list(offset=-1)
    with pytest.raises(InvalidInput, match="limit to be an int"):
        store.list(limit=False)


@pytest.mark.parametrize("bad_id", [None, 5, "", "x" * 129, "a\x00b", "\ud800"])
def test_bad_ids(store: MemoryStore, bad_id):
    for call in (store.get, store.forget, store.history, lambda i: store.update(i, "t")):
        with pytest.raises(InvalidInput):
            call(bad_id)


def test_unknown_ids_are_fact_not_found(store: MemoryStore):
    for call in (store.get, store.forget, store.history, lambda i: store.update(i, "t")):
        with pytest.raises(FactNotFound):
            call("0" * 32)
    with pytest.raises(InvalidInput, match="at least one of text, tags or source"):
        store.update(store.remember("x"))


def test_forget_where_needs_a_filter(store: MemoryStore):
    store.remember("x")
    with pytest.raises(InvalidInput, match="expected tags, where, source, since or until"):
        store.forget_where()
    assert len(store) == 1


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda n: np.full((n, 4), np.nan, np.float32), "non-finite"),
        (lambda n: np.full((n, 4), np.inf, np.float32), "non-finite"),
        (lambda n: np.zeros((n, 4), np.float32), "zero vector"),
        (lambda n: np.ones((n, 3), np.float32), r"expected shape \(1, 4\)"),
        (lambda n: np.ones((n + 1, 4), np.float32), "expected shape"),
        (lambda n: np.array([["a"] * 4] * n), "numeric array"),
        (lambda n: [[1.0, 2.0], [3.0]], "not an array|numeric|shape"),
    ],
)
def test_bad_embedder_output_is_refused(tmp_path: Path, make, message):
    # an embedder that is bad for every text fails at open, before a file is written
    with pytest.raises(EmbedderOutputInvalid, match="probed the embedder at open"):
        MemoryStore(tmp_path / "a.db", BadEmbedder(make))
    assert not (tmp_path / "a.db").exists()
    # the strict contract: remember() embeds before the commit and refuses a bad vector, storing nothing
    with MemoryStore(tmp_path / "b.db", BadEmbedder(make, bad_for="poison"), background_embedding=False) as store:
        with pytest.raises(EmbedderOutputInvalid, match=message):
            store.remember("poison fact")
        assert len(store) == 0
    with MemoryStore(tmp_path / "g.db", BadEmbedder(GOOD)) as store:
        store.remember("fact")
    # a query vector is checked too (the stored fingerprint matches, so no re-embed happens)
    with MemoryStore(tmp_path / "g.db", BadEmbedder(make, bad_for="fact")) as store:
        with pytest.raises(EmbedderOutputInvalid):
            store.recall("fact", mode="vector")
        assert store.recall("fact", mode="lexical")[0].text == "fact"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda n: np.full((n, 4), np.nan, np.float32), "non-finite"),
        (lambda n: np.zeros((n, 4), np.float32), "zero vector"),
        (lambda n: np.ones((n, 3), np.float32), r"expected shape \(1, 4\)"),
        (lambda n: [[1.0, 2.0], [3.0]], "not an array|numeric|shape"),
    ],
)
def test_bad_vector_in_the_background_leaves_the_fact_lexical_only(tmp_path: Path, make, message):
    with MemoryStore(tmp_path / "b.db", BadEmbedder(make, bad_for="poison")) as store:  # default mode
        good = store.remember("a good fact")
        bad = store.remember("a poison fact")  # committed and acknowledged: its vector comes later
        with pytest.raises(EmbedderOutputInvalid, match=message) as caught:
            store.flush()
        assert f"first {bad}" in str(caught.value) and "lexical recall" in str(caught.value)
        store.flush()  # each failure is raised once
        assert store.get(bad).text == "a poison fact" and store.get(bad).fingerprint is None
        assert [h.id for h in store.recall("poison", mode="lexical")] == [bad]
        assert [h.id for h in store.recall("good fact", k=5, mode="vector")] == [good]  # no vector, no hit
        assert bad in store.info()["vector_error"]
        report = store.check()
        assert not report.ok and report.waiting_vectors == 1 and report.indexed == 1
        assert any("1 fact has no vector" in p for p in report.problems), report.problems
        # a vector or hybrid recall raises for a new failure too (once), lexical recall never does
        store.remember("another poison fact")
        assert len(store.recall("another", mode="lexical")) == 1
        with pytest.raises(EmbedderOutputInvalid, match="recall\\(\\): the embedder failed on a remembered fact"):
            store.recall("good fact", mode="hybrid")
        assert store.recall("good fact", k=1, mode="hybrid")[0].id == good
        store.forget(bad)
    # still without a vector at the next open: retried there, and reported again
    with MemoryStore(tmp_path / "b.db", BadEmbedder(make, bad_for="poison")) as store:
        with pytest.raises(EmbedderOutputInvalid, match="first"):
            store.flush()
        assert store.check().waiting_vectors == 1
    # with a working embedder the next open embeds it: nothing is lost
    with MemoryStore(tmp_path / "b.db", BadEmbedder(GOOD)) as store:
        store.flush()
        assert store.check().ok and store.info()["indexed"] == 2


def test_embedder_exception_in_the_background_is_wrapped(tmp_path: Path):
    from evermind_memory import EvermindError

    with MemoryStore(tmp_path / "r.db", BadEmbedder(raising, bad_for="poison")) as store:
        fid = store.remember("poison pill")
        with pytest.raises(EvermindError, match="RuntimeError: the model server is down") as caught:
            store.flush()
        assert not isinstance(caught.value, EmbedderOutputInvalid)
        assert isinstance(caught.value.__cause__, RuntimeError) and fid in str(caught.value)
        assert store.recall("poison", mode="lexical")[0].id == fid
    with pytest.raises(EvermindError, match="raised RuntimeError: the model server is down"):
        MemoryStore(tmp_path / "x.db", BadEmbedder(raising))


def test_embedder_vectors_are_normalised(tmp_path: Path):
    with MemoryStore(tmp_path / "n.db", BadEmbedder(lambda n: np.full((n, 4), 7.0))) as store:
        store.remember("fact")
        assert store.recall("fact", mode="vector")[0].score == pytest.approx(1.0)


@pytest.mark.parametrize(
    "embedder, message",
    [
        (object(), "lacks embed, embed_many, dimensions, fingerprint"),
        (BadEmbedder(GOOD, dimensions=0), "dimensions"),
        (BadEmbedder(GOOD, dimensions=True), "dimensions"),
    ],
)
def test_bad_embedders(tmp_path: Path, embedder, message):
    with pytest.raises(InvalidInput, match=message):
        MemoryStore(tmp_path / "e.db", embedder)


def test_bad_fingerprint(tmp_path: Path):
    emb = BadEmbedder(GOOD)
    emb.fingerprint = ""
    with pytest.raises(InvalidInput, match="fingerprint"):
        MemoryStore(tmp_path / "e.db", emb)


def test_bad_constructor_args(tmp_path: Path, embedder):
    with pytest.raises(InvalidInput, match="durability"):
        MemoryStore(tmp_path / "a.db", embedder, durability="off")
    with pytest.raises(InvalidInput, match="on_mismatch"):
        MemoryStore(tmp_path / "a.db", embedder, on_mismatch="ignore")
    with pytest.raises(InvalidInput, match="lock_timeout"):
        MemoryStore(tmp_path / "a.db", embedder, lock_timeout=-1)
    with pytest.raises(InvalidInput, match="to exist"):
        MemoryStore(tmp_path / "missing" / "a.db", embedder)
    with pytest.raises(InvalidInput, match="does not exist"):
        MemoryStore(tmp_path / "nothing.db", embedder, read_only=True)
    with pytest.raises(InvalidInput, match="directory"):
        MemoryStore(tmp_path, embedder)
    with pytest.raises(InvalidInput, match="path"):
        MemoryStore(123, embedder)  # type: ignore[arg-type]


def test_no_embedder_means_the_shipped_default(tmp_path: Path):
    from evermind_memory import default_embedder

    with MemoryStore(tmp_path / "d.db") as store:
        assert store.fingerprint == default_embedder().fingerprint


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(exclude_categories=()), max_size=40))
def test_any_text_is_stored_exactly_or_refused_cleanly(store: MemoryStore, text: str):
    try:
        fid = store.remember(text, tags={"fuzz": "1"})
    except InvalidInput:
        assert "\x00" in text or not text.strip() or any(0xD800 <= ord(c) <= 0xDFFF for c in text)
        return
    assert store.get(fid).text == text
    store.recall(text, k=3)
    store.recall(text, k=3, mode="lexical")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tags=st.dictionaries(st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,20}", fullmatch=True),
                            st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20),
                            max_size=5))
def test_valid_tags_round_trip(store: MemoryStore, tags: dict):
    fid = store.remember("tagged fact", tags=tags)
    assert store.get(fid).tags == tags
    if tags:
        assert fid in {f.id for f in store.list(tags=tags, limit=1000)}
