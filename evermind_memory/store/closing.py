"""How a MemoryStore's life in a process ends (issue 17 item 4): close()'s best-effort steps, the finaliser of a
store dropped without close(), the atexit hook that closes every store still open, and the backend's follow()
callback, which must not keep a dropped store alive.

A script that never calls close() must exit and lose nothing; a notebook cell that opens the same store again
must not wait on its own earlier object. So nothing here raises, and nothing here waits during interpreter
finalisation. Everything here works on the parts (parts.py) of the store that opened them, never on a view.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .backend.base import Backend
    from .leases import Owner
    from .parts import StoreParts

_open_stores: "weakref.WeakSet[StoreParts]" = weakref.WeakSet()  # closed by _close_all at interpreter exit


def track(parts: StoreParts) -> None:
    """Close the store of `parts` at interpreter exit if it is still open then."""
    _open_stores.add(parts)


def close(parts: StoreParts) -> None:
    """MemoryStore.close(): stop the threads, embed the waiting vectors, save the index, checkpoint, release.

    In a forked child only the release runs.
    """
    if parts.closed:
        return
    _open_stores.discard(parts)
    ours = os.getpid() == parts.pid
    parts.sweeper.stop()
    parts.vectors.stop_background()
    adaptation = parts.adaptation
    if adaptation is not None and ours:
        adaptation.stop(wait=True)  # its error, if any, stays for adaptation.join() to raise
    try:
        # Each step is best effort and never raises: what was acknowledged is committed already (a full disk,
        # a read-only directory or a damaged page met here loses nothing; the next open recovers).
        if parts.worker.started and ours:
            try:
                parts.worker.wait()
            except Exception:  # noqa: BLE001
                pass  # SQLite refused the writes (disk full): the facts wait in SQLite for any writer
            finally:
                parts.worker.stop()
        if ours and parts.access.saves_index and parts.vectors.unsaved:
            try:
                parts.vectors.save()
            except Exception:  # noqa: BLE001
                pass  # the index is a cache: SQLite has everything, next open replays or rebuilds
        if ours and parts.access.saves_index:
            save_postings(parts)
        if ours:
            try:
                parts.checkpoints.at_close()
            except Exception:  # noqa: BLE001
                pass  # another process checkpoints later (or the last one to close)
    finally:
        parts.closed = True
        if ours:
            parts.vectors.close_index()  # no thread is inside the graph's native code from here (exit safety)
        release(parts.db, parts.holder)


def save_postings(parts: StoreParts, *, force: bool = False) -> bool:
    """Rewrite the lexical postings file beside a large store when it is due (store/postings_file.py), or with
    `force` whatever its age (compact(): pruned history leaves an older file unpatchable), under the "postings"
    lease so two processes do not both spend the seconds it takes. Best effort, never raises: the file is a cache,
    and without it a process reads FTS5's vocabulary as before."""
    from .postings_file import LEASE

    claimed = False

    def claim() -> bool:
        nonlocal claimed
        claimed = parts.leases.claim(LEASE, 120.0)
        return claimed

    try:
        return parts.db.save_postings(claim=claim, force=force)
    except Exception:  # noqa: BLE001
        return False
    finally:
        if claimed:
            try:
                parts.leases.release(LEASE)
            except Exception:  # noqa: BLE001
                pass  # it expires


def release(db: Backend | None, holder: Owner) -> None:
    """Close the backend and retire the store's owner token: what it still owns (facts waiting, leases) may now
    be taken over at once. Also what a failed open runs (`db` None: the backend did not open)."""
    if db is not None:
        db.close()
    holder.retire()


def drop(parts: StoreParts) -> None:
    """MemoryStore.__del__: free a store dropped without close() (a notebook cell run again, a script's last
    line) without waiting on anything.

    At interpreter exit the atexit hook has already closed it; if this runs during finalisation anyway, it touches
    no lock: a daemon thread frozen by the finalising interpreter may hold one (waiting on it is what hung scripts
    that never called close()). Never raises.
    """
    try:
        if parts.closed or os.getpid() != parts.pid:
            return
        parts.closed = True
        if sys.is_finalizing():
            return  # committed data is in the WAL; the OS closes the files
        parts.sweeper.signal_stop()
        parts.vectors.stop_background(wait=False)
        parts.worker.signal_stop()
        release(parts.db, parts.holder)
    except Exception:  # noqa: BLE001
        pass


def follower(parts: StoreParts) -> Callable[[int], None]:
    """The backend's follow() callback for a store's `parts`: serve the generation the database names and replay
    the changes after the watermark, in the backend's thread (a weak reference: a dropped store is still
    collected)."""
    ref = weakref.ref(parts)

    def on_change(head: int) -> None:
        live = ref()
        if live is None or live.closed:
            return
        cache = live.vectors
        if cache.loaded and (head < 0 or head > cache.current.watermark):  # (not loaded: its load reads it all)
            live.sync()

    return on_change


@atexit.register
def _close_all() -> None:
    """At exit (before daemon threads are frozen): close every store still open, so its waiting vectors are
    embedded, its index saved and its WAL checkpointed (nothing acknowledged is lost either way)."""
    for parts in list(_open_stores):
        try:
            close(parts)
        except Exception:  # noqa: BLE001 (exit must go on)
            pass
