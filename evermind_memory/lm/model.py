"""EvermindLM: tied-embedding language model of causal depthwise convolutions and shared-expert MoE layers.

Batched numpy forward and exact backward over right-padded batches (tokens (B, T), lengths (B,)); padded
positions never change real ones and get no gradient. Shapes: B batch, T time, C channels, V vocab,
E experts, K conv width, H expert hidden. Training loops and optimisers live in `training/`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Collection, Mapping, NamedTuple, Sequence

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.lm.layers import (
    RMS_EPS,
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
from evermind_memory.lm.attention import AttentionCache, attention_backward, attention_forward, key_mask
from evermind_memory.lm.moe import (
    SHORT_MAX_ROWS,
    MoECache,
    moe_backward,
    moe_forward,
    moe_infer,
    moe_infer_short,
    moe_inference_weights,
)

__all__ = ["LMConfig", "param_shapes", "EvermindLM", "FrozenEmbedder", "HEAD_CHUNK_ELEMENTS"]

# The training loss computes the tied head in row chunks of about this many logits (rows x V; 16 MiB in
# float32), so the (N, V) logits never exist whole. loss_and_grads(head_chunk=...) overrides it per call.
HEAD_CHUNK_ELEMENTS = 1 << 22

_NORM_EPS = 1e-12  # an all-zero pooled vector stays zero instead of dividing by zero
_EMBED_BUCKET_SEQS = 64  # at most this many sequences per embedding forward


@dataclass(frozen=True)
class LMConfig:
    """Shape of an EvermindLM; validated on construction (InvalidInput)."""

    vocab_size: int  # V: token ids are in [0, vocab_size)
    d_model: int = 64  # C: channels of the residual stream and of the tied embedding
    n_layers: int = 2  # conv + MoE blocks
    conv_kernel: int = 3  # K: causal conv width (tap k reads the input k steps back)
    hidden_dim: int = 128  # H: hidden width of every expert FFN (shared and routed)
    n_experts: int = 4  # E: routed experts per layer
    top_k: int = 2  # routed experts active per position, 1 <= top_k <= n_experts
    attn_heads: int = 0  # heads of the bidirectional attention block before pooling; 0: plain mean pooling

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InvalidInput(
                    f"LMConfig expected an int for {f.name}, got {value!r} ({type(value).__name__})."
                )
            lowest = 0 if f.name == "attn_heads" else 1
            if value < lowest:
                raise InvalidInput(f"LMConfig expected {f.name} >= {lowest}, got {f.name}={value}.")
            object.__setattr__(self, f.name, int(value))
        if self.attn_heads and self.d_model % self.attn_heads:
            raise InvalidInput(
                f"LMConfig expected d_model divisible by attn_heads, got d_model={self.d_model}, "
                f"attn_heads={self.attn_heads}."
            )
        if self.top_k > self.n_experts:
            raise InvalidInput(
                f"LMConfig expected top_k <= n_experts, got top_k={self.top_k}, n_experts={self.n_experts}. "
                "Lower top_k or add experts."
            )

    def to_dict(self) -> dict[str, int]:
        """Return the config as a plain dict (JSON-ready).

        Returns:
            {field name: int} in field order.
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LMConfig:
        """Build a config from a dict such as `to_dict()` returns.

        Args:
            d: mapping of field names to ints; vocab_size is required, the rest default.

        Returns:
            The validated LMConfig.

        Raises:
            InvalidInput: not a mapping, unknown or missing keys, wrong types or ranges.
        """
        if not isinstance(d, Mapping):
            raise InvalidInput(f"LMConfig.from_dict expected a dict, got {type(d).__name__}.")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidInput(
                f"LMConfig.from_dict got unknown keys {unknown}; expected a subset of {sorted(known)}."
            )
        if "vocab_size" not in d:
            raise InvalidInput("LMConfig.from_dict expected a 'vocab_size' key; it is missing.")
        return cls(**d)


