"""A batch that holds the same text more than once embeds it once, on both engines, and its copies store the same
vector (remember_many of a note agents repeat, a re-embedding of a store full of copies)."""

from __future__ import annotations

from evermind_memory import MemoryStore
from store_helpers import stored_rows

TEXTS = ["Ada drinks tea with lemon", "Bob rides his bike to work", "Ada drinks tea with lemon",
         "Cy keeps bees on the roof", "Bob rides his bike to work", "Ada drinks tea with lemon"]


class CountingEmbedder:
    """A real embedder that records every text it is asked to embed in a batch."""

    def __init__(self, inner) -> None:
        self.inner, self.dimensions, self.fingerprint = inner, inner.dimensions, inner.fingerprint
        self.seen: list[str] = []

    def embed(self, text):
        return self.inner.embed(text)

    def embed_many(self, texts):
        self.seen.extend(texts)
        return self.inner.embed_many(texts)


def _vectors_by_text(target) -> dict[str, set[bytes]]:
    out: dict[str, set[bytes]] = {}
    for text, blob in stored_rows(target, "SELECT text, vector FROM facts"):
        out.setdefault(text, set()).add(bytes(blob))
    return out


def test_remember_many_embeds_each_text_once(target, embedder):
    counting = CountingEmbedder(embedder)
    with MemoryStore(target, counting) as store:
        counting.seen.clear()  # what opening the store embedded (its probe)
        ids = store.remember_many(TEXTS)
        assert sorted(counting.seen) == sorted(set(TEXTS))
        assert len(set(ids)) == len(TEXTS)  # every copy is a fact of its own
        hits = store.recall("Ada drinks tea with lemon", k=3, mode="vector")
        assert {h.id for h in hits} == {ids[0], ids[2], ids[5]}
    vectors = _vectors_by_text(target)
    assert set(vectors) == set(TEXTS)
    assert all(len(blobs) == 1 for blobs in vectors.values())  # copies hold the same bytes


def test_reembed_embeds_each_text_once(target, embedder, other_embedder):
    with MemoryStore(target, embedder) as store:
        store.remember_many(TEXTS)
    counting = CountingEmbedder(other_embedder)
    with MemoryStore(target, counting) as store:  # a new model: the store embeds its facts again
        store.reembed()
        assert {text: counting.seen.count(text) for text in TEXTS} == {text: 1 for text in TEXTS}
        assert store.recall("Cy keeps bees on the roof", k=1, mode="vector")[0].text == "Cy keeps bees on the roof"
    assert all(len(blobs) == 1 for blobs in _vectors_by_text(target).values())
