"""The adapters of one SQLite store: `<db>.adapters/NNNN.lora` files and the `index.json` that lists them (a
PostgreSQL store keeps them in a table: backend/postgres_adapters.py, with the same methods). The store owns
them; adaptation reaches them only through the generation API (store/generations.py)."""

from __future__ import annotations

import json
import os
import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .._atomic import write_atomic
from ..errors import CheckpointError, InvalidInput
from ..lm.adapter import LoRAWeights, adapter_digest, load_adapter, save_adapter
from ..lm.checkpoint import file_sha256

if TYPE_CHECKING:
    from ..lm.model import EvermindLM

HISTORY_FORMAT = "evermind-adapters 1"
HISTORY_INDEX = "index.json"
ADAPTER_FILE_RE = re.compile(r"^(\d{4,9})\.lora$")
MAX_HISTORY_BYTES = 4 << 20


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class AdapterLog(Protocol):
    """What the store's adapter history offers (AdapterHistory beside an SQLite file, the `adapters` table of a
    PostgreSQL store): its entries, oldest first, and adding, updating and loading one."""

    def entries(self) -> list[dict]: ...

    def get(self, adapter_id: str) -> dict: ...

    def add(self, weights: LoRAWeights, **info: object) -> dict: ...

    def update(self, adapter_id: str, **changes: object) -> None: ...

    def load(self, entry: dict, model: EvermindLM) -> LoRAWeights: ...


class AdapterHistory:
    """The adapters of one store: `<db>.adapters/NNNN.lora` files plus `index.json` listing them.

    Files are written atomically and never deleted (any of them can be rolled back to); the JSON index is
    informational and rewritten atomically; the store's SQLite meta says which adapter is active.

    Args:
        directory: the adapters directory (created on first write).
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()

    def entries(self) -> list[dict]:
        """Every known adapter, oldest first (an unreadable index is rebuilt from the files)."""
        data = self._read()
        by_id = {e["id"]: e for e in data}
        if self.directory.is_dir():
            for p in sorted(self.directory.iterdir()):
                m = ADAPTER_FILE_RE.match(p.name)
                if m and m.group(1) not in by_id:
                    by_id[m.group(1)] = {"id": m.group(1), "file": p.name, "status": "unlisted"}
        return [by_id[i] for i in sorted(by_id)]

    def _read(self) -> list[dict]:
        path = self.directory / HISTORY_INDEX
        try:
            if path.stat().st_size > MAX_HISTORY_BYTES:
                return []
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        if not isinstance(raw, dict) or raw.get("format") != HISTORY_FORMAT or not isinstance(raw.get("entries"), list):
            return []
        good = []
        for e in raw["entries"]:
            if isinstance(e, dict) and isinstance(e.get("id"), str) and isinstance(e.get("file"), str) \
                    and ADAPTER_FILE_RE.match(e["file"]) and e["file"] == f"{e['id']}.lora":
                good.append(e)
        return good

    def _write(self, entries: list[dict]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"format": HISTORY_FORMAT, "entries": entries}, indent=1, sort_keys=True)
        write_atomic(self.directory / HISTORY_INDEX, data.encode("utf-8"))

    def get(self, adapter_id: str) -> dict:
        """The entry of one adapter.

        Raises:
            InvalidInput: no such adapter.
        """
        return entry_of(self.entries(), adapter_id, str(self.directory))

    def path(self, entry: dict) -> Path:
        """The file of an entry (its name is checked)."""
        name = str(entry.get("file", ""))
        if not ADAPTER_FILE_RE.match(name):
            raise CheckpointError(f"adapter entry names an unexpected file {name!r:.60}.")
        return self.directory / name

    def add(self, weights: LoRAWeights, **info: object) -> dict:
        """Write a new adapter file (atomic) and list it with status "candidate".

        Returns:
            the entry: id, file, sha256, digest, created_at, status and `info`.
        Raises:
            CheckpointError: the file system refused the write.
        """
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            entries = self.entries()
            taken = [int(e["id"]) for e in entries]
            taken += [int(m.group(1)) for p in self.directory.iterdir() if (m := ADAPTER_FILE_RE.match(p.name))]
            adapter_id = f"{max(taken, default=0) + 1:04d}"
            path = self.directory / f"{adapter_id}.lora"
            save_adapter(path, weights)
            entry = {"id": adapter_id, "file": path.name, "sha256": file_sha256(path),
                     "digest": adapter_digest(weights), "created_at": _utc_now(), "status": "candidate", **info}
            self._write([e for e in entries if e["id"] != adapter_id] + [entry])
            return entry

    def put(self, entry: dict, data: bytes) -> None:
        """Write an adapter file's bytes under its entry's id and list the entry (copying a store's adapters).

        Raises:
            CheckpointError: the entry names no valid file.
        """
        with self._lock:
            path = self.path(entry)
            if entry.get("file") != f"{entry.get('id')}.lora":
                raise CheckpointError(f"adapter entry {entry.get('id')!r:.40} names the file "
                                      f"{entry.get('file')!r:.40}.")
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data)
            self._write([e for e in self.entries() if e["id"] != entry["id"]] + [dict(entry)])

    def update(self, adapter_id: str, **changes: object) -> None:
        """Change fields of an entry (best effort: the index is informational)."""
        with self._lock:
            entries = self.entries()
            for e in entries:
                if e["id"] == adapter_id:
                    e.update(changes)
            try:
                self._write(entries)
            except OSError:
                pass

    def load(self, entry: dict, model: EvermindLM) -> LoRAWeights:
        """Load an adapter, checked against its recorded sha256 and the model's shapes.

        Raises:
            CheckpointError: missing, corrupt, not the recorded file, or not fitting the model.
        """
        sha = entry.get("sha256")
        return load_adapter(self.path(entry), model=model, sha256=sha if isinstance(sha, str) else None)


def entry_of(entries: list[dict], adapter_id: str, where: str) -> dict:
    """The entry with id `adapter_id` among `entries` (an adapter history's, file or database).

    Raises:
        InvalidInput: no such adapter (the message names `where` and the known ids).
    """
    for e in entries:
        if e["id"] == adapter_id:
            return e
    ids = [e["id"] for e in entries]
    raise InvalidInput(f"no adapter {adapter_id!r} in {where}; known: {ids or 'none'} (or 'base').")
