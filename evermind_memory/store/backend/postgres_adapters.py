"""The adapters of a PostgreSQL store, in its `adapters` table: id, the entry (JSON: file, sha256, digest,
status, round, ...) and the adapter file's bytes. The same methods as store/adapter_history.AdapterHistory (which
keeps them as files beside an SQLite store), so adaptation, rollback and every node read one history.

An adapter is written and read through the one file format (lm/adapter.py: magic, CRC, shapes): `add` saves it
to a private temp file and stores the bytes; `load` checks the recorded sha256 and size before it writes them
to a temp file for load_adapter, which validates the rest. Ids are allocated inside the store's write
transaction, so two nodes never take the same one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import CheckpointError

if TYPE_CHECKING:
    from ...lm.adapter import LoRAWeights
    from ...lm.model import EvermindLM
    from .postgres import PostgresBackend
    from .postgres_session import PostgresSession

MAX_ADAPTER_BYTES = 256 << 20  # lm/adapter.DEFAULT_MAX_BYTES's order: refuse anything larger before touching it


class DatabaseAdapters:
    """AdapterHistory's interface (store/adapter_history.AdapterLog, and `put` and `data` for migrate) over the
    `adapters` table of one PostgreSQL store.

    Args:
        backend: the PostgresBackend (its sessions and write transactions).
    """

    def __init__(self, backend: PostgresBackend) -> None:
        self._db = backend
        self.directory = Path(backend.path)  # shown in messages only (a URL without its password)

    def entries(self) -> list[dict]:
        """Every adapter, oldest first."""
        with self._db.reading() as r:
            rows = r.conn.execute("SELECT entry FROM adapters ORDER BY id").fetchall()
        out = []
        for (raw,) in rows:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                out.append(entry)
        return out

    def get(self, adapter_id: str) -> dict:
        """The entry of one adapter.

        Raises:
            InvalidInput: no such adapter.
        """
        from ..adapter_history import entry_of

        return entry_of(self.entries(), adapter_id, "this store")

    def add(self, weights: LoRAWeights, **info: object) -> dict:
        """Store a new adapter with status "candidate"; returns its entry (id, file, sha256, digest, created_at,
        status and `info`)."""
        from ...lm.adapter import adapter_digest, save_adapter

        with tempfile.TemporaryDirectory(prefix="evermind-adapter-") as tmp:
            path = Path(tmp) / "adapter.lora"
            save_adapter(path, weights)
            data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        with self._db.transaction() as tx:
            taken = [int(r[0]) for r in tx.conn.execute("SELECT id FROM adapters").fetchall() if str(r[0]).isdigit()]
            adapter_id = f"{max(taken, default=0) + 1:04d}"
            entry = {"id": adapter_id, "file": f"{adapter_id}.lora", "sha256": sha, "digest": adapter_digest(weights),
                     "created_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"), "status": "candidate",
                     **info}
            self._insert(tx, entry, data)
        return entry

    def put(self, entry: dict, data: bytes) -> None:
        """Store one adapter's entry and file bytes as they are (migrate copies a store's adapters this way, as
        AdapterHistory.put writes them beside an SQLite file)."""
        with self._db.transaction() as tx:
            self._insert(tx, entry, data)

    @staticmethod
    def _insert(tx: PostgresSession, entry: dict, data: bytes) -> None:
        """Insert (or replace) one adapter in the write transaction `tx`."""
        tx.conn.execute("INSERT INTO adapters (id, entry, data, sha256) VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO "
                        "UPDATE SET entry = excluded.entry, data = excluded.data, sha256 = excluded.sha256",
                        (entry["id"], json.dumps(entry, sort_keys=True), data, hashlib.sha256(data).hexdigest()))

    def update(self, adapter_id: str, **changes: object) -> None:
        """Change fields of an entry."""
        with self._db.transaction() as tx:
            row = tx.conn.execute("SELECT entry FROM adapters WHERE id = %s", (adapter_id,)).fetchone()
            if row is None:
                return
            entry = {**json.loads(row[0]), **changes}
            tx.conn.execute("UPDATE adapters SET entry = %s WHERE id = %s",
                            (json.dumps(entry, sort_keys=True), adapter_id))

    def data(self, adapter_id: str) -> bytes | None:
        """The adapter file's bytes, or None."""
        with self._db.reading() as r:
            row = r.conn.execute("SELECT data FROM adapters WHERE id = %s AND octet_length(data) <= %s",
                                 (adapter_id, MAX_ADAPTER_BYTES)).fetchone()
        return None if row is None else bytes(row[0])

    def load(self, entry: dict, model: EvermindLM) -> LoRAWeights:
        """The LoRAWeights of an entry, checked against its recorded sha256 and the model's shapes.

        Raises:
            CheckpointError: missing, too large, corrupt, not the recorded bytes, or not fitting the model.
        """
        from ...lm.adapter import load_adapter

        adapter_id = entry.get("id") if isinstance(entry, dict) else None
        data = None if not isinstance(adapter_id, str) else self.data(adapter_id)
        if data is None:
            raise CheckpointError(f"adapter {adapter_id!r:.40} is not in the store's adapters table (or is larger "
                                  f"than {MAX_ADAPTER_BYTES} bytes).")
        sha = entry.get("sha256")
        if isinstance(sha, str) and hashlib.sha256(data).hexdigest() != sha:
            raise CheckpointError(f"adapter {adapter_id} in the database is not the one recorded (sha256 differs).")
        fd, name = tempfile.mkstemp(prefix="evermind-adapter-", suffix=".lora")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            return load_adapter(name, model=model, sha256=sha if isinstance(sha, str) else None)
        finally:
            os.unlink(name)
