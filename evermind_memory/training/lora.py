"""LoRA and QLoRA, training side: low-rank adapters fitted over a frozen (optionally quantised) EvermindLM.

W_eff = W + (alpha / R) * B @ A on each target weight W (rows, cols), with B (rows, R) zero-initialised
and A (R, cols) Gaussian. Only A and B train. The adapter file, applying and merging for inference live
in lm/adapter.py; this module computes the exact adapter gradients and drives LMTrainer over them.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import CheckpointError, InvalidInput
from .trainer import LMTrainer, TrainConfig, TrainHistory

BASE_QUANTS = ("none", "fp16", "int8")
DEFAULT_LORA_CONFIG = TrainConfig(lr=5e-3, weight_decay=0.0)  # adapters start at zero: no decay, a brisk lr


def lora_delta(A: np.ndarray, B: np.ndarray, scale: float) -> np.ndarray:
    """The weight update scale * B @ A.

    Args:
        A: (R, cols).
        B: (rows, R).
        scale: alpha / R.

    Returns:
        (rows, cols) array in the dtype of A and B.
    """
    return (B @ A) * np.asarray(scale, dtype=A.dtype)  # (rows, cols)


def lora_grads(G: np.ndarray, A: np.ndarray, B: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact gradients of a loss w.r.t. A and B, given G = dL/dW_eff.

    From W_eff = W + s * B @ A:  dL/dA = s * B^T @ G,  dL/dB = s * G @ A^T.

    Args:
        G: (rows, cols) gradient of the loss w.r.t. the effective weight.
        A: (R, cols).
        B: (rows, R).
        scale: s = alpha / R.

    Returns:
        (gA (R, cols), gB (rows, R)).
    """
    s = np.asarray(scale, dtype=G.dtype)
    gA = (B.T @ G) * s  # (R, cols)
    gB = (G @ A.T) * s  # (rows, R)
    return gA, gB


