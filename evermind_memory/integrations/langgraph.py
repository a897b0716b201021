"""LangGraph's BaseStore over a MemoryStore: EvermindStore, long-term memory for LangGraph agents.

Needs the `langgraph` extra. How an item maps onto a fact (the facts of other code, without these tags, are
never seen; hand in `store.scope(user=...)` or `MemoryStore(path, namespace=...)` to keep agents apart):
    (namespace, key)  one fact whose id is "lg:" + a digest of both and the handle's scope: put upserts it,
                      delete forgets it (a handle also searches the items of the scopes under its own)
    value             the fact's text, the value as JSON (at most 100,000 characters). Semantic search embeds
                      that text: the whole value, as LangGraph's default `fields=["$"]` does (an index config
                      with other fields is refused); a per-put list of fields is accepted and not used
    namespace         tags lg.ns.0 .. lg.ns.<n-1> (one per label) and lg.depth: a prefix is one equality per
                      level, so search and list run in SQL; at most MAX_DEPTH labels, labels and key <= 512 chars
    value fields      scalar leaves (str <= 512 chars without NUL, bool, a number exact as a double) of nested
                      dicts become tags lg.f.<path> (path "a.b" for value["a"]["b"]), as many as the 32-tag budget
                      leaves, so a filter runs in SQL; an item with leaves left out is tagged lg.partial and
                      checked in Python
    ttl (minutes)     the fact's ttl: an expired item is never returned (omit_expired, always). lg.ttl keeps the
                      minutes so a read can refresh them (refresh_on_read): a refresh rewrites the fact (a
                      history row; updated_at moves), once 1% of the ttl has passed since the last. Expired
                      facts are swept by the store's own sweeper, every minute (sweep_interval_minutes is not
                      used)
    index=False       tag lg.noindex: query searches put such items after the scored ones, with score None
Filters compare typed values, as the where-language does: {"n": 3} matches the number 3, not "3" nor True;
$gt/$gte/$lt/$lte order numbers with numbers and strings with strings; $ne also matches items without the
field; a dict matches the fields it names (nested); a list matches an equal list.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping

try:
    from langgraph.store.base import (
        BaseStore, GetOp, IndexConfig, InvalidNamespaceError, Item, ListNamespacesOp, MatchCondition, Op, PutOp,
        Result, SearchItem, SearchOp, TTLConfig, validate_op_namespace,
    )
except ImportError as exc:  # pragma: no cover - the message is the point
    from .._extras import install_command

    raise ImportError("evermind_memory.integrations.langgraph needs langgraph: "
                      f"`{install_command('langgraph')}`") from exc

from ..errors import EvermindError, FactNotFound, InvalidInput
from ..store.memory_store import MemoryStore
from ..store.records import Fact, Recall
from ..store.validate import K_MAX, MAX_LIST_LIMIT, MAX_TAG_VALUE_CHARS, MAX_TAGS, TAG_KEY_RE, check_choice, value_type
from .threads import run_to_completion

MAX_DEPTH = 16
REFRESH_SLACK = 0.01  # a read refreshes a ttl only once 1% of it has passed since the last refresh
PAGE = 1000  # facts read per list() call when Python has to look at them
TTL_KEYS = ("refresh_on_read", "default_ttl", "sweep_interval_minutes", "omit_expired")
INDEX_KEYS = ("dims", "embed", "fields")
DEPTH, KEY, TTL, NOINDEX, PARTIAL = "lg.depth", "lg.key", "lg.ttl", "lg.noindex", "lg.partial"
ORDER_OPS = ("$gt", "$gte", "$lt", "$lte")
FILTER_OPS = ("$eq", "$ne", *ORDER_OPS)


class InvalidNamespace(InvalidInput, InvalidNamespaceError):
    """A namespace LangGraph or this store refuses (an InvalidInput and LangGraph's InvalidNamespaceError)."""


class EvermindStore(BaseStore):
    """A LangGraph BaseStore on a MemoryStore: put/get/search/list_namespaces/delete, TTL, semantic search.

        store = EvermindStore("memories.db", ttl={"default_ttl": 60 * 24})    # items live a day after last use
        store.put(("users", "ada", "memories"), "tea", {"text": "Ada prefers green tea", "kind": "preference"})
        store.search(("users", "ada"), query="what does Ada drink?", filter={"kind": "preference"}, limit=3)
        graph = builder.compile(store=store)                                  # LangGraph hands it to nodes

    Operations in one batch run in order. A bad namespace raises LangGraph's InvalidNamespaceError (from
    BaseStore's own put/get/search) or InvalidNamespace, which is both it and our InvalidInput (from batch).
    The async methods run the batch in a worker thread to its end, even when the await is cancelled. The
    module docstring has the item <-> fact mapping and the filter rules.

    Args:
        store: an open MemoryStore or scope view (closing this leaves it open), or a path (":memory:" by
            default) to open one, which close() closes.
        ttl: LangGraph's TTLConfig: default_ttl (minutes, for puts without ttl), refresh_on_read (default
            True); sweep_interval_minutes is accepted (our sweeper runs every minute), omit_expired too (always).
        mode: recall mode of query searches: "vector" (default: cosine scores, as LangGraph's stores give),
            "hybrid" or "lexical".
        index: LangGraph's IndexConfig, when opening a path: `embed` (a LangChain Embeddings, an embedding
            function, or a provider string if LangChain can load it) becomes the store's model (its vectors are
            kept: see LangChainEmbedder), `dims` must be its size; `fields` may only be ["$"] (the whole value,
            the default). None: the store's own model (the shipped one for a new store).
        fingerprint: with `index`, the model's name in the store (LangChainEmbedder).
        **options: MemoryStore(...) options when opening a path.
    Raises:
        InvalidInput: a bad ttl config, mode, index or option.
    """

    supports_ttl = True

    def __init__(self, store: MemoryStore | str | os.PathLike = ":memory:", *, ttl: TTLConfig | None = None,
                 mode: str = "vector", index: IndexConfig | None = None, fingerprint: str | None = None,
                 **options: Any) -> None:
        self._mode = check_choice(mode, "mode", ("vector", "hybrid", "lexical"), "EvermindStore")
        self.ttl_config = _check_ttl_config(ttl)
        if isinstance(store, MemoryStore):
            given = sorted(options) + ["index"] * (index is not None) + ["fingerprint"] * (fingerprint is not None)
            if given:
                raise InvalidInput(f"EvermindStore(store) uses an open MemoryStore as it is; give {', '.join(given)} "
                                   "to MemoryStore() instead (an index's embed as LangChainEmbedder(embed)).")
            self._store, self._owner = store, False
        else:
            embedder = index_embedder(index, fingerprint)
            self._store, self._owner = MemoryStore(store, embedder, **options), True

    @property
    def store(self) -> MemoryStore:
        """The MemoryStore (or scope view) the items live in."""
        return self._store

    def close(self) -> None:
        """Close the MemoryStore if this opened it."""
        if self._owner:
            self._store.close()

    def __enter__(self) -> "EvermindStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- BaseStore ---------------------------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order; one result per operation (None for a put or delete).

        Raises:
            InvalidNamespace: a bad namespace. InvalidInput: a bad value, key, ttl, filter or limit.
        """
        ops = list(ops)
        for op in ops:
            _check_namespace(op)
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, PutOp):
                results.append(self._put(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise InvalidInput(f"EvermindStore.batch() expected GetOp, SearchOp, PutOp or ListNamespacesOp, got "
                                   f"{type(op).__name__}.")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """batch() in a worker thread; a cancelled await lets the batch finish there (see threads.py)."""
        return await run_to_completion(None, self.batch, list(ops))

    def sweep(self) -> int:
        """Delete expired items now (the store's sweeper also does, every minute). Returns how many facts went."""
        return self._store.sweep()

    # ---- operations --------------------------------------------------------------------------------------------
    def _id(self, namespace: tuple[str, ...], key: str) -> str:
        return item_id(namespace, key, self._store.scoped_to)

    def _get(self, op: GetOp) -> Item | None:
        try:
            fact = self._store.get(self._id(op.namespace, op.key))
        except FactNotFound:
            return None
        if _namespace_of(fact) != tuple(op.namespace) or fact.tags.get(KEY) != op.key:
            return None  # a digest collision (never seen) or a fact of other code that took the id
        item = _item(fact)
        item = Item(namespace=item.namespace, key=item.key, value=item.value, created_at=item.created_at,
                    updated_at=item.updated_at)
        if op.refresh_ttl:
            self._refresh([fact])
        return item

    def _put(self, op: PutOp) -> None:
        fid = self._id(op.namespace, op.key)
        if op.value is None:
            try:
                self._store.forget(fid)
            except FactNotFound:
                pass  # deleting what is not there is a no-op in LangGraph
            return None
        minutes = _check_ttl(op.ttl)
        text = value_text(op.value)  # first: it says what a value must be (item_tags reads its leaves)
        tags = item_tags(op.namespace, op.key, op.value, index=op.index, ttl=minutes)
        self._store.remember(text, id=fid, tags=tags, ttl=None if minutes is None else minutes * 60)
        return None

    def _search(self, op: SearchOp) -> list[SearchItem]:
        limit, offset = _check_page(op.limit, op.offset, "search")
        if limit == 0:
            return []
        where = namespace_where(op.namespace_prefix)
        check: Callable[[dict], bool] | None = None
        if op.filter:
            if not isinstance(op.filter, Mapping):
                raise InvalidInput(f"search() expected filter to be a dict, got {type(op.filter).__name__}.")
            clause = filter_where(op.filter)
            where = {"$and": [where, clause]} if clause else where
            check = lambda value: matches(value, op.filter)  # noqa: E731  (SQL narrows; Python has the last word)
        if op.query:
            scored = self._scored(op.query, {"$and": [where, {NOINDEX: {"$exists": False}}]}, offset + limit, check)
            found = [(fact, score) for fact, score in scored[offset:]]
            if len(found) < limit:  # unindexed items follow, unscored (LangGraph's InMemoryStore does the same):
                # `scored` then holds every scored item, so a page past them starts that far into the unindexed
                start = max(0, offset - len(scored))
                found += [(fact, None) for fact in self._listed({"$and": [where, {NOINDEX: True}]}, start,
                                                                limit - len(found), check)]
        else:
            found = [(fact, None) for fact in self._listed(where, offset, limit, check)]
        items = [_item(fact, score) for fact, score in found]
        if op.refresh_ttl:
            self._refresh([fact for fact, _ in found])
        return items

    def _scored(self, query: str, where: dict, want: int,
                check: Callable[[dict], bool] | None) -> list[tuple[Recall, float]]:
        """The best `want` facts for query that pass `check`; recalls more while check drops some.

        Raises:
            InvalidInput: the answer needs more than the K_MAX best matches (a page past them, or a filter that
                only Python can check dropping too many), which recall does not rank.
        """
        k = min(K_MAX, want)
        while True:
            hits = self._store.recall(query, k, where=where, mode=self._mode)
            kept = [(hit, hit.score) for hit in hits if check is None or check(_value(hit))]
            if len(kept) >= want or len(hits) < k:
                return kept[:want]
            if k == K_MAX:
                raise InvalidInput(f"search() with a query ranks the {K_MAX} best matches, and this page (offset + "
                                   f"limit = {want}) needs more of them ({len(kept)} of {K_MAX} passed the filter); "
                                   "page within them, narrow the namespace, or search without a query.")
            k = min(K_MAX, k * 4)

    def _listed(self, where: dict, offset: int, limit: int, check: Callable[[dict], bool] | None) -> list[Fact]:
        """Facts matching `where` and `check`, in the order remembered, from `offset`, at most `limit`."""
        if check is None:
            return self._store.list(where=where, offset=offset, limit=min(limit, MAX_LIST_LIMIT))
        out: list[Fact] = []
        skipped, start = 0, 0
        while len(out) < limit:
            page = self._store.list(where=where, offset=start, limit=PAGE)
            for fact in page:
                if check(_value(fact)):
                    if skipped < offset:
                        skipped += 1
                    elif len(out) < limit:
                        out.append(fact)
            if len(page) < PAGE:
                break
            start += PAGE
        return out

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        limit, offset = _check_page(op.limit, op.offset, "list_namespaces")
        conditions = tuple(op.match_conditions or ())
        where: dict[str, Any] = {DEPTH: {"$gte": max([1] + [len(c.path) for c in conditions])}}
        for cond in conditions:
            if cond.match_type == "prefix":
                where.update({f"lg.ns.{i}": label for i, label in enumerate(cond.path) if label != "*"})
            elif cond.match_type != "suffix":
                raise InvalidInput("list_namespaces() expected match_type 'prefix' or 'suffix', got "
                                   f"{cond.match_type!r}.")
        if op.max_depth is not None and (isinstance(op.max_depth, bool) or not isinstance(op.max_depth, int)
                                         or op.max_depth < 1):
            raise InvalidInput(f"list_namespaces() expected max_depth to be an int >= 1 or None, got {op.max_depth!r}.")
        seen: set[tuple[str, ...]] = set()
        start = 0
        while True:  # every item is read once: namespaces are not stored apart from their items
            page = self._store.list(where=where, offset=start, limit=PAGE)
            for fact in page:
                ns = _namespace_of(fact)
                if all(_namespace_matches(cond, ns) for cond in conditions):
                    seen.add(ns if op.max_depth is None else ns[: op.max_depth])
            if len(page) < PAGE:
                break
            start += PAGE
        return sorted(seen)[offset: offset + limit]

    def _refresh(self, facts: list[Fact | Recall]) -> None:
        """Restart the ttl of items read (those put with one): each is rewritten with the same text and tags,
        unless its expiry was set within the last REFRESH_SLACK of its ttl (a hot item is not rewritten at every
        read; it may expire that much early)."""
        if self._store.read_only:
            return
        now = datetime.now(timezone.utc)
        for fact in facts:
            minutes = fact.tags.get(TTL)
            if minutes is None or fact.expires_at is None:
                continue
            if fact.expires_at >= now + timedelta(minutes=float(minutes) * (1 - REFRESH_SLACK)):
                continue
            try:
                self._store.remember(fact.text, id=fact.id, tags=dict(fact.tags), source=fact.source,
                                     ttl=float(minutes) * 60)
            except FactNotFound:
                continue


# ---- the mapping ----------------------------------------------------------------------------------------------
def item_id(namespace: tuple[str, ...], key: str, scope: Mapping[str, str] | None = None) -> str:
    """The fact id of an item: "lg:" + 40 hex digits of SHA-256 over the JSON of [scope, namespace labels, key].

    The scope (the handle's, e.g. {"user": "ada"}) is in it because fact ids are unique in the whole store, while
    two scopes may each hold an item at one namespace and key.
    """
    scope_items = sorted((scope or {}).items())
    text = json.dumps([scope_items, list(namespace), key], ensure_ascii=False)
    return "lg:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


def value_text(value: Mapping) -> str:
    """The JSON text of a value (a fact's text).

    Raises:
        InvalidInput: not a dict with str keys, not JSON (sets, NaN, objects), or a lone surrogate in it.
    """
    if not isinstance(value, Mapping):
        raise InvalidInput(f"put() expected value to be a dict, got {type(value).__name__}.")
    try:
        text = json.dumps(dict(value), ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput("put() expected a value of valid Unicode text, found a lone surrogate "
                           f"{exc.object[exc.start]!r} in it. Decode your bytes with errors='replace' first.") from None
    except (TypeError, ValueError) as exc:
        raise InvalidInput("put() expected a JSON value (str keys; str, number, bool, None, list, dict values): "
                           f"{exc}.") from None
    return text


def item_tags(namespace: tuple[str, ...], key: str, value: Mapping, *, index: Any = None,
              ttl: float | None = None) -> dict[str, Any]:
    """The tags of an item: its namespace, key, ttl, index flag and as many value leaves as fit.

    Raises:
        InvalidNamespace: more than MAX_DEPTH labels, or a label too long. InvalidInput: a key too long.
    """
    if not namespace:
        raise InvalidNamespace("put() expected a namespace with at least one label, e.g. ('users', 'ada').")
    if len(namespace) > MAX_DEPTH:
        raise InvalidNamespace(f"put() expected at most {MAX_DEPTH} namespace labels, got {len(namespace)}.")
    for label in namespace:
        if len(label) > MAX_TAG_VALUE_CHARS:
            raise InvalidNamespace(f"namespace labels are at most {MAX_TAG_VALUE_CHARS} characters, got {len(label)}.")
    if not isinstance(key, str) or len(key) > MAX_TAG_VALUE_CHARS or "\x00" in key:
        raise InvalidInput(f"put() expected key to be a str of at most {MAX_TAG_VALUE_CHARS} characters without NUL, "
                           f"got {key!r:.60}.")
    tags: dict[str, Any] = {DEPTH: len(namespace), KEY: key}
    tags.update({f"lg.ns.{i}": label for i, label in enumerate(namespace)})
    if ttl is not None:
        tags[TTL] = ttl
    if index is False:
        tags[NOINDEX] = True
    leaves = list(_leaves(value, ""))
    room = MAX_TAGS - len(tags) - 1  # one kept for lg.partial
    partial = any(tag is None for tag, _ in leaves) or sum(tag is not None for tag, _ in leaves) > room
    for tag, leaf in leaves:
        if tag is not None and room > 0:
            tags[tag] = leaf
            room -= 1
    if partial:
        tags[PARTIAL] = True
    return tags


def _leaves(value: Any, path: str):
    """(tag or None, leaf) of every scalar leaf under nested dicts; None: the leaf cannot be a tag."""
    for name, leaf in value.items():
        sub = f"{path}.{name}" if path else str(name)
        fits = isinstance(name, str) and "." not in name and TAG_KEY_RE.fullmatch(f"lg.f.{sub}") is not None
        if isinstance(leaf, Mapping):
            yield from _leaves(leaf, sub) if fits else [(None, leaf)]
        else:
            # lists, None, long strings, strings with NUL, big ints: filters on them are checked in Python
            yield (f"lg.f.{sub}" if fits and _taggable(leaf) else None), leaf


def _taggable(leaf: Any) -> bool:
    """Whether a scalar can be a tag value that compares in SQL as it does in Python: a bool, a finite number
    exact as a double, or a str of at most MAX_TAG_VALUE_CHARS with no NUL (which the store refuses in tags)."""
    kind = value_type(leaf)
    if kind == "bool":
        return True
    if kind == "number":
        return math.isfinite(leaf) and not (isinstance(leaf, int) and abs(leaf) > 2**53 - 1)
    return kind == "str" and len(leaf) <= MAX_TAG_VALUE_CHARS and "\x00" not in leaf


def namespace_where(prefix: tuple[str, ...]) -> dict:
    """The where-filter of the items under a namespace prefix (every item for ())."""
    where: dict[str, Any] = {DEPTH: {"$gte": max(1, len(prefix))}}
    where.update({f"lg.ns.{i}": label for i, label in enumerate(prefix)})
    return where


def filter_where(filter: Mapping) -> dict | None:
    """The SQL part of a LangGraph filter over value fields: it may let through more than match (items tagged
    lg.partial always pass; a condition the tags cannot express is left out), never less. `matches` decides.

    Raises:
        InvalidInput: an operator LangGraph does not have, or an order operator on a value it cannot order.
    """
    clauses: list[dict] = []
    for path, cond in _conditions(filter, ""):
        tag = f"lg.f.{path}" if path is not None and TAG_KEY_RE.fullmatch(f"lg.f.{path}") else None
        for op, operand in cond:
            if op in ORDER_OPS and value_type(operand) not in ("number", "str"):
                raise InvalidInput(f"filter: {op} orders numbers or strings, got {operand!r:.40} at {path!r}.")
            if tag is None or not _taggable(operand):
                continue
            clauses.append({tag: {op: operand}})
    if not clauses:
        return None
    return {"$or": [{"$and": clauses} if len(clauses) > 1 else clauses[0], {PARTIAL: True}]}


def _conditions(filter: Mapping, path: str):
    """(path or None, [(op, operand)]) of each field condition of a filter; None: a path no tag can name."""
    for name, cond in filter.items():
        sub = f"{path}.{name}" if path else str(name)
        named = sub if isinstance(name, str) and "." not in name and not name.startswith("$") else None
        if isinstance(cond, Mapping) and any(str(k).startswith("$") for k in cond):
            unknown = sorted(str(k) for k in cond if k not in FILTER_OPS)
            if unknown:
                raise InvalidInput(f"filter: {', '.join(unknown)} at {sub!r} is not a LangGraph filter operator "
                                   f"({', '.join(FILTER_OPS)}).")
            yield named, list(cond.items())
        elif isinstance(cond, Mapping) and cond:
            if named is None:
                yield None, [("$eq", cond)]
            else:
                yield from _conditions(cond, sub)
        else:
            yield named, [("$eq", cond)]


def matches(value: Mapping, filter: Mapping) -> bool:
    """Whether a value passes a LangGraph filter, by the typed rules of the module docstring."""
    return all(_passes(name in value, value.get(name), cond) for name, cond in filter.items())


def _passes(present: bool, got: Any, cond: Any) -> bool:
    if isinstance(cond, Mapping) and any(str(k).startswith("$") for k in cond):
        return all(_holds(present, got, op, operand) for op, operand in cond.items())
    if isinstance(cond, Mapping):
        return isinstance(got, Mapping) and all(_passes(k in got, got.get(k), v) for k, v in cond.items())
    return present and _same(got, cond)


def _holds(present: bool, got: Any, op: str, operand: Any) -> bool:
    if op == "$ne":
        return not (present and _same(got, operand))
    if not present:
        return False
    if op == "$eq":
        return _same(got, operand)
    kind = value_type(got)
    if kind not in ("number", "str") or kind != value_type(operand):
        return False
    return {"$gt": got > operand, "$gte": got >= operand, "$lt": got < operand, "$lte": got <= operand}[op]


def _same(a: Any, b: Any) -> bool:
    """Typed equality: 1 == 1.0, but 1 != True != "1"; lists and dicts element by element."""
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return isinstance(a, Mapping) and isinstance(b, Mapping) and a.keys() == b.keys() and all(
            _same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))
    return value_type(a) == value_type(b) and a == b


def _namespace_of(fact: Fact | Recall) -> tuple[str, ...]:
    depth = fact.tags.get(DEPTH)
    if not isinstance(depth, int) or isinstance(depth, bool):
        return ()
    return tuple(str(fact.tags.get(f"lg.ns.{i}", "")) for i in range(depth))


def _value(fact: Fact | Recall) -> dict:
    try:
        value = json.loads(fact.text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise EvermindError(f"fact {fact.id!r} carries LangGraph tags but its text is not a JSON object; forget it "
                            "or give it a JSON object text.")
    return value


def _item(fact: Fact | Recall, score: float | None = None) -> SearchItem:
    return SearchItem(namespace=_namespace_of(fact), key=str(fact.tags.get(KEY, "")), value=_value(fact),
                      created_at=fact.created_at, updated_at=fact.updated_at, score=score)


def _namespace_matches(cond: MatchCondition, ns: tuple[str, ...]) -> bool:
    path = tuple(cond.path)
    if len(ns) < len(path):
        return False
    part = ns[: len(path)] if cond.match_type == "prefix" else ns[len(ns) - len(path):]
    return all(want == "*" or want == got for want, got in zip(path, part))


def _check_namespace(op: Any) -> None:
    try:
        validate_op_namespace(op)
    except InvalidNamespaceError as exc:
        raise InvalidNamespace(str(exc)) from None
    if isinstance(op, PutOp) and not op.namespace:
        raise InvalidNamespace("put() expected a namespace with at least one label, e.g. ('users', 'ada').")


def _check_ttl(ttl: Any) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
        raise InvalidInput(f"put() expected ttl to be a positive number of minutes or None, got {ttl!r:.40}.")
    return float(ttl)


def _check_ttl_config(config: Any) -> TTLConfig | None:
    if config is None:
        return None
    if not isinstance(config, Mapping) or set(config) - set(TTL_KEYS):
        raise InvalidInput(f"EvermindStore() expected ttl to be a TTLConfig dict over {', '.join(TTL_KEYS)}, got "
                           f"{config!r:.80}.")
    if config.get("default_ttl") is not None:
        _check_ttl(config["default_ttl"])
    if not isinstance(config.get("refresh_on_read", True), bool):
        raise InvalidInput("EvermindStore() expected ttl['refresh_on_read'] to be a bool, got "
                           f"{config['refresh_on_read']!r}.")
    return TTLConfig(**config)


def index_embedder(index: Any, fingerprint: str | None = None) -> Any:
    """The store's embedder for a LangGraph IndexConfig: None (the store's own model) for no config.

    Raises:
        InvalidInput: not an IndexConfig we take, fields other than ["$"], an embed that cannot be loaded or
            called, dims that are not the embedding's size.
    """
    if index is None:
        if fingerprint is not None:
            raise InvalidInput("EvermindStore() got a fingerprint without an index; it names the index's embed model.")
        return None
    if not isinstance(index, Mapping) or set(index) - set(INDEX_KEYS) or "embed" not in index:
        raise InvalidInput("EvermindStore() expected index to be an IndexConfig dict with embed (and dims, "
                           f"fields), got {index!r:.80}.")
    fields = index.get("fields")
    if fields is not None and list(fields) != ["$"]:
        raise InvalidInput(f"EvermindStore() embeds each whole value (fields=['$']), got fields={fields!r:.60}: a "
                           "fact has one vector. Leave fields out, and keep the text to search in the value.")
    from langgraph.store.base.embed import ensure_embeddings

    from .langchain import EvermindEmbeddings, LangChainEmbedder

    try:
        embeddings = ensure_embeddings(index["embed"])
        embedder = (embeddings.embedder if isinstance(embeddings, EvermindEmbeddings)
                    else LangChainEmbedder(embeddings, fingerprint))
    except InvalidInput:
        raise
    except Exception as exc:  # a provider string LangChain cannot load, an async-only function, a failing model
        raise InvalidInput(f"EvermindStore() could not use index['embed'] ({index['embed']!r:.60}): {exc}") from None
    dims = index.get("dims")
    if dims is not None and dims != embedder.dimensions:
        raise InvalidInput(f"EvermindStore() expected index['dims'] to be the embedding's size, {embedder.dimensions}, "
                           f"got {dims!r:.20}.")
    return embedder


def _check_page(limit: Any, offset: Any, method: str) -> tuple[int, int]:
    for name, value in (("limit", limit), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(f"{method}() expected {name} to be an int >= 0, got {value!r:.40}.")
    return limit, offset


__all__ = ["EvermindStore", "InvalidNamespace", "filter_where", "index_embedder", "item_id", "item_tags", "matches",
           "namespace_where", "value_text"]