def param_shapes(config: LMConfig) -> dict[str, tuple[int, ...]]:
    """The canonical parameter names and shapes, in canonical order.

    Args:
        config: the model shape.

    Returns:
        {name: shape}: "emb" (V, C), then per layer l: conv_norm (C,), conv (K, C), moe_norm (C,),
        router (C, E), shared.{w1 (C, H), b1 (H,), w2 (H, C), b2 (C,)} and the same for expert0..E-1.
    """
    v, c, k, h, e = config.vocab_size, config.d_model, config.conv_kernel, config.hidden_dim, config.n_experts
    shapes: dict[str, tuple[int, ...]] = {"emb": (v, c)}
    for layer in range(config.n_layers):
        p = f"layers.{layer}."
        shapes[p + "conv_norm"] = (c,)
        shapes[p + "conv"] = (k, c)
        shapes[p + "moe_norm"] = (c,)
        shapes[p + "router"] = (c, e)
        for expert in ["shared"] + [f"expert{i}" for i in range(e)]:
            shapes[p + expert + ".w1"] = (c, h)
            shapes[p + expert + ".b1"] = (h,)
            shapes[p + expert + ".w2"] = (h, c)
            shapes[p + expert + ".b2"] = (c,)
    if config.attn_heads:  # the embedder's pooling block: h += attn(norm(h)); h = norm(h); mean
        shapes["pool.attn_norm"] = (c,)
        shapes["pool.wqkv"] = (c, 3 * c)
        shapes["pool.wo"] = (c, c)
        shapes["pool.out_norm"] = (c,)
    return shapes


def _init_param(name: str, shape: tuple[int, ...], rng: np.random.Generator, d_model: int) -> np.ndarray:
    """Initial value of one parameter (draws from rng only for the random ones)."""
    leaf = name.rsplit(".", 1)[-1]
    if name == "emb" or leaf in ("router", "w2"):
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)
    if leaf == "w1":  # He init for the ReLU layer
        return rng.normal(0.0, math.sqrt(2.0 / d_model), size=shape).astype(np.float32)
    if leaf in ("conv_norm", "moe_norm", "attn_norm", "out_norm"):
        return np.ones(shape, dtype=np.float32)
    if leaf == "wqkv":
        return rng.normal(0.0, 1.0 / math.sqrt(d_model), size=shape).astype(np.float32)
    if leaf == "wo":  # small, so the untrained block starts close to a residual no-op
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)
    if leaf == "conv":  # identity pass-through: an untrained block is close to a residual no-op
        w = np.zeros(shape, dtype=np.float32)  # (K, C)
        w[0] = 1.0
        return w
    return np.zeros(shape, dtype=np.float32)  # biases


class _Batch(NamedTuple):
    tokens: np.ndarray  # (B, T) intp; padded positions replaced by 0 so lookups stay in range
    lengths: np.ndarray  # (B,) intp
    real: np.ndarray | None  # (N,) flat row ids of real positions; None when nothing is padded
    pad: np.ndarray | None  # (B*T - N,) flat row ids of padded positions; None when nothing is padded


class _LayerCache(NamedTuple):
    conv_norm: RMSNormCache
    conv: ConvCache
    moe_norm: RMSNormCache
    moe: MoECache


