"""Blocking store calls from asyncio: each runs in a worker thread to its end, whatever happens to the await.

A MemoryStore call is one transaction (or a read); cutting it short from the event loop is neither possible
(Python cannot stop a thread) nor wanted (half a batch). So a cancelled await stops waiting, and the call still
completes in its thread; its result or error is dropped, never handed to another call.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from concurrent.futures import Executor, Future
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def _drop_outcome(future: "asyncio.Future[Any]") -> None:
    """Read a finished future's error so asyncio does not log "exception was never retrieved" for a call
    nobody awaits any more (its caller was cancelled)."""
    if not future.cancelled():
        future.exception()


def _abandon(release: Callable[[Any], None], future: "asyncio.Future[Any]") -> None:
    """Hand the result of a call nobody awaits any more to `release`."""
    if not future.cancelled() and future.exception() is None:
        release(future.result())


async def run_to_completion(executor: Executor | None, fn: Callable[..., T], *args: Any,
                            on_abandon: Callable[[T], None] | None = None, **kwargs: Any) -> T:
    """Run fn(*args, **kwargs) in `executor` (None: the loop's default) and await its result.

    Cancelling the await does not cancel the call: once submitted it runs to its end (even if it had not
    started yet), and its outcome goes nowhere, except that `on_abandon(result)` is called (in the loop) with
    the result of a call whose await was cancelled, to release what it made (a store it opened, say). The
    call sees the caller's contextvars, as asyncio.to_thread.

    Raises:
        whatever fn raises; asyncio.CancelledError if the await is cancelled.
    """
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    if executor is None:
        inner = loop.run_in_executor(None, call)
    else:
        submitted: Future[T] = executor.submit(call)
        inner = asyncio.wrap_future(submitted, loop=loop)
    try:
        # shield: a cancellation of this await must not reach `inner`, whose cancel would also cancel a
        # submitted call that has not started (so a cancelled await would sometimes write and sometimes not)
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        inner.add_done_callback(_drop_outcome if on_abandon is None else functools.partial(_abandon, on_abandon))
        raise
