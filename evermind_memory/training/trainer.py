"""LMTrainer: next-token training of an EvermindLM (or a LoRAModel) with AdamW over numpy.

Length-bucketed padded batches, token-weighted gradient accumulation, activation checkpointing, mixed
precision with a dynamic loss scale, a sharded optimizer, held-out evaluation, and training checkpoints
that a later run resumes to the same result. Runs in the calling thread; not thread-safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..errors import CheckpointError, InvalidInput
from .mixed_precision import DynamicLossScaler, has_overflow, round_fp16, round_fp16_
from .optim import AdamW, LRSchedule, ShardSpec, clip_factor, grad_norm

TRAIN_MAGIC = b"\x89EVTRN\r\n"
TRAIN_KIND = "evermind-train 1"
_BUCKET_BATCHES = 32  # sequences are sorted by length within windows of this many batches


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run (all keyword arguments have working defaults)."""

    lr: float = 3e-3  # peak learning rate
    weight_decay: float = 0.01  # decoupled AdamW decay on 2-D weights (norm gains and biases are exempt)
    betas: tuple[float, float] = (0.9, 0.999)  # Adam moment decays
    eps: float = 1e-8  # Adam denominator epsilon
    batch_size: int = 16  # sequences per micro-batch
    accum_steps: int = 1  # micro-batches per optimizer step, averaged by token count
    max_len: int = 128  # longer sequences are cut into windows of this many tokens (1 token overlap)
    checkpoint: bool = False  # activation checkpointing: recompute each layer in backward
    mixed_precision: bool = False  # fp16-rounded weights and gradients over fp32 master weights
    init_loss_scale: float = 2.0**15  # dynamic loss scale at the start (mixed precision only)
    scale_growth_interval: int = 200  # clean steps before the loss scale doubles
    shards: int = 1  # optimizer-state shards (each owns 1/shards of the moments); same result as 1
    clip: float = 1.0  # max global gradient norm; 0 disables clipping
    max_delta: float = 0.0  # trust region per element and step; 0 disables
    warmup: int = 0  # optimizer steps of linear LR warm-up
    total_steps: int | None = None  # cosine horizon; None: the end of each fit() call (set it to resume)
    min_lr: float = 0.0  # floor of the cosine schedule
    seed: int = 0  # data order; the same seed and data give the same run
    eval_every: int = 0  # evaluate every this many steps (0: only at the end of fit)
    progress: bool | None = None  # progress bar; None: only when stderr is a terminal

    def __post_init__(self) -> None:
        problems = []
        if not (self.lr >= 0 and math.isfinite(self.lr)):
            problems.append(f"lr >= 0 (got {self.lr})")
        if not self.weight_decay >= 0:
            problems.append(f"weight_decay >= 0 (got {self.weight_decay})")
        for name in ("batch_size", "accum_steps", "shards"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} an int >= 1 (got {value!r})")
        if not isinstance(self.max_len, int) or self.max_len < 2:
            problems.append(f"max_len an int >= 2 (got {self.max_len!r})")
        for name in ("warmup", "eval_every", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append(f"{name} an int >= 0 (got {value!r})")
        if self.total_steps is not None and (not isinstance(self.total_steps, int) or self.total_steps < 1):
            problems.append(f"total_steps None or an int >= 1 (got {self.total_steps!r})")
        if not (self.clip >= 0 and self.max_delta >= 0 and self.min_lr >= 0):
            problems.append(f"clip, max_delta, min_lr >= 0 (got {self.clip}, {self.max_delta}, {self.min_lr})")
        if not (self.init_loss_scale >= 1 and self.scale_growth_interval >= 1):
            problems.append("init_loss_scale >= 1 and scale_growth_interval >= 1")
        if problems:
            raise InvalidInput("TrainConfig expected " + "; ".join(problems) + ".")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrainConfig":
        """Inverse of `to_dict`.

        Raises:
            InvalidInput: unknown keys or invalid values.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise InvalidInput(f"TrainConfig.from_dict got unknown keys {sorted(unknown)}.")
        kw = dict(d)
        if "betas" in kw:
            kw["betas"] = tuple(kw["betas"])
        return cls(**kw)


@dataclass
class TrainHistory:
    """What a run did: one entry per optimizer step (skipped overflow steps included)."""

    losses: list[float] = field(default_factory=list)  # token-weighted mean training loss of each step
    lrs: list[float] = field(default_factory=list)  # learning rate of each step
    grad_norms: list[float] = field(default_factory=list)  # global gradient norm before clipping
    eval_losses: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out loss)
    skipped: int = 0  # steps dropped for a non-finite gradient (fp16 overflow)
    tokens: int = 0  # predicted tokens trained on


class _Data:
    """Token sequences packed into one flat array, cut to max_len windows; builds padded batches."""

    def __init__(self, data: Sequence[Sequence[int]], vocab_size: int, max_len: int, what: str) -> None:
        if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
            raise InvalidInput(f"{what} expected a list of token-id lists, got {type(data).__name__}.")
        pieces: list[np.ndarray] = []
        for i, seq in enumerate(data):
            try:
                arr = np.asarray(seq, dtype=np.int64)  # (L,)
            except (TypeError, ValueError, OverflowError) as e:
                raise InvalidInput(f"{what}[{i}] expected a list of ints, got {type(seq).__name__}.") from e
            if arr.ndim != 1 or (arr.size and (arr.min() < 0 or arr.max() >= vocab_size)):
                raise InvalidInput(
                    f"{what}[{i}] expected token ids in [0, {vocab_size}) in a flat list; "
                    f"got shape {arr.shape}, range [{arr.min() if arr.size else '-'}, "
                    f"{arr.max() if arr.size else '-'}]."
                )
            # Windows overlap by one token so every next-token target of the sequence is trained once.
            for start in range(0, max(arr.size - 1, 0), max_len - 1):
                pieces.append(arr[start:start + max_len])
        pieces = [p for p in pieces if p.size >= 2]
        self.lengths = np.array([p.size for p in pieces], dtype=np.int64)  # (N,)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)  # (N,)
        self.flat = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)  # (sum L,)
        h = hashlib.sha256()
        h.update(self.lengths.astype("<i8").tobytes())
        h.update(self.flat.astype("<i8").tobytes())
        self.digest = h.hexdigest()

    def __len__(self) -> int:
        return int(self.lengths.size)

    def batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Padded (B, T) tokens, (B,) lengths and the number of predicted positions."""
        lengths = self.lengths[idx]  # (B,)
        T = int(lengths.max())
        pos = np.arange(T)  # (T,)
        real = pos[None, :] < lengths[:, None]  # (B, T)
        src = self.offsets[idx][:, None] + np.minimum(pos[None, :], lengths[:, None] - 1)  # (B, T)
        tokens = np.where(real, self.flat[src], 0)  # (B, T) pad id 0; padded positions are masked
        return tokens, lengths, int((lengths - 1).sum())

    def plan(self, epoch: int, seed: int, batch_size: int) -> list[np.ndarray]:
        """The batches of one epoch: shuffled, length-bucketed, in a shuffled order; depends on (seed, epoch)."""
        rng = np.random.default_rng([seed, epoch])
        perm = rng.permutation(len(self))  # (N,)
        window = batch_size * _BUCKET_BATCHES
        batches: list[np.ndarray] = []
        for start in range(0, perm.size, window):
            chunk = perm[start:start + window]  # (<= window,)
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches.extend(chunk[i:i + batch_size] for i in range(0, chunk.size, batch_size))
        order = rng.permutation(len(batches))
        return [batches[i] for i in order]


def _is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class LMTrainer:
    """Trains `model` (an EvermindLM, or a LoRAModel whose params are its adapter) on token sequences.

    The model is trained in place: `model.params` are the fp32 master weights. Not thread-safe.
    """

    def __init__(self, model: Any, config: TrainConfig | None = None, *, engine: Any = None) -> None:
        """Set up optimizer(s), loss scaler and progress counters.

        Args:
            model: anything with `params` (dict of float32 arrays), `config.vocab_size`,
                `loss_and_grads(tokens, lengths, *, checkpoint)` and `forward(tokens, lengths)`:
                EvermindLM, or training.lora.LoRAModel.
            config: training settings (default TrainConfig()).
            engine: None to step in numpy here, or a step engine's constructor, called as
                engine(model, config, optimizers); e.g. gpu.trainer.GpuTrainer (weights, gradients and moments
                stay on the device and are copied back into model.params after fit, before evaluation and
                checkpoint saves). The engine's object provides trainer_step(trainer, batches, lr) -> loss,
                pull() and push(). The trainer never imports an engine itself, so it does not depend on gpu/.

        Raises:
            InvalidInput: the model lacks what training needs, config is not a TrainConfig, or engine is not
                callable. An engine may raise its own errors (GpuUnavailable: no GPU adapter).
        """
        if engine is not None and not callable(engine):
            raise InvalidInput(
                f"LMTrainer expected engine=None or a step engine's constructor such as GpuTrainer, got {engine!r}."
            )
        config = TrainConfig() if config is None else config
        if not isinstance(config, TrainConfig):
            raise InvalidInput(f"LMTrainer expected a TrainConfig, got {type(config).__name__}.")
        for attr in ("params", "config", "loss_and_grads", "forward"):
            if not hasattr(model, attr):
                raise InvalidInput(
                    f"LMTrainer expected an EvermindLM or LoRAModel (with .{attr}), got {type(model).__name__}."
                )
        self.model = model
        self.config = config
        params: dict[str, np.ndarray] = model.params
        no_decay = [n for n, p in params.items() if p.ndim < 2]
        self.optimizers = [
            AdamW(params, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay,
                  no_decay=no_decay, max_delta=config.max_delta,
                  shard=ShardSpec(i, config.shards) if config.shards > 1 else None)
            for i in range(config.shards)
        ]
        self.scaler = (
            DynamicLossScaler(init_scale=config.init_loss_scale, growth_interval=config.scale_growth_interval,
                              max_scale=max(2.0**24, config.init_loss_scale))
            if config.mixed_precision else None
        )
        self.step = 0  # optimizer steps taken (applied or skipped)
        self.epoch = 0  # current pass over the data
        self.cursor = 0  # next batch of the current epoch
        self.horizon: int | None = config.total_steps  # cosine horizon of the current fit()
        self.data_digest: str | None = None  # digest of the data the cursor points into
        self.history = TrainHistory()
        self._engine = None if engine is None else engine(model, config, self.optimizers)

    # ----------------------------------------------------------------------------------------- training

    def fit(
        self,
        data: Sequence[Sequence[int]],
        *,
        eval_data: Sequence[Sequence[int]] | None = None,
        steps: int | None = None,
        epochs: int | None = None,
    ) -> TrainHistory:
        """Train for `steps` optimizer steps or `epochs` passes (default: one pass) over `data`.

        Continues where the trainer stands (after a previous fit or a loaded training checkpoint).

        Args:
            data: token-id lists; sequences shorter than 2 tokens are ignored, longer than max_len cut.
            eval_data: held-out token-id lists; their loss is recorded every eval_every steps and at the end.
            steps: optimizer steps to run in this call.
            epochs: passes over data to run in this call (ignored when steps is given).

        Returns:
            The trainer's history (all calls so far).

        Raises:
            InvalidInput: bad data, bad counts, or data other than the one a resumed checkpoint was in.
        """
        cfg = self.config
        vocab = int(self.model.config.vocab_size)
        train = _Data(data, vocab, cfg.max_len, "fit(data)")
        held = _Data(eval_data, vocab, cfg.max_len, "fit(eval_data)") if eval_data is not None else None
        if len(train) == 0:
            raise InvalidInput("fit(data) expected at least one sequence of 2 or more tokens, got none.")
        for name, value in (("steps", steps), ("epochs", epochs)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise InvalidInput(f"fit() expected {name} None or an int >= 1, got {value!r}.")
        if self.cursor > 0 and self.data_digest not in (None, train.digest):
            raise InvalidInput(
                "fit() was given other data than the run it resumes (which stopped mid-epoch); "
                "pass the same data to continue it, or start a new LMTrainer."
            )
        self.data_digest = train.digest
        n_batches = -(-len(train) // cfg.batch_size)
        per_epoch = -(-n_batches // cfg.accum_steps)
        planned = steps if steps is not None else (epochs or 1) * per_epoch
        # Without total_steps each call runs its own cosine to its last step. A run meant to be resumed
        # sets total_steps, so the schedule does not depend on where it was interrupted.
        self.horizon = cfg.total_steps if cfg.total_steps is not None else self.step + planned
        schedule = LRSchedule(cfg.lr, cfg.warmup, self.horizon, cfg.min_lr)
        show = _is_tty() if cfg.progress is None else cfg.progress
        bar = self._progress(planned, show)
        plan = train.plan(self.epoch, cfg.seed, cfg.batch_size)
        try:
            for _ in range(planned):
                if self.cursor >= len(plan):
                    self.epoch += 1
                    self.cursor = 0
                    plan = train.plan(self.epoch, cfg.seed, cfg.batch_size)
                window = plan[self.cursor:self.cursor + cfg.accum_steps]
                self.cursor += len(window)
                loss = self._train_step([train.batch(idx) for idx in window], schedule(self.step))
                self.step += 1
                if held is not None and cfg.eval_every and self.step % cfg.eval_every == 0:
                    self.history.eval_losses.append((self.step, self._eval_loss(held)))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.4f}")
        finally:
            if bar is not None:
                bar.close()
            if self._engine is not None:
                self._engine.pull()
        if held is not None and not (self.history.eval_losses and self.history.eval_losses[-1][0] == self.step):
            self.history.eval_losses.append((self.step, self._eval_loss(held)))
        return self.history

    def evaluate(self, data: Sequence[Sequence[int]]) -> float:
        """Mean next-token loss over `data` (token-weighted), forward only.

        Raises:
            InvalidInput: bad data or no sequence of 2+ tokens.
        """
        held = _Data(data, int(self.model.config.vocab_size), self.config.max_len, "evaluate(data)")
        if len(held) == 0:
            raise InvalidInput("evaluate(data) expected at least one sequence of 2 or more tokens, got none.")
        return self._eval_loss(held)

    def optimizer_state_bytes(self) -> list[int]:
        """Bytes of AdamW moments held by each optimizer shard."""
        return [opt.state_bytes() for opt in self.optimizers]

    def _progress(self, total: int, show: bool) -> Any:
        if not show:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc="train", unit="step", file=sys.stderr, leave=False)

    @contextlib.contextmanager
    def _compute_weights(self) -> Iterator[None]:
        """Under mixed precision, the forward/backward see fp16-rounded copies of the fp32 master weights."""
        if self.scaler is None:
            yield
            return
        params = self.model.params
        master = dict(params)
        try:
            for n, p in master.items():
                params[n] = round_fp16(p, flush_subnormals=False)  # (same as param)
            yield
        finally:
            params.update(master)

    def _train_step(self, batches: list[tuple[np.ndarray, np.ndarray, int]], lr: float) -> float:
        """Accumulate the window's gradients, then one (possibly skipped) optimizer step; returns the loss."""
        if self._engine is not None:
            return self._engine.trainer_step(self, batches, lr)
        scale = self.scaler.scale if self.scaler is not None else 1.0  # fixed for the whole window
        total = sum(n for _, _, n in batches)
        single = len(batches) == 1
        acc: dict[str, np.ndarray] = {}
        loss_sum = 0.0
        # fp16 overflow makes inf (and inf - inf = nan): expected, detected below, so no warnings.
        with self._compute_weights(), np.errstate(over="ignore", invalid="ignore"):
            for tokens, lengths, n_pred in batches:
                loss, grads = self.model.loss_and_grads(tokens, lengths, checkpoint=self.config.checkpoint)
                loss_sum += float(loss) * n_pred
                # Token weights make N micro-batches equal one batch of N: sum(n_i * mean_i) / sum(n_i).
                weight = np.float32(1.0 if single else n_pred)
                for name, g in grads.items():
                    if self.scaler is not None:
                        # Scaling the gradient equals scaling the loss before backward (backward is linear).
                        g *= np.float32(scale)
                        round_fp16_({name: g})
                    if name in acc:
                        g *= weight
                        acc[name] += g
                    else:  # a copy, so a model that reuses its gradient buffers cannot overwrite the sum
                        acc[name] = g if single else g * weight  # (same as param)
        unscale = 1.0 / (scale * (1 if single else total))
        loss = loss_sum / max(total, 1)
        norm = grad_norm(acc) * unscale
        overflow = not math.isfinite(norm) and has_overflow(acc)
        proceed = self.scaler.update(overflow) if self.scaler is not None else not overflow
        self.history.losses.append(loss)
        self.history.lrs.append(lr)
        self.history.grad_norms.append(norm)
        self.history.tokens += total
        if not proceed or not math.isfinite(norm):
            self.history.skipped += 1
            return loss
        gs = unscale * clip_factor(norm, self.config.clip)
        for opt in self.optimizers:
            opt.step(acc, lr=lr, grad_scale=gs)
        return loss

    def _eval_loss(self, held: _Data) -> float:
        if self._engine is not None:
            self._engine.pull()
        total_nll = 0.0
        total_n = 0
        idx = np.argsort(held.lengths, kind="stable")  # (N,) similar lengths share a batch: less padding
        for start in range(0, idx.size, self.config.batch_size):
            tokens, lengths, n_pred = held.batch(idx[start:start + self.config.batch_size])
            logits = np.asarray(self.model.forward(tokens, lengths), dtype=np.float32)  # (B, T, V)
            pred = logits[:, :-1]  # (B, T-1, V)
            top = pred.max(axis=-1, keepdims=True)  # (B, T-1, 1)
            lse = np.log(np.exp(pred - top).sum(axis=-1)) + top[..., 0]  # (B, T-1)
            target = np.take_along_axis(pred, tokens[:, 1:, None], axis=-1)[..., 0]  # (B, T-1)
            real = np.arange(tokens.shape[1] - 1)[None, :] < (lengths - 1)[:, None]  # (B, T-1)
            total_nll += float(np.where(real, lse - target, 0.0).sum(dtype=np.float64))
            total_n += n_pred
        return total_nll / max(total_n, 1)

    # -------------------------------------------------------------------------------------- checkpoints

    def save_training_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write model weights, optimizer moments, loss scaler, step, data position and history, atomically.

        Args:
            path: destination file (evermind-train format, CRC-checked; never pickle).

        Raises:
            OSError: the file system refused the write.
        """
        from ..lm.checkpoint import write_tensor_file

        if self._engine is not None:
            self._engine.pull()
        tensors: dict[str, np.ndarray] = {f"param/{n}": p for n, p in self.model.params.items()}
        opt_meta = []
        for i, opt in enumerate(self.optimizers):
            meta, moments = opt.state_dict()
            opt_meta.append(meta)
            tensors.update({f"opt{i}/{k}": v for k, v in moments.items()})
        model_cfg = self.model.config.to_dict() if hasattr(self.model.config, "to_dict") else None
        meta = {
            "model_type": type(self.model).__name__,
            "model_config": model_cfg,
            "model_extra": getattr(self.model, "training_meta", lambda: None)(),
            "train_config": self.config.to_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "horizon": self.horizon,
            "data_digest": self.data_digest,
            "optimizers": opt_meta,
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "history": _history_to_json(self.history),
        }
        write_tensor_file(path, magic=TRAIN_MAGIC, kind=TRAIN_KIND, meta=meta, tensors=tensors)

    def load_training_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore a training checkpoint into this trainer and its model (weights copied in place).

        Args:
            path: a file written by save_training_checkpoint.

        Raises:
            CheckpointError: the file is corrupt or not a training checkpoint, or it does not fit this
                trainer (other parameters, other training settings, other model type).
        """
        from ..lm.checkpoint import read_tensor_file

        meta, tensors = read_tensor_file(path, magic=TRAIN_MAGIC, kind=TRAIN_KIND)
        label = os.fspath(path)
        try:
            saved_cfg = TrainConfig.from_dict(meta["train_config"])
        except (KeyError, TypeError, InvalidInput) as e:
            raise CheckpointError(f"{label}: the training settings in the checkpoint are unreadable ({e}).") from e
        differ = [k for k, v in saved_cfg.to_dict().items()
                  if k not in ("progress", "eval_every") and self.config.to_dict()[k] != v]
        if differ:
            raise CheckpointError(
                f"{label}: the checkpoint was trained with other settings ({', '.join(differ)}); a resumed run "
                "must use the same TrainConfig. Use LMTrainer.resume(path) to take the saved one."
            )
        if meta.get("model_type") != type(self.model).__name__:
            raise CheckpointError(f"{label}: checkpoint of a {meta.get('model_type')}, this trainer has a "
                                  f"{type(self.model).__name__}.")
        params = self.model.params
        names = {n[len("param/"):] for n in tensors if n.startswith("param/")}
        if names != set(params) or any(tensors[f"param/{n}"].shape != params[n].shape for n in params):
            raise CheckpointError(f"{label}: the checkpoint's parameters do not match this model's names and shapes.")
        try:
            for i, opt in enumerate(self.optimizers):
                prefix = f"opt{i}/"
                opt.load_state_dict(meta["optimizers"][i],
                                    {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
            if self.scaler is not None:
                self.scaler.load_state_dict(meta["scaler"])
            history = _history_from_json(meta["history"])
            step, epoch, cursor = int(meta["step"]), int(meta["epoch"]), int(meta["cursor"])
            horizon = None if meta["horizon"] is None else int(meta["horizon"])
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise CheckpointError(f"{label}: the training state in the checkpoint is incomplete ({e}).") from e
        for n, p in params.items():
            p[...] = tensors[f"param/{n}"]
        self.step, self.epoch, self.cursor, self.horizon = step, epoch, cursor, horizon
        self.data_digest = meta.get("data_digest")
        self.history = history
        if self._engine is not None:
            self._engine.push()

    @classmethod
    def resume(cls, path: str | os.PathLike[str], model: Any = None, *, progress: bool | None = None) -> "LMTrainer":
        """A trainer (and, for an EvermindLM run, its model) rebuilt from a training checkpoint.

        Args:
            path: a file written by save_training_checkpoint.
            model: the model to load the weights into; None builds an EvermindLM from the checkpoint
                (pass the LoRAModel for a LoRA run).
            progress: progress-bar setting for the resumed run.

        Returns:
            The trainer, positioned where the checkpoint was saved.

        Raises:
            CheckpointError: the file is corrupt or does not fit the model.
        """
        from ..lm.checkpoint import read_tensor_file

        meta, tensors = read_tensor_file(path, magic=TRAIN_MAGIC, kind=TRAIN_KIND)
        label = os.fspath(path)
        try:
            cfg = dataclasses.replace(TrainConfig.from_dict(meta["train_config"]), progress=progress)
        except (KeyError, TypeError, InvalidInput) as e:
            raise CheckpointError(f"{label}: the training settings in the checkpoint are unreadable ({e}).") from e
        if model is None:
            if meta.get("model_type") != "EvermindLM" or meta.get("model_config") is None:
                raise CheckpointError(f"{label}: a {meta.get('model_type')} checkpoint; pass the model to resume().")
            from ..lm.model import EvermindLM, LMConfig

            try:
                lm_cfg = LMConfig.from_dict(meta["model_config"])
                params = {k[len("param/"):]: v for k, v in tensors.items() if k.startswith("param/")}
                model = EvermindLM.from_params(lm_cfg, params)
            except InvalidInput as e:
                raise CheckpointError(f"{label}: the model in the checkpoint is invalid ({e}).") from e
        trainer = cls(model, cfg)
        trainer.load_training_checkpoint(path)
        return trainer


def _history_to_json(h: TrainHistory) -> dict[str, Any]:
    def clean(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None  # JSON has no NaN/Inf

    return {
        "losses": [clean(x) for x in h.losses],
        "lrs": [clean(x) for x in h.lrs],
        "grad_norms": [clean(x) for x in h.grad_norms],
        "eval_losses": [[s, clean(x)] for s, x in h.eval_losses],
        "skipped": h.skipped,
        "tokens": h.tokens,
    }


def _history_from_json(d: Mapping[str, Any]) -> TrainHistory:
    def back(x: float | None) -> float:
        return math.nan if x is None else float(x)

    return TrainHistory(
        losses=[back(x) for x in d["losses"]],
        lrs=[back(x) for x in d["lrs"]],
        grad_norms=[back(x) for x in d["grad_norms"]],
        eval_losses=[(int(s), back(x)) for s, x in d["eval_losses"]],
        skipped=int(d["skipped"]),
        tokens=int(d["tokens"]),
    )


__all__ = ["TrainConfig", "TrainHistory", "LMTrainer", "TRAIN_MAGIC", "TRAIN_KIND"]
