"""Background LoRA adaptation: fit an adapter on a store's own memories, gate it, publish it, keep history.

A round fits LoRA tensors over the frozen base embedder: short query-like views of the stored memories (a few
words around a rare one) learn to retrieve their memory among the current vectors of the whole store, while
whole memories are anchored to their current vectors (an optional next-token term remains, off by default).
It then gates the candidate on held-out memories queried by a span of themselves and asks the store to
publish it (re-embed into a new generation, build and catch up its index, swap under the lock).

policy.py (AdaptationPolicy, AdaptationHooks), report.py (GateResult, AdaptationReport), fit.py (losses, views,
fit_adapter), gate.py (gate_candidate) and rounds.py (run_round, Adaptation, rollback); the adapter files belong
to the store (store/adapter_history.py). The store imports this package only when adaptation is used; this package
never imports the store: it works through the generation API the store hands it
(evermind_memory/store/generations.py).
"""

from __future__ import annotations

from .fit import (
    FitResult, anchor_loss_and_grad, contrastive_loss_and_grad, default_targets, fit_adapter, pad_batch, query_view,
    retrieval_loss_and_grad, token_span, word_weights,
)
from .gate import gate_candidate, probe_queries, split_probe, text_span
from .policy import AdaptationHooks, AdaptationPolicy, check_hooks
from .report import AdaptationReport, GateResult
from .rounds import Adaptation, rollback, run_round

__all__ = [
    "AdaptationPolicy",
    "AdaptationHooks",
    "AdaptationReport",
    "GateResult",
    "FitResult",
    "Adaptation",
    "check_hooks",
    "contrastive_loss_and_grad",
    "default_targets",
    "fit_adapter",
    "gate_candidate",
    "anchor_loss_and_grad",
    "pad_batch",
    "probe_queries",
    "query_view",
    "retrieval_loss_and_grad",
    "rollback",
    "run_round",
    "split_probe",
    "text_span",
    "token_span",
    "word_weights",
]
