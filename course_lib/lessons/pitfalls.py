"""Gradient accumulation and its pitfalls, each one runnable (notebook 03).

    from course_lib.lessons.pitfalls import accumulated_grad, Recipe, train
    g = accumulated_grad(model, x, y, accum_steps=4)         # equals the big-batch gradient
    g_bad = accumulated_grad(model, x, y, 4, scale=False)    # 4 times too large
    model2, losses, lrs = train(model, batches, Recipe(accum_steps=4, optimizer="adam"))

Every function works on a copy or on the model's ``.grad`` only, on the tensors' device.
Variable-length sequences (token-count normalisation) are in ``course_lib.core.accumulation``;
:func:`sequence_run` trains the tiny transformer with either normalisation.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.core import accumulation
from course_lib.lessons import memory
from course_lib.lessons.gradients import flat_grad
from course_lib.tasks import batching, sequences


def micro_batches(x: torch.Tensor, y: torch.Tensor, accum_steps: int) -> list:
    """The ``accum_steps`` equal micro-batches of one process, in order: [(x_j, y_j), ...]."""
    return batching.micro_batches_of_rank((x, y), 0, 1, accum_steps)


def accumulate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, accum_steps: int,
               scale: bool = True, loss_fn: Callable = F.cross_entropy) -> float:
    """Backward over ``accum_steps`` micro-batches; adds to ``.grad``; returns the batch loss."""
    total = 0.0
    for x_micro, y_micro in micro_batches(x, y, accum_steps):
        loss = loss_fn(model(x_micro), y_micro)  # mean over this micro-batch
        if scale:
            loss = loss / accum_steps  # the sum of k scaled means is the mean over the batch
        loss.backward()  # .grad += d loss / d param
        total += loss.item() if scale else loss.item() / accum_steps
    return total


def accumulated_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor, accum_steps: int,
                     scale: bool = True, loss_fn: Callable = F.cross_entropy) -> torch.Tensor:
    """Zero the grads, accumulate, return the gradient as one vector (P,)."""
    model.zero_grad(set_to_none=True)
    accumulate(model, x, y, accum_steps, scale, loss_fn)
    return flat_grad(model).detach().clone()


@dataclass
class Recipe:
    """How one run accumulates and steps; the defaults are the correct recipe."""

    accum_steps: int = 1  # micro-batches per optimizer step
    scale_loss: bool = True  # divide each micro-batch loss by accum_steps
    optimizer: str = "sgd"  # "sgd", "adam" or "adamw"
    lr: float = 0.1  # learning rate at the peak of the schedule
    weight_decay: float = 0.0  # Adam: added to the gradient (L2); AdamW: applied to the weights
    clip_norm: float | None = None  # clip the gradient's total norm to this before the step
    clip_every_micro_step: bool = False  # the bug: clip the partial sum after each backward
    decay_steps: int | None = None  # cosine learning-rate decay to 0 over this many steps
    scheduler_every_micro_step: bool = False  # the bug: step the scheduler after each backward


def make_optimizer(model: nn.Module, config: Recipe) -> torch.optim.Optimizer:
    kinds = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if config.optimizer not in kinds:
        raise ValueError(f"optimizer={config.optimizer!r} is not known; use one of {list(kinds)}")
    return kinds[config.optimizer](model.parameters(), lr=config.lr,
                                   weight_decay=config.weight_decay)


def train(model: nn.Module, batches, config: Recipe, loss_fn: Callable = F.cross_entropy):
    """Train a copy of ``model`` on ``batches`` [(x, y), ...]: one optimizer step per batch.

    Returns (the trained copy, the loss of each batch before its step, the lr of each step).
    """
    model = copy.deepcopy(model)
    optimizer = make_optimizer(model, config)
    scheduler = None
    if config.decay_steps:
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, config.decay_steps)
    losses, lrs = [], []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        lrs.append(optimizer.param_groups[0]["lr"])
        loss = 0.0
        for x_micro, y_micro in micro_batches(x, y, config.accum_steps):
            micro_loss = loss_fn(model(x_micro), y_micro)
            loss += micro_loss.item() / config.accum_steps
            if config.scale_loss:
                micro_loss = micro_loss / config.accum_steps
            micro_loss.backward()
            if config.clip_norm and config.clip_every_micro_step:
                nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm)  # too early
            if scheduler and config.scheduler_every_micro_step:
                with warnings.catch_warnings():  # torch warns: stepped before optimizer.step()
                    warnings.simplefilter("ignore", UserWarning)
                    scheduler.step()  # too often: k times per optimizer step
        if config.clip_norm and not config.clip_every_micro_step:
            nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm)  # the whole gradient
        optimizer.step()
        if scheduler and not config.scheduler_every_micro_step:
            scheduler.step()  # once per optimizer step
        losses.append(loss)
    return model, losses, lrs


def uneven_accumulated_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                            micro_batch: int, weighting: str = "size",
                            loss_fn: Callable = F.cross_entropy) -> torch.Tensor:
    """Accumulate over micro-batches of ``micro_batch`` rows; the last one may be shorter.

    weighting: "size" (right: each micro-batch mean weighs n_j / N) or "equal" (the bug: 1 / k).
    """
    if weighting not in ("size", "equal"):
        raise ValueError(f"weighting={weighting!r}: use 'size' or 'equal'")
    n = x.shape[0]
    parts = list(zip(x.split(micro_batch), y.split(micro_batch), strict=True))  # last: n % micro
    model.zero_grad(set_to_none=True)
    for x_micro, y_micro in parts:
        weight = x_micro.shape[0] / n if weighting == "size" else 1 / len(parts)
        (loss_fn(model(x_micro), y_micro) * weight).backward()  # sum_j (n_j/N) mean_j = mean
    return flat_grad(model).detach().clone()


def dropout_masks(model: nn.Module, batch_size: int, seed: int,
                  device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """One keep-mask per dropout layer for the whole global batch, drawn from ``seed`` alone.

    Each mask is (batch_size, width of the layer before it), scaled by 1 / (1 - p).
    """
    g = torch.Generator().manual_seed(seed)
    masks, width = [], None
    for module in model.modules():
        if isinstance(module, nn.Linear):
            width = module.out_features
        if isinstance(module, nn.Dropout):
            keep = torch.rand(batch_size, width, generator=g) >= module.p  # (B, width)
            masks.append(keep.to(device) / (1 - module.p))  # scaled: the mean stays the same
    return masks


def forward_with_masks(model: nn.Module, x: torch.Tensor,
                       masks: list[torch.Tensor]) -> torch.Tensor:
    """Run a ``toy.MLP`` with given dropout masks instead of random ones (rows match x)."""
    remaining = list(masks)
    for layer in model.net:
        x = x * remaining.pop(0) if isinstance(layer, nn.Dropout) else layer(x)
    return x


def masked_accumulated_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                            accum_steps: int, seed: int) -> torch.Tensor:
    """Accumulate with the global batch's masks, each micro-batch using its own rows of them."""
    masks = dropout_masks(model, x.shape[0], seed, x.device)
    micro = batching.micro_batch_size(x.shape[0], 1, accum_steps)
    model.zero_grad(set_to_none=True)
    for j in range(accum_steps):
        rows = slice(j * micro, (j + 1) * micro)
        logits = forward_with_masks(model, x[rows], [m[rows] for m in masks])
        (F.cross_entropy(logits, y[rows]) / accum_steps).backward()
    return flat_grad(model).detach().clone()


