"""Adaptation rounds: train, gate and publish an adapter (run_round), the background thread that runs them when
due (Adaptation), and rollback to an earlier adapter or the base model.

They reach the store only through its public generation API (store/generations.py, `MemoryStore.generations`):
what serves, the memories and feedback to learn from, and publish() / resume() to swap in a new generation.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np

from .._blas import single_blas
from .._crash import crash_point
from ..errors import EvermindError, InvalidInput, StoreLocked
from ..lm.adapter import LoRAWeights
from .fit import fit_adapter
from .gate import gate_candidate, split_probe, too_small_to_judge
from .policy import AdaptationHooks, AdaptationPolicy
from .report import AdaptationReport, GateResult


def save_candidate(gens: Any, weights: LoRAWeights, report: AdaptationReport) -> dict:
    """Write a gated candidate to the store's adapter history; returns its entry."""
    entry = gens.adapter_history().add(
        weights, fingerprint=report.fingerprint_after, base_fingerprint=report.base_fingerprint,
        round=report.round, gate=None if report.gate is None else report.gate.to_dict(),
        steps=report.steps, final_loss=None if not report.losses else list(report.losses[-1]),
    )
    report.adapter_id = entry["id"]
    crash_point("adapt.adapter_written")
    return entry


def record_outcome(gens: Any, report: AdaptationReport) -> None:
    """Note in the adapter history what became of the adapter a publish tried (published, refused, ...)."""
    if not report.adapter_id:
        return
    if report.status == "swapped":
        gens.adapter_history().update(report.adapter_id, status="published", published_at=report.swapped_at)
    elif report.status in ("refused", "vetoed", "abandoned"):
        gens.adapter_history().update(report.adapter_id, status=report.status)


def rollback(gens: Any, to: str) -> AdaptationReport:
    """Serve an earlier adapter (its id) or the base model ("base") again, through a new generation.

    Args:
        gens: the writable store's generation API.
        to: an adapter id or "base".
    Returns:
        the report (kind "rollback"; status "swapped" or "unchanged").
    Raises:
        InvalidInput: an unknown id, an adapter made for another base model, or a store that cannot adapt.
        CheckpointError: the adapter file is missing, corrupt or not the one recorded.
    """
    with gens.round_lock, gens.claimed() as mine:
        if not mine:
            raise StoreLocked("rollback_adapter(): another process is running an adaptation round or re-embed on "
                              "this store; try again when it has finished.")
        base, _, _ = gens.adaptable_base()
        report = AdaptationReport(round=0, kind="rollback", fingerprint_before=gens.fingerprint,
                                  base_fingerprint=base.fingerprint)
        entry = None
        embedder = base
        if to != "base":
            history = gens.adapter_history()
            entry = history.get(to)
            weights = history.load(entry, base.model)
            if weights.base_fingerprint not in (None, base.fingerprint):
                raise InvalidInput(
                    f"adapter {to} was fitted on {weights.base_fingerprint}, this store's base is {base.fingerprint}."
                )
            embedder = gens.adapted_embedder(weights, base)
            report.adapter_id = entry["id"]
        report.fingerprint_after = embedder.fingerprint
        if embedder.fingerprint == gens.fingerprint and gens.pending() is None:
            report.status, report.reason = "unchanged", "that model already serves"
            return report
        t0 = time.perf_counter()
        gens.publish(embedder, entry, report)
        record_outcome(gens, report)
        report.total_seconds = time.perf_counter() - t0
        return report


