"""MemoryStore's adaptation methods: start_adaptation, adapt_now, rollback_adapter and adapter_history.

They check their arguments here and hand the work to evermind_memory.adaptation, which is imported only when one
of them is called and reaches the store only through its public generation API (store/generations.py).
MemoryStore inherits them; nothing else uses this class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidInput

if TYPE_CHECKING:
    from ..adaptation import Adaptation, AdaptationHooks, AdaptationPolicy, AdaptationReport
    from ..lm.adapter import LoRAWeights
    from .parts import StoreParts


class AdaptationMethods:
    """The adaptation part of MemoryStore's public API (a mixin: it uses the store's guards and generations)."""

    _parts: StoreParts  # what the store is made of: its generations, access, the adaptation started last

    if TYPE_CHECKING:  # MemoryStore's, the one class that mixes this in (memory_store.py)
        def _check_usable(self) -> None: ...

        def _check_writable(self, method: str) -> None: ...

        def _check_owner(self, method: str) -> None: ...

    def start_adaptation(self, policy: AdaptationPolicy | None = None,
                         hooks: AdaptationHooks | dict | None = None) -> Adaptation:
        """Start a background thread that adapts the embedder to this store's memories (LoRA rounds).

        A round runs when the policy says so (enough new memories, long enough since the last round): it fits
        an adapter, gates it on held-out memories, writes it to `<db>.adapters/` (a PostgreSQL store: its adapters
        table), re-embeds every memory into a new generation while the current one keeps serving, catches up with writes
        made meanwhile and swaps under the lock. A publish interrupted by a crash or stop() is resumed by the next
        round.

        Args:
            policy: an AdaptationPolicy (None: the defaults).
            hooks: an AdaptationHooks or a dict of hook name -> callable (they run in the adaptation thread
                and must not start another round themselves).
        Returns:
            the Adaptation (stop(), join(), status()).
        Raises:
            InvalidInput: an in-memory or read-only store, an embedder that is not an LMEmbedder, bad policy
                or hooks, or an adaptation already running.
        """
        from ..adaptation import Adaptation, check_hooks

        self._check_adaptable("start_adaptation")
        policy = self._check_policy(policy, "start_adaptation")
        hooks = check_hooks(hooks)
        self._parts.gens.adaptable_base()  # fail now, not in the thread, when the store cannot be adapted
        if self._parts.adaptation is not None and self._parts.adaptation.running:
            raise InvalidInput("start_adaptation(): an adaptation is already running; stop() and join() it first.")
        self._parts.adaptation = Adaptation(self._parts.gens, policy, hooks, owner=self).start()
        return self._parts.adaptation

    @property
    def adaptation(self) -> Adaptation | None:
        """The Adaptation started by start_adaptation() (None if never started)."""
        return self._parts.adaptation

    def adapt_now(self, policy: AdaptationPolicy | None = None, hooks: AdaptationHooks | dict | None = None, *,
                  adapter: LoRAWeights | None = None) -> AdaptationReport:
        """Run one adaptation round in this thread (for scripts and `evermind adapt`).

        If an earlier publish was interrupted (crash, stop()), this call finishes it instead and returns that
        report (kind "resume"); call again for a new round. Recalls and writes from other threads continue.

        Args:
            policy: an AdaptationPolicy (None: the defaults; min_new_facts and min_interval_s do not apply).
            hooks: as for start_adaptation.
            adapter: a LoRAWeights to gate and publish instead of training one.
        Returns:
            the AdaptationReport (status "swapped", "refused", "vetoed", "skipped" (too few memories, a store too
            small for the gate to judge a gain, said at once with the sizes and before any training, or another
            process is running a round or a re-embed), "stopped" or "abandoned").
        Raises:
            InvalidInput: as for start_adaptation.
        """
        from ..adaptation import check_hooks, run_round

        self._check_adaptable("adapt_now")
        policy = self._check_policy(policy, "adapt_now")
        hooks = check_hooks(hooks)
        self._parts.adapt_rounds += 1
        return run_round(self._parts.gens, policy, hooks, round_no=self._parts.adapt_rounds, adapter=adapter)

    def rollback_adapter(self, to: str | None = "base") -> AdaptationReport:
        """Serve an earlier adapter (by id, see adapter_history()) or the base model again.

        Re-embeds into a new generation and swaps like an adaptation round (no gate, no hooks).

        Args:
            to: an adapter id such as "0002", or "base" / None for the base model.
        Returns:
            the AdaptationReport (kind "rollback"; status "swapped" or "unchanged").
        Raises:
            InvalidInput: an unknown id, an adapter made for another base model, or a store that cannot adapt.
            CheckpointError: the adapter file is missing, corrupt or not the one recorded.
            StoreLocked: another process is running an adaptation round or a re-embed on this store.
        """
        from ..adaptation import rollback

        self._check_adaptable("rollback_adapter")
        to = "base" if to is None else to
        if not isinstance(to, str) or not to:
            raise InvalidInput(f"rollback_adapter() expected an adapter id or 'base', got {to!r:.60}.")
        return rollback(self._parts.gens, to)

    def adapter_history(self) -> list[dict]:
        """Every adapter written for this store, oldest first, each with "active" (the one serving now)."""
        self._check_usable()
        active = self._parts.gens.active_adapter_id()
        return [{**e, "active": e["id"] == active} for e in self._parts.gens.adapter_history().entries()]

    def _check_adaptable(self, method: str) -> None:
        self._check_writable(method)
        self._check_owner(method)
        if self._parts.access.memory:
            raise InvalidInput(f"{method}() needs a store file (adapters are kept beside it); this store is "
                               "':memory:'.")

    @staticmethod
    def _check_policy(policy: object, method: str) -> AdaptationPolicy:
        from ..adaptation import AdaptationPolicy

        if policy is None:
            return AdaptationPolicy()
        if not isinstance(policy, AdaptationPolicy):
            raise InvalidInput(f"{method}() expected policy to be an AdaptationPolicy, got {type(policy).__name__}.")
        return policy
