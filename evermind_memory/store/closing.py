"""How a MemoryStore's life in a process ends (issue 17 item 4): close()'s best-effort steps, the finaliser of a
store dropped without close(), the atexit hook that closes every store still open, and the backend's follow()
callback, which must not keep a dropped store alive.

A script that never calls close() must exit and lose nothing; a notebook cell that opens the same store again
must not wait on its own earlier object. So nothing here raises, and nothing here waits during interpreter
finalisation. Everything here is called by memory_store.py with the store that owns the parts.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .memory_store import MemoryStore

_open_stores: "weakref.WeakSet[MemoryStore]" = weakref.WeakSet()  # closed by _close_all at interpreter exit


def track(store: MemoryStore) -> None:
    """Close `store` at interpreter exit if it is still open then."""
    _open_stores.add(store)


def close(store: MemoryStore) -> None:
    """MemoryStore.close(): stop the threads, embed the waiting vectors, save the index, checkpoint, release.

    A view only marks itself closed (the store it shares stays open). In a forked child only the release runs.
    """
    if store._closed or not store._owner:
        store._closed = True  # a view: the store it shares stays open
        return
    _open_stores.discard(store)
    ours = os.getpid() == store._pid
    store._sweeper.stop()
    adaptation = store._adaptation
    if adaptation is not None and ours:
        adaptation.stop(wait=True)  # its error, if any, stays for adaptation.join() to raise
    try:
        # Each step is best effort and never raises: what was acknowledged is committed already (a full disk,
        # a read-only directory or a damaged page met here loses nothing; the next open recovers).
        if store._worker.started and ours:
            try:
                store._worker.wait()
            except Exception:  # noqa: BLE001
                pass  # SQLite refused the writes (disk full): the facts wait in SQLite for any writer
            finally:
                store._worker.stop()
        if ours and store._access.saves_index and store._vectors.unsaved:
            try:
                store._vectors.save()
            except Exception:  # noqa: BLE001
                pass  # the index is a cache: SQLite has everything, next open replays or rebuilds
        if ours:
            try:
                store._checkpoints.at_close()
            except Exception:  # noqa: BLE001
                pass  # another process checkpoints later (or the last one to close)
    finally:
        store._closed = True
        release(store)


def release(store: MemoryStore) -> None:
    """Close the backend and retire the store's owner token: what it still owns (facts waiting, leases) may now
    be taken over at once. Also what a failed open runs."""
    if store._db is not None:
        store._db.close()
    store._holder.retire()


def drop(store: MemoryStore) -> None:
    """MemoryStore.__del__: free a store dropped without close() (a notebook cell run again, a script's last
    line) without waiting on anything.

    At interpreter exit the atexit hook has already closed it; if this runs during finalisation anyway, it touches
    no lock: a daemon thread frozen by the finalising interpreter may hold one (waiting on it is what hung scripts
    that never called close()). Never raises.
    """
    try:
        if not getattr(store, "_owner", False) or getattr(store, "_closed", True) or os.getpid() != store._pid:
            return
        store._closed = True
        if sys.is_finalizing():
            return  # committed data is in the WAL; the OS closes the files
        store._sweeper.signal_stop()
        if store._worker is not None:
            store._worker.signal_stop()
        release(store)
    except Exception:  # noqa: BLE001
        pass


def follower(store: MemoryStore) -> Any:
    """The backend's follow() callback for `store`: serve the generation the database names and replay the
    changes after the watermark, in the backend's thread (a weak reference: a dropped store is still collected)."""
    ref = weakref.ref(store)

    def on_change(head: int) -> None:
        live = ref()
        if live is None or live._closed:
            return
        cache = live._vectors
        if cache.loaded and (head < 0 or head > cache.current.watermark):  # (not loaded: its load reads it all)
            live._sync()

    return on_change


@atexit.register
def _close_all() -> None:
    """At exit (before daemon threads are frozen): close every store still open, so its waiting vectors are
    embedded, its index saved and its WAL checkpointed (nothing acknowledged is lost either way)."""
    for store in list(_open_stores):
        try:
            store.close()
        except Exception:  # noqa: BLE001 (exit must go on)
            pass
