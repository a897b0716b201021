"""The adapter side of a store's generation: the adaptation state recorded in meta (the serving adapter, the base
model it sits on, a publish in progress, how far the adapter has seen the memories), what an adaptation round
learns from (memories, feedback), adapter files, and the one way the store obtains an embedder.

`AdapterState` holds the reads; `Generations` (generations.py), which builds and swaps generations, inherits
them, so adaptation still sees one public generation API.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from .._lazy import lazy_import
from ..embedder.base import Adaptable, Embedder, is_adaptable
from ..errors import CheckpointError, InvalidInput
from .backend import vector_blobs
from .backend.base import Backend
from .vectors import VectorCache

if TYPE_CHECKING:
    from ..lm.adapter import LoRAWeights
    from .adapter_history import AdapterLog


if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

# Adaptation state in the database (the truth): the active adapter, the base model it sits on, a publish in
# progress, and how far the serving adapter has seen the memories.
META_ADAPTER = "adapter"
META_BASE_FP = "base_fingerprint"
META_PENDING = "adapt_pending"
META_ADAPT_SEQ = "adapt_seq"  # the change seq up to which the serving adapter has seen memories
_ADAPTER_NAME_RE = re.compile(r"^\d{4,9}\.lora$")


def resolve_embedder(embedder: Embedder | None = None, adapter: LoRAWeights | None = None) -> Embedder:
    """The store's one way to obtain an embedder, through embedder/loader.py: the shipped default (its weights
    read at the first embed), the one given, or one plus an adapter.

    Args:
        embedder: the embedder to use; None for the shipped default model.
        adapter: lm.adapter.LoRAWeights fitted on embedder.model: merged into a new LMEmbedder whose
            fingerprint covers the adapter (R11); `embedder` itself is not changed.
    Returns:
        the embedder.
    Raises:
        InvalidInput: the adapter does not fit the model or the merged weights are not finite.
        EvermindError, CheckpointError: no default model is shipped, or its card is damaged.
    """
    from ..embedder.loader import adapted_embedder, default_embedder

    if embedder is None:
        embedder = default_embedder()
    return embedder if adapter is None else adapted_embedder(embedder, adapter)


class AdapterState:
    """Reads of the adaptation state and of what a round learns from (a base of Generations).

    Needs, from the class it is mixed into: `_db` (the backend), `_cache` (the VectorCache), `base_embedder`
    and `adapters_dir`. Thread-safe: every method only reads, each in its own read transaction.
    """

    _db: Backend
    _cache: VectorCache
    base_embedder: Embedder
    if TYPE_CHECKING:  # Generations' (generations.py): `<db>.adapters/`
        @property
        def adapters_dir(self) -> Path: ...

    # ---- the adaptation state in meta ----------------------------------------------------------------------
    def _meta_json(self, key: str) -> dict | None:
        with self._db.reading() as r:
            raw = r.meta(key)
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def active_adapter(self) -> dict | None:
        """The serving adapter's entry (id, file, sha256, digest), or None for the base model."""
        return self._meta_json(META_ADAPTER)

    def active_adapter_id(self) -> str | None:
        """The serving adapter's id, or None."""
        entry = self.active_adapter()
        return None if entry is None else entry.get("id")

    def pending(self) -> dict | None:
        """The publish in progress (fingerprint, adapter, base_fingerprint, kind, since), or None."""
        return self._meta_json(META_PENDING)

    def max_seq(self) -> int:
        """The head of the change feed."""
        with self._db.reading() as r:
            return r.max_seq()

    def adapted_upto(self) -> int:
        """The change seq up to which the serving adapter has seen the memories (0: never adapted)."""
        with self._db.reading() as r:
            raw = r.meta(META_ADAPT_SEQ)
        return int(raw) if raw and raw.isdigit() else 0

    def remembered_since(self, seq: int) -> int:
        """How many memories were remembered after change `seq`."""
        with self._db.reading() as r:
            return r.remembered_since(seq)

    # ---- what adaptation learns from -----------------------------------------------------------------------
    def adaptable_base(self) -> tuple[Adaptable, LoRAWeights | None, dict | None]:
        """(base LMEmbedder, the active adapter's weights or None, its entry or None).

        Raises:
            InvalidInput: the store was not opened with an LMEmbedder, or not with the base its adapter sits on.
        """
        base = self.base_embedder
        if not is_adaptable(base):
            raise InvalidInput(
                f"adaptation needs an LMEmbedder (an EvermindLM with a tokenizer); this store was opened with "
                f"{type(base).__name__}. Open it with embedder=LMEmbedder(model, tokenizer)."
            )
        entry = self.active_adapter()
        with self._db.reading() as r:
            base_fp = r.meta(META_BASE_FP)
        gen = self._cache.current
        if entry is None:
            if gen.fingerprint != base.fingerprint:
                raise InvalidInput(f"this store serves {gen.fingerprint}, not the embedder it was opened with.")
            return base, None, None
        if base_fp != base.fingerprint or gen.embedder is base:
            raise InvalidInput(
                f"this store serves adapter {entry.get('id')} on base model {base_fp}; open it with that base "
                f"LMEmbedder to adapt or roll back (it was opened with {base.fingerprint})."
            )
        try:
            init = self.load_adapter(entry, base)
        except CheckpointError:
            init = None
        return base, init, entry

    def memories(self, max_memories: int, seed: int) -> tuple[np.ndarray, list[str], np.ndarray]:
        """(labels (N,), texts, current vectors (N, D)) of the memories a round learns from: all of them, or a
        sample of max_memories seeded by `seed`."""
        gen, dim = self._cache.current, self._cache.dim
        with self._db.snapshot() as r:
            labels, texts = r.memory_texts(gen.fingerprint, dim)
            if len(labels) > max_memories:
                keep = np.sort(np.random.default_rng([seed, 3]).choice(len(labels), max_memories, replace=False))
                labels, texts = labels[keep], [texts[i] for i in keep.tolist()]  # (N,)
            got, vectors = r.vectors(gen.fingerprint, dim, labels=labels.tolist())
        return labels, texts, vectors[np.argsort(got)]  # (N,), N, (N, D) in label order

    @staticmethod
    def as_stored(vectors: np.ndarray) -> np.ndarray:
        """(N, D) vectors as a database row rounds them (backend/vector_blobs.py): how `memories()` returns the
        current model's, so a round's gate compares a candidate's the same way."""
        return vector_blobs.as_stored(vectors)

    def feedback_pairs(self, labels: np.ndarray) -> list[tuple[str, int, float]]:
        """(query, row in `labels`, weight 1.0) for every standing "useful" judgement of those memories."""
        row = {int(label): i for i, label in enumerate(labels.tolist())}
        with self._db.reading() as r:
            pairs = r.feedback_pairs(self._cache.current.fingerprint)
        return [(query, row[label], 1.0) for query, label in pairs if label in row]

    def load_adapter(self, entry: dict, base: Adaptable) -> LoRAWeights:
        """The LoRAWeights of an adapter entry (file name and sha256 checked), for base.model.

        Raises:
            CheckpointError: a bad entry, or a missing, corrupt or different file.
        """
        from ..lm.adapter import load_adapter

        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _ADAPTER_NAME_RE.match(name):
            raise CheckpointError(f"the recorded adapter entry {entry!r:.80} names no valid adapter file.")
        in_db = self._db.adapters()
        if in_db is not None:
            return in_db.load(entry, base.model)
        sha = entry.get("sha256")
        return load_adapter(self.adapters_dir / name, model=base.model, sha256=sha if isinstance(sha, str) else None)

    def adapter_history(self) -> AdapterLog:
        """The store's adapters (entries, get, add, update, load): files in `adapters_dir` beside an SQLite store,
        the `adapters` table of a PostgreSQL one (every node reads the same history)."""
        in_db = self._db.adapters()
        if in_db is not None:
            return in_db
        from .adapter_history import AdapterHistory

        return AdapterHistory(self.adapters_dir)

    def adapted_embedder(self, weights: LoRAWeights | None, base: Embedder | None = None) -> Embedder:
        """base (default: the store's base embedder) + adapter `weights`, merged (see resolve_embedder)."""
        return resolve_embedder(self.base_embedder if base is None else base, weights)
