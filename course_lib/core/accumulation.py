"""How to scale each micro-step's loss so that accumulated gradients equal the big batch's
(notebooks 03 and 07).

The loss of a global batch of sequences is a mean over its scored tokens:

    loss = (sum of per-token losses, all ranks, all micro-steps) / (global number of scored tokens)

so each micro-step backpropagates ``its token-loss sum x world_size / global_tokens``
(``scale_by_global_tokens``); the x world_size undoes the average over ranks that every
gradient sync (ours and DDP's) performs. When every micro-batch has the same number of
examples and the loss is a mean per example, ``mean_loss / accum_steps`` is the same thing
(``scale_for_micro_steps``).

Kept on purpose, as a bug to reproduce: ``mean_of_micro_means`` divides each micro-batch's
*own* token mean by accum_steps. With variable-length sequences micro-batches hold different
numbers of tokens, so tokens in short micro-batches weigh more and the gradient is not the big
batch's.

    from course_lib.core.accumulation import accumulate_gradients, big_batch_backward
    accumulate_gradients(model, micro_batches, normalisation="tokens")         # right
    accumulate_gradients(model, micro_batches, normalisation="mean_of_means")  # the bug

``accumulation_step`` is the whole recipe for equal micro-batches, as notebook 03 shows it:
zero once, scale, backward each micro-batch, clip, step, schedule.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import clip_grad_norm_

from course_lib.tasks.sequences import IGNORE, TokenBatch

NORMALISATIONS = ("tokens", "mean_of_means")


def sum_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of the cross-entropy over scored tokens: logits (B, T, V), targets (B, T).
    A sum can be divided by any count later; a mean has already fixed its denominator."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                           reduction="sum")


def count_target_tokens(targets: torch.Tensor) -> torch.Tensor:
    """Scored tokens in ``targets``, as a 0-d int64 tensor on the same device."""
    return (targets != IGNORE).sum()


def all_reduce_token_count(local_count: torch.Tensor,
                           group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Global scored-token count: the sum of every rank's count (a copy; the input is kept).

    Outside a process group (one process) the count is already global.
    """
    total = local_count.detach().clone().to(torch.int64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)  # every rank gets the sum
    return total


def scale_by_global_tokens(loss_sum: torch.Tensor, global_tokens: torch.Tensor | int,
                           world_size: int = 1) -> torch.Tensor:
    """Right for any batch: the sync averages over ranks (divides by world_size), so multiply
    by world_size here; then the summed, averaged gradient is that of the global token mean."""
    tokens = torch.as_tensor(global_tokens, dtype=loss_sum.dtype, device=loss_sum.device)
    return loss_sum * world_size / tokens  # the count in the loss's dtype: no float32 rounding


def accumulation_step(model, optimizer, micro_batches, loss_fn, max_norm: float | None = None,
                      scheduler=None) -> float:
    """One optimizer step from equal micro-batches ``[(x, y), ...]``; returns the batch loss."""
    accum_steps = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)  # once per optimizer step, not per micro-batch
    batch_loss = 0.0
    for x, y in micro_batches:  # (b, ...) each: one micro-batch at a time in memory
        loss = loss_fn(model(x), y) / accum_steps  # k scaled means add up to the batch mean
        loss.backward()  # .grad += this micro-batch's share; its graph is freed
        batch_loss += loss.item()
    if max_norm is not None:
        clip_grad_norm_(model.parameters(), max_norm)  # only now is .grad the whole gradient
    optimizer.step()
    if scheduler is not None:
        scheduler.step()  # once per optimizer step: the schedule counts steps, not micro-steps
    return batch_loss


def scale_for_micro_steps(mean_loss: torch.Tensor, accum_steps: int) -> torch.Tensor:
    """Right when every micro-batch has equal weight (same number of examples, loss = mean per
    example): the sum of accum_steps means / accum_steps is the mean over the whole batch."""
    return mean_loss / accum_steps


def mean_of_micro_means(loss_sum: torch.Tensor, micro_tokens: torch.Tensor | int,
                        accum_steps: int) -> torch.Tensor:
    """THE BUG, kept to be reproduced: each micro-batch divides by its *own* token count, so a
    token's weight depends on which micro-batch it landed in."""
    return (loss_sum / micro_tokens) / accum_steps


def mean_token_loss(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """The mean loss over every scored token of ``batch`` (the big-batch reference)."""
    return sum_token_loss(model(batch.inputs), batch.targets) / batch.num_targets


def big_batch_backward(model: torch.nn.Module, batch: TokenBatch) -> float:
    """One backward pass over the whole batch; returns its loss. Gradients add to ``.grad``."""
    loss = mean_token_loss(model, batch)
    loss.backward()
    return loss.item()


def accumulate_gradients(model: torch.nn.Module, micro_batches: Sequence[TokenBatch],
                         normalisation: str = "tokens") -> float:
    """Run backward on each micro-batch in turn (one process) and return the loss that the
    accumulated gradient belongs to. Gradients add to ``.grad``; zero them before.

    normalisation: "tokens" (right: divide by the token count of all micro-batches together)
    or "mean_of_means" (the bug: each micro-batch divides by its own count).
    """
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"unknown normalisation {normalisation!r}; use one of {NORMALISATIONS}")
    accum_steps = len(micro_batches)
    total_tokens = sum(mb.num_targets for mb in micro_batches)  # known before any backward
    reported = 0.0
    for mb in micro_batches:
        loss_sum = sum_token_loss(model(mb.inputs), mb.targets)
        if normalisation == "tokens":
            loss = scale_by_global_tokens(loss_sum, total_tokens)
        else:
            loss = mean_of_micro_means(loss_sum, mb.num_targets, accum_steps)
        loss.backward()  # adds this micro-step's share to .grad
        reported += loss.item()
    return reported
