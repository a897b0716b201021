"""LangChain over a MemoryStore: EvermindVectorStore (a VectorStore), EvermindEmbeddings (LangChain Embeddings
over our embedder) and LangChainEmbedder (the other way: a LangChain Embeddings as a store's embedder).

Needs the `langchain` extra (langchain-core). How a Document maps onto a fact:
    page_content      the fact's text (non-blank, at most 100,000 characters)
    id                the fact's id: adding with ids (or Documents that carry one) upserts
    metadata          tags (str, int, float or bool values; keys [A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}; at most 32),
                      except metadata["source"], a str, which is the fact's source (LangChain loaders put the
                      file or URL there; filters on "source" then read the fact's source)
Other metadata values (None, lists, dicts) are refused with the key named, or, with
non_scalar_metadata="json", kept as JSON text in the tag (the key is listed in the reserved tag "lc.json" and
decoded on the way back; a filter compares that JSON text). Filters are our where-language (Chroma-style:
$eq $ne $gt $gte $lt $lte $in $nin $exists $and $or) over metadata keys; a key named created_at or updated_at
means the metadata key, not the fact's time.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

try:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.vectorstores import VectorStore
    from langchain_core.vectorstores.utils import maximal_marginal_relevance
except ImportError as exc:  # pragma: no cover - the message is the point
    from .._extras import install_command

    raise ImportError("evermind_memory.integrations.langchain needs langchain-core: "
                      f"`{install_command('langchain')}`") from exc

from ..errors import FactNotFound, InvalidInput
from ..store.memory_store import MemoryStore
from ..store.records import Fact, Recall
from ..store.validate import (
    SCOPE_LEVELS, check_choice, check_id, check_source, check_text, check_typed_tags, scope_name_refused, value_type,
)

JSON_KEYS_TAG = "lc.json"  # reserved tag: the metadata keys whose values are stored as JSON text
SOURCE_KEY = "source"
TIME_KEYS = ("created_at", "updated_at")  # names our where-language gives the fact's own times
NON_SCALAR = ("refuse", "json")
ADD_OPTIONS = ("ttl", "expires_at", "pinned")  # passed to remember() for every text
IGNORED_OPTIONS = ("batch_size",)  # LangChain's indexing API passes it; we batch on our own
PROBE_TEXT = "evermind dimension probe"


class EvermindEmbeddings(Embeddings):
    """LangChain Embeddings over an evermind embedder: the unit-length vectors a MemoryStore with that embedder
    stores (embed_documents) and searches with (embed_query).

        emb = EvermindEmbeddings()            # the shipped model
        emb.embed_query("what does Ada drink?")   # 256 floats

    Args:
        embedder: any evermind embedder (embed, embed_many, dimensions, fingerprint); None: the shipped model.
    Raises:
        InvalidInput: not an embedder.
    """

    def __init__(self, embedder: Any = None) -> None:
        from ..embedder import default_embedder  # (here, not at import: importing this module loads no model code)
        from ..embedder.base import check_embedder

        if embedder is None:
            embedder = default_embedder()
        self._dim, self._fingerprint = check_embedder(embedder)
        self.embedder = embedder

    @property
    def dimensions(self) -> int:
        """Length of every vector."""
        return self._dim

    @property
    def fingerprint(self) -> str:
        """The embedder's fingerprint (which model made a vector)."""
        return self._fingerprint

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Vectors of texts to store. Raises: InvalidInput: not a list of str; EmbedderOutputInvalid."""
        texts = _texts(texts, "embed_documents")
        if not texts:
            return []
        from ..embedder.base import checked_vectors

        return checked_vectors(self.embedder.embed_many(texts), len(texts), self._dim).tolist()

    def embed_query(self, text: str) -> list[float]:
        """The vector of a query. Raises: InvalidInput: not a str; EmbedderOutputInvalid."""
        (text,) = _texts([text], "embed_query")
        from ..store.embedding import embed_query

        return embed_query(self.embedder, text, self._dim).tolist()  # (the query map's vector, as recall's)


class LangChainEmbedder:
    """A LangChain Embeddings as an evermind embedder: MemoryStore(path, LangChainEmbedder(OpenAIEmbeddings())).

    Documents go through embed_documents and queries through embed_query, so models that embed the two
    differently keep doing so. The fingerprint names the model whose vectors a store holds (a store opened
    with another re-embeds): by default the class, its model / model_name / model_id / size attribute and the
    dimensions; pass `fingerprint` when two configurations that this does not tell apart give other vectors.

    Raises:
        InvalidInput: not a LangChain Embeddings, or a bad fingerprint.
    """

    def __init__(self, embeddings: Embeddings, fingerprint: str | None = None) -> None:
        if not isinstance(embeddings, Embeddings):
            raise InvalidInput("LangChainEmbedder() expected a langchain_core Embeddings, got "
                               f"{type(embeddings).__name__}.")
        self.embeddings = embeddings
        self.dimensions = len(embeddings.embed_query(PROBE_TEXT))
        self.fingerprint = fingerprint if fingerprint is not None else _fingerprint_of(embeddings, self.dimensions)
        from ..embedder.base import check_embedder

        check_embedder(self)

    def embed(self, text: str) -> np.ndarray:
        return np.asarray(self.embeddings.embed_query(text), dtype=np.float32)  # (D,)

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.embeddings.embed_documents(list(texts)), dtype=np.float32)  # (N, D)


class EvermindVectorStore(VectorStore):
    """A LangChain VectorStore on a MemoryStore (the module docstring has the Document <-> fact mapping).

        vs = EvermindVectorStore("notes.db")                     # the shipped model
        vs.add_texts(["Ada prefers green tea"], metadatas=[{"topic": "drinks"}], ids=["ada-tea"])
        vs.similarity_search("what does Ada drink?", k=1, filter={"topic": "drinks"})
        vs.as_retriever(search_kwargs={"k": 3, "filter": {"topic": {"$in": ["drinks", "food"]}}})
        EvermindVectorStore(store.scope(user="ada"))             # one user's documents: a scope, not metadata

    Scores: similarity_search_with_score gives the store's recall score (cosine in the default vector mode,
    higher is closer); relevance scores are that cosine clipped to [0, 1] (vector mode only).

    Args:
        store: an open MemoryStore or scope view (used as it is: closing the vector store leaves it open), or
            a path (":memory:" by default) to open one, which close() closes.
        embedding: None: the store's own embedder (the shipped model for a new store). A LangChain Embeddings
            when opening a path: the store keeps its vectors (see LangChainEmbedder). With an open store it
            must be the store's own model (an EvermindEmbeddings of it, or the Embeddings it was opened with).
        mode: recall mode of searches: "vector" (default; cosine scores), "hybrid" or "lexical".
        non_scalar_metadata: "refuse" (default) or "json" (see the module docstring).
        fingerprint: with a LangChain embedding, the model's name in the store (LangChainEmbedder).
        **options: MemoryStore(...) options when opening a path (read_only, durability, namespace, ...).
    Raises:
        InvalidInput: bad options, or an embedding that is not the open store's model.
    """

    def __init__(self, store: MemoryStore | str | os.PathLike = ":memory:", embedding: Embeddings | None = None, *,
                 mode: str = "vector", non_scalar_metadata: str = "refuse", fingerprint: str | None = None,
                 **options: Any) -> None:
        self._mode = check_choice(mode, "mode", ("vector", "hybrid", "lexical"), "EvermindVectorStore")
        self._non_scalar = check_choice(non_scalar_metadata, "non_scalar_metadata", NON_SCALAR, "EvermindVectorStore")
        if embedding is not None and not isinstance(embedding, Embeddings):
            raise InvalidInput(f"EvermindVectorStore() expected embedding to be a LangChain Embeddings or None, got "
                               f"{type(embedding).__name__}.")
        if isinstance(store, MemoryStore):
            if options or fingerprint is not None:
                raise InvalidInput("EvermindVectorStore(store) uses an open MemoryStore as it is; give "
                                   f"{', '.join(sorted(options) or ['fingerprint'])} to MemoryStore() instead.")
            _check_same_model(store, embedding)
            self._store, self._owner = store, False
        else:
            embedder = None
            if isinstance(embedding, EvermindEmbeddings):
                embedder = embedding.embedder
            elif embedding is not None:
                embedder = LangChainEmbedder(embedding, fingerprint)
            self._store, self._owner = MemoryStore(store, embedder, **options), True
        self._embedding = None if isinstance(embedding, EvermindEmbeddings) else embedding

    # ---- what it wraps ---------------------------------------------------------------------------------------
    @property
    def store(self) -> MemoryStore:
        """The MemoryStore (or scope view) the documents live in."""
        return self._store

    @property
    def embeddings(self) -> Embeddings:
        """The Embeddings whose vectors this store holds (its current model, after any adaptation)."""
        return self._embedding if self._embedding is not None else EvermindEmbeddings(self._store.embedder)

    def close(self) -> None:
        """Close the MemoryStore if this vector store opened it (a store handed in stays open)."""
        if self._owner:
            self._store.close()

    def __enter__(self) -> "EvermindVectorStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writes ----------------------------------------------------------------------------------------------
    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                  ids: list[str | None] | None = None, **kwargs: Any) -> list[str]:
        """Store texts as facts; a text with an id replaces the fact with that id (upsert), one without gets a new id.

        Every text and metadata is checked before the first is stored; each text is then its own transaction.

        Args:
            texts: the texts.
            metadatas: one dict per text (see the module docstring), or None.
            ids: one id (1..128 characters) or None per text, or None.
            ttl, expires_at, pinned: as remember(), for every text. batch_size: accepted and ignored.
        Returns:
            the ids, in order.
        Raises:
            InvalidInput (a ValueError): lengths differ, a blank text, bad metadata or ids, an unknown option.
        """
        options = _options(kwargs, ADD_OPTIONS, "add_texts")
        texts = [check_text(text, f"texts[{i}]") for i, text in enumerate(_texts(texts, "add_texts"))]
        metadatas = _per_text(metadatas, len(texts), "metadatas")
        ids = [None if fid is None else check_id(fid) for fid in _per_text(ids, len(texts), "ids")]
        facts = [(text, *metadata_to_tags(meta, self._non_scalar, f"metadatas[{i}]"))
                 for i, (text, meta) in enumerate(zip(texts, metadatas))]
        return [self._store.remember(text, tags=tags, source=source, id=fid, **options)
                for (text, tags, source), fid in zip(facts, ids)]

    def delete(self, ids: list[str] | None = None, *, filter: Mapping | None = None, where: Mapping | None = None,
               **kwargs: Any) -> bool:
        """Forget the facts with these ids (ids that are not there are skipped), or every fact a filter matches.

        Returns:
            True.
        Raises:
            InvalidInput: neither ids nor a filter (to forget everything: vectorstore.store.clear(confirm=True)).
        """
        _options(kwargs, (), "delete")
        if ids is not None:
            for fid in _texts(ids, "delete"):
                try:
                    self._store.forget(fid)
                except (FactNotFound, InvalidInput):
                    pass  # an id that is not stored (or cannot be: too long) is already deleted
            return True
        if filter is None and where is None:
            raise InvalidInput("delete() expected ids or a filter; to delete every document call "
                               "vectorstore.store.clear(confirm=True).")
        self._store.forget_where(where=_where(filter, where))
        return True

    # ---- reads -----------------------------------------------------------------------------------------------
    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids that are stored, in the order asked (missing ids are skipped)."""
        docs = []
        for fid in _texts(ids, "get_by_ids"):
            try:
                docs.append(fact_to_document(self._store.get(fid)))
            except (FactNotFound, InvalidInput):
                continue
        return docs

    def similarity_search(self, query: str, k: int = 4, filter: Mapping | None = None, **kwargs: Any) -> list[Document]:
        """The k documents closest to query, best first (filter: the where-language over metadata)."""
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter, **kwargs)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: Mapping | None = None, *,
                                     where: Mapping | None = None, mode: str | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """(document, score) of the k best matches, best first: the store's recall score (cosine in vector mode).

        Args:
            query: what to look for. k: at most this many (1..1000).
            filter: the where-language over metadata keys (see the module docstring).
            where: our where-language as is (tags, source, created_at, updated_at), ANDed with filter.
            mode: "vector", "hybrid" or "lexical" for this search (default: the store's).
            since, until, recency, min_score: as MemoryStore.recall.
        Raises:
            InvalidInput: a bad query, k, filter or option.
        """
        options = _options(kwargs, ("since", "until", "recency", "min_score"), "similarity_search")
        hits = self._store.recall(query, k, where=_where(filter, where), mode=mode or self._mode, **options)
        return [(fact_to_document(hit), hit.score) for hit in hits]

    def _similarity_search_with_relevance_scores(self, query: str, k: int = 4,
                                                 **kwargs: Any) -> list[tuple[Document, float]]:
        if kwargs.get("mode", self._mode) != "vector":
            raise InvalidInput("relevance scores are cosines, so they need mode='vector'; got mode="
                               f"{kwargs.get('mode', self._mode)!r}.")
        return super()._similarity_search_with_relevance_scores(query, k, **{**kwargs, "mode": "vector"})

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return _clip_cosine

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: Mapping | None = None, *, where: Mapping | None = None,
                                      **kwargs: Any) -> list[Document]:
        """k documents picked from the fetch_k closest for closeness to query and difference from each other.

        The candidates' vectors are made again by `embeddings` (the store does not hand out its vectors).
        """
        _options(kwargs, (), "max_marginal_relevance_search")
        hits = self._store.recall(query, max(k, fetch_k), where=_where(filter, where), mode="vector")
        if not hits:
            return []
        emb = self.embeddings
        query_vec = np.asarray(emb.embed_query(query), dtype=np.float32)  # (D,)
        cand = np.asarray(emb.embed_documents([hit.text for hit in hits]), dtype=np.float32)  # (fetch_k, D)
        picked = maximal_marginal_relevance(query_vec, cand, lambda_mult=lambda_mult, k=k)
        return [fact_to_document(hits[i]) for i in picked]

    @classmethod
    def from_documents(cls, documents: list[Document], embedding: Embeddings | None = None,
                       **kwargs: Any) -> "EvermindVectorStore":
        """from_texts with the documents' texts, metadata and ids (the embedding optional here too)."""
        ids = [doc.id for doc in documents]
        if any(i is not None for i in ids):
            kwargs.setdefault("ids", ids)
        return cls.from_texts([doc.page_content for doc in documents], embedding,
                              [doc.metadata for doc in documents], **kwargs)

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings | None = None, metadatas: list[dict] | None = None, *,
                   ids: list[str] | None = None, store: MemoryStore | str | os.PathLike = ":memory:",
                   **kwargs: Any) -> "EvermindVectorStore":
        """A vector store on `store` (a path, ":memory:" by default, or an open MemoryStore) holding `texts`.

        kwargs go to EvermindVectorStore(...) (mode, non_scalar_metadata, fingerprint, MemoryStore options).
        """
        vs = cls(store, embedding, **kwargs)
        try:
            vs.add_texts(texts, metadatas, ids=ids)
        except BaseException:
            vs.close()
            raise
        return vs