def clipped_accumulated_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                             accum_steps: int, max_norm: float,
                             every_micro_step: bool = False) -> torch.Tensor:
    """Accumulate, clipping once at the end (right) or after every backward (the bug)."""
    model.zero_grad(set_to_none=True)
    for x_micro, y_micro in micro_batches(x, y, accum_steps):
        (F.cross_entropy(model(x_micro), y_micro) / accum_steps).backward()
        if every_micro_step:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # clips a partial sum
    if not every_micro_step:
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # clips the whole gradient
    return flat_grad(model).detach().clone()


def accumulate_in_dtype(micro_grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Sum micro-batch gradients in a buffer of ``dtype`` (what ``.grad += g`` does)."""
    buffer = torch.zeros_like(micro_grads[0], dtype=dtype)
    for g in micro_grads:
        buffer += g.to(dtype)  # each addition rounds to the buffer's precision
    return buffer


def precision_errors(micro_grads: list[torch.Tensor], dtypes) -> dict[str, float]:
    """Relative error of each dtype's accumulated sum against the float64 sum."""
    exact = accumulate_in_dtype(micro_grads, torch.float64)
    out = {}
    for dtype in dtypes:
        got = accumulate_in_dtype(micro_grads, dtype).double()
        out[str(dtype).replace("torch.", "")] = ((got - exact).norm() / exact.norm()).item()
    return out


def sorted_by_length(batch: sequences.TokenBatch) -> sequences.TokenBatch:
    """The same examples, shortest answers first (what length-bucketing samplers do)."""
    order = torch.argsort(batch.target_counts(), stable=True)
    return sequences.TokenBatch(batch.inputs[order], batch.targets[order])


def sequence_run(model: nn.Module, steps: int, size: int, accum_steps: int,
                 normalisation: str, lr: float = 3e-3, seed: int = 0,
                 by_length: bool = True) -> list[float]:
    """Train a copy of the tiny transformer with Adam on the sums task.

    normalisation: "big batch" (no accumulation), "tokens" (right) or "mean_of_means" (the
    bug). Returns the global token-mean loss of each step's batch, before the step.
    """
    model = copy.deepcopy(model)
    device = next(model.parameters()).device
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        batch = sequences.global_batch(seed, step, size).to(device)
        if by_length:
            batch = sorted_by_length(batch)
        optimizer.zero_grad(set_to_none=True)
        if normalisation == "big batch":
            losses.append(accumulation.big_batch_backward(model, batch))
        else:
            with torch.no_grad():
                losses.append(accumulation.mean_token_loss(model, batch).item())
            parts = batching.micro_batches_of_rank(batch, 0, 1, accum_steps)
            accumulation.accumulate_gradients(model, parts, normalisation)
        optimizer.step()
    return losses


def cosine_lr(step: int, base_lr: float, decay_steps: int) -> float:
    """The learning rate of CosineAnnealingLR at ``step`` (to compare a run's lrs with)."""
    return base_lr * (1 + math.cos(math.pi * step / decay_steps)) / 2


def accumulation_cost(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                      accum_choices: list[int], repeats: int = 3):
    """For each k: activation bytes of one micro-batch, and seconds for one optimizer step's
    worth of forward and backward passes (the fastest of ``repeats``, to dodge noise)."""
    used, seconds = [], []
    for k in accum_choices:
        micro = batching.micro_batch_size(x.shape[0], 1, k)
        used.append(memory.activation_bytes(model, x[:micro], y[:micro]))
        best = math.inf
        for _ in range(repeats):
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            accumulate(model, x, y, k)
            if x.is_cuda:
                torch.cuda.synchronize(x.device)  # wait for the GPU before reading the clock
            best = min(best, time.perf_counter() - start)
        seconds.append(best)
    model.zero_grad(set_to_none=True)
    return used, seconds