class ForwardCache(NamedTuple):
    """What `hidden_backward` needs from `hidden_forward` (treat as opaque)."""

    batch: _Batch
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
            name: _init_param(name, shape, rng, config.d_model) for name, shape in param_shapes(config).items()
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

    def _check_ids(self, ids: np.ndarray, where: str, locate: Any = None) -> None:
        """Raise InvalidInput unless every id is in [0, V); `locate(i)` names flat index i in the message."""
        v = self.config.vocab_size
        if ids.size == 0 or (ids.min() >= 0 and ids.max() < v):
            return
        i = int(np.argmax((ids < 0) | (ids >= v)))
        at = f"position {i}" if locate is None else locate(i)
        raise InvalidInput(
            f"{where} expected token ids in [0, {v}), got {int(ids[i])} at {at}. "
            "Check that the tokenizer's vocab_size matches LMConfig.vocab_size."
        )

    def _prepare(self, tokens: Any, lengths: Any, where: str) -> _Batch:
        """Validate a (B, T) token batch with optional lengths; neutralise padding."""
        try:
            arr = np.asarray(tokens)  # (B, T)
        except ValueError as e:  # ragged nested lists
            raise InvalidInput(
                f"{where} expected a rectangular (B, T) batch of token ids; pad the sequences and pass lengths."
            ) from e
        if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
            raise InvalidInput(f"{where} expected tokens of shape (B, T) with B, T >= 1, got shape {arr.shape}.")
        if arr.dtype.kind not in "iu":
            raise InvalidInput(f"{where} expected integer token ids, got dtype {arr.dtype}.")
        b, t = arr.shape
        if lengths is None:
            lens = np.full(b, t, dtype=np.intp)  # (B,)
        else:
            lens = np.asarray(lengths)  # (B,)
            if lens.shape != (b,) or lens.dtype.kind not in "iu":
                raise InvalidInput(
                    f"{where} expected integer lengths of shape ({b},), got shape {lens.shape} dtype {lens.dtype}."
                )
            if lens.min() < 1 or lens.max() > t:
                raise InvalidInput(
                    f"{where} expected 1 <= lengths <= T={t}, got lengths in [{lens.min()}, {lens.max()}]."
                )
            lens = lens.astype(np.intp)
        if lens.min() == t:
            self._check_ids(arr.ravel(), where, lambda i: "(batch {}, position {})".format(*divmod(i, t)))
            return _Batch(arr.astype(np.intp, copy=False), lens, None, None)
        mask = np.arange(t)[None, :] < lens[:, None]  # (B, T)
        self._check_ids(arr[mask], where, lambda i: "(batch {}, position {})".format(*np.argwhere(mask)[i]))
        clean = np.where(mask, arr, 0).astype(np.intp)  # (B, T)
        flat_mask = mask.ravel()  # (B*T,)
        return _Batch(clean, lens, np.flatnonzero(flat_mask), np.flatnonzero(~flat_mask))

    def _prepare_list(self, tokens: Any, where: str) -> np.ndarray:
        """Validate one non-empty token list; return it as (T,) intp."""
        if isinstance(tokens, (str, bytes)):
            raise InvalidInput(f"{where} expected a list of token ids, got {type(tokens).__name__}; encode text first.")
        arr = np.asarray(tokens)  # (T,)
        if arr.ndim != 1:
            raise InvalidInput(f"{where} expected a flat list of token ids, got shape {arr.shape}.")
        if arr.size == 0:
            raise InvalidInput(f"{where} expected at least one token, got an empty list.")
        if arr.dtype.kind not in "iu":
            raise InvalidInput(f"{where} expected integer token ids, got dtype {arr.dtype}.")
        self._check_ids(arr, where)
        return arr.astype(np.intp)

    # ── the trunk: embedding and layers ───────────────────────────────────────

    def _layer_params(self, layer: int) -> dict[str, np.ndarray]:
        return {local: self.params[full] for local, full in self._layer_names[layer]}

    def _layer_forward(
        self, layer: int, x: np.ndarray, batch: _Batch, keep_cache: bool
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
        self, dout: np.ndarray, batch: _Batch, cache: _LayerCache, need: frozenset[str] | None = None
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

    def _trunk_forward(self, batch: _Batch, mode: str) -> tuple[np.ndarray, ForwardCache]:
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
            batch = _Batch(context, np.array([context.shape[1]]), None, None)  # no padding
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

    def _pool_forward(self, h: np.ndarray, lengths: np.ndarray, keep_cache: bool) -> tuple[np.ndarray, Any]:
        """The embedder's pooling: [h += attn(norm(h)); h = norm(h)] when attn_heads, then mean over real positions.

        h is (B, T, C) with zeros at padded positions; returns the unnormalised (B, C) mean and a cache.
        """
        b, t, c = h.shape
        real = np.arange(t)[None, :] < lengths[:, None]  # (B, T)
        if not self.config.attn_heads:
            return h.sum(axis=1) / lengths[:, None].astype(h.dtype), (real, None)  # (B, C)
        p = self.params
        a, norm1 = rmsnorm_forward(h.reshape(b * t, c), p["pool.attn_norm"])  # (B*T, C)
        y, attn = attention_forward(a.reshape(b, t, c), p["pool.wqkv"], p["pool.wo"], lengths,
                                    self.config.attn_heads)  # (B, T, C)
        o, norm2 = rmsnorm_forward((h + y).reshape(b * t, c), p["pool.out_norm"])  # (B*T, C)
        o = o.reshape(b, t, c) * real[..., None]  # (B, T, C): padded queries never reach the mean
        pooled = o.sum(axis=1) / lengths[:, None].astype(h.dtype)  # (B, C)
        return pooled, ((real, (norm1, attn, norm2)) if keep_cache else (real, None))

    def _pool_backward(
        self, dpooled: np.ndarray, lengths: np.ndarray, cache: Any, grads: dict,
        need: frozenset[str] | None = None,
    ) -> np.ndarray:
        """Backward of `_pool_forward`: fills the pool.* grads (those in need, when given); returns dh (B, T, C)."""
        real, inner = cache
        b, t = real.shape
        c = dpooled.shape[1]
        do = (dpooled / lengths[:, None].astype(dpooled.dtype))[:, None, :] * real[..., None]  # (B, T, C)
        if not self.config.attn_heads:
            return do
        norm1, attn, norm2 = inner
        p = self.params
        found = {}
        dz, found["pool.out_norm"] = rmsnorm_backward(
            do.reshape(b * t, c), norm2, gain_grad=need is None or "pool.out_norm" in need)  # (B*T, C)
        da, found["pool.wqkv"], found["pool.wo"] = attention_backward(
            dz.reshape(b, t, c), attn, p["pool.wqkv"], p["pool.wo"], self.config.attn_heads)  # (B, T, C)
        dh, found["pool.attn_norm"] = rmsnorm_backward(
            da.reshape(b * t, c), norm1, gain_grad=need is None or "pool.attn_norm" in need)  # (B*T, C)
        grads.update({n: g for n, g in found.items() if need is None or n in need})
        return (dh + dz).reshape(b, t, c)  # residual: z = h + y

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
        pooled, pool = self._pool_forward(h, lens, keep_cache=True)
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
        dh = self._pool_backward(d, lens, pool, pool_grads, need)  # (B, T, C)
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
        return _plan_embed_one(_build_plan(self.config, self.params, fused=False), arr)

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
        plan = _build_plan(self.config, self.params, fused=False)
        return _plan_embed_many(plan, seqs, self.config.d_model)

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
        from evermind_memory.lm.checkpoint import save_model  # lazy: checkpoint imports this module

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
        from evermind_memory.lm.checkpoint import load_model  # lazy: checkpoint imports this module

        config, params = load_model(path)
        return cls.from_params(config, params)


# ── inference plan: the embedding path without caches ─────────────────────────
# `hidden_forward`/`pooled_forward` keep what a backward needs; embeddings need only outputs. The plan holds
# the weights rearranged once (norm gains folded into the following linear maps, the attention scale into
# the query columns) and the functions below run the same maths with fewer numpy calls and temporaries.
# Results equal the training path's up to float rounding.

_HAS_VECDOT = hasattr(np, "vecdot")
# Padded positions x C per embedding forward (1024 positions at C=128): the layer's arrays stay in L2, which
# measured faster than larger buckets although the matmuls get smaller.
_EMBED_BUCKET_ELEMENTS = 1 << 17


class _PoolPlan(NamedTuple):
    wqkv: np.ndarray  # (C, 3C) attn_norm gain folded into the rows, 1/sqrt(D) into the query columns
    wo: np.ndarray  # (C, C)
    out_gain: np.ndarray  # (C,) out_norm gain, applied after pooling (a per-channel scale commutes with the mean)
    heads: int


class _Plan(NamedTuple):
    emb: np.ndarray  # (V, C)
    taps: list  # per layer (K, C): conv taps * conv_norm gain, reversed (tap K-1 first) for the window view
    moe: list  # per layer MoEInference
    pool: _PoolPlan | None
    top_k: int


def _build_plan(config: LMConfig, params: Mapping[str, np.ndarray], *, fused: bool) -> _Plan:
    """Rearrange params for inference; fused=False only derives the small arrays (cheap per call)."""
    taps, moes = [], []
    for layer in range(config.n_layers):
        p = f"layers.{layer}."
        taps.append(np.ascontiguousarray((params[p + "conv"] * params[p + "conv_norm"])[::-1]))  # (K, C)
        local = {n[len(p) :]: a for n, a in params.items() if n.startswith(p)}
        moes.append(moe_inference_weights(local, params[p + "moe_norm"], fused=fused))
    pool = None
    if config.attn_heads:
        c = config.d_model
        wqkv = params["pool.attn_norm"][:, None] * params["pool.wqkv"]  # (C, 3C)
        wqkv[:, :c] *= wqkv.dtype.type(1.0 / math.sqrt(c // config.attn_heads))
        pool = _PoolPlan(wqkv, params["pool.wo"], params["pool.out_norm"], config.attn_heads)
    return _Plan(params["emb"], taps, moes, pool, config.top_k)


def _row_sumsq(x: np.ndarray) -> np.ndarray:
    """Sum of squares of each row of x (N, C): np.vecdot where numpy has it (2.0+; faster), else einsum."""
    return np.vecdot(x, x) if _HAS_VECDOT else np.einsum("nc,nc->n", x, x)  # (N,)


def _rms_scale(x: np.ndarray) -> np.ndarray:
    """1 / sqrt(mean(x^2) + eps) per row of x (N, C), as in rmsnorm_forward."""
    ms = _row_sumsq(x) / x.shape[-1]  # (N,)
    return 1.0 / np.sqrt(ms + RMS_EPS)  # (N,)


def _windows(padded: np.ndarray, k: int) -> np.ndarray:
    """(B, T, C, K) view of a (B, T+K-1, C) buffer: [b, t, :, j] is row t + j (sliding_window_view, cheaper)."""
    b, tk, c = padded.shape
    s0, s1, s2 = padded.strides
    return np.ndarray((b, tk - k + 1, c, k), padded.dtype, padded, 0, (s0, s1, s2, s1))


def _plan_hidden(plan: _Plan, tokens: np.ndarray) -> np.ndarray:
    """Final hidden states (B*T, C) of a (B, T) token batch; rows of padded positions hold finite junk.

    A single short sequence runs every expert on every row (moe_infer_short); anything else is dispatched
    by expert. Padded positions go through the layers like real ones (cheaper than gathering the real rows
    of a length-sorted bucket); nothing after them reads them.
    """
    b, t = tokens.shape
    x = np.take(plan.emb, tokens.ravel(), axis=0)  # (B*T, C)
    c = x.shape[1]
    k = plan.taps[0].shape[0]
    padded = np.zeros((b, t + k - 1, c), dtype=x.dtype)  # (B, T+K-1, C): K-1 zero rows before each sequence
    body = padded[:, k - 1 :]  # (B, T, C) where the normalised input goes
    windows = _windows(padded, k)  # (B, T, C, K): tap K-1-j multiplies [..., j] (the plan keeps taps reversed)
    short = b * t <= SHORT_MAX_ROWS and plan.moe[0].w1_aug is not None
    if short:
        xa = np.ones((b * t, c + 1), dtype=x.dtype)  # (B*T, C+1) MoE input with a ones column
    for taps, moe in zip(plan.taps, plan.moe):
        np.multiply(x.reshape(b, t, c), _rms_scale(x).reshape(b, t, 1), out=body)
        h = np.einsum("btck,kc->btc", windows, taps).reshape(b * t, c)  # (B*T, C) causal depthwise conv
        h += x
        if short:
            np.multiply(h, _rms_scale(h)[:, None], out=xa[:, :c])
            moe_infer_short(moe, xa, plan.top_k, h)
        else:
            moe_infer(moe, h * _rms_scale(h)[:, None], plan.top_k, h)
        x = h
    return x


def _plan_pool(plan: _Plan, h: np.ndarray, b: int, lengths: np.ndarray | None) -> np.ndarray:
    """Pooled (B, C) of hidden states h (B*T, C); lengths None means no padding."""
    t = h.shape[0] // b
    c = h.shape[1]
    if lengths is None:
        weights = np.full((b, t), 1.0 / t, dtype=h.dtype)  # (B, T)
    else:
        real = np.arange(t)[None, :] < lengths[:, None]  # (B, T)
        weights = (real / lengths[:, None]).astype(h.dtype)  # (B, T)
    pp = plan.pool
    if pp is None:
        return np.einsum("bt,btc->bc", weights, h.reshape(b, t, c))  # (B, C) mean over real positions
    n, d = pp.heads, c // pp.heads
    qkv = (h * _rms_scale(h)[:, None]) @ pp.wqkv  # (B*T, 3C)
    qkv = qkv.reshape(b, t, 3, n, d).transpose(2, 0, 3, 1, 4)  # (3, B, N, T, D) view
    q, k, v = np.ascontiguousarray(qkv)  # (B, N, T, D) each
    s = q @ k.transpose(0, 1, 3, 2)  # (B, N, T, T) scores, already scaled by 1/sqrt(D)
    if lengths is not None:
        s += key_mask(lengths, t, s.dtype)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    o = (s @ v).transpose(0, 2, 1, 3).reshape(b * t, c)  # (B*T, C) heads concatenated
    z = o @ pp.wo  # (B*T, C)
    z += h
    weights *= _rms_scale(z).reshape(b, t)  # out_norm's 1/rms folded into the pooling weights
    return np.einsum("bt,btc->bc", weights, z.reshape(b, t, c)) * pp.out_gain  # (B, C)


def _normalise_rows(pooled: np.ndarray) -> np.ndarray:
    """L2-normalise each row (an exactly zero row stays zero); float32."""
    norms = np.sqrt(_row_sumsq(pooled))  # (B,)
    return (pooled / np.maximum(norms, _NORM_EPS)[:, None]).astype(np.float32, copy=False)


def _plan_embed_one(plan: _Plan, seq: np.ndarray) -> np.ndarray:
    """Embedding (C,) float32 of one validated (T,) sequence."""
    h = _plan_hidden(plan, seq[None, :])  # (T, C)
    return _normalise_rows(_plan_pool(plan, h, 1, None))[0]


def _plan_embed_many(plan: _Plan, seqs: Sequence[np.ndarray], d_model: int) -> np.ndarray:
    """Embeddings (N, C) float32 of validated sequences, run in length-sorted buckets of similar length."""
    out = np.zeros((len(seqs), d_model), dtype=np.float32)  # (N, C)
    if not seqs:
        return out
    lens = np.array([s.size for s in seqs], dtype=np.intp)  # (N,)
    order = np.argsort(lens, kind="stable").tolist()  # short to long, so a bucket pads little
    max_rows = max(1, _EMBED_BUCKET_ELEMENTS // d_model)
    start = 0
    while start < len(order):
        stop = start + 1
        while (
            stop < len(order)
            and stop - start < _EMBED_BUCKET_SEQS
            and (stop - start + 1) * lens[order[stop]] <= max_rows
        ):
            stop += 1
        ids = order[start:stop]
        sub_lens = lens[ids]  # (b,)
        t = int(sub_lens[-1])
        if len(ids) == 1:
            out[ids[0]] = _plan_embed_one(plan, seqs[ids[0]])
            start = stop
            continue
        tokens = np.zeros((len(ids), t), dtype=np.intp)  # (b, t) padding is token 0: finite junk, never read
        for row, i in enumerate(ids):
            tokens[row, : sub_lens[row]] = seqs[i]
        h = _plan_hidden(plan, tokens)  # (b*t, C)
        padded = None if sub_lens[0] == t else sub_lens
        out[ids] = _normalise_rows(_plan_pool(plan, h, len(ids), padded))
        start = stop
    return out


class FrozenEmbedder:
    """A snapshot of an EvermindLM's embedding function, with its weights arranged once for speed.

    Made by `EvermindLM.frozen()`. It copies the weights, so later changes to the model do not reach it
    (an embedder's fingerprint names the weights it was made with). Thread-safe: it is only read.
    """

    def __init__(self, model: EvermindLM) -> None:
        params = {name: np.array(p, copy=True) for name, p in model.params.items()}
        self.config = model.config
        self._check = model._prepare_list
        self._plan = _build_plan(model.config, params, fused=True)

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """Same as `EvermindLM.embed` with the weights of the snapshot.

        Args:
            tokens: non-empty list of token ids.

        Returns:
            (C,) float32 vector of norm 1 (or zero if the pooled state is exactly zero).

        Raises:
            InvalidInput: empty list or ids out of range.
        """
        return _plan_embed_one(self._plan, self._check(tokens, "embed()"))

    def embed_batch(self, token_lists: Sequence[Sequence[int]]) -> np.ndarray:
        """Same as `EvermindLM.embed_batch` with the weights of the snapshot.

        Args:
            token_lists: sequence of non-empty token-id lists.

        Returns:
            (N, C) float32, row i the embedding of token_lists[i]; (0, C) for an empty input.

        Raises:
            InvalidInput: an empty list or ids out of range (the message names the index).
        """
        seqs = [self._check(tokens, f"embed_batch() item {i}") for i, tokens in enumerate(token_lists)]
        return _plan_embed_many(self._plan, seqs, self.config.d_model)
