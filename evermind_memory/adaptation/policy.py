"""When an adaptation round runs and what it fits (AdaptationPolicy), and the hooks agent code sets on it."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable

import numpy as np

from ..errors import InvalidInput

VIEWS = ("rare-span-memory", "words-memory", "span-memory", "sentence-or-span", "two-spans")
NEGATIVES = ("store", "batch")


@dataclass(frozen=True)
class AdaptationPolicy:
    """When a background round runs, what it fits, and how strict the gate is.

    Args:
        min_new_facts: a round starts once this many memories were remembered since the last round.
        min_interval_s: and at least this many seconds passed since the last round ended.
        max_cpu_seconds: training stops after this much CPU time of the adaptation thread (the gate and the
            re-embedding always finish; their time is reported separately). 50 (a round of about 53 s on one
            core for 300 memories) over 25: chosen leave-one-source-out with gate_margin 1 on nine unseen
            manuals (benchmarks/results/adaptation_gain_gate*.txt).
        rank: LoRA rank R. 16 over 8 (alpha 32 over 16, the same scale): on the shipped model, over five samples
            of the nine unseen dev manuals, mean gain +0.022 against +0.018, chosen leave-one-source-out for all
            nine; rank 32 and other targets, anchor weight, lr and temperature did not beat it
            (benchmarks/results/adaptation_gain_stage3_rank_seeds.txt, adaptation_gain_stage3_grid_seed0.txt).
        alpha: LoRA scale numerator (update = alpha / R * B @ A).
        targets: 2-D weights to adapt; None picks the tied embedding plus the pooling attention (or the last
            layer's shared expert when the model has no pooling attention).
        lr: AdamW learning rate (the peak, with a schedule). 6e-3 with "sentence-or-span" views: of {3e-3 rare
            spans (the former default), 3e-3 and 6e-3 sentence-or-span} it had the best mean gain on the other
            eight dev sources for each of the nine left out (vector ndcg@10 after one round on 300 documents,
            left-out mean +0.032 before the gate; benchmarks/results/adaptation_gain_grid.txt). Feedback moves
            the model off general text; an earlier maxima study kept 3e-3 for that reason (general ndcg@10
            -0.003 with feedback at 3e-3); the dev runs show general within +-0.008 at 6e-3 from memories alone.
        lr_schedule: "cosine": lr * (1 + cos(pi * progress)) / 2, progress being the larger of the share of
            steps done and the share of max_cpu_seconds spent (the round ends at lr ~ 0 whichever budget binds,
            which keeps the general-purpose drift of the last noisy steps small); "constant": lr throughout.
        steps: at most this many optimizer steps per round (max_cpu_seconds usually binds first).
        batch_size: memories per contrastive batch.
        views: the short query-like view of a memory. "rare-span-memory": a contiguous run of
            query_min_words..query_max_words words around a word drawn with weight idf ** query_idf_power
            (idf over the training memories: the words a person searching for that memory would type);
            "span-memory": such a run anywhere; "sentence-or-span": with probability sentence_share one
            sentence of the memory (cut to sentence_max_words words: the shape of a one-line description or a
            question), else a rare-span view (the shape of a name or a title; the default, see lr); "words-memory": that
            many words drawn by that weight, kept in their order; "two-spans": two random token spans of the memory, a
            quarter to all of it (symmetric, the first design; "batch" negatives only).
        query_min_words, query_max_words: length range of the short view.
        query_idf_power: sharpness of the rare-word weighting (0: any word).
        sentence_share: share of sentence views ("sentence-or-span").
        sentence_max_words: a sentence view keeps at most this many words.
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
        probe_k: the gate also reports recall@probe_k.
        probe_views: probe queries per held-out memory: short query-like views of it (the same kind as the
            training views, policy.views), so the gate measures what training optimises on memories it never saw.
            8 rather than 4: less of the noise of which views were drawn (on the nine dev sources, 300 documents
            each, 5 of 9 rounds passed either way, and the gain let through was +0.022 vs +0.015 mean;
            benchmarks/results/adaptation_gain_gate.txt).
        min_probe_queries: fewer probe queries than this and the gate refuses: it cannot tell a gain from
            noise (40 memories gave 8 probes, every one found by both models, and a tie swapped an adapter in).
            128: at least 16 held-out memories, so a store needs about 32 memories for a round to pass.
        gate_corpus: probes plus distractors searched by the gate (at most this many memories).
        gate_margin: the candidate must beat the current model on its probe: the mean paired gain in
            reciprocal rank (per held-out memory, the mean over its views) must be > 0 and > gate_margin standard
            errors of its mean over the memories (1.0: about a one-sided 16% chance that a candidate no better on
            the probe passes). A tie is refused. 1.0 over 2.0: with the gate off, 8 of 9 rounds on unseen
            manuals (one sample) raised recall on their real queries and none lowered it, while 2 SE refused most of
            them (the probe is a noisy view of query recall); 1 SE kept most of that gain: of the 27 rounds it let
            through on five samples, 3 lowered query recall (by 0.004, 0.0004 and 0.013). Measured with the previous
            model (845a819d); the shipped one passes 23 of 45 rounds on the same five samples.
        require_gain: False turns the margin test off (a candidate as good as the current one within
            gate_tolerance passes): for tests of the publish mechanics, never for real stores.
        gate_tolerance: the candidate's probe recall@probe_k may be at most this much below the current
            model's, even when its reciprocal rank is better (a gain at the top must not lose memories below).
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
    max_cpu_seconds: float = 50.0
    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] | None = None
    lr: float = 6e-3
    lr_schedule: str = "cosine"
    steps: int = 400
    batch_size: int = 64
    views: str = "sentence-or-span"
    query_min_words: int = 1
    query_max_words: int = 5
    query_idf_power: float = 4.0
    sentence_share: float = 0.5
    sentence_max_words: int = 24
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
    min_probe: int = 16
    max_probe: int = 256
    probe_k: int = 10
    probe_views: int = 8
    min_probe_queries: int = 128
    gate_corpus: int = 1024
    gate_margin: float = 1.0
    require_gain: bool = True
    gate_tolerance: float = 0.01
    max_mean_cosine: float = 0.99
    min_facts: int = 16
    max_memories: int = 50_000
    reembed_batch: int = 256
    poll_seconds: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        ints = {"min_new_facts": (0, 10**9), "rank": (1, 4096), "steps": (0, 10**7), "batch_size": (2, 65_536),
                "query_min_words": (1, 10_000), "query_max_words": (1, 10_000), "sentence_max_words": (1, 10_000),
                "train_tokens": (2, 65_536), "anchor_batch": (1, 65_536), "query_batch": (1, 65_536),
                "lm_batch": (1, 65_536), "min_probe": (1, 10**6), "max_probe": (1, 10**6), "probe_k": (1, 1000),
                "probe_views": (1, 64), "min_probe_queries": (1, 10**6),
                "gate_corpus": (2, 10**6), "min_facts": (2, 10**9), "max_memories": (2, 10**9),
                "reembed_batch": (1, 100_000), "seed": (0, 2**63 - 1)}
        for name, (lo, hi) in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
                raise InvalidInput(f"AdaptationPolicy expected {name} an int in [{lo}, {hi}], got {value!r}.")
        reals = {"min_interval_s": (0.0, 1e9), "max_cpu_seconds": (0.0, 1e9), "alpha": (1e-9, 1e9),
                 "lr": (0.0, 10.0), "lm_weight": (0.0, 1e6), "contrastive_weight": (0.0, 1e6),
                 "query_weight": (0.0, 1e6), "anchor_weight": (0.0, 1e6), "query_idf_power": (0.0, 100.0),
                 "sentence_share": (0.0, 1.0), "temperature": (1e-4, 100.0), "max_grad_norm": (0.0, 1e9),
                 "probe_fraction": (0.0, 0.9), "gate_tolerance": (0.0, 1.0), "gate_margin": (0.0, 100.0),
                 "max_mean_cosine": (0.0, 1.0), "poll_seconds": (0.001, 3600.0)}
        for name, (low, high) in reals.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(value) or not low <= value <= high:
                raise InvalidInput(f"AdaptationPolicy expected {name} a finite number in [{low}, {high}], got "
                                   f"{value!r}.")
        if not isinstance(self.require_gain, bool):
            raise InvalidInput(f"AdaptationPolicy expected require_gain a bool, got {self.require_gain!r}.")
        if self.targets is not None:
            if isinstance(self.targets, str) or not all(isinstance(t, str) and t for t in self.targets) \
                    or not self.targets or len(set(self.targets)) != len(self.targets):
                raise InvalidInput("AdaptationPolicy expected targets a tuple of distinct names or None, got "
                                   f"{self.targets!r}.")
            object.__setattr__(self, "targets", tuple(self.targets))
        if self.views not in VIEWS:
            raise InvalidInput(f"AdaptationPolicy expected views one of {VIEWS}, got {self.views!r}.")
        if self.lr_schedule not in ("cosine", "constant"):
            raise InvalidInput("AdaptationPolicy expected lr_schedule 'cosine' or 'constant', got "
                               f"{self.lr_schedule!r}.")
        if self.negatives not in NEGATIVES:
            raise InvalidInput(f"AdaptationPolicy expected negatives one of {NEGATIVES}, got {self.negatives!r}.")
        if self.query_min_words > self.query_max_words:
            raise InvalidInput(f"AdaptationPolicy expected query_min_words <= query_max_words, got "
                               f"{self.query_min_words} > {self.query_max_words}.")
        if self.min_probe > self.max_probe:
            raise InvalidInput(f"AdaptationPolicy expected min_probe <= max_probe, got {self.min_probe} > "
                               f"{self.max_probe}.")


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
    on_adapted: Callable[[Any], Any] | None = None
    before_swap: Callable[[Any], Any] | None = None
    on_reindexed: Callable[[Any], Any] | None = None
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
