"""Data parallelism simulated in one process: N replicas of one model (notebook 04).

    from course_lib.lessons.replicas import make_replicas, data_parallel_step
    replicas = make_replicas(model, world_size=4)            # 4 exact copies
    optimizers = [torch.optim.SGD(r.parameters(), lr=0.1) for r in replicas]
    data_parallel_step(replicas, optimizers, x, y, accum_steps=2)   # shard, backward, average, step

Replica ``rank`` plays the part of process ``rank`` in notebook 07: it sees only its shard of the
global batch, and the only thing the replicas share is :func:`average_gradients` (our
all-reduce, done by hand). The global batch is ``world_size x accum_steps x micro_batch``;
rank r owns block r of it (the split of ``course_lib.tasks.batching``, used by the multi-process
notebooks too).
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.tasks import batching


def global_batch_size(world_size: int, accum_steps: int, micro_batch: int) -> int:
    """Examples per optimizer step: every replica runs ``accum_steps`` micro-batches."""
    for name, value in (("world_size", world_size), ("accum_steps", accum_steps),
                        ("micro_batch", micro_batch)):
        if value < 1:
            raise ValueError(f"{name}={value} must be at least 1")
    return world_size * accum_steps * micro_batch


def shard(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous block of rows: (B, ...) -> (B // world_size, ...)."""
    return batching.micro_batch(t, rank, 0, world_size, accum_steps=1)


def make_replicas(model: nn.Module, world_size: int, same_init: bool = True,
                  seed: int = 0) -> list[nn.Module]:
    """``world_size`` copies of ``model``. With ``same_init=False`` replica r is re-initialised
    from ``seed + r``: what happens when ranks forget to broadcast rank 0's weights.
    """
    replicas = [copy.deepcopy(model) for _ in range(world_size)]
    if not same_init:
        for rank, replica in enumerate(replicas):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed + rank)
                for module in replica.modules():
                    if hasattr(module, "reset_parameters"):
                        module.reset_parameters()
    return replicas


def average_gradients(replicas: Sequence[nn.Module]) -> None:
    """The all-reduce, by hand: every replica's ``.grad`` becomes the mean over replicas."""
    world_size = len(replicas)
    for params in zip(*(r.parameters() for r in replicas), strict=True):  # one param, all replicas
        total = torch.stack([p.grad for p in params]).sum(dim=0)  # (world, *shape) -> (*shape)
        mean = total / world_size  # each replica's loss is a mean over its shard: mean again
        for p in params:
            p.grad.copy_(mean)  # one result, copied: the replicas stay bitwise equal


def replicas_identical(replicas: Sequence[nn.Module]) -> bool:
    """True when every parameter of every replica equals replica 0's, bit for bit."""
    first = list(replicas[0].parameters())
    return all(torch.equal(a, b) for r in replicas[1:]
               for a, b in zip(first, r.parameters(), strict=True))


def max_replica_difference(replicas: Sequence[nn.Module]) -> float:
    """The largest absolute difference between any parameter and replica 0's."""
    first = list(replicas[0].parameters())
    diffs = [(a - b).abs().max().item() for r in replicas[1:]
             for a, b in zip(first, r.parameters(), strict=True)]
    return max(diffs, default=0.0)


def data_parallel_step(replicas: Sequence[nn.Module], optimizers: Sequence, x: torch.Tensor,
                       y: torch.Tensor, accum_steps: int = 1, sync: bool = True,
                       loss_fn: Callable = F.cross_entropy) -> float:
    """One optimizer step of every replica on the global batch ``x``, ``y``.

    Returns the mean loss over the global batch (measured before the step).
    """
    world_size = len(replicas)
    batching.micro_batch_size(x.shape[0], world_size, accum_steps)  # clear error if uneven
    total_loss = 0.0
    for rank, (model, optimizer) in enumerate(zip(replicas, optimizers, strict=True)):
        optimizer.zero_grad(set_to_none=True)
        for x_micro, y_micro in batching.micro_batches_of_rank((x, y), rank, world_size,
                                                                  accum_steps):
            loss = loss_fn(model(x_micro), y_micro) / accum_steps  # the k terms sum to the mean
            loss.backward()  # adds to .grad
            total_loss += loss.item() / world_size
    if sync:
        average_gradients(replicas)
    for optimizer in optimizers:
        optimizer.step()
    return total_loss


def train_replicas(model: nn.Module, batches, world_size: int, lr: float,
                   accum_steps: int = 1, sync: bool = True, same_init: bool = True,
                   loss_fn: Callable = F.cross_entropy) -> dict:
    """SGD on N replicas over ``batches`` (a list of (x, y)); the model itself is not changed.

    Returns per-step ``losses``, ``difference`` (largest gap to replica 0 after the step),
    ``identical`` (bitwise, after the step) and the final ``replicas``.
    """
    replicas = make_replicas(model, world_size, same_init=same_init)
    optimizers = [torch.optim.SGD(r.parameters(), lr=lr) for r in replicas]
    out = {"losses": [], "difference": [], "identical": []}
    for x, y in batches:
        out["losses"].append(data_parallel_step(replicas, optimizers, x, y, accum_steps,
                                                sync, loss_fn))
        out["difference"].append(max_replica_difference(replicas))
        out["identical"].append(replicas_identical(replicas))
    out["replicas"] = replicas
    return out


def train_single(model: nn.Module, batches, lr: float | Sequence[float],
                 loss_fn: Callable = F.cross_entropy,
                 evaluate: Callable[[nn.Module], float] | None = None):
    """Plain big-batch SGD on a copy of ``model``; ``lr`` may be a list (one per step).

    Returns (the trained copy, one loss per step): each batch's loss before its step, or
    ``evaluate(model)`` after each step when given (e.g. the loss on the whole data set).
    """
    model = copy.deepcopy(model)
    rates = [lr] * len(batches) if isinstance(lr, (int, float)) else list(lr)
    optimizer = torch.optim.SGD(model.parameters(), lr=rates[0])
    losses = []
    for (x, y), rate in zip(batches, rates, strict=True):
        for group in optimizer.param_groups:
            group["lr"] = rate
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if evaluate is None:
            losses.append(loss.item())
        else:
            with torch.no_grad():
                losses.append(float(evaluate(model)))
    return model, losses


def scaled_lr(base_lr: float, base_batch: int, global_batch: int) -> float:
    """Linear scaling rule: k times the batch, k times the learning rate (for SGD)."""
    return base_lr * global_batch / base_batch  # k small steps ~ one step with k x the gradient


def warmup_lr(step: int, peak_lr: float, warmup_steps: int) -> float:
    """Linear warmup: step 0 gets peak / warmup_steps, step warmup_steps - 1 and later get peak."""
    if warmup_steps <= 0:
        return peak_lr
    return peak_lr * min(1.0, (step + 1) / warmup_steps)  # +1: the first step is not wasted