@single_blas
def run_round(gens: Any, policy: AdaptationPolicy, hooks: AdaptationHooks, *, round_no: int,
              should_stop: Callable[[], bool] | None = None, adapter: LoRAWeights | None = None) -> AdaptationReport:
    """One round on a store: resume a started publish, or train, gate and publish a new adapter.

    Args:
        gens: the writable store's generation API (MemoryStore.generations).
        policy: the policy.
        hooks: the hooks.
        round_no: the number reported.
        should_stop: polled between steps and batches.
        adapter: publish this adapter (gated) instead of training one.
    Returns:
        the report.
    """
    asked = should_stop or (lambda: False)

    def stop() -> bool:  # asked to, or another process took the generation lease over (this one hung)
        return asked() or not gens.keep_lease()

    t0 = time.perf_counter()
    with gens.round_lock, gens.claimed() as mine:
        report = AdaptationReport(round=round_no, fingerprint_before=gens.fingerprint)
        if not mine:
            report.status, report.reason = "skipped", "another process is running an adaptation round or re-embed"
            report.total_seconds = time.perf_counter() - t0
            return report
        if gens.pending() is not None:
            report.kind = "resume"
            gens.resume(report, before_swap=hooks.before_swap, should_stop=stop, batch=policy.reembed_batch)
            record_outcome(gens, report)
            if report.status == "swapped" and hooks.on_reindexed:
                hooks.on_reindexed(report)
            report.total_seconds = time.perf_counter() - t0
            return report
        if hooks.on_round_start:
            hooks.on_round_start()
        base, init, _ = gens.adaptable_base()
        report.base_fingerprint = base.fingerprint
        labels, texts, stored = gens.memories(policy.max_memories, policy.seed)
        report.memories = len(texts)
        # refused now, with the sizes, rather than after a training the gate must refuse; the gate's reason first,
        # as it names the size a round needs (under the default policy above min_facts)
        small = too_small_to_judge(len(texts), policy)
        if small is None and len(texts) < policy.min_facts:
            small = f"{len(texts)} memories, fewer than min_facts={policy.min_facts}"
        if small is not None:
            report.status, report.reason = "skipped", small
            report.total_seconds = time.perf_counter() - t0
            return report
        train_idx, probe_idx = split_probe(len(texts), policy)
        report.trained_on = len(train_idx)
        if adapter is None:
            at = {int(i): j for j, i in enumerate(train_idx.tolist())}  # the gate's probes are never trained on
            pairs = [(q, at[i], w) for q, i, w in gens.feedback_pairs(labels) if i in at]
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
            candidate = gens.adapted_embedder(weights, base)
        except InvalidInput as exc:  # e.g. the merged weights overflow to Inf
            candidate = None
            gate = GateResult(False, f"the candidate model is invalid ({exc})", False, 0, 0, policy.probe_k)
            report.gate = gate
        if candidate is not None:
            distract = np.setdiff1d(np.arange(len(texts)), probe_idx)  # (N - P,)
            want = max(0, policy.gate_corpus - len(probe_idx))
            if len(distract) > want:
                distract = np.sort(np.random.default_rng([policy.seed, 13]).choice(distract, want, replace=False))
            corpus_idx = np.concatenate([probe_idx, distract]).astype(np.int64)  # (N,)
            gate = gate_candidate(
                gens.embedder, candidate, [texts[i] for i in probe_idx], [texts[i] for i in distract], policy,
                current_doc_vectors=stored[corpus_idx], corpus_labels=labels[corpus_idx],
                round_docs=gens.as_stored,
            )
            report.gate = gate
            report.fingerprint_after = candidate.fingerprint
        report.gate_seconds = time.perf_counter() - t_gate
        if hooks.on_adapted:
            hooks.on_adapted(report)
        if not gate.passed:
            report.status, report.reason = "refused", gate.reason
            report.total_seconds = time.perf_counter() - t0
            return report
        entry = save_candidate(gens, weights, report)
        seed = None if gate.candidate_vectors is None else (gate.candidate_labels, gate.candidate_vectors)
        gens.publish(candidate, entry, report, seed=seed, before_swap=hooks.before_swap, should_stop=stop,
                     batch=policy.reembed_batch)
        record_outcome(gens, report)
        if report.status == "swapped" and hooks.on_reindexed:
            hooks.on_reindexed(report)
        report.total_seconds = time.perf_counter() - t0
        return report


class Adaptation:
    """A background adaptation thread on one store (made by `MemoryStore.start_adaptation`).

    Thread-safe: stop(), join() and status() may be called from any thread.

    Args:
        gens: the writable store's generation API.
        policy: when rounds run and what they fit.
        hooks: the callbacks.
        owner: kept alive while the thread runs (the MemoryStore: a store dropped while it adapts stays open
            until the thread is stopped, as its close() would stop it).
    """

    def __init__(self, gens: Any, policy: AdaptationPolicy, hooks: AdaptationHooks, owner: Any = None) -> None:
        self._gens = gens
        self._owner = owner
        self.policy = policy
        self.hooks = hooks
        self._stop = threading.Event()
        self._state_lock = threading.Lock()
        self._error: BaseException | None = None
        self._reports: list[AdaptationReport] = []
        self._rounds = 0
        self._last_seq = gens.adapted_upto()  # memories the serving adapter has already seen
        self._last_end = time.monotonic() - policy.min_interval_s
        self._thread = threading.Thread(target=self._run, name="evermind-adaptation", daemon=True)

    def start(self) -> "Adaptation":
        """Start the thread (called by the store)."""
        self._thread.start()
        return self

    def _due(self) -> bool:
        if self._gens.pending() is not None:
            return True
        if time.monotonic() - self._last_end < self.policy.min_interval_s:
            return False
        return self._gens.remembered_since(self._last_seq) >= max(1, self.policy.min_new_facts)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._due():
                    seq = self._gens.max_seq()
                    report = run_round(self._gens, self.policy, self.hooks, round_no=self._rounds + 1,
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

    def stop(self, *, wait: bool = False) -> None:
        """Ask the thread to stop after the current step or batch (a started publish resumes later).

        Args:
            wait: also wait for the thread to end (without raising its error: join() does that).
        """
        self._stop.set()
        if wait and self._thread is not threading.current_thread():
            self._thread.join()

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
            "pending": self._gens.pending() if not self._gens.closed else None,
        }
