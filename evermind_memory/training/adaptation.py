"""Background LoRA adaptation: fit an adapter on a store's own memories, gate it, publish it, keep history.

A round fits LoRA tensors over the frozen base embedder: short query-like views of the stored memories (a few
words around a rare one) learn to retrieve their memory among the current vectors of the whole store, while
whole memories are anchored to their current vectors (an optional next-token term remains, off by default).
It then gates the candidate on held-out memories queried by a span of themselves and asks the store to
publish it (re-embed into a new generation, build and catch up its index, swap under the lock).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import CheckpointError, EvermindError, InvalidInput
from ..lm.adapter import LoRAWeights, adapter_digest, load_adapter, save_adapter
from ..lm.checkpoint import file_sha256
from ..lm.sequence import SequenceBackbone
from .lora import LoRAAdapter
from .optim import AdamW, clip_grad_norm_

HISTORY_FORMAT = "evermind-adapters 1"
HISTORY_INDEX = "index.json"
ADAPTER_FILE_RE = re.compile(r"^(\d{4,9})\.lora$")
MAX_HISTORY_BYTES = 4 << 20
_EPS = 1e-12
VIEWS = ("rare-span-memory", "words-memory", "span-memory", "two-spans")
NEGATIVES = ("store", "batch")
_EDGE_PUNCT = "\"'`.,;:!?()[]{}<>"


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


# ---------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class AdaptationPolicy:
    """When a background round runs, what it fits, and how strict the gate is.

    Args:
        min_new_facts: a round starts once this many memories were remembered since the last round.
        min_interval_s: and at least this many seconds passed since the last round ended.
        max_cpu_seconds: training stops after this much CPU time of the adaptation thread (the gate and the
            re-embedding always finish; their time is reported separately).
        rank: LoRA rank R.
        alpha: LoRA scale numerator (update = alpha / R * B @ A).
        targets: 2-D weights to adapt; None picks the tied embedding plus the pooling attention (or the last
            layer's shared expert when the model has no pooling attention).
        lr: AdamW learning rate (the peak, with a schedule). 3e-3, chosen on the maxima dev domain (domain /
            general ndcg@10 change): memories only +0.053 / -0.002 at 6e-3, +0.044 / -0.003 at 4e-3, +0.042 /
            -0.000 at 3e-3; with feedback -0.010, -0.007 and -0.003 general at the same gain (+0.076..+0.088).
            Feedback moves the model off general text; the smaller step keeps that within bounds
            (benchmarks/results/adaptation_gain_dev.txt).
        lr_schedule: "cosine": lr * (1 + cos(pi * progress)) / 2, progress being the larger of the share of
            steps done and the share of max_cpu_seconds spent (the round ends at lr ~ 0 whichever budget binds,
            which keeps the general-purpose drift of the last noisy steps small); "constant": lr throughout.
        steps: at most this many optimizer steps per round (max_cpu_seconds usually binds first).
        batch_size: memories per contrastive batch.
        views: the short query-like view of a memory. "rare-span-memory": a contiguous run of
            query_min_words..query_max_words words around a word drawn with weight idf ** query_idf_power
            (idf over the training memories: the words a person searching for that memory would type);
            "span-memory": such a run anywhere; "words-memory": that many words drawn by that weight, kept
            in their order; "two-spans": two random token spans of the memory, a quarter to all of it
            (symmetric, the first design; "batch" negatives only).
        query_min_words, query_max_words: length range of the short view.
        query_idf_power: sharpness of the rare-word weighting (0: any word).
        train_tokens: memory views are cut to this many tokens in training ("batch" negatives).
        negatives: "store": the short view is scored against the current vectors of all the training memories
            (fixed targets, its own memory the positive): each step trains retrieval over the real store and
            the memories need no forward pass; "batch": symmetric in-batch InfoNCE between the short view and
            the memory, both through the model. "store" needs the memories' vectors (else "batch" is used).
        anchor_weight: weight of 1 - cos(candidate vector, current vector) on anchor_batch whole memories per
            step: the memories stay where the index has them while the short views learn to reach them.
        anchor_batch: memories per step in the anchor term.
        lm_batch: memories per next-token batch.
        lm_weight: weight of the next-token loss (0 by default: the shipped model is an embedder, its tied
            head serves no recall, and the full-vocabulary softmax made a step ~4x slower without moving the
            vectors; see benchmarks/results/adaptation_gain_*).
        contrastive_weight: weight of the contrastive (retrieval) loss.
        query_weight: weight of the logged-query term (real queries from the store's query log, each trained to
            retrieve the memory it confidently found or was marked useful; see MemoryStore(query_log=...)).
        query_batch: logged queries per step in that term.
        temperature: contrastive softmax temperature (the shipped model was trained at 0.05; 0.03 broke it).
        max_grad_norm: global gradient clipping.
        probe_fraction: share of memories held out of training for the gate.
        min_probe, max_probe: bounds on the number of held-out probe memories.
        probe_k: the gate compares recall@probe_k.
        gate_corpus: probes plus distractors searched by the gate (at most this many memories).
        gate_tolerance: the candidate's probe recall may be at most this much below the current model's.
            0.01 by default: one probe of 256 is 0.0039, and with d probes changing hands the paired difference
            has a sampling standard error of about sqrt(d) / n (0.006 for d = 2), so a tolerance of 0 refused
            candidates over one flipped probe (0.9922 -> 0.9883) whose general recall was within 0.003.
        max_mean_cosine: a candidate whose mean pairwise cosine exceeds this (and the current model's by
            more than 0.02) is degenerate.
        min_facts: no round on fewer memories than this.
        max_memories: at most this many memories (a seeded sample) are used for training.
        reembed_batch: memories per re-embedding transaction.
        poll_seconds: how often the background thread checks whether a round is due.
        seed: seeds the adapter init, the batches, the spans and the probe split.
    Raises:
        InvalidInput: a value is out of range or of the wrong type.
    """

    min_new_facts: int = 100
    min_interval_s: float = 600.0
    max_cpu_seconds: float = 25.0
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] | None = None
    lr: float = 3e-3
    lr_schedule: str = "cosine"
    steps: int = 400
    batch_size: int = 64
    views: str = "rare-span-memory"
    query_min_words: int = 1
    query_max_words: int = 5
    query_idf_power: float = 4.0
    train_tokens: int = 128
    negatives: str = "store"
    anchor_weight: float = 3.0
    anchor_batch: int = 8
    lm_batch: int = 8
    lm_weight: float = 0.0
    contrastive_weight: float = 1.0
    query_weight: float = 1.0
    query_batch: int = 32
    temperature: float = 0.05
    max_grad_norm: float = 1.0
    probe_fraction: float = 0.1
    min_probe: int = 8
    max_probe: int = 256
    probe_k: int = 10
    gate_corpus: int = 1024
    gate_tolerance: float = 0.01
    max_mean_cosine: float = 0.99
    min_facts: int = 16
    max_memories: int = 50_000
    reembed_batch: int = 256
    poll_seconds: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        ints = {"min_new_facts": (0, 10**9), "rank": (1, 4096), "steps": (0, 10**7), "batch_size": (2, 65_536),
                "query_min_words": (1, 10_000), "query_max_words": (1, 10_000), "train_tokens": (2, 65_536),
                "anchor_batch": (1, 65_536), "query_batch": (1, 65_536),
                "lm_batch": (1, 65_536), "min_probe": (1, 10**6), "max_probe": (1, 10**6), "probe_k": (1, 1000),
                "gate_corpus": (2, 10**6), "min_facts": (2, 10**9), "max_memories": (2, 10**9),
                "reembed_batch": (1, 100_000), "seed": (0, 2**63 - 1)}
        for name, (lo, hi) in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
                raise InvalidInput(f"AdaptationPolicy expected {name} an int in [{lo}, {hi}], got {value!r}.")
        reals = {"min_interval_s": (0.0, 1e9), "max_cpu_seconds": (0.0, 1e9), "alpha": (1e-9, 1e9),
                 "lr": (0.0, 10.0), "lm_weight": (0.0, 1e6), "contrastive_weight": (0.0, 1e6), "query_weight": (0.0, 1e6),
                 "anchor_weight": (0.0, 1e6), "query_idf_power": (0.0, 100.0),
                 "temperature": (1e-4, 100.0), "max_grad_norm": (0.0, 1e9), "probe_fraction": (0.0, 0.9),
                 "gate_tolerance": (0.0, 1.0), "max_mean_cosine": (0.0, 1.0), "poll_seconds": (0.001, 3600.0)}
        for name, (lo, hi) in reals.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(value) or not lo <= value <= hi:
                raise InvalidInput(f"AdaptationPolicy expected {name} a finite number in [{lo}, {hi}], got {value!r}.")
        if self.targets is not None:
            if isinstance(self.targets, str) or not all(isinstance(t, str) and t for t in self.targets) \
                    or not self.targets or len(set(self.targets)) != len(self.targets):
                raise InvalidInput(f"AdaptationPolicy expected targets a tuple of distinct names or None, got {self.targets!r}.")
            object.__setattr__(self, "targets", tuple(self.targets))
        if self.views not in VIEWS:
            raise InvalidInput(f"AdaptationPolicy expected views one of {VIEWS}, got {self.views!r}.")
        if self.lr_schedule not in ("cosine", "constant"):
            raise InvalidInput(f"AdaptationPolicy expected lr_schedule 'cosine' or 'constant', got {self.lr_schedule!r}.")
        if self.negatives not in NEGATIVES:
            raise InvalidInput(f"AdaptationPolicy expected negatives one of {NEGATIVES}, got {self.negatives!r}.")
        if self.query_min_words > self.query_max_words:
            raise InvalidInput(f"AdaptationPolicy expected query_min_words <= query_max_words, got "
                               f"{self.query_min_words} > {self.query_max_words}.")
        if self.min_probe > self.max_probe:
            raise InvalidInput(f"AdaptationPolicy expected min_probe <= max_probe, got {self.min_probe} > {self.max_probe}.")


@dataclass
class AdaptationHooks:
    """Callbacks for agent code; each runs in the thread doing the round. A hook that raises fails the round.

    on_round_start(): a round begins (before training).
    on_adapted(report): a candidate was fitted and gated (report.gate.passed says whether it goes on).
    before_swap(report) -> bool: the new generation is embedded and indexed; return False to veto the swap.
    on_reindexed(report): the new generation serves.
    on_error(exc): the background thread failed; it stops and `join()` re-raises exc.
    """

    on_round_start: Callable[[], Any] | None = None
    on_adapted: Callable[["AdaptationReport"], Any] | None = None
    before_swap: Callable[["AdaptationReport"], Any] | None = None
    on_reindexed: Callable[["AdaptationReport"], Any] | None = None
    on_error: Callable[[BaseException], Any] | None = None


def check_hooks(hooks: Any) -> AdaptationHooks:
    """Accept None, an AdaptationHooks, or a dict of hook name -> callable.

    Raises:
        InvalidInput: an unknown hook name or a value that is not callable.
    """
    if hooks is None:
        return AdaptationHooks()
    if isinstance(hooks, dict):
        known = {f.name for f in fields(AdaptationHooks)}
        unknown = sorted(set(hooks) - known)
        if unknown:
            raise InvalidInput(f"hooks got unknown names {unknown}; expected some of {sorted(known)}.")
        hooks = AdaptationHooks(**hooks)
    if not isinstance(hooks, AdaptationHooks):
        raise InvalidInput(f"hooks expected an AdaptationHooks or a dict, got {type(hooks).__name__}.")
    for f in fields(hooks):
        value = getattr(hooks, f.name)
        if value is not None and not callable(value):
            raise InvalidInput(f"hooks.{f.name} must be callable or None, got {type(value).__name__}.")
    return hooks


# ---------------------------------------------------------------------------------------------- reports
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


# ---------------------------------------------------------------------------------------------- maths
def default_targets(config: Any) -> tuple[str, ...]:
    """The default LoRA targets for an LMConfig: the tied embedding and the pooling attention if present."""
    if getattr(config, "attn_heads", 0):
        return ("emb", "pool.wqkv", "pool.wo")
    return ("emb", f"layers.{config.n_layers - 1}.shared.w2")


def pad_batch(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token lists into (tokens (B, T) intp, lengths (B,) intp); padding is token 0."""
    lens = np.array([len(s) for s in seqs], dtype=np.intp)  # (B,)
    t = int(lens.max())
    mask = np.arange(t)[None, :] < lens[:, None]  # (B, T)
    tokens = np.zeros((len(seqs), t), dtype=np.intp)  # (B, T)
    tokens[mask] = np.concatenate([np.asarray(s, dtype=np.intp) for s in seqs])
    return tokens, lens


def contrastive_loss_and_grad(pooled: np.ndarray, temperature: float) -> tuple[float, np.ndarray]:
    """Symmetric in-batch InfoNCE between two views, and its gradient w.r.t. the unnormalised pooled rows.

    Rows [0, B) are view one of B memories, rows [B, 2B) view two of the same memories in the same order;
    z = pooled / |pooled|, S = z1 @ z2^T / temperature, loss = (CE(S, diag) + CE(S^T, diag)) / 2.

    Args:
        pooled: (2B, C) pooled vectors (float32 in training, float64 in gradient checks).
        temperature: softmax temperature (> 0).
    Returns:
        (loss, dpooled (2B, C) in pooled's dtype).
    """
    b = pooled.shape[0] // 2
    norms = np.maximum(np.sqrt(np.einsum("nc,nc->n", pooled, pooled)), _EPS)  # (2B,)
    z = pooled / norms[:, None]  # (2B, C)
    z1, z2 = z[:b], z[b:]  # (B, C) each
    s = (z1 @ z2.T) / temperature  # (B, B)
    row = s - s.max(axis=1, keepdims=True)  # (B, B)
    p_row = np.exp(row)  # (B, B)
    p_row /= p_row.sum(axis=1, keepdims=True)
    col = s - s.max(axis=0, keepdims=True)  # (B, B)
    p_col = np.exp(col)  # (B, B)
    p_col /= p_col.sum(axis=0, keepdims=True)
    diag = np.arange(b)  # (B,)
    loss = -0.5 * (np.log(np.maximum(p_row[diag, diag], 1e-30)).mean() + np.log(np.maximum(p_col[diag, diag], 1e-30)).mean())
    eye = np.eye(b, dtype=pooled.dtype)  # (B, B)
    ds = ((p_row - eye) + (p_col - eye)) * (0.5 / b)  # (B, B)
    dz1 = (ds @ z2) / temperature  # (B, C)
    dz2 = (ds.T @ z1) / temperature  # (B, C)
    dz = np.concatenate([dz1, dz2], axis=0)  # (2B, C)
    dpooled = (dz - z * np.einsum("nc,nc->n", z, dz)[:, None]) / norms[:, None]  # (2B, C)
    return float(loss), dpooled.astype(pooled.dtype, copy=False)


def _unit_backward(z: np.ndarray, dz: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """Gradient w.r.t. the unnormalised rows p of dL/dz where z = p / |p|."""
    return (dz - z * np.einsum("nc,nc->n", z, dz)[:, None]) / norms[:, None]  # (B, C)


def retrieval_loss_and_grad(pooled: np.ndarray, targets: np.ndarray, positives: np.ndarray,
                            temperature: float, weights: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """InfoNCE of query vectors against fixed memory vectors, and its gradient w.r.t. the query rows.

    z = pooled / |pooled|, S = z @ targets^T / temperature, loss = mean_b w_b CE(S[b], positives[b]): each
    query against every memory of the store, its own memory the positive.

    Args:
        pooled: (B, C) unnormalised query vectors.
        targets: (N, C) unit memory vectors (constants).
        positives: (B,) row of each query's memory in targets.
        temperature: softmax temperature (> 0).
        weights: (B,) per-query weights (None: all 1), e.g. the confidence of a pseudo-label.
    Returns:
        (loss, dpooled (B, C) in pooled's dtype).
    """
    b = pooled.shape[0]
    norms = np.maximum(np.sqrt(np.einsum("bc,bc->b", pooled, pooled)), _EPS)  # (B,)
    z = pooled / norms[:, None]  # (B, C)
    s = (z @ targets.T) / temperature  # (B, N)
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)  # (B, N)
    p /= p.sum(axis=1, keepdims=True)
    rows = np.arange(b)  # (B,)
    w = np.ones(b, dtype=pooled.dtype) if weights is None else np.asarray(weights, dtype=pooled.dtype)  # (B,)
    loss = -float((w * np.log(np.maximum(p[rows, positives], 1e-30))).mean())
    p[rows, positives] -= 1.0
    dz = ((p * w[:, None]) @ targets) / (b * temperature)  # (B, C)
    return loss, _unit_backward(z, dz, norms).astype(pooled.dtype, copy=False)


def anchor_loss_and_grad(pooled: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """mean_b (1 - cos(pooled[b], targets[b])) and its gradient w.r.t. pooled; targets are unit (B, C) rows."""
    b = pooled.shape[0]
    norms = np.maximum(np.sqrt(np.einsum("bc,bc->b", pooled, pooled)), _EPS)  # (B,)
    z = pooled / norms[:, None]  # (B, C)
    loss = float(1.0 - np.einsum("bc,bc->b", z, targets).mean())
    return loss, _unit_backward(z, -targets / b, norms).astype(pooled.dtype, copy=False)


def token_span(tokens: Sequence[int], rng: np.random.Generator) -> list[int]:
    """A random contiguous span of a memory's tokens (a quarter to all of it; short memories whole)."""
    n = len(tokens)
    if n < 4:
        return list(tokens)
    length = int(rng.integers(max(2, n // 4), n + 1))
    start = int(rng.integers(0, n - length + 1))
    return list(tokens[start : start + length])


def text_span(text: str, rng: np.random.Generator) -> str:
    """A probe query: a contiguous run of about half of a memory's words (short memories whole)."""
    words = text.split()
    if len(words) <= 4:
        return text
    length = max(3, len(words) // 2)
    start = int(rng.integers(0, len(words) - length + 1))
    return " ".join(words[start : start + length])


def word_weights(word_lists: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """Per memory, the idf of each of its words over all the memories given (0 for words with no letter or digit).

    Words are compared lowercased with edge punctuation stripped; idf = log((N + 1) / (df + 0.5)).
    """
    keys = [[w.strip(_EDGE_PUNCT).lower() for w in words] for words in word_lists]
    df: dict[str, int] = {}
    for ks in keys:
        for k in set(ks):
            df[k] = df.get(k, 0) + 1
    n = len(keys)
    return [np.array([math.log((n + 1) / (df[k] + 0.5)) if any(ch.isalnum() for ch in k) else 0.0 for k in ks],
                     dtype=np.float64) for ks in keys]  # (words,) each


def query_view(words: Sequence[str], weights: np.ndarray, rng: np.random.Generator, policy: AdaptationPolicy) -> str:
    """A short query-like view of a memory: a few of its words (see AdaptationPolicy.views).

    k is drawn from query_min_words..query_max_words. "rare-span-memory": a contiguous run of k words holding a
    word drawn with probability proportional to `weights` ** policy.query_idf_power (weights: idf);
    "span-memory": a contiguous run of k words anywhere; "words-memory": k words drawn by that probability
    without replacement, kept in their order, edge punctuation stripped. A memory of k words or fewer gives
    them all.
    """
    n = len(words)
    k = min(n, int(rng.integers(policy.query_min_words, policy.query_max_words + 1)))
    if policy.views == "span-memory" or k >= n:
        start = int(rng.integers(0, n - k + 1))
        return " ".join(words[start : start + k])
    w = np.asarray(weights, dtype=np.float64)  # (n,)
    w = np.where(w > 0, w ** policy.query_idf_power, 0.0)  # (n,)
    live = int((w > 0).sum())
    if live == 0:
        w, live = np.ones(n), n
    if policy.views == "rare-span-memory":  # a contiguous run around a word drawn by rarity
        centre = int(rng.choice(n, p=w / w.sum()))
        start = min(max(0, centre - int(rng.integers(0, k))), n - k)
        return " ".join(words[start : start + k])
    pick = np.sort(rng.choice(n, size=min(k, live), replace=False, p=w / w.sum()))  # (k,)
    return " ".join(words[i].strip(_EDGE_PUNCT) or words[i] for i in pick.tolist())


@dataclass
class FitResult:
    """What `fit_adapter` produced."""

    weights: LoRAWeights
    steps: int
    losses: list  # [(step, lm_loss, contrastive_loss)]
    seconds: float
    cpu_seconds: float
    stopped: bool


def _check_lm_embedder(embedder: Any, what: str) -> None:
    model = getattr(embedder, "model", None)
    if isinstance(model, SequenceBackbone):
        raise InvalidInput(
            f"{what}: LoRA adaptation is EvermindLM-only, and this embedder ({embedder.fingerprint}) runs a "
            "sequence backbone (Mamba / attention blocks). Adapt a store opened with an LMEmbedder, or keep "
            "this one unadapted."
        )
    ok = all(hasattr(embedder, a) for a in ("tokenizer", "max_tokens", "fingerprint")) and model is not None \
        and all(hasattr(model, a) for a in ("params", "config", "pooled_forward", "pooled_backward", "loss_and_grads"))
    if not ok:
        raise InvalidInput(
            f"{what} needs an LMEmbedder (an EvermindLM with a tokenizer) to adapt; got {type(embedder).__name__}. "
            "Open the store with embedder=LMEmbedder(model, tokenizer)."
        )


def fit_adapter(base: Any, texts: Sequence[str], policy: AdaptationPolicy, *, init: LoRAWeights | None = None,
                should_stop: Callable[[], bool] | None = None, vectors: np.ndarray | None = None,
                pairs: Sequence[tuple[str, int, float]] | None = None) -> FitResult:
    """Fit LoRA tensors over a frozen LMEmbedder on memories: retrieval + anchor (+ lm_weight * next-token).

    Each step draws batch_size memories, cuts a short query-like view of each (policy.views) and trains it to
    find its memory among the current vectors of every training memory ("store" negatives), while
    anchor_batch whole memories are pulled to their current vectors, so that the index built from the
    adapted model keeps its layout and only what short queries reach changes. Without vectors the two views
    of each memory meet in-batch negatives instead, both through the model.

    The base model is never written; a private copy runs with W + s * B @ A on each target, and the gradient G
    of a target's effective weight (for the tied embedding: lookup plus head) is projected onto the adapter as
    gA = s * B^T @ G, gB = s * G @ A^T.

    Args:
        base: the base LMEmbedder (model, tokenizer, max_tokens).
        texts: the training memories.
        policy: rank, alpha, targets, lr, steps, batch sizes, weights, CPU budget, seed.
        init: start from this adapter (same targets and rank) instead of zero.
        should_stop: polled before each step; True ends training early.
        vectors: (N, D) the current vectors of `texts` (e.g. stored): the fixed targets of "store" negatives
            and of the anchor term; without them training uses "batch" negatives and no anchor.
        pairs: (query, index into texts, weight) from the store's query log: real queries, each with the memory
            it found (a pseudo-label) or was told was useful. With "store" negatives, each step also trains
            query_batch of them to retrieve their memory, weighted by weight * policy.query_weight.
    Returns:
        FitResult (weights carry base_fingerprint = base.fingerprint).
    Raises:
        InvalidInput: base is not an LMEmbedder, a target is not a 2-D weight, or no text has any token.
    """
    _check_lm_embedder(base, "fit_adapter()")
    model, tok = base.model, base.tokenizer
    targets = policy.targets or default_targets(model.config)
    for t in targets:
        if t not in model.params or np.ndim(model.params[t]) != 2:
            raise InvalidInput(f"fit_adapter() target {t!r} is not a 2-D weight of the model.")
    encoded = [list(tok.encode(t))[: base.max_tokens] for t in texts]
    keep = [i for i, t in enumerate(encoded) if t]
    token_lists = [encoded[i] for i in keep]
    if len(token_lists) < 2:
        raise InvalidInput(f"fit_adapter() expected at least 2 non-empty texts, got {len(token_lists)}.")
    current = None
    if vectors is not None:
        current = np.asarray(vectors, dtype=np.float32)
        if current.ndim != 2 or len(current) != len(texts):
            raise InvalidInput(f"fit_adapter() expected vectors of shape ({len(texts)}, D), got {current.shape}.")
        current = current[keep]  # (N, D)
        current = current / np.maximum(np.linalg.norm(current, axis=1, keepdims=True), _EPS)  # (N, D) unit
    to_store = current is not None and policy.negatives == "store"
    where = {orig: pos for pos, orig in enumerate(keep)}
    logged = []  # (query tokens, row in token_lists, weight)
    for query, idx, weight in pairs or ():
        q = list(tok.encode(query))[: policy.train_tokens]
        if q and int(idx) in where and weight > 0:
            logged.append((q, where[int(idx)], float(weight)))
    anchored = current is not None and policy.anchor_weight > 0
    asymmetric = policy.views != "two-spans"
    word_lists = [texts[i].split() for i in keep] if asymmetric else []
    rare = policy.views in ("words-memory", "rare-span-memory")
    idf = word_weights(word_lists) if rare else [np.ones(len(w)) for w in word_lists]
    rng = np.random.default_rng(policy.seed)
    adapters = {t: LoRAAdapter(*np.shape(model.params[t]), rank=min(policy.rank, *np.shape(model.params[t])),
                               alpha=float(policy.alpha), seed=[policy.seed, i]) for i, t in enumerate(targets)}
    if init is not None and tuple(init.tensors) == tuple(targets) and all(
            adapters[t].rank == init.rank and float(init.alpha) == adapters[t].alpha for t in targets):
        for t, (a, b) in init.tensors.items():
            adapters[t].A[...] = a
            adapters[t].B[...] = b
    params = {}
    for t, ad in adapters.items():
        params[f"{t}.A"], params[f"{t}.B"] = ad.A, ad.B
    opt = AdamW(params, lr=float(policy.lr), weight_decay=0.0)
    base_w = {t: np.asarray(model.params[t], dtype=np.float32) for t in targets}
    work = type(model).from_params(model.config, model.params)  # private copy; the serving model is never touched
    # the pooling block never reaches the next-token loss: with only pool.* targets that term is skipped
    lm_ok = [i for i, t in enumerate(token_lists) if len(t) >= 2] if any(not t.startswith("pool.") for t in targets) else []
    n = len(token_lists)
    b = min(policy.batch_size, n)
    losses: list = []
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    stopped = False
    for step in range(policy.steps):
        if should_stop is not None and should_stop():
            stopped = True
            break
        spent = time.thread_time() - cpu0
        if spent >= policy.max_cpu_seconds:
            break
        progress = max(step / max(policy.steps, 1), spent / policy.max_cpu_seconds if policy.max_cpu_seconds > 0 else 1.0)
        lr = float(policy.lr) * (0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) if policy.lr_schedule == "cosine" else 1.0)
        for t, ad in adapters.items():
            work.params[t] = base_w[t] + ad.delta()  # (rows, cols)
        pick = rng.choice(n, size=b, replace=False)  # (B,)
        if asymmetric:  # a short query-like view of each memory
            views = [list(tok.encode(query_view(word_lists[i], idf[i], rng, policy)))[: policy.train_tokens]
                     or token_lists[i][:1] for i in pick]
        else:
            views = [token_span(token_lists[i], rng) for i in pick]
        grads_w = {t: np.zeros_like(base_w[t]) for t in targets}  # (rows, cols) each
        con_loss = lm_loss = 0.0
        if policy.contrastive_weight > 0:
            if to_store:  # the short views against the fixed vectors of every memory
                tokens, lengths = pad_batch(views)  # (B, T), (B,)
                pooled, cache = work.pooled_forward(tokens, lengths)  # (B, C)
                con_loss, dpooled = retrieval_loss_and_grad(pooled, current, pick, float(policy.temperature))
            else:  # two views of each memory through the model, in-batch negatives
                second = ([token_lists[i][: policy.train_tokens] for i in pick] if asymmetric
                          else [token_span(token_lists[i], rng) for i in pick])
                tokens, lengths = pad_batch(views + second)  # (2B, T), (2B,)
                pooled, cache = work.pooled_forward(tokens, lengths)  # (2B, C)
                con_loss, dpooled = contrastive_loss_and_grad(pooled, float(policy.temperature))
            g = work.pooled_backward(dpooled, cache, grads_for=targets)
            for t in targets:
                grads_w[t] += np.float32(policy.contrastive_weight) * g[t]
        if to_store and logged and policy.query_weight > 0:  # real queries to the memory they found
            sub = rng.choice(len(logged), size=min(policy.query_batch, len(logged)), replace=False)  # (Q,)
            tokens, lengths = pad_batch([logged[i][0] for i in sub])  # (Q, T), (Q,)
            pooled, cache = work.pooled_forward(tokens, lengths)  # (Q, C)
            q_loss, dpooled = retrieval_loss_and_grad(
                pooled, current, np.array([logged[i][1] for i in sub], dtype=np.intp), float(policy.temperature),
                weights=np.array([logged[i][2] for i in sub], dtype=np.float32))
            con_loss += float(policy.query_weight) * q_loss
            g = work.pooled_backward(dpooled, cache, grads_for=targets)
            for t in targets:
                grads_w[t] += np.float32(policy.query_weight) * g[t]
        if anchored:  # whole memories keep their current vectors
            sub = rng.choice(n, size=min(policy.anchor_batch, n), replace=False)  # (A,)
            tokens, lengths = pad_batch([token_lists[i] for i in sub])  # (A, T), (A,)
            pooled, cache = work.pooled_forward(tokens, lengths)  # (A, C)
            _, dpooled = anchor_loss_and_grad(pooled, current[sub])
            g = work.pooled_backward(dpooled, cache, grads_for=targets)
            for t in targets:
                grads_w[t] += np.float32(policy.anchor_weight) * g[t]
        if policy.lm_weight > 0 and lm_ok:
            sub = rng.choice(len(lm_ok), size=min(policy.lm_batch, len(lm_ok)), replace=False)  # (b,)
            seq_tokens, seq_lengths = pad_batch([token_lists[lm_ok[i]] for i in sub])  # (b, T), (b,)
            lm_loss, g = work.loss_and_grads(seq_tokens, seq_lengths, grads_for=targets)
            for t in targets:
                grads_w[t] += np.float32(policy.lm_weight) * g[t]
        grads = {}
        for t, ad in adapters.items():
            grads[f"{t}.A"], grads[f"{t}.B"] = ad.project_grad(grads_w[t])
        if policy.max_grad_norm > 0:
            clip_grad_norm_(grads, float(policy.max_grad_norm))
        opt.step(grads, lr=lr)
        losses.append((step, float(lm_loss), float(con_loss)))
    done = len(losses)
    weights = LoRAWeights(
        rank=next(iter(adapters.values())).rank, alpha=float(policy.alpha),
        tensors={t: (ad.A.copy(), ad.B.copy()) for t, ad in adapters.items()}, base_fingerprint=base.fingerprint,
    )
    return FitResult(weights, done, losses, time.perf_counter() - wall0, time.thread_time() - cpu0, stopped)


# ---------------------------------------------------------------------------------------------- gate
def _ranks(queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Rank (0 = best) of doc i for query i among all docs; ties count against the target."""
    scores = queries @ docs.T  # (Q, N)
    own = scores[np.arange(len(queries)), np.arange(len(queries))]  # (Q,)
    return (scores >= own[:, None]).sum(axis=1) - 1  # (Q,)


def _mean_cosine(vectors: np.ndarray, limit: int = 512) -> float:
    v = vectors[:limit].astype(np.float64)  # (n, D)
    n = len(v)
    if n < 2:
        return 0.0
    gram = v @ v.T  # (n, n)
    return float((gram.sum() - np.trace(gram)) / (n * (n - 1)))


def gate_candidate(current: Any, candidate: Any, probe_texts: Sequence[str], distractor_texts: Sequence[str],
                   policy: AdaptationPolicy, *, current_doc_vectors: np.ndarray | None = None,
                   corpus_labels: np.ndarray | None = None) -> GateResult:
    """Decide whether a candidate embedder may replace the current one.

    The corpus is the probe memories followed by the distractors; each probe is queried by a span of its own
    words (seeded by policy.seed) and counts when it ranks in the top probe_k. The candidate passes when every
    vector is finite with norm > 1e-6, its vectors are not collapsed (mean pairwise cosine), and its recall is
    at least the current model's minus policy.gate_tolerance.

    Args:
        current: the serving embedder.
        candidate: the embedder to judge.
        probe_texts: held-out memories (never trained on).
        distractor_texts: other memories searched alongside them.
        policy: probe_k, gate_tolerance, max_mean_cosine, seed.
        current_doc_vectors: (N, D) the current model's vectors of the corpus if already known (e.g. stored).
        corpus_labels: (N,) store labels of the corpus, kept in the result with the candidate's vectors.
    Returns:
        GateResult.
    """
    corpus = list(probe_texts) + list(distractor_texts)
    k = min(policy.probe_k, max(1, len(corpus)))
    result = GateResult(passed=False, reason="", finite=False, probes=len(probe_texts), corpus=len(corpus), k=k)
    if not probe_texts:
        result.reason = "no probe memories"
        return result
    rng = np.random.default_rng([policy.seed, 7])
    queries = [text_span(t, rng) for t in probe_texts]
    with np.errstate(all="ignore"):
        cand_docs = np.asarray(candidate.embed_many(corpus), dtype=np.float32)  # (N, D)
        cand_q = np.asarray(candidate.embed_many(queries), dtype=np.float32)  # (Q, D)
        finite = bool(np.isfinite(cand_docs).all() and np.isfinite(cand_q).all())
        norms_ok = finite and bool((np.linalg.norm(cand_docs, axis=1) > 1e-6).all()
                                   and (np.linalg.norm(cand_q, axis=1) > 1e-6).all())
    result.finite = finite
    if not finite:
        result.reason = "the candidate's vectors are not finite (NaN or Inf)"
        return result
    if not norms_ok:
        result.reason = "the candidate produced zero vectors"
        return result
    cur_docs = (np.asarray(current.embed_many(corpus), dtype=np.float32) if current_doc_vectors is None
                else np.asarray(current_doc_vectors, dtype=np.float32))  # (N, D)
    cur_q = np.asarray(current.embed_many(queries), dtype=np.float32)  # (Q, D)
    r_cur, r_cand = _ranks(cur_q, cur_docs), _ranks(cand_q, cand_docs)  # (Q,) each
    result.recall_current = float((r_cur < k).mean())
    result.recall_candidate = float((r_cand < k).mean())
    result.mrr_current = float((1.0 / (1 + r_cur)).mean())
    result.mrr_candidate = float((1.0 / (1 + r_cand)).mean())
    result.mean_cosine_current = _mean_cosine(cur_docs)
    result.mean_cosine_candidate = _mean_cosine(cand_docs)
    if result.mean_cosine_candidate > 0.999 or (
            result.mean_cosine_candidate > policy.max_mean_cosine
            and result.mean_cosine_candidate > result.mean_cosine_current + 0.02):
        result.reason = (f"the candidate's vectors are degenerate (mean pairwise cosine "
                         f"{result.mean_cosine_candidate:.4f}, current {result.mean_cosine_current:.4f})")
        return result
    if result.recall_candidate < result.recall_current - policy.gate_tolerance:
        result.reason = (f"probe recall@{k} would drop from {result.recall_current:.4f} to "
                         f"{result.recall_candidate:.4f} (tolerance {policy.gate_tolerance})")
        return result
    result.passed = True
    result.reason = f"probe recall@{k} {result.recall_current:.4f} -> {result.recall_candidate:.4f}"
    if corpus_labels is not None:
        result.candidate_labels = np.asarray(corpus_labels, dtype=np.int64)  # (N,)
        result.candidate_vectors = cand_docs
    return result


def split_probe(count: int, policy: AdaptationPolicy) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of `count` memories into (train indices, probe indices)."""
    order = np.random.default_rng([policy.seed, 11]).permutation(count)  # (N,)
    n_probe = int(round(count * policy.probe_fraction))
    n_probe = min(max(n_probe, policy.min_probe), policy.max_probe, count // 2)
    return np.sort(order[n_probe:]), np.sort(order[:n_probe])


# ---------------------------------------------------------------------------------------------- history
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
        from ..store.index import write_atomic

        self.directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"format": HISTORY_FORMAT, "entries": entries}, indent=1, sort_keys=True)
        write_atomic(self.directory / HISTORY_INDEX, data.encode("utf-8"))

    def get(self, adapter_id: str) -> dict:
        """The entry of one adapter.

        Raises:
            InvalidInput: no such adapter.
        """
        for e in self.entries():
            if e["id"] == adapter_id:
                return e
        ids = [e["id"] for e in self.entries()]
        raise InvalidInput(f"no adapter {adapter_id!r} in {self.directory}; known: {ids or 'none'} (or 'base').")

    def path(self, entry: dict) -> Path:
        """The file of an entry (its name is checked)."""
        name = str(entry.get("file", ""))
        if not ADAPTER_FILE_RE.match(name):
            raise CheckpointError(f"adapter entry names an unexpected file {name!r:.60}.")
        return self.directory / name

    def add(self, weights: LoRAWeights, **info: Any) -> dict:
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

    def update(self, adapter_id: str, **changes: Any) -> None:
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

    def load(self, entry: dict, model: Any) -> LoRAWeights:
        """Load an adapter, checked against its recorded sha256 and the model's shapes.

        Raises:
            CheckpointError: missing, corrupt, not the recorded file, or not fitting the model.
        """
        sha = entry.get("sha256")
        return load_adapter(self.path(entry), model=model, sha256=sha if isinstance(sha, str) else None)


# ---------------------------------------------------------------------------------------------- rounds
def run_round(store: Any, policy: AdaptationPolicy, hooks: AdaptationHooks, *, round_no: int,
              should_stop: Callable[[], bool] | None = None, adapter: LoRAWeights | None = None) -> AdaptationReport:
    """One round on a store: resume a started publish, or train, gate and publish a new adapter.

    Args:
        store: a writable MemoryStore (its adaptation internals are used).
        policy: the policy.
        hooks: the hooks.
        round_no: the number reported.
        should_stop: polled between steps and batches.
        adapter: publish this adapter (gated) instead of training one.
    Returns:
        the report.
    """
    stop = should_stop or (lambda: False)
    t0 = time.perf_counter()
    with store._adapt_mutex:
        report = AdaptationReport(round=round_no, fingerprint_before=store.fingerprint)
        if store._adapt_pending() is not None:
            report.kind = "resume"
            store._adapt_resume(report, before_swap=hooks.before_swap, should_stop=stop, batch=policy.reembed_batch)
            if report.status == "swapped" and hooks.on_reindexed:
                hooks.on_reindexed(report)
            report.total_seconds = time.perf_counter() - t0
            return report
        if hooks.on_round_start:
            hooks.on_round_start()
        base, init, _ = store._adapt_base()
        report.base_fingerprint = base.fingerprint
        labels, texts, stored = store._adapt_memories(policy)
        report.memories = len(texts)
        if len(texts) < policy.min_facts:
            report.status, report.reason = "skipped", f"{len(texts)} memories, fewer than min_facts={policy.min_facts}"
            report.total_seconds = time.perf_counter() - t0
            return report
        train_idx, probe_idx = split_probe(len(texts), policy)
        report.trained_on = len(train_idx)
        if adapter is None:
            at = {int(i): j for j, i in enumerate(train_idx.tolist())}  # the gate's probes are never trained on
            pairs = [(q, at[i], w) for q, i, w in store._adapt_feedback(labels) if i in at]
            report.feedback_pairs = len(pairs)
            fit = fit_adapter(base, [texts[i] for i in train_idx], policy, init=init, should_stop=stop,
                              vectors=stored[train_idx], pairs=pairs)
            report.steps, report.losses = fit.steps, fit.losses
            report.train_seconds, report.train_cpu_seconds = fit.seconds, fit.cpu_seconds
            if fit.stopped:
                report.status, report.reason = "stopped", "stop() was called during training"
                report.total_seconds = time.perf_counter() - t0
                return report
            weights = fit.weights
        else:
            if not isinstance(adapter, LoRAWeights):
                raise InvalidInput(f"adapt_now(adapter=...) expected LoRAWeights, got {type(adapter).__name__}.")
            weights = LoRAWeights(adapter.rank, adapter.alpha, dict(adapter.tensors), base.fingerprint)
        t_gate = time.perf_counter()
        try:
            candidate = store._adapt_embedder(base, weights)
        except InvalidInput as exc:  # e.g. the merged weights overflow to Inf
            candidate = None
            report.gate = GateResult(False, f"the candidate model is invalid ({exc})", False, 0, 0, policy.probe_k)
        if candidate is not None:
            distract = np.setdiff1d(np.arange(len(texts)), probe_idx)  # (N - P,)
            want = max(0, policy.gate_corpus - len(probe_idx))
            if len(distract) > want:
                distract = np.sort(np.random.default_rng([policy.seed, 13]).choice(distract, want, replace=False))
            corpus_idx = np.concatenate([probe_idx, distract]).astype(np.int64)  # (N,)
            report.gate = gate_candidate(
                store.embedder, candidate, [texts[i] for i in probe_idx], [texts[i] for i in distract], policy,
                current_doc_vectors=stored[corpus_idx], corpus_labels=labels[corpus_idx],
            )
            report.fingerprint_after = candidate.fingerprint
        report.gate_seconds = time.perf_counter() - t_gate
        if hooks.on_adapted:
            hooks.on_adapted(report)
        if not report.gate.passed:
            report.status, report.reason = "refused", report.gate.reason
            report.total_seconds = time.perf_counter() - t0
            return report
        entry = store._adapt_save(weights, report)
        store._adapt_publish(candidate, entry, report, before_swap=hooks.before_swap, should_stop=stop,
                             batch=policy.reembed_batch)
        if report.status == "swapped" and hooks.on_reindexed:
            hooks.on_reindexed(report)
        report.total_seconds = time.perf_counter() - t0
        return report


class Adaptation:
    """A background adaptation thread on one store (made by `MemoryStore.start_adaptation`).

    Thread-safe: stop(), join() and status() may be called from any thread.
    """

    def __init__(self, store: Any, policy: AdaptationPolicy, hooks: AdaptationHooks) -> None:
        self._store = store
        self.policy = policy
        self.hooks = hooks
        self._stop = threading.Event()
        self._state_lock = threading.Lock()
        self._error: BaseException | None = None
        self._reports: list[AdaptationReport] = []
        self._rounds = 0
        self._last_seq = store._adapt_last_seq()  # memories the serving adapter has already seen
        self._last_end = time.monotonic() - policy.min_interval_s
        self._thread = threading.Thread(target=self._run, name="evermind-adaptation", daemon=True)

    def start(self) -> "Adaptation":
        """Start the thread (called by the store)."""
        self._thread.start()
        return self

    def _due(self) -> bool:
        if self._store._adapt_pending() is not None:
            return True
        if time.monotonic() - self._last_end < self.policy.min_interval_s:
            return False
        return self._store._adapt_new_facts(self._last_seq) >= max(1, self.policy.min_new_facts)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._due():
                    seq = self._store._adapt_max_seq()
                    report = run_round(self._store, self.policy, self.hooks, round_no=self._rounds + 1,
                                       should_stop=self._stop.is_set)
                    with self._state_lock:
                        self._rounds += 1
                        self._reports.append(report)
                        del self._reports[:-50]
                        if report.kind == "round" and report.status != "stopped":
                            self._last_seq = seq
                    self._last_end = time.monotonic()
                self._stop.wait(self.policy.poll_seconds)
        except BaseException as exc:  # noqa: BLE001 - handed to on_error and re-raised by join()
            with self._state_lock:
                self._error = exc
            if self.hooks.on_error is not None:
                try:
                    self.hooks.on_error(exc)
                except BaseException as hook_exc:  # noqa: BLE001
                    exc.__context__ = hook_exc

    def stop(self) -> None:
        """Ask the thread to stop after the current step or batch (a started publish resumes later)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (call stop() first); re-raise the error that ended it, if any.

        Raises:
            EvermindError: the thread is still running after `timeout`.
            the thread's exception.
        """
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise EvermindError(f"the adaptation thread is still running after {timeout} s; call stop() first.")
        with self._state_lock:
            error = self._error
        if error is not None:
            raise error

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread.is_alive()

    def status(self) -> dict:
        """Rounds so far, the last losses and gate results, the last swap, any error, a pending publish."""
        with self._state_lock:
            reports = list(self._reports)
            error = self._error
            rounds = self._rounds
        swaps = [r for r in reports if r.status == "swapped"]
        last_train = next((r for r in reversed(reports) if r.losses), None)
        return {
            "running": self.running,
            "rounds": rounds,
            "swaps": len(swaps),
            "refused": sum(r.status == "refused" for r in reports),
            "vetoed": sum(r.status == "vetoed" for r in reports),
            "losses": [] if last_train is None else [list(x) for x in last_train.losses],
            "gates": [r.gate.to_dict() for r in reports if r.gate is not None],
            "last_swap": None if not swaps else {"at": swaps[-1].swapped_at, "fingerprint": swaps[-1].fingerprint_after,
                                                 "adapter": swaps[-1].adapter_id},
            "last_report": None if not reports else reports[-1].to_dict(),
            "error": None if error is None else f"{type(error).__name__}: {error}",
            "pending": self._store._adapt_pending() if not self._store._closed else None,
        }


__all__ = [
    "AdaptationPolicy",
    "AdaptationHooks",
    "AdaptationReport",
    "GateResult",
    "FitResult",
    "AdapterHistory",
    "Adaptation",
    "check_hooks",
    "contrastive_loss_and_grad",
    "default_targets",
    "fit_adapter",
    "gate_candidate",
    "anchor_loss_and_grad",
    "pad_batch",
    "query_view",
    "retrieval_loss_and_grad",
    "run_round",
    "split_probe",
    "text_span",
    "token_span",
    "word_weights",
]
