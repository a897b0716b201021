"""Training toolkit: AdamW (sharded, kernel-mirroring), mixed precision, LMTrainer, LoRA/QLoRA.

Nothing in the inference path imports this package; what inference needs of LoRA lives in lm/adapter.py.
"""

from .lora import LoRAAdapter, LoRAFootprint, LoRAModel
from .mixed_precision import DynamicLossScaler, has_overflow, round_fp16, round_fp16_
from .optim import AdamW, AdamWStep, LRSchedule, ShardSpec, adamw_update_, clip_grad_norm_, grad_norm
from .trainer import LMTrainer, TrainConfig, TrainHistory

__all__ = [
    "AdamW",
    "AdamWStep",
    "LRSchedule",
    "ShardSpec",
    "adamw_update_",
    "clip_grad_norm_",
    "grad_norm",
    "DynamicLossScaler",
    "round_fp16",
    "round_fp16_",
    "has_overflow",
    "LMTrainer",
    "TrainConfig",
    "TrainHistory",
    "LoRAAdapter",
    "LoRAFootprint",
    "LoRAModel",
]
