"""What a round did: the gate's verdict (GateResult) and the round's report (AdaptationReport)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class GateResult:
    """The gate's verdict on a candidate adapter."""

    passed: bool
    reason: str
    finite: bool
    probes: int
    corpus: int
    k: int
    recall_current: float = float("nan")
    recall_candidate: float = float("nan")
    mrr_current: float = float("nan")
    mrr_candidate: float = float("nan")
    queries: int = 0  # probe queries (probe memories x policy.probe_views)
    mrr_gain: float = float("nan")  # mean paired gain in reciprocal rank, candidate minus current
    mrr_gain_se: float = float("nan")  # its standard error
    mean_cosine_current: float = float("nan")
    mean_cosine_candidate: float = float("nan")
    candidate_labels: Any = field(default=None, repr=False)  # (N,) labels of the corpus (reused by re-embed)
    candidate_vectors: Any = field(default=None, repr=False)  # (N, D) the candidate's corpus vectors

    def to_dict(self) -> dict:
        """JSON-able summary (without the vectors)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("candidate_labels", "candidate_vectors")}
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


@dataclass
class AdaptationReport:
    """What one round (or a resume or rollback) did; filled in as it goes and handed to the hooks.

    status: "running", "skipped" (too few memories), "stopped" (asked to stop; a started publish resumes
    later), "refused" (the gate said no), "vetoed" (before_swap said no), "swapped" or "unchanged".
    """

    round: int
    kind: str = "round"  # "round", "resume" or "rollback"
    status: str = "running"
    reason: str = ""
    fingerprint_before: str = ""
    fingerprint_after: str = ""
    base_fingerprint: str = ""
    adapter_id: str | None = None
    memories: int = 0
    trained_on: int = 0
    feedback_pairs: int = 0  # standing "useful" judgements (store.feedback) trained on
    steps: int = 0
    losses: list = field(default_factory=list)  # [(step, lm_loss, contrastive_loss)]
    gate: GateResult | None = None
    resumed: bool = False
    reembedded: int = 0
    replayed: int = 0
    train_seconds: float = 0.0
    train_cpu_seconds: float = 0.0
    gate_seconds: float = 0.0
    reembed_seconds: float = 0.0
    index_seconds: float = 0.0
    swap_seconds: float = 0.0
    total_seconds: float = 0.0
    swapped_at: str | None = None

    def to_dict(self) -> dict:
        """JSON-able summary."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "gate"}
        out["gate"] = None if self.gate is None else self.gate.to_dict()
        out["losses"] = [list(x) for x in self.losses]
        return out
