"""How the SQLite backend turns a fault into a clear error: damaged files are named before SQLite touches them,
and every `sqlite3` or OS exception that escapes a session becomes one of ours.

Before a connection opens a store file (`preflight`): a file that is not SQLite, a header that contradicts the
file's length (a truncation), or an empty file whose sidecars (the index manifest, a non-empty WAL, the adapter
history) say it held a store, is refused with StoreCorrupt. SQLite would otherwise open an empty file as a new
store and delete the WAL beside it (measured: a 4 MB WAL of committed rows was removed by the first connection
to an emptied database), and a foreign file would leave a stray `<db>.lock` behind.

`translate()` maps an exception to the class a caller can act on:
- "database is locked" / busy                                  -> StoreLocked   (retry later)
- a read-only file or directory, a full disk, an I/O error    -> StorageError  (also an OSError: fix the system)
- a malformed page, a missing table, undecodable text, JSON   -> StoreCorrupt  (run repair)
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
from pathlib import Path

from ...errors import EvermindError, StorageError, StoreCorrupt, StoreLocked

SQLITE_MAGIC = b"SQLite format 3\x00"
REPAIR_HINT = "`evermind repair {path}` (or store.repair()) keeps every readable fact and quarantines the rest"
CHECK_HINT = "`evermind check {path}` lists what is wrong"

_STORAGE = {  # sqlite3 message fragment -> (errno, what to do)
    "readonly": (errno.EROFS, "give this process write access to the file and its directory, or open it with "
                              "read_only=True"),
    "unable to open": (errno.EACCES, "check that the directory exists and is readable and writable by this user "
                                     "(SQLite creates <db>-wal and <db>-shm beside the file)"),
    "disk is full": (errno.ENOSPC, "free disk space, then retry"),
    "disk i/o": (errno.EIO, "the disk or filesystem failed a read or write; check it (dmesg), then retry"),
    "out of memory": (errno.ENOMEM, "free memory, then retry"),
}
_CORRUPT = (  # sqlite3 message fragment -> the part it names
    ("fts", "full-text index"), ("vtable", "full-text index"), ("no such table", "schema"),
    ("no such column", "schema"), ("could not decode", "fact row"), ("malformed json", "fact row"),
    ("json", "fact row"), ("not a database", "database header"), ("malformed", "database"),
    ("unique constraint", "database index"), ("corrupt", "database"),
)


def repair_hint(path: str) -> str:
    """What to do about a damaged store at `path`: the command as a shell takes it (the path quoted if need be)."""
    import shlex

    return REPAIR_HINT.format(path=shlex.quote(path))


def translate(exc: BaseException, path: str, doing: str) -> EvermindError:
    """The error to raise for `exc`, raised while `doing` (e.g. "reading", "opening") the store at `path`.

    An EvermindError is returned as it is; an OSError becomes StorageError (errno kept); an sqlite3 error
    becomes StoreLocked, StorageError or StoreCorrupt by its message; anything else an EvermindError naming it.
    """
    if isinstance(exc, EvermindError):
        return exc
    text = str(exc)
    low = text.lower()
    if isinstance(exc, OSError):
        err = StorageError(f"{path}: the operating system refused {doing} ({exc.strerror or text}"
                           f"{': ' + exc.filename if getattr(exc, 'filename', None) else ''}). Check the permissions "
                           "and free space of the store's directory, then retry.")
        err.errno = exc.errno
        return err
    if isinstance(exc, sqlite3.Error):
        if "locked" in low or "busy" in low:
            return StoreLocked(f"{path}: another process held the database lock for longer than busy_timeout while "
                               f"{doing}; retry, or open the store with a larger busy_timeout.")
        for fragment, (code, todo) in _STORAGE.items():
            if fragment in low:
                err = StorageError(f"{path}: SQLite could not go on {doing} ({text}); {todo}.")
                err.errno = code
                return err
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.ProgrammingError):
            part = next((name for fragment, name in _CORRUPT if fragment in low), "database")
            import shlex

            return StoreCorrupt(f"{path}: the {part} is damaged ({text}) while {doing}. {repair_hint(path)}; "
                                f"{CHECK_HINT.format(path=shlex.quote(path))}.", path=path, part=part)
    return EvermindError(f"{path}: unexpected {type(exc).__name__} while {doing}: {text}")


def sidecar_evidence(path: str) -> list[str]:
    """Files beside `path` that show a store with contents lived there: a non-empty WAL, an index manifest naming
    a store with facts, index files, an adapter history. Empty when there are none."""
    found = []
    p = Path(path)
    try:
        if os.path.getsize(path + "-wal") > 32:
            found.append(f"{p.name}-wal ({os.path.getsize(path + '-wal')} bytes of log)")
    except OSError:
        pass
    manifest = p.with_name(p.name + ".json")
    try:
        if manifest.stat().st_size <= 64 * 1024:
            data = json.loads(manifest.read_bytes().decode("utf-8"))
            if isinstance(data, dict) and data.get("count"):
                found.append(f"{manifest.name} (an index of {data.get('live')} facts, store {data.get('store_id')})")
    except (OSError, ValueError):
        pass
    graphs = sorted(x.name for suffix in (".usearch", ".hnsw") for x in p.parent.glob(f"{p.name}.*{suffix}")
                    if x.is_file())
    if graphs:
        found.append(f"{graphs[0]} (an index file)")
    history = p.with_name(p.name + ".adapters") / "index.json"
    if history.is_file():
        found.append(f"{history.parent.name}/index.json (an adapter history)")
    return found


def preflight(path: str) -> None:
    """Refuse a store file that SQLite would misread, before any connection or lock file touches it.

    Raises:
        StoreCorrupt: not an SQLite file, a header that disagrees with the file length (truncated), or an empty
            file where sidecars show a store lived (SQLite would open it as a new, empty store and drop its WAL).
        StorageError: the file cannot be read.
    """
    try:
        size = os.path.getsize(path)
        if size == 0:
            header = b""
        else:
            with open(path, "rb") as fh:
                header = fh.read(100)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise translate(exc, path, "reading the database header") from None
    hint = repair_hint(path)
    if size == 0:
        evidence = sidecar_evidence(path)
        if evidence:
            raise StoreCorrupt(
                f"{path} is empty, but {'; '.join(evidence)} show a store with contents lived here: the database lost "
                f"its contents (a truncation or a bad copy). Restore it from a backup; or {hint} (here: none; the "
                "damaged files are kept aside and a new, empty store takes the name).", path=path,
                part="database (empty file)")
        return  # an empty file: a new store
    if not header.startswith(SQLITE_MAGIC):
        ours = sidecar_evidence(path)
        raise StoreCorrupt(
            f"{path} is not an SQLite database (its first bytes are {header[:16]!r}). "
            + (f"Beside it {'; '.join(ours)} show it was an evermind store: {hint}." if ours else
               "If it is an evermind store whose header was damaged, " + hint + "; otherwise choose another path."),
            path=path, part="database header")
    if len(header) < 100:
        raise StoreCorrupt(f"{path} is {size} bytes, shorter than SQLite's 100-byte header: it was truncated. {hint}.",
                           path=path, part="database header")
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    if page < 512 or page & (page - 1):
        raise StoreCorrupt(f"{path}: the database header names an impossible page size ({page}). {hint}.",
                           path=path, part="database header")
    if os.path.exists(path + "-wal"):
        return  # open (or left by a crash): a checkpoint may be growing the file right now; SQLite judges it
    pages = int.from_bytes(header[28:32], "big")
    valid = header[24:28] == header[92:96] and pages > 0  # SQLite's rule for trusting the in-header size
    if size % page or (valid and pages * page > size):
        raise StoreCorrupt(
            f"{path} is {size} bytes but its header says {pages} pages of {page} bytes ({pages * page} bytes): "
            f"the file was truncated or overwritten. {hint}.", path=path, part="database (truncated)")