def quantize_int8_rows(W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantisation with one scale per row (finer than one scale per matrix).

    Args:
        W: (rows, cols) float array.

    Returns:
        (q (rows, cols) int8 in [-127, 127], scales (rows,) float32); W ~= q * scales[:, None].
    """
    absmax = np.abs(W).max(axis=1)  # (rows,)
    scales = np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)  # (rows,) an all-zero row keeps scale 1
    q = np.clip(np.rint(W / scales[:, None]), -127, 127).astype(np.int8)  # (rows, cols)
    return q, scales


def dequantize_int8_rows(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Inverse of `quantize_int8_rows`: (rows, cols) float32."""
    return q.astype(np.float32) * scales[:, None]  # (rows, cols)


class LoRAAdapter:
    """A low-rank adapter over one (rows, cols) weight: delta = (alpha / rank) * B @ A."""

    def __init__(self, rows: int, cols: int, rank: int = 8, alpha: float = 16.0, seed: int | Sequence[int] = 0,
                 *, dtype: Any = np.float32) -> None:
        """B (rows, R) zeros, so the adapted weight starts equal to the base; A (R, cols) ~ N(0, 1/cols).

        Args:
            rows: rows of the adapted weight.
            cols: columns of the adapted weight.
            rank: R, 1 <= R <= min(rows, cols).
            alpha: scale numerator (finite, > 0).
            seed: seed (or seed sequence) of A's initialisation.
            dtype: float32 for training, float64 for gradient checks.

        Raises:
            InvalidInput: a size or rank out of range, or alpha not a positive finite number.
        """
        for name, value in (("rows", rows), ("cols", cols), ("rank", rank)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise InvalidInput(f"LoRAAdapter expected {name} an int >= 1, got {value!r}.")
        if rank > min(rows, cols):
            raise InvalidInput(f"LoRAAdapter expected rank <= min(rows, cols) = {min(rows, cols)}, got {rank}.")
        if not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
            raise InvalidInput(f"LoRAAdapter expected alpha a finite number > 0, got {alpha!r}.")
        self.rows, self.cols, self.rank, self.alpha = int(rows), int(cols), int(rank), float(alpha)
        rng = np.random.default_rng(seed)
        self.A = (rng.standard_normal((self.rank, self.cols)) / math.sqrt(self.cols)).astype(dtype)  # (R, cols)
        self.B = np.zeros((self.rows, self.rank), dtype=dtype)  # (rows, R)

    @property
    def scale(self) -> float:
        """alpha / rank."""
        return self.alpha / self.rank

    def num_params(self) -> int:
        """Trainable values: R * (rows + cols)."""
        return self.A.size + self.B.size

    def delta(self) -> np.ndarray:
        """(rows, cols) weight update scale * B @ A."""
        return lora_delta(self.A, self.B, self.scale)

    def apply(self, W: np.ndarray) -> np.ndarray:
        """W + delta as a new array (W is not modified).

        Raises:
            InvalidInput: W is not (rows, cols).
        """
        if np.shape(W) != (self.rows, self.cols):
            raise InvalidInput(f"LoRAAdapter.apply expected a weight of shape {(self.rows, self.cols)}, got "
                               f"{np.shape(W)}.")
        return W + self.delta()  # (rows, cols)

    def project_grad(self, G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(gA, gB) from G = dL/dW_eff; see `lora_grads`.

        Raises:
            InvalidInput: G is not (rows, cols).
        """
        if np.shape(G) != (self.rows, self.cols):
            raise InvalidInput(f"LoRAAdapter.project_grad expected G of shape {(self.rows, self.cols)}, got "
                               f"{np.shape(G)}.")
        return lora_grads(G, self.A, self.B, self.scale)


@dataclass(frozen=True)
class LoRAFootprint:
    """Memory cost of a LoRA/QLoRA setup."""

    adapter_bytes: int  # A and B of every target, float32
    base_bytes: int  # the frozen base as held (quantised under QLoRA, with its scales)
    trainable_params: int  # values in A and B
    base_params: int  # values in the frozen base model


class _FrozenBase:
    """The base model's weights, read-only, as float32, float16 or int8 with per-row scales (2-D only)."""

    def __init__(self, params: Mapping[str, np.ndarray], quant: str) -> None:
        self.quant = quant
        self.shapes = {n: tuple(p.shape) for n, p in params.items()}
        self.store: dict[str, tuple[np.ndarray, ...]] = {}
        for name, p in params.items():
            p = np.asarray(p, dtype=np.float32)
            if quant == "int8" and p.ndim == 2:
                held: tuple[np.ndarray, ...] = quantize_int8_rows(p)
            elif quant == "fp16" and p.ndim == 2:
                with np.errstate(over="ignore"):
                    held = (p.astype(np.float16),)  # (rows, cols)
            else:  # fp32 (and every 1-D gain/bias: tiny, kept exact)
                held = (p.copy(),)
            for arr in held:
                arr.setflags(write=False)  # the base is frozen: any write is a bug, so make it raise
            self.store[name] = held

    def nbytes(self) -> int:
        return sum(a.nbytes for held in self.store.values() for a in held)

    def num_params(self) -> int:
        return sum(int(np.prod(s)) for s in self.shapes.values())

    def weight(self, name: str) -> np.ndarray:
        """The float32 weight used in the forward (dequantised under QLoRA; read-only when not)."""
        held = self.store[name]
        if len(held) == 2:
            return dequantize_int8_rows(*held)  # (rows, cols)
        if held[0].dtype == np.float16:
            return held[0].astype(np.float32)  # (rows, cols)
        return held[0]


class LoRAModel:
    """An EvermindLM with a frozen base and trainable low-rank adapters on chosen 2-D weights.

    `params` holds only the adapter tensors ("<target>.A", "<target>.B"), so LMTrainer trains exactly
    those. The user's model is copied (quantised under QLoRA) at construction and never mutated.
    Not thread-safe.
    """

    def __init__(self, model: Any, *, targets: Sequence[str] = ("emb",), rank: int = 8, alpha: float = 16.0,
                 base_quant: str = "none", seed: int = 0) -> None:
        """Freeze `model` and attach zero-initialised adapters.

        Args:
            model: the base EvermindLM (read, never written).
            targets: 2-D parameter names to adapt: "emb" (the tied embedding, default), any
                "layers.{l}.shared.w1/.w2", "layers.{l}.expert{e}.w1/.w2" or "layers.{l}.router".
            rank: adapter rank R.
            alpha: adapter scale numerator; the update is (alpha / R) * B @ A.
            base_quant: "none" keeps the base in float32; "fp16" or "int8" (per-row scales) hold every
                2-D base weight quantised and dequantise it for each forward (QLoRA).
            seed: seed of the A initialisation.

        Raises:
            InvalidInput: model is not an EvermindLM, a target is unknown or not 2-D, rank or
                base_quant is invalid.
        """
        if not hasattr(model, "params") or not hasattr(model, "config") or not hasattr(type(model), "from_params"):
            raise InvalidInput(f"LoRAModel expected an EvermindLM, got {type(model).__name__}.")
        if base_quant not in BASE_QUANTS:
            raise InvalidInput(f"LoRAModel expected base_quant in {BASE_QUANTS}, got {base_quant!r}.")
        targets = (targets,) if isinstance(targets, str) else tuple(targets)
        if not targets or len(set(targets)) != len(targets):
            raise InvalidInput(f"LoRAModel expected one or more distinct target names, got {list(targets)}.")
        for t in targets:
            if t not in model.params or np.ndim(model.params[t]) != 2:
                two_d = [n for n, p in model.params.items() if np.ndim(p) == 2]
                raise InvalidInput(
                    f"LoRAModel target {t!r} is not a 2-D weight of the model; choose from e.g. {two_d[:6]}."
                )
        self.config = model.config
        self.base_quant = base_quant
        self.rank, self.alpha = int(rank), float(alpha)
        self.targets = targets
        self._model_cls = type(model)
        self._base = _FrozenBase(model.params, base_quant)
        self.params: dict[str, np.ndarray] = {}
        self._set_adapters({
            t: LoRAAdapter(*self._base.shapes[t], rank=rank, alpha=alpha, seed=[seed, i])
            for i, t in enumerate(targets)
        })
        self.trainer: LMTrainer | None = None
        self._work: Any = None  # private model over the effective weights (see _effective_model)
        self._work_key: bytes | None = None

    def _set_adapters(self, adapters: Mapping[str, LoRAAdapter]) -> None:
        self.params.clear()  # keep the dict object: a trainer holds it
        for t, ad in adapters.items():
            self.params[f"{t}.A"] = ad.A
            self.params[f"{t}.B"] = ad.B

    @property
    def scale(self) -> float:
        """alpha / rank."""
        return self.alpha / self.rank

    # ----------------------------------------------------------------------------- effective weights

    def effective_params(self) -> dict[str, np.ndarray]:
        """The weights the adapted model runs with: dequantised base, plus the adapter on each target.

        Returns:
            name -> float32 array (new arrays for targets and quantised weights).
        """
        out = {name: self._base.weight(name) for name in self._base.shapes}
        for t in self.targets:
            A, B = self.params[f"{t}.A"], self.params[f"{t}.B"]
            out[t] = out[t] + lora_delta(A, B, self.scale)  # (rows, cols)
        return out

    def _effective_model(self) -> Any:
        """A private EvermindLM whose params dict holds the current effective weights (no extra copy).

        The model reads `params` at call time, so swapping the dict's entries re-targets it. Rebuilt
        only when the adapter tensors changed since the last call.
        """
        h = hashlib.blake2b(digest_size=16)
        for name in sorted(self.params):
            h.update(name.encode())
            h.update(np.ascontiguousarray(self.params[name]).tobytes())
        key = h.digest()
        if self._work is None:
            self._work = self._model_cls.from_params(self.config, self.effective_params())
        elif self._work_key != key:
            self._work.params.update(self.effective_params())
        self._work_key = key
        return self._work

    def _release(self) -> None:
        """Under QLoRA, drop the dequantised float32 weights between training steps (the base stays int8/fp16)."""
        if self.base_quant != "none" and self._work is not None:
            self._work.params.clear()  # refilled, in the same order, by the next _effective_model
            self._work_key = None

    def merge(self) -> Any:
        """A standalone EvermindLM with the adapter baked into the (dequantised) base weights."""
        return self._model_cls.from_params(self.config, self.effective_params())

    # ------------------------------------------------------------------------------- model interface

    def loss_and_grads(self, tokens: np.ndarray, lengths: np.ndarray | None = None, *,
                       checkpoint: bool = False) -> tuple[float, dict[str, np.ndarray]]:
        """Mean next-token loss of the adapted model and its gradients w.r.t. the adapter tensors.

        Args:
            tokens: (B, T) token ids.
            lengths: (B,) real lengths, or None for all T.
            checkpoint: activation checkpointing in the base model's backward.

        Returns:
            (loss, {"<target>.A": (R, cols), "<target>.B": (rows, R)}).
        """
        try:
            # Only the targets' weight gradients: frozen weights cost no dW matmuls, and layers below the
            # lowest target are not back-propagated.
            loss, grads = self._effective_model().loss_and_grads(tokens, lengths, checkpoint=checkpoint,
                                                                 grads_for=self.targets)
        finally:
            self._release()
        out: dict[str, np.ndarray] = {}
        for t in self.targets:
            gA, gB = lora_grads(grads[t], self.params[f"{t}.A"], self.params[f"{t}.B"], self.scale)
            out[f"{t}.A"], out[f"{t}.B"] = gA, gB
        return loss, out

    def forward(self, tokens: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
        """(B, T, V) logits of the adapted model."""
        return self._effective_model().forward(tokens, lengths)

    def generate(self, prompt: Sequence[int], max_new_tokens: int, **kwargs: Any) -> list[int]:
        """New token ids from the adapted model (same arguments as EvermindLM.generate)."""
        return self._effective_model().generate(prompt, max_new_tokens, **kwargs)

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """(C,) L2-normalised embedding from the adapted model."""
        return self._effective_model().embed(tokens)

    def embed_batch(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """(N, C) embeddings from the adapted model."""
        return self._effective_model().embed_batch(batch)

    # ------------------------------------------------------------------------------------- training

    def fit(self, data: Sequence[Sequence[int]], *, config: TrainConfig | None = None,
            eval_data: Sequence[Sequence[int]] | None = None, steps: int | None = None,
            epochs: int | None = None) -> TrainHistory:
        """Train the adapter only (the base stays frozen); repeated calls continue the same optimizer.

        Args:
            data: token-id lists.
            config: training settings (default DEFAULT_LORA_CONFIG; a new config starts a new optimizer).
            eval_data: held-out token-id lists.
            steps: optimizer steps to run.
            epochs: passes over data (when steps is None; default one).

        Returns:
            The training history.

        Raises:
            InvalidInput: bad data or settings.
        """
        config = DEFAULT_LORA_CONFIG if config is None else config
        if self.trainer is None or self.trainer.config != config:
            self.trainer = LMTrainer(self, config)
        return self.trainer.fit(data, eval_data=eval_data, steps=steps, epochs=epochs)

    def training_meta(self) -> dict[str, Any]:
        """JSON-able description stored in training checkpoints."""
        return {"targets": list(self.targets), "rank": self.rank, "alpha": self.alpha, "base_quant": self.base_quant}

    # -------------------------------------------------------------------------------- adapter files

    def weights(self, *, base_fingerprint: str | None = None) -> Any:
        """The adapter as lm.adapter.LoRAWeights (copies of A and B)."""
        from ..lm.adapter import LoRAWeights

        tensors = {t: (self.params[f"{t}.A"].copy(), self.params[f"{t}.B"].copy()) for t in self.targets}
        return LoRAWeights(rank=self.rank, alpha=self.alpha, tensors=tensors, base_fingerprint=base_fingerprint)

    def save_adapter(self, path: str | os.PathLike[str], *, fp16: bool = False,
                     base_fingerprint: str | None = None) -> None:
        """Write the adapter file (lm.adapter format: magic, version, shapes, CRC), atomically.

        Args:
            path: destination.
            fp16: store A and B as float16.
            base_fingerprint: optional identity of the base model, stored in the file.

        Raises:
            OSError: the file system refused the write.
        """
        from ..lm.adapter import save_adapter

        save_adapter(path, self.weights(base_fingerprint=base_fingerprint), fp16=fp16)

    def load_adapter(self, path: str | os.PathLike[str]) -> None:
        """Replace this model's adapter (targets, rank, alpha, A, B) with the one in `path`.

        A trainer built before this call keeps the old optimizer state; call fit with a new config or
        build a new LMTrainer.

        Raises:
            CheckpointError: the file is corrupt, of another format, or does not fit this base model.
        """
        from ..lm.adapter import load_adapter

        w = load_adapter(path)
        for t, (a, b) in w.tensors.items():
            want = self._base.shapes.get(t)
            if want is None or len(want) != 2 or (b.shape[0], a.shape[1]) != want:
                raise CheckpointError(
                    f"{os.fspath(path)}: adapter for {t!r} needs a weight of shape {(b.shape[0], a.shape[1])}; "
                    f"this base has {want}. The adapter was fitted on another model."
                )
        self.rank, self.alpha, self.targets = int(w.rank), float(w.alpha), tuple(w.tensors)
        adapters = {}
        for t, (a, b) in w.tensors.items():
            ad = LoRAAdapter(*self._base.shapes[t], rank=self.rank, alpha=self.alpha)
            ad.A[...] = a
            ad.B[...] = b
            adapters[t] = ad
        self._set_adapters(adapters)
        self._work_key = None
        self.trainer = None

    @classmethod
    def from_adapter(cls, model: Any, path: str | os.PathLike[str], *, base_quant: str = "none") -> "LoRAModel":
        """A LoRAModel over `model` carrying the adapter stored at `path`.

        Raises:
            CheckpointError: the file is corrupt or does not fit the model.
            InvalidInput: model or base_quant is invalid.
        """
        from ..lm.adapter import load_adapter

        w = load_adapter(path, model=model)
        lora = cls(model, targets=tuple(w.tensors), rank=int(w.rank), alpha=float(w.alpha), base_quant=base_quant)
        lora.load_adapter(path)
        return lora

    def footprint(self) -> LoRAFootprint:
        """Adapter bytes and parameters beside the frozen base's."""
        trainable = sum(p.size for p in self.params.values())
        return LoRAFootprint(
            adapter_bytes=4 * trainable,
            base_bytes=self._base.nbytes(),
            trainable_params=trainable,
            base_params=self._base.num_params(),
        )


__all__ = [
    "BASE_QUANTS",
    "DEFAULT_LORA_CONFIG",
    "lora_delta",
    "lora_grads",
    "quantize_int8_rows",
    "dequantize_int8_rows",
    "LoRAAdapter",
    "LoRAFootprint",
    "LoRAModel",
]