# ---- Document <-> fact -------------------------------------------------------------------------------------------
def metadata_to_tags(metadata: Mapping | None, non_scalar: str, what: str) -> tuple[dict, str | None]:
    """(tags, source) of a Document's metadata (the module docstring has the rule).

    Raises:
        InvalidInput: not a dict, a non-str source, a non-scalar value (with non_scalar="refuse"), a value that
            is not JSON, a bad key, too many keys, a string too long, the reserved key "lc.json".
    """
    if metadata is None:
        return {}, None
    if not isinstance(metadata, Mapping):
        raise InvalidInput(f"{what} expected a dict of metadata, got {type(metadata).__name__}.")
    tags: dict[str, Any] = {}
    encoded: list[str] = []
    source = None
    for key, value in metadata.items():
        if key == SOURCE_KEY:
            if not isinstance(value, str):
                raise InvalidInput(f"{what}['source'] becomes the fact's source, which is text; got {value!r:.40} "
                                   f"({type(value).__name__}). Store it as a str.")
            source = value
        elif key in SCOPE_LEVELS:  # "user" is a scope in every interface, not a label
            raise InvalidInput(f"{scope_name_refused(key, what)} Here: EvermindVectorStore(store.scope({key}=...)) "
                               f"keeps each {key}'s documents apart.")
        elif key == JSON_KEYS_TAG:
            raise InvalidInput(f"{what} uses the key {JSON_KEYS_TAG!r}, which the vector store reserves; rename it.")
        elif value_type(value) in ("str", "number", "bool"):
            tags[key] = value
        elif non_scalar == "refuse":
            raise InvalidInput(
                f"{what}[{key!r}] is {value!r:.40} ({type(value).__name__}); metadata values become tags, which are "
                "str, int, float or bool. Drop or flatten it, or open the vector store with "
                "non_scalar_metadata='json' to keep it as JSON text.")
        else:
            try:
                tags[key] = json.dumps(value, ensure_ascii=False, sort_keys=True, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise InvalidInput(f"{what}[{key!r}] cannot be stored as JSON ({exc}).") from None
            encoded.append(str(key))
    if encoded:
        tags[JSON_KEYS_TAG] = ",".join(encoded)
    try:
        source = check_source(source)
    except InvalidInput as exc:
        raise InvalidInput(f"{what}['source']: {exc}") from None
    return check_typed_tags(tags, what), source


def fact_to_document(fact: Fact | Recall) -> Document:
    """The Document of a stored fact (JSON-kept metadata decoded, the source back under "source")."""
    metadata: dict[str, Any] = dict(fact.tags)
    for key in str(metadata.pop(JSON_KEYS_TAG, "")).split(","):
        if key and isinstance(metadata.get(key), str):
            try:
                metadata[key] = json.loads(metadata[key])
            except ValueError:
                pass  # stored by other means than this vector store: leave the text as it is
    if fact.source is not None:
        metadata[SOURCE_KEY] = fact.source
    return Document(page_content=fact.text, metadata=metadata, id=fact.id)


def _where(filter: Any, where: Any) -> dict | None:
    """Our where-filter of a LangChain filter (metadata keys) and a where (ours, as is), ANDed."""
    if filter is not None:
        if callable(filter):
            raise InvalidInput("filter expected a dict such as {'user': 'ada'}; a Python function cannot run "
                               "inside the database's search (it would cut results short of k).")
        if not isinstance(filter, Mapping):
            raise InvalidInput(f"filter expected a dict such as {{'user': 'ada'}}, got {type(filter).__name__}.")
        filter = _metadata_keys(filter)
    parts = [part for part in (filter, where) if part]
    return None if not parts else parts[0] if len(parts) == 1 else {"$and": parts}


def _metadata_keys(node: Any) -> Any:
    """A LangChain filter with metadata keys named like our time fields rewritten to tags[...]."""
    if not isinstance(node, Mapping):
        return node
    out = {}
    for key, value in node.items():
        if key in ("$and", "$or") and isinstance(value, list):
            out[key] = [_metadata_keys(part) for part in value]
        elif key in TIME_KEYS:
            out[f"tags[{key}]"] = value
        else:
            out[key] = value
    return out


def _check_same_model(store: MemoryStore, embedding: Embeddings | None) -> None:
    if embedding is None:
        return
    own = store.embedder
    if isinstance(embedding, EvermindEmbeddings) and embedding.fingerprint == store.fingerprint:
        return
    if isinstance(own, LangChainEmbedder) and own.embeddings is embedding:
        return
    raise InvalidInput(f"EvermindVectorStore(store, embedding) got an embedding that is not the store's model "
                       f"({store.fingerprint}); leave embedding out to use it, or open the MemoryStore with "
                       "LangChainEmbedder(embedding).")


def _fingerprint_of(embeddings: Embeddings, dim: int) -> str:
    cls = type(embeddings)
    model = next((getattr(embeddings, name) for name in ("model", "model_name", "model_id", "size")
                  if isinstance(getattr(embeddings, name, None), (str, int))), "")
    return f"langchain/{cls.__module__}.{cls.__qualname__}/{model}/{dim}"


def _clip_cosine(score: float) -> float:
    return min(1.0, max(0.0, float(score)))


def _texts(values: Any, method: str) -> list:
    if isinstance(values, (str, bytes)):
        raise InvalidInput(f"{method}() expected a list of str, got a single {type(values).__name__}; wrap it in a "
                           "list.")
    values = list(values)
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise InvalidInput(f"{method}() expected str items, got {type(value).__name__} at position {i}.")
    return values


def _per_text(values: Sequence | None, count: int, name: str) -> list:
    if values is None:
        return [None] * count
    values = list(values)
    if len(values) != count:
        raise InvalidInput(f"add_texts() expected one of {name} per text ({count}), got {len(values)}.")
    return values


def _options(kwargs: dict, known: Sequence[str], method: str) -> dict:
    unknown = sorted(set(kwargs) - set(known) - set(IGNORED_OPTIONS))
    if unknown:
        raise InvalidInput(f"{method}() got unknown options {', '.join(unknown)}; it takes "
                           f"{', '.join(known) or 'none'}.")
    return {key: value for key, value in kwargs.items() if key in known}


__all__ = ["EvermindEmbeddings", "EvermindVectorStore", "LangChainEmbedder", "fact_to_document", "metadata_to_tags"]
