"""GpuTrainer: the device half of a GPU training run. LMTrainer(model, config, engine=GpuTrainer) hands it each
optimizer step; weights, gradients and AdamW moments stay on the GPU (forward, backward, global-norm clip and
AdamW in one submit), and `pull`/`push` move them to and from the host model and optimizers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.gpu.device import GpuDevice
from evermind_memory.gpu.model import GpuLM
from evermind_memory.gpu.ops.support import SUMSQ_CHUNK
from evermind_memory.gpu.plan import Plan, pack_tensor, unpack_tensor
from evermind_memory.lm.model import EvermindLM, param_shapes

__all__ = ["GpuTrainer", "StepResult"]

class StepResult(NamedTuple):
    """What one training step did."""

    loss: float  # token-weighted mean next-token loss of the step's batches
    grad_norm: float  # global gradient norm before clipping (as LMTrainer records it)
    applied: bool  # False when the step was dropped (a non-finite gradient)
    tokens: int  # predicted positions trained on


class GpuTrainer:
    """The device half of `LMTrainer(model, config, engine=GpuTrainer)`: one optimizer step per call with
    weights, gradients and AdamW moments resident on the GPU (forward, backward, global-norm clip and AdamW in
    one submit).

    It mirrors `LMTrainer._train_step` for a plain EvermindLM: token-weighted accumulation over the window's
    micro-batches, clip to `config.clip`, decoupled decay on 2-D weights only, the trust region and the
    whole-step drop on a non-finite gradient. Mixed precision is not supported here (fp32 on the device);
    `checkpoint` and `shards` do not change the result, so they are accepted and ignored.

    LMTrainer integration (trainer.py, owner: training helper), with `self._engine = None` by default:
        __init__:            self._engine = engine(model, config, self.optimizers) when an engine is given
        _train_step, first:  if self._engine is not None: return self._engine.trainer_step(self, batches, lr)
        fit (finally:), and before _eval_loss / save_training_checkpoint:  if self._engine: self._engine.pull()
        load_training_checkpoint, at the end:                              if self._engine: self._engine.push()
    Not thread-safe.
    """

    def __init__(self, model: EvermindLM, config: Any, optimizers: Sequence[Any] | None = None, *,
                 device: GpuDevice | None = None) -> None:
        """Upload the model (and the optimizers' moments, when given) to the device.

        Args:
            model: the EvermindLM trained in place (its params are written back by `pull`).
            config: a training.trainer.TrainConfig (lr schedule is passed per step; betas, eps,
                weight_decay, max_delta and clip are read here).
            optimizers: the trainer's AdamW instances (their moments and step count are the starting state,
                and `pull` writes back into them); None starts from zero moments.
            device: the GPU device; None opens the process-wide one.

        Raises:
            InvalidInput: a model other than an EvermindLM, or mixed precision asked for.
            GpuUnavailable: no GPU device.
        """
        if not isinstance(model, EvermindLM):
            raise InvalidInput(f"the GPU trainer needs an EvermindLM, got {type(model).__name__}; "
                               "train LoRA adapters on the CPU path (device='cpu').")
        if getattr(config, "mixed_precision", False):
            raise InvalidInput("the GPU trainer runs in float32; set TrainConfig(mixed_precision=False) "
                               "or train on the CPU path.")
        self.model = model
        self.config = config
        self.optimizers = list(optimizers or [])
        self.gpu = GpuLM.from_model(model, device=device)
        self.view = self.gpu.training_view()
        dev = self.gpu.dev
        sizes = [int(np.prod(t.shape)) for t in self.view.layout]
        self._m = [dev.storage(n * 4) for n in sizes]
        self._v = [dev.storage(n * 4) for n in sizes]
        self.t = 0
        align = int(dev.raw.limits.get("min-uniform-buffer-offset-alignment", 256))
        self._stride = -(-48 // align) * align
        u = dev.wgpu.BufferUsage
        self._hp = dev.acquire(self._stride * len(sizes), u.UNIFORM | u.COPY_DST)
        self._ctl, self._flag = dev.storage(16), dev.storage(16)  # [scale, norm], [drop flag]
        self._staging = dev.acquire(48, u.MAP_READ | u.COPY_DST)
        self._opt = self._build_optimizer(sizes)
        self.push()

    def _build_optimizer(self, sizes: list[int]) -> Plan:
        """Global norm + clip scale, scale the grads, AdamW check then apply; stats copied for the read back."""
        gpu = self.gpu
        plan = Plan(gpu.dev)
        grads = self.view.grads
        n_part = [-(-n // SUMSQ_CHUNK) for n in sizes]
        slots = np.concatenate([[0], np.cumsum(n_part)]).astype(int)  # (n_tensors + 1,)
        partials = plan.buffer(int(slots[-1]) * 4)
        ctl, flag = self._ctl, self._flag
        for g, n, slot in zip(grads, sizes, slots):
            u = plan.uniform([("u", n), ("u", int(slot)), ("u", 0), ("u", 0)] + [("f", 0.0)] * 4)
            plan.dispatch("sum_squares", "partial", {0: u, 1: g, 2: partials}, plan.fold(-(-n // SUMSQ_CHUNK)))
        clip = float(getattr(self.config, "clip", 0.0))
        fin = plan.uniform([("u", 0), ("u", 0), ("u", int(slots[-1])), ("u", 0), ("f", 1.0), ("f", clip),
                            ("f", 0.0), ("f", 0.0)])
        plan.dispatch("sum_squares", "finish", {0: fin, 2: partials, 3: ctl, 4: flag}, (1, 1, 1))
        for g, n in zip(grads, sizes):
            u = plan.uniform([("u", n), ("u", 0), ("u", 0), ("u", 0)] + [("f", 0.0)] * 4)
            plan.elementwise("sum_squares", "scale", {0: u, 3: ctl, 5: g}, n)
        hp = [(self._hp, i * self._stride, 48) for i in range(len(sizes))]
        for i, n in enumerate(sizes):
            plan.elementwise("adamw_update", "check", {0: hp[i], 2: grads[i], 3: self._m[i], 4: self._v[i], 5: flag}, n)
        for i, n in enumerate(sizes):
            plan.elementwise("adamw_update", "apply", {0: hp[i], 1: self.view.params[i], 2: grads[i], 3: self._m[i],
                                                       4: self._v[i], 5: flag}, n)
        plan.copy(self._ctl, self._staging, 16)
        plan.copy(self._flag, self._staging, 16, dst_offset=16)
        plan.copy(self.view.loss, self._staging, 16, dst_offset=32)
        return plan

    def _write_hyper(self, lr: float, t: int) -> None:
        cfg = self.config
        b1, b2 = (float(x) for x in cfg.betas)
        rows = np.zeros((len(self.view.layout), self._stride // 4), dtype=np.float32)  # (n_tensors, stride/4)
        rows[:, 0] = np.array([int(np.prod(tt.shape)) for tt in self.view.layout], dtype=np.uint32).view(np.float32)
        rows[:, 1] = lr
        rows[:, 2], rows[:, 3], rows[:, 4] = b1, b2, float(cfg.eps)
        rows[:, 5] = [float(cfg.weight_decay) if tt.decay else 0.0 for tt in self.view.layout]
        rows[:, 6], rows[:, 7] = b1 ** t, b2 ** t
        rows[:, 8] = float(cfg.max_delta)
        rows[:, 9] = 1.0  # the clip scale is already applied to the gradients by sum_squares.scale
        self.gpu.dev.raw.queue.write_buffer(self._hp.raw, 0, rows)

    def step(self, batches: Sequence[tuple[Any, Any]], lr: float) -> StepResult:
        """One optimizer step over a window of micro-batches, resident on the device.

        Args:
            batches: (tokens (B, T), lengths (B,) or None) per micro-batch; their gradients are summed
                weighted by predicted positions (one batch of all of them).
            lr: learning rate of this step.

        Returns:
            StepResult(loss, grad_norm, applied, tokens).

        Raises:
            InvalidInput: bad batches, or no sequence with two or more tokens.
        """
        if not batches:
            raise InvalidInput("step() expected at least one (tokens, lengths) batch, got none.")
        self._write_hyper(float(lr), self.t + 1)
        total = self.gpu.record_batches(batches, "step()", tail=self._opt.record)
        st = self._staging.raw
        st.map_sync(self.gpu.dev.wgpu.MapMode.READ, 0, self._staging.capacity)
        try:
            raw = np.frombuffer(st.read_mapped(0, 48), dtype=np.uint8).copy()  # (48,)
        finally:
            st.unmap()
        ctl = raw.view(np.float32)  # (12,)
        applied = int(raw[16:20].view(np.uint32)[0]) == 0
        if applied:
            self.t += 1
        return StepResult(float(ctl[8]), float(ctl[1]), applied, total)

    def trainer_step(self, trainer: Any, batches: Sequence[tuple[np.ndarray, np.ndarray, int]], lr: float) -> float:
        """`LMTrainer._train_step` on the device: the step plus the trainer's history; returns the loss.

        Args:
            trainer: the LMTrainer whose history is updated.
            batches: its (tokens, lengths, n_pred) micro-batches.
            lr: learning rate of this step.

        Returns:
            The step's token-weighted mean loss.
        """
        res = self.step([(tok, lens) for tok, lens, _ in batches], lr)
        h = trainer.history
        h.losses.append(res.loss)
        h.lrs.append(lr)
        h.grad_norms.append(res.grad_norm)
        h.tokens += res.tokens
        if not res.applied:
            h.skipped += 1
        return res.loss

    def pull(self) -> None:
        """Copy the device weights into model.params (in place) and the moments and step count into the optimizers."""
        dev = self.gpu.dev
        params = self.gpu.to_params()
        for name, arr in params.items():
            self.model.params[name][...] = arr
        if not self.optimizers:
            return
        m: dict[str, np.ndarray] = {}
        v: dict[str, np.ndarray] = {}
        for t, mb, vb in zip(self.view.layout, self._m, self._v):
            m.update(unpack_tensor(t, dev.read(mb, np.float32, t.shape)))
            v.update(unpack_tensor(t, dev.read(vb, np.float32, t.shape)))
        for opt in self.optimizers:
            for name in opt.owned:
                opt.m[name][...] = m[name]
                opt.v[name][...] = v[name]
            opt.t = self.t

    def push(self) -> None:
        """Upload model.params and the optimizers' moments and step count (after a checkpoint load)."""
        dev = self.gpu.dev
        self.gpu.load_params(self.model.params)
        shapes = param_shapes(self.gpu.config)
        m = {n: np.zeros(s, dtype=np.float32) for n, s in shapes.items()}  # (per param)
        v = {n: np.zeros(s, dtype=np.float32) for n, s in shapes.items()}  # (per param)
        self.t = 0
        for opt in self.optimizers:
            for name in opt.owned:
                m[name], v[name] = opt.m[name], opt.v[name]
            self.t = int(opt.t)
        for t, mb, vb in zip(self.view.layout, self._m, self._v):
            dev.write(mb, pack_tensor(t, m))
            dev.write(vb, pack_tensor(t, v))

    def close(self) -> None:
        """Give the device buffers back (weights are not pulled first)."""
        dev = self.gpu.dev
        self._opt.release()
        for buf in self._m + self._v + [self._hp, self._ctl, self._flag, self._staging]:
            dev.release(buf)
        self.gpu.close()
