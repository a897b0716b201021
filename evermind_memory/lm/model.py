"""EvermindLM: tied-embedding language model of causal depthwise convolutions and shared-expert MoE layers.

Batched numpy forward and exact backward over right-padded batches (tokens (B, T), lengths (B,)); padded
positions never change real ones and get no gradient. Shapes: B batch, T time, C channels, V vocab,
E experts, K conv width, H expert hidden. Token input is checked in batch.py; training loops and optimisers
live in `training/`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Collection, Mapping, NamedTuple, Sequence

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.lm.layers import (
    ConvCache,
    EmbedCache,
    RMSNormCache,
    conv_backward,
    conv_forward,
    cross_entropy_backward,
    cross_entropy_forward,
    embed_backward,
    embed_forward,
    rmsnorm_backward,
    rmsnorm_forward,
    unembed_backward,
    unembed_forward,
)
from evermind_memory.lm.attention import pool_backward, pool_forward
from evermind_memory.lm.batch import Batch, prepare_batch, prepare_list
from evermind_memory.lm.checkpoint import DEFAULT_MAX_BYTES
from evermind_memory.lm.config import LMConfig, init_param, param_shapes
from evermind_memory.lm.inference import FrozenEmbedder, build_plan, plan_embed_many, plan_embed_one
from evermind_memory.lm.model_file import LM_BACKBONE, Backbone, load_model_file, save_model_file
from evermind_memory.lm.moe import (
    MoECache,
    moe_backward,
    moe_forward,
)

__all__ = [
    "LMConfig", "param_shapes", "EvermindLM", "FrozenEmbedder", "HEAD_CHUNK_ELEMENTS", "LM_FILE", "save_model",
    "load_model",
]

# The training loss computes the tied head in row chunks of about this many logits (rows x V; 16 MiB in
# float32), so the (N, V) logits never exist whole. loss_and_grads(head_chunk=...) overrides it per call.
HEAD_CHUNK_ELEMENTS = 1 << 22



class _LayerCache(NamedTuple):
    conv_norm: RMSNormCache
    conv: ConvCache
    moe_norm: RMSNormCache
    moe: MoECache


class ForwardCache(NamedTuple):
    """What `hidden_backward` needs from `hidden_forward` (treat as opaque)."""

    batch: Batch
    layers: list  # one _LayerCache per layer, or each layer's input (B*T, C) when checkpointed
    checkpointed: bool


class EvermindLM:
    """The language model: parameters plus batched forward, backward, generation and pooled embeddings.

    Not thread-safe for concurrent mutation of `params`; read-only methods may run concurrently.
    The maths follow the dtype of `params` (float32 in product use).
    """

    def __init__(self, config: LMConfig, *, seed: int = 0) -> None:
        """Create a freshly initialised model.

        Args:
            config: the model shape.
            seed: seed of the one generator all parameters are drawn from, in param_shapes order.

        Raises:
            InvalidInput: config is not an LMConfig.
        """
        if not isinstance(config, LMConfig):
            raise InvalidInput(f"EvermindLM expected an LMConfig, got {type(config).__name__}.")
        rng = np.random.default_rng(seed)
        params = {
            name: init_param(name, shape, rng, config.d_model) for name, shape in param_shapes(config).items()
        }
        self._setup(config, params)

    def _setup(self, config: LMConfig, params: dict[str, np.ndarray]) -> None:
        self.config = config
        self.params = params
        # (local name, full name) per layer, so a layer's forward reads the current arrays in self.params.
        self._layer_names = [
            [(name[len(f"layers.{layer}.") :], name) for name in params if name.startswith(f"layers.{layer}.")]
            for layer in range(config.n_layers)
        ]

    @classmethod
    def from_params(cls, config: LMConfig, params: Mapping[str, np.ndarray]) -> EvermindLM:
        """Build a model from existing parameters (copied to float32).

        Args:
            config: the model shape.
            params: {name: array} with exactly the names and shapes of `param_shapes(config)`.

        Returns:
            A new EvermindLM that does not share memory with `params`.

        Raises:
            InvalidInput: wrong config type, missing or unknown names, wrong shapes, non-float or
                non-finite values.
        """
        if not isinstance(config, LMConfig):
            raise InvalidInput(f"from_params expected an LMConfig, got {type(config).__name__}.")
        shapes = param_shapes(config)
        missing = [n for n in shapes if n not in params]
        unknown = [n for n in params if n not in shapes]
        if missing or unknown:
            raise InvalidInput(
                f"from_params expected the parameter names of param_shapes(config); "
                f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                f"unknown {unknown[:5]}{'...' if len(unknown) > 5 else ''}. Was it saved with another config?"
            )
        checked = {}
        for name, shape in shapes.items():
            value = np.asarray(params[name])  # (shape)
            if value.shape != shape:
                raise InvalidInput(f"from_params expected {name} of shape {shape}, got {value.shape}.")
            if not np.issubdtype(value.dtype, np.floating):
                raise InvalidInput(f"from_params expected floating-point {name}, got dtype {value.dtype}.")
            if not np.all(np.isfinite(value)):
                raise InvalidInput(f"from_params expected finite values in {name}; it holds NaN or Inf.")
            checked[name] = np.array(value, dtype=np.float32, copy=True)  # (shape)
        model = cls.__new__(cls)
        model._setup(config, checked)
        return model

    def num_parameters(self) -> int:
        """Total number of scalar parameters.

        Returns:
            The sum of the sizes of all parameter arrays.
        """
        return int(sum(p.size for p in self.params.values()))

    # ── input checks ──────────────────────────────────────────────────────────

    def _prepare(self, tokens: Any, lengths: Any, where: str) -> Batch:
        """Validate a (B, T) token batch with optional lengths; neutralise padding (lm/batch.py)."""
        return prepare_batch(tokens, lengths, self.config.vocab_size, where)

    def _prepare_list(self, tokens: Any, where: str) -> np.ndarray:
        """Validate one non-empty token list; return it as (T,) intp (lm/batch.py)."""
        return prepare_list(tokens, self.config.vocab_size, where)

    # ── the trunk: embedding and layers ───────────────────────────────────────

    def _layer_params(self, layer: int) -> dict[str, np.ndarray]:
        return {local: self.params[full] for local, full in self._layer_names[layer]}

    def _layer_forward(
        self, layer: int, x: np.ndarray, batch: Batch, keep_cache: bool
    ) -> tuple[np.ndarray, _LayerCache | None]:
        """x + conv(RMSNorm(x)), then + MoE(RMSNorm(.)) on real rows; does not modify x."""
        p = self._layer_params(layer)
        b, t = batch.tokens.shape
        c = x.shape[1]
        normed, conv_norm_cache = rmsnorm_forward(x, p["conv_norm"])  # (B*T, C)
        mixed, conv_cache = conv_forward(normed.reshape(b, t, c), p["conv"])  # (B, T, C)
        out = mixed.reshape(b * t, c)  # (B*T, C) reuses the conv output buffer
        out += x
        rows = out if batch.real is None else out[batch.real]  # (N, C)
        normed, moe_norm_cache = rmsnorm_forward(rows, p["moe_norm"])  # (N, C)
        moe_out, moe_cache = moe_forward(p, normed, self.config.top_k, keep_cache=keep_cache)  # (N, C)
        if batch.real is None:
            out += moe_out
        else:
            out[batch.real] += moe_out
        if not keep_cache:
            return out, None
        return out, _LayerCache(conv_norm_cache, conv_cache, moe_norm_cache, moe_cache)

    def _layer_backward(
        self, dout: np.ndarray, batch: Batch, cache: _LayerCache, need: frozenset[str] | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray | None]]:
        """Backward of `_layer_forward`; consumes (overwrites) dout.

        need: the local names whose weight gradients to compute (None: all); skipped ones are absent or None.
        """
        b, t = batch.tokens.shape
        c = dout.shape[1]
        drows = dout if batch.real is None else dout[batch.real]  # (N, C)
        dnormed, grads = moe_backward(drows, cache.moe, need=need)  # (N, C)
        drows, grads["moe_norm"] = rmsnorm_backward(
            dnormed, cache.moe_norm, gain_grad=need is None or "moe_norm" in need)  # (N, C)
        if batch.real is None:
            dout += drows  # residual: dout now holds d(after conv)
        else:
            dout[batch.real] += drows
        dnormed, grads["conv"] = conv_backward(
            dout.reshape(b, t, c), cache.conv, weight_grad=need is None or "conv" in need)  # (B, T, C)
        dx, grads["conv_norm"] = rmsnorm_backward(
            dnormed.reshape(b * t, c), cache.conv_norm, gain_grad=need is None or "conv_norm" in need)  # (B*T, C)
        dx += dout
        return dx, grads

    def _trunk_forward(self, batch: Batch, mode: str) -> tuple[np.ndarray, ForwardCache]:
        """Embedding and all layers. mode: "all" caches, "inputs" keeps layer inputs only, "none"."""
        x, _ = embed_forward(self.params["emb"], batch.tokens.ravel())  # (B*T, C)
        kept = []
        for layer in range(self.config.n_layers):
            if mode == "inputs":
                kept.append(x)
            x, cache = self._layer_forward(layer, x, batch, keep_cache=(mode == "all"))  # (B*T, C)
            if mode == "all":
                kept.append(cache)
        return x, ForwardCache(batch, kept, mode == "inputs")

    def _check_grads_for(self, grads_for: Any, where: str) -> frozenset[str] | None:
        """Validate a `grads_for` argument: None, or a collection of parameter names of this model."""
        if grads_for is None:
            return None
        if isinstance(grads_for, (str, bytes)) or not isinstance(grads_for, Collection):
            raise InvalidInput(
                f"{where} expected grads_for as a collection of parameter names (or None), got {grads_for!r}; "
                "wrap a single name in a list."
            )
        need = frozenset(grads_for)
        unknown = sorted(str(n) for n in need if n not in self.params)
        if unknown:
            raise InvalidInput(
                f"{where} got unknown parameter names in grads_for: {unknown[:5]}; "
                "expected names from param_shapes(config), e.g. 'emb' or 'layers.0.shared.w1'."
            )
        return need

    def _lowest_layer(self, need: frozenset[str] | None) -> int:
        """The lowest layer the backward must reach: 0 when the lookup needs gradients, n_layers for none."""
        if need is None or "emb" in need:
            return 0
        for layer in range(self.config.n_layers):
            if any(full in need for _, full in self._layer_names[layer]):
                return layer
        return self.config.n_layers

    def _trunk_backward(
        self, dx: np.ndarray, cache: ForwardCache, grads: dict[str, np.ndarray | None],
        need: frozenset[str] | None = None,
    ) -> None:
        """Backward through the layers and the lookup; fills the names present in `grads` (adds into "emb").

        With `need`, weight gradients outside it are skipped, and so are the layers below the lowest one
        that holds a needed name (nothing below it can change a needed gradient).
        """
        batch = cache.batch
        for layer in reversed(range(self._lowest_layer(need), self.config.n_layers)):
            if cache.checkpointed:
                # Recompute this layer's activations from its kept input: one layer's cache alive at a time.
                _, layer_cache = self._layer_forward(layer, cache.layers[layer], batch, keep_cache=True)
            else:
                layer_cache = cache.layers[layer]
            local_need = None if need is None else frozenset(
                local for local, full in self._layer_names[layer] if full in need)
            dx, layer_grads = self._layer_backward(dx, batch, layer_cache, local_need)  # (B*T, C)
            for local, full in self._layer_names[layer]:
                if full in grads and layer_grads.get(local) is not None:
                    grads[full] = layer_grads[local]
        if "emb" not in grads:
            return
        if grads["emb"] is None:
            grads["emb"] = np.zeros_like(self.params["emb"])  # (V, C)
        flat_tokens = batch.tokens.ravel()  # (B*T,)
        if batch.real is None:
            embed_backward(dx, EmbedCache(flat_tokens), grads["emb"])
        else:
            embed_backward(dx[batch.real], EmbedCache(flat_tokens[batch.real]), grads["emb"])

    def _empty_grads(self, need: frozenset[str] | None) -> dict[str, np.ndarray | None]:
        """{name: None} for the parameters whose gradients are wanted, in param_shapes order."""
        return dict.fromkeys(n for n in self.params if need is None or n in need)

    def _finish_grads(self, grads: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """Zero gradients for parameters nothing reached (experts no position chose)."""
        return {name: (np.zeros_like(self.params[name]) if g is None else g) for name, g in grads.items()}

    # ── public maths ──────────────────────────────────────────────────────────

    def hidden_forward(self, tokens: Any, lengths: Any = None) -> tuple[np.ndarray, ForwardCache]:
        """Final hidden states (before the head) for a right-padded batch.

        Args:
            tokens: (B, T) integer ids; positions at or after lengths[b] are padding (any value).
            lengths: (B,) real lengths, 1 <= lengths[b] <= T; None means no padding.

        Returns:
            h: (B, T, C) with zeros at padded positions, and the cache for `hidden_backward`.

        Raises:
            InvalidInput: bad shapes, dtypes, lengths or token ids out of [0, V).
        """
        batch = self._prepare(tokens, lengths, "hidden_forward()")
        x, cache = self._trunk_forward(batch, "all")  # (B*T, C)
        if batch.pad is not None:
            x[batch.pad] = 0.0
        b, t = batch.tokens.shape
        return x.reshape(b, t, -1), cache

    def hidden_backward(
        self, dh: Any, cache: ForwardCache, *, grads_for: Collection[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Exact parameter gradients of sum(dh * h) for the h that `hidden_forward` returned.

        Args:
            dh: (B, T, C) gradient of the hidden states; values at padded positions are ignored.
            cache: from `hidden_forward` (may be reused).
            grads_for: parameter names to compute gradients for (None: all). Names outside it are absent
                from the result and their weight-gradient work is skipped (see `loss_and_grads`).

        Returns:
            {name: gradient} for every parameter (or every name in grads_for), in param_shapes order.

        Raises:
            InvalidInput: dh has the wrong shape, cache is not from hidden_forward, or grads_for names
                unknown parameters.
        """
        if not isinstance(cache, ForwardCache) or cache.checkpointed:
            raise InvalidInput("hidden_backward() expected the cache returned by hidden_forward().")
        need = self._check_grads_for(grads_for, "hidden_backward()")
        b, t = cache.batch.tokens.shape
        c = self.config.d_model
        dh_arr = np.asarray(dh)  # (B, T, C)
        if dh_arr.shape != (b, t, c):
            raise InvalidInput(f"hidden_backward() expected dh of shape {(b, t, c)}, got {dh_arr.shape}.")
        grads = self._empty_grads(need)
        if self._lowest_layer(need) == self.config.n_layers:
            return self._finish_grads(grads)  # no trunk parameter wanted: nothing to propagate
        dx = np.array(dh_arr, dtype=self.params["emb"].dtype, copy=True).reshape(b * t, c)  # (B*T, C)
        if cache.batch.pad is not None:
            dx[cache.batch.pad] = 0.0  # padded positions get (and give) no gradient
        self._trunk_backward(dx, cache, grads, need)
        return self._finish_grads(grads)

    def forward(self, tokens: Any, lengths: Any = None) -> np.ndarray:
        """Next-token logits for every position of a right-padded batch.

        Args:
            tokens: (B, T) integer ids; positions at or after lengths[b] are padding.
            lengths: (B,) real lengths; None means no padding.

        Returns:
            logits: (B, T, V); rows at padded positions are zero.

        Raises:
            InvalidInput: bad shapes, dtypes, lengths or token ids.
        """
        batch = self._prepare(tokens, lengths, "forward()")
        x, _ = self._trunk_forward(batch, "none")  # (B*T, C)
        if batch.pad is not None:
            x[batch.pad] = 0.0
        logits, _ = unembed_forward(x, self.params["emb"])  # (B*T, V)
        b, t = batch.tokens.shape
        return logits.reshape(b, t, -1)

    def loss_and_grads(
        self,
        tokens: Any,
        lengths: Any = None,
        *,
        checkpoint: bool = False,
        grads_for: Collection[str] | None = None,
        head_chunk: int | None = None,
    ) -> tuple[float, dict[str, np.ndarray]]:
        """Mean next-token cross-entropy over real predicted positions, and its exact gradients.

        Position t of sequence b predicts token t+1 when t + 1 < lengths[b]. The tied head and the
        cross-entropy run in chunks of predicted rows, so the full (M, V) logits never exist at once.

        Args:
            tokens: (B, T) integer ids; positions at or after lengths[b] are padding.
            lengths: (B,) real lengths; None means no padding.
            checkpoint: keep only each layer's input during the forward and recompute the layer in the
                backward (less memory, identical gradients).
            grads_for: parameter names to compute gradients for (None: all). Names outside it are ABSENT
                from the returned dict; their weight-gradient matmuls are skipped, gradients still flow
                through them to the names that need them, and layers below the lowest needed name are
                not back-propagated at all (an empty collection returns just the loss).
            head_chunk: predicted rows per head chunk (>= 1); None takes max(1, HEAD_CHUNK_ELEMENTS // V).
                Any value gives the same loss and gradients up to float rounding.

        Returns:
            (loss, {name: gradient} for every parameter, or every name in grads_for, in param_shapes order).

        Raises:
            InvalidInput: bad inputs, grads_for names an unknown parameter, head_chunk < 1, or no sequence
                has two or more tokens (nothing to predict).
        """
        need = self._check_grads_for(grads_for, "loss_and_grads()")
        if head_chunk is None:
            head_chunk = max(1, HEAD_CHUNK_ELEMENTS // self.config.vocab_size)
        elif isinstance(head_chunk, bool) or not isinstance(head_chunk, (int, np.integer)) or head_chunk < 1:
            raise InvalidInput(f"loss_and_grads() expected head_chunk an int >= 1 or None, got {head_chunk!r}.")
        batch = self._prepare(tokens, lengths, "loss_and_grads()")
        b, t = batch.tokens.shape
        predicted = np.arange(t)[None, :] < (batch.lengths - 1)[:, None]  # (B, T)
        rows = np.flatnonzero(predicted.ravel())  # (M,)
        if rows.size == 0:
            raise InvalidInput(
                "loss_and_grads() expected at least one sequence with >= 2 tokens; every sequence has 1."
            )
        targets = batch.tokens.ravel()[rows + 1]  # (M,)
        want_emb = need is None or "emb" in need
        want_trunk = self._lowest_layer(need) < self.config.n_layers  # some layer (or the lookup) needs dx

        mode = "none" if not want_trunk else ("inputs" if checkpoint else "all")
        x, cache = self._trunk_forward(batch, mode)  # (B*T, C)
        emb = self.params["emb"]
        m = rows.size
        dx = np.zeros_like(x) if want_trunk else None  # (B*T, C)
        d_emb = None
        loss_sum = 0.0
        for start in range(0, m, head_chunk):  # loop over chunks of rows: the (M, V) logits never exist whole
            part = rows[start : start + head_chunk]  # (m,)
            logits, head_cache = unembed_forward(x[part], emb)  # (m, V)
            loss, ce_cache = cross_entropy_forward(logits, targets[start : start + head_chunk], inplace=True)
            loss_sum += loss * part.size
            if want_trunk:  # (wanting "emb" implies want_trunk: the lookup needs dx)
                dlogits = cross_entropy_backward(ce_cache, part.size / m)  # (m, V) the chunk's share of the mean
                dx[part], d_emb = unembed_backward(dlogits, head_cache, d_emb, weight_grad=want_emb)  # (m, C)
        if m > head_chunk:
            loss = loss_sum / m  # else the one chunk's mean, exactly as unchunked
        grads = self._empty_grads(need)
        if want_emb:
            grads["emb"] = d_emb  # the head's part; the lookup's part is added in _trunk_backward
        if want_trunk:
            self._trunk_backward(dx, cache, grads, need)
        return loss, self._finish_grads(grads)

    # ── generation and embeddings ─────────────────────────────────────────────

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        seed: int | None = None,
        stop_token: int | None = None,
    ) -> list[int]:
        """Continue a prompt token by token: greedy at temperature 0, else sample softmax(logits / T).

        A position depends only on the last (K-1)*n_layers + 1 tokens, so each step runs the model on
        that window only.

        Args:
            prompt: non-empty list of token ids.
            max_new_tokens: how many tokens to produce at most (>= 0).
            temperature: 0 for greedy argmax; > 0 samples.
            seed: seed of the sampler's np.random.default_rng (sampling only).
            stop_token: stop after producing this id (it is included in the result).

        Returns:
            The new token ids (not including the prompt).

        Raises:
            InvalidInput: empty prompt, ids out of range, negative max_new_tokens or temperature.
        """
        seq = self._prepare_list(prompt, "generate()").tolist()
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
            raise InvalidInput(f"generate() expected an int max_new_tokens >= 0, got {max_new_tokens!r}.")
        if not (isinstance(temperature, (int, float, np.floating)) and math.isfinite(temperature) and temperature >= 0):
            raise InvalidInput(f"generate() expected a finite temperature >= 0, got {temperature!r}.")
        if stop_token is not None and not (0 <= int(stop_token) < self.config.vocab_size):
            raise InvalidInput(
                f"generate() expected stop_token in [0, {self.config.vocab_size}) or None, got {stop_token!r}."
            )
        window = (self.config.conv_kernel - 1) * self.config.n_layers + 1
        rng = np.random.default_rng(seed) if temperature > 0 else None
        emb = self.params["emb"]
        produced: list[int] = []
        for _ in range(int(max_new_tokens)):
            context = np.asarray(seq[-window:], dtype=np.intp)[None, :]  # (1, W)
            batch = Batch(context, np.array([context.shape[1]]), None, None)  # no padding
            x, _ = self._trunk_forward(batch, "none")  # (W, C)
            logits = emb @ x[-1]  # (V,)
            if rng is None:
                nxt = int(np.argmax(logits))
            else:
                z = logits.astype(np.float64) / temperature  # (V,) float64 so the probabilities sum to 1
                z -= z.max()
                probs = np.exp(z)  # (V,)
                probs /= probs.sum()
                nxt = int(rng.choice(probs.shape[0], p=probs))
            produced.append(nxt)
            seq.append(nxt)
            if stop_token is not None and nxt == stop_token:
                break
        return produced

    def pooled_forward(self, tokens: Any, lengths: Any = None) -> tuple[np.ndarray, Any]:
        """Unnormalised pooled embeddings of a right-padded batch (what `embed` normalises).

        Args:
            tokens: (B, T) integer ids; positions at or after lengths[b] are padding.
            lengths: (B,) real lengths; None means no padding.

        Returns:
            pooled (B, C), and the cache for `pooled_backward`.

        Raises:
            InvalidInput: bad shapes, dtypes, lengths or token ids.
        """
        h, trunk = self.hidden_forward(tokens, lengths)  # (B, T, C)
        lens = trunk.batch.lengths
        pooled, pool = pool_forward(self.params, h, lens, self.config.attn_heads, keep_cache=True)
        return pooled, (trunk, pool)

    def pooled_backward(
        self, dpooled: Any, cache: Any, *, grads_for: Collection[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Exact parameter gradients of sum(dpooled * pooled) for the pooled that `pooled_forward` returned.

        Args:
            dpooled: (B, C) gradient of the pooled vectors.
            cache: from `pooled_forward`.
            grads_for: parameter names to compute gradients for (None: all); names outside it are absent
                from the result (see `loss_and_grads`).

        Returns:
            {name: gradient} for every parameter (or every name in grads_for), in param_shapes order.

        Raises:
            InvalidInput: grads_for names unknown parameters.
        """
        need = self._check_grads_for(grads_for, "pooled_backward()")
        trunk, pool = cache
        lens = trunk.batch.lengths
        d = np.asarray(dpooled, dtype=self.params["emb"].dtype)  # (B, C)
        pool_grads: dict[str, np.ndarray] = {}
        dh = pool_backward(self.params, d, lens, pool, self.config.attn_heads, pool_grads, need)  # (B, T, C)
        grads = self.hidden_backward(dh, trunk, grads_for=need)
        grads.update(pool_grads)
        return grads

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """Embedding of one token sequence: final hidden states mean-pooled over positions, unit L2 norm.

        Runs the inference path (no caches); equal to normalising `pooled_forward` up to float rounding.
        For many calls with fixed weights, `frozen()` is faster.

        Args:
            tokens: non-empty list of token ids.

        Returns:
            (C,) float32 vector of norm 1 (or zero if the pooled state is exactly zero).

        Raises:
            InvalidInput: empty list or ids out of range.
        """
        arr = self._prepare_list(tokens, "embed()")
        return plan_embed_one(build_plan(self.config, self.params, fused=False), arr)

    def embed_batch(self, token_lists: Sequence[Sequence[int]]) -> np.ndarray:
        """Embeddings of many token sequences, batched by similar length (same vectors as `embed`).

        Args:
            token_lists: sequence of non-empty token-id lists.

        Returns:
            (N, C) float32, row i the embedding of token_lists[i]; (0, C) for an empty input.

        Raises:
            InvalidInput: an empty list or ids out of range (the message names the index).
        """
        seqs = [self._prepare_list(tokens, f"embed_batch() item {i}") for i, tokens in enumerate(token_lists)]
        plan = build_plan(self.config, self.params, fused=False)
        return plan_embed_many(plan, seqs, self.config.d_model)

    def frozen(self) -> FrozenEmbedder:
        """A snapshot of the embedding function for repeated use: `embed` and `embed_batch` with the
        current weights copied and arranged once (faster, above all for short texts).

        Returns:
            A FrozenEmbedder; later changes to this model's params do not reach it.
        """
        return FrozenEmbedder(self)

    # ── files ─────────────────────────────────────────────────────────────────

    def save(self, path: Any, *, fp16: bool = False) -> None:
        """Write the config and weights to a checkpoint file (see lm.checkpoint).

        Args:
            path: file path.
            fp16: store the weights as float16 (half the size, a small loss of precision).

        Raises:
            CheckpointError: the file could not be written.
        """
        save_model(path, self.config, self.params, fp16=fp16)

    @classmethod
    def load(cls, path: Any) -> EvermindLM:
        """Read a model from a checkpoint file written by `save`.

        Args:
            path: file path.

        Returns:
            The loaded EvermindLM (float32).

        Raises:
            CheckpointError: the file is missing, corrupt, truncated or of an unknown format.
        """
        config, params = load_model(path)
        return cls.from_params(config, params)


# ── model files ───────────────────────────────────────────────────────────────

LM_FILE = Backbone(LM_BACKBONE, LMConfig, param_shapes)  # how lm.model_file reads and writes an EvermindLM


def save_model(
    path: str | os.PathLike[str], config: LMConfig, params: Mapping[str, np.ndarray], *, fp16: bool = False
) -> None:
    """Save a model's config and parameters atomically (temp file + fsync + rename).

    Args:
        path: destination file (conventionally *.evlm).
        config: the LMConfig.
        params: name -> array, exactly the names and shapes of param_shapes(config).
        fp16: store weights as float16 (half the size; loaded back as float32).

    Raises:
        InvalidInput: params do not match the config, are not finite floats, or cannot be stored.
        CheckpointError: the file system refused the write (an existing file is left as it was).
    """
    save_model_file(path, LM_FILE, config, params, fp16=fp16, what="save_model")


def load_model(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[LMConfig, dict[str, np.ndarray]]:
    """Load and validate an EvermindLM checkpoint written by save_model.

    The tensor set and every shape are checked against param_shapes(config) before any weights are read.

    Args:
        path: the checkpoint file.
        max_bytes: refuse files larger than this.

    Returns:
        (config, params): the LMConfig and name -> float32 array in param_shapes order.

    Raises:
        CheckpointError: missing, unreadable, corrupt, truncated, of another format or backbone, inconsistent
            with its config, or holding non-finite weights.
    """
    _, config, params = load_model_file(path, [LM_FILE], max_bytes=max_bytes)
    return config, params
