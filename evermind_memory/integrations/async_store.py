"""AsyncMemoryStore: every public method of MemoryStore as a coroutine, run in a worker thread.

The twins are made from MemoryStore's own methods when this module loads (same names, signatures and
docstrings), so a method added to MemoryStore gets its async twin with no edit here; `scope()` and the
properties stay plain (they do no I/O). Cancellation: see threads.py (a cancelled await never cuts a call short).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import EvermindError, InvalidInput
from ..store.memory_store import MemoryStore
from .threads import run_to_completion

MAX_WORKERS = 64
PLAIN_METHODS = ("scope",)  # no I/O: returns a view at once, so it stays a plain method (returning an async view)


class AsyncMemoryStore:
    """A MemoryStore for asyncio programs: `await store.remember(...)`, `await store.recall(...)`.

        async with await AsyncMemoryStore.open("agent.db") as store:
            fid = await store.scope(user="ada").remember("Ada prefers green tea", tags={"topic": "drinks"})
            hits = await store.recall("what does Ada drink?", k=3)

    Every public method of MemoryStore is here as a coroutine with the same arguments, run in a bounded pool
    of worker threads (MemoryStore is thread-safe: reads run side by side, writes are serialised); the
    properties (path, fingerprint, scoped_to, ...) are plain attributes, and `scope(...)` returns an
    AsyncMemoryStore view at once.

    Cancellation: a call, once awaited, runs in its thread to its end even if the await is cancelled (Python
    cannot stop a thread part way, and a write is one transaction, so it is either wholly done or, if it
    fails, not done at all: never half done). A cancelled `remember` is therefore stored; its result is
    dropped, never handed to another call. `aclose()` waits for every call still running, then closes.

    Args:
        path: as MemoryStore(path, ...), or an open MemoryStore (or a scope view) to wrap; the embedder and
            options must then be left out, and aclose() closes that store.
        embedder, **options: as MemoryStore(...). Opening loads the model (about 0.5 s): inside a running
            event loop prefer `await AsyncMemoryStore.open(...)`, which opens in a thread.
        max_workers: threads in the pool (1..64), shared by the views of this store.
    Raises:
        InvalidInput: a bad max_workers, or options given with an open MemoryStore; as MemoryStore(...).
    """

    def __init__(self, path: Any, embedder: Any = None, *, max_workers: int = 4, **options: Any) -> None:
        _check_workers(max_workers, "AsyncMemoryStore")
        if isinstance(path, MemoryStore):
            if embedder is not None or options:
                raise InvalidInput("AsyncMemoryStore(store) wraps a store that is already open; pass its embedder and "
                                   "options to MemoryStore() instead (got "
                                   f"{', '.join(['embedder'] * (embedder is not None) + sorted(options))}).")
            store = path
        else:
            store = MemoryStore(path, embedder, **options)
        self._store = store
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="evermind-async")
        self._root = self
        self._closed = False

    @classmethod
    async def open(cls, path: str | os.PathLike, embedder: Any = None, *, max_workers: int = 4,
                   **options: Any) -> "AsyncMemoryStore":
        """Open a MemoryStore in a worker thread (the event loop keeps running while the model loads) and wrap it.

        If this await is cancelled the store still opens in its thread, and is then closed.

        Raises:
            as MemoryStore(path, embedder, **options).
        """
        _check_workers(max_workers, "AsyncMemoryStore.open")
        store = await run_to_completion(None, MemoryStore, path, embedder, on_abandon=_close_later, **options)
        return cls(store, max_workers=max_workers)

    @property
    def store(self) -> MemoryStore:
        """The MemoryStore (or scope view) this wraps, for code that is not async."""
        return self._store

    def scope(self, *, namespace: str | None = None, user: str | None = None, agent: str | None = None,
              run: str | None = None) -> "AsyncMemoryStore":
        """An async view confined to a scope: MemoryStore.scope(...) wrapped, sharing this store's threads.

        Raises:
            InvalidInput: as MemoryStore.scope. EvermindError: this store is closed.
        """
        self._check_open()
        view = object.__new__(AsyncMemoryStore)
        view._store = self._store.scope(namespace=namespace, user=user, agent=agent, run=run)
        view._pool, view._root, view._closed = self._pool, self._root, False
        return view

    async def aclose(self) -> None:
        """Wait for every call still running, then close the store (a view: only this handle). Idempotent.

        Calls made after it (or while it waits) raise EvermindError. If this await is cancelled, the closing
        still completes in its thread.
        """
        if self._closed:
            return
        self._closed = True
        if self._root is self:
            await run_to_completion(None, self._shut_down)
        else:
            self._store.close()  # a view: marks the view closed, touches nothing shared

    close = aclose  # the async twin of MemoryStore.close

    def _shut_down(self) -> None:
        self._pool.shutdown(wait=True)  # every call already submitted runs to its end first
        self._store.close()

    def _check_open(self) -> None:
        if self._closed or self._root._closed:
            raise EvermindError("this AsyncMemoryStore is closed; open a new one.")

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._check_open()
        try:
            return await run_to_completion(self._pool, getattr(self._store, name), *args, **kwargs)
        except RuntimeError as exc:
            if self._root._closed and "shutdown" in str(exc):  # submitted as aclose() shut the pool
                raise EvermindError("this AsyncMemoryStore is closed; open a new one.") from None
            raise

    async def __aenter__(self) -> "AsyncMemoryStore":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"Async{self._store!r}" if not self._closed else f"AsyncMemoryStore({self._store.path!r}, closed)"


def _check_workers(value: Any, method: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise InvalidInput(f"{method}() expected max_workers to be an int in [1, {MAX_WORKERS}], got {value!r:.40}.")


def _close_later(store: MemoryStore) -> None:
    """Close a store opened for an await that was cancelled (in a thread: close waits for its vectors)."""
    asyncio.get_running_loop().run_in_executor(None, store.close)


def _async_twin(name: str) -> Any:
    method = getattr(MemoryStore, name)

    @functools.wraps(method)  # name, docstring and (through __wrapped__) the signature of the sync method
    async def twin(self: AsyncMemoryStore, *args: Any, **kwargs: Any) -> Any:
        return await self._call(name, *args, **kwargs)

    twin.__qualname__ = f"AsyncMemoryStore.{name}"
    twin.__doc__ = (f"Async twin of MemoryStore.{name}, run in a worker thread (see "
                    f"AsyncMemoryStore).\n\n{method.__doc__ or ''}")
    return twin


def _forwarded(name: str) -> property:
    prop = inspect.getattr_static(MemoryStore, name)
    return property(lambda self: getattr(self._store, name), doc=prop.__doc__)


def public_members() -> tuple[list[str], list[str]]:
    """(methods, properties): the public names of MemoryStore that AsyncMemoryStore mirrors."""
    methods, properties = [], []
    for name in sorted(dir(MemoryStore)):
        if name.startswith("_"):
            continue
        member = inspect.getattr_static(MemoryStore, name)
        if isinstance(member, property):
            properties.append(name)
        elif inspect.isfunction(member):
            methods.append(name)
    return methods, properties


def _mirror_memory_store() -> None:
    methods, properties = public_members()
    for name in methods:
        if name not in PLAIN_METHODS and name != "close":
            setattr(AsyncMemoryStore, name, _async_twin(name))
    for name in properties:
        setattr(AsyncMemoryStore, name, _forwarded(name))


_mirror_memory_store()
