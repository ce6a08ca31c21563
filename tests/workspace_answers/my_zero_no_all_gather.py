"""Wrong: never shares the updated chunk."""

import torch
import torch.distributed as dist

from course_lib.core.collectives import chunk_bounds, ring_reduce_scatter


def make_shard_optimizer(flat_params, optimizer_class, group=None, **options):
    """``optimizer_class`` over this rank's chunk of ``flat_params`` only."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    start, end = chunk_bounds(flat_params.numel(), n)[rank]  # my chunk, cut as the ring cuts
    shard = torch.nn.Parameter(flat_params[start:end])  # a view: its updates land in flat_params
    return optimizer_class([shard], **options)  # state for end - start values, not numel


def zero1_step(flat_params, flat_grad, optimizer, group=None):
    """Average the gradients, update my chunk, share it: ``flat_params`` ends up the same on
    every rank. ``flat_grad`` (numel,): this rank's own gradient."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    start, end = chunk_bounds(flat_params.numel(), n)[rank]
    ring_reduce_scatter(flat_grad, group)  # my chunk of flat_grad now holds the sum over ranks
    shard = optimizer.param_groups[0]["params"][0]  # (end - start,): my chunk of flat_params
    shard.grad = flat_grad[start:end] / n  # the mean, as plain data parallelism would use
    optimizer.step()  # updates my chunk of flat_params, in place

