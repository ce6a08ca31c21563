"""One optimizer step of data-parallel training with gradient accumulation (notebook 07).

``python -m course_lib.train`` calls ``train_step`` once per step on every rank, with ``model``
wrapped by one of our data-parallel wrappers (``data_parallel.py``, ``buckets.py``,
``overlap.py``) or by torch's ``DistributedDataParallel``: the loop is the same for all four.

The loss of a step is the mean over every scored token of the GLOBAL batch. No rank knows how
many tokens the other ranks hold, so the count is all-reduced first; then each micro-step
backpropagates its token-loss sum x world_size / global tokens (the gradient sync divides by
world_size, so it cancels), and the summed, averaged gradient is that of the global mean.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils import clip_grad_norm_

from course_lib.core.accumulation import (
    all_reduce_token_count,
    count_target_tokens,
    mean_of_micro_means,
    scale_by_global_tokens,
    sum_token_loss,
)


def finish_sync(model) -> None:
    """Ours: average the gradients now (or wait for the buckets). DDP did it in backward."""
    if not isinstance(model, DistributedDataParallel):
        model.finish_gradient_sync()


def train_step(model, optimizer, micro_batches, group: dist.ProcessGroup | None,
               max_norm: float = float("inf"), loss_norm: str = "tokens") -> dict:
    """Forward and backward over this rank's micro-batches, sync once, clip, step.

    ``micro_batches``: this rank's part of the global batch (``TokenBatch`` each). Returns the
    global batch's mean loss (all-reduced: the same number on every rank), this rank's own
    mean loss, the gradient norm and the global token count.
    """
    world_size, accum_steps = dist.get_world_size(group), len(micro_batches)
    local_tokens = sum(count_target_tokens(mb.targets) for mb in micro_batches)
    global_tokens = all_reduce_token_count(local_tokens, group)  # before any backward
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), dtype=torch.float64, device=local_tokens.device)
    for k, mb in enumerate(micro_batches):
        last = k == accum_steps - 1
        with nullcontext() if last else model.no_sync():  # talk on the last micro-step only
            token_losses = sum_token_loss(model(mb.inputs), mb.targets)  # (B, T) -> ()
            if loss_norm == "tokens":  # the sync divides by world_size: multiply it back
                loss = scale_by_global_tokens(token_losses, global_tokens, world_size)
            else:  # the bug of notebook 03 (each micro-batch's own mean), kept to show it
                loss = mean_of_micro_means(token_losses, mb.num_targets, accum_steps)
            loss.backward()  # .grad += this micro-step's share, on this rank only
        loss_sum += token_losses.detach().double()  # float64: the log is exact enough
    finish_sync(model)  # every .grad now holds the global batch's gradient, on every rank
    grad_norm = clip_grad_norm_(model.parameters(), max_norm)  # the whole gradient, at last
    optimizer.step()  # the same gradient and weights everywhere: the same step
    rank_loss = float(loss_sum) / int(local_tokens)  # this rank's share only: not the loss
    dist.all_reduce(loss_sum, group=group)  # for logging: every rank's token losses
    return {"loss": float(loss_sum) / int(global_tokens), "rank_loss": rank_loss,
            "grad_norm": float(grad_norm), "tokens": int(global_tokens)}
