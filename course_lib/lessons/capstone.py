"""What one process of the course's trainer holds in memory (notebook 11), measured.

    from course_lib.lessons.capstone import memory_per_process, trainer_model
    memory_per_process(8)   # bytes: parameters, gradients, optimizer state, activations, total

Memory is measured as in notebook 02, on the CPU, so every machine gets the same numbers: the
parameters, their gradients and AdamW's state after one real step, plus the activations that
autograd saves for one micro-batch (``course_lib.lessons.memory``, saved-tensor hooks). Only one
micro-batch's activations are alive at a time: each backward frees its graph (notebook 03).
The capstone's budget (``course_lib.lessons.budget``) adds the sync's buckets and ZeRO-1.
"""

from __future__ import annotations

import functools

import torch

from course_lib.core.accumulation import sum_token_loss
from course_lib.lessons.memory import memory_breakdown
from course_lib.tasks.models import make_transformer
from course_lib.tasks.sequences import global_batch
from course_lib.train.config import TrainConfig

KIB = 1024  # bytes in a KiB
PARTS = ("parameters", "gradients", "optimizer state", "activations")
LR = 3e-3  # the trainer's peak learning rate (AdamW's state does not depend on it)


def trainer_model(config: TrainConfig | None = None) -> torch.nn.Module:
    """The model ``course_lib.train`` builds, on the CPU in float32."""
    c = config or TrainConfig()
    return make_transformer(c.model_shape, seed=c.seed)


@functools.lru_cache(maxsize=64)
def _measure(micro_batch: int, lr: float, seed: int) -> tuple[int, ...]:
    model = trainer_model(TrainConfig(seed=seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)  # the trainer's optimizer
    batch = global_batch(seed, 0, micro_batch, TrainConfig().max_digits)
    parts = memory_breakdown(model, optimizer, batch.inputs, batch.targets,
                             loss_fn=sum_token_loss)  # one real step, then a fresh forward
    return tuple(parts[name] for name in PARTS)


def memory_per_process(micro_batch: int, seed: int = 0) -> dict[str, int]:
    """Bytes one process holds for a micro-batch of this size; "total" adds them up."""
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"micro_batch must be a whole number >= 1, got {micro_batch!r}")
    parts = dict(zip(PARTS, _measure(micro_batch, LR, seed), strict=True))
    parts["total"] = sum(parts.values())
    return parts
