"""ZeRO stage 1: each rank keeps the optimizer state of its own chunk only (exercise 10.4)."""

import torch
import torch.distributed as dist

from course_lib.core.collectives import chunk_bounds, ring_all_gather, ring_reduce_scatter


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
    ring_all_gather(flat_params, group)  # every chunk from its owner, to every rank


if __name__ == "__main__":  # torchrun --nproc-per-node 3 workspace/my_zero.py
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    params = torch.zeros(10)  # the same on every rank
    optimizer = make_shard_optimizer(params, torch.optim.AdamW, lr=0.1)
    grad = torch.full((10,), float(rank + 1))  # each rank its own gradient
    zero1_step(params, grad, optimizer)
    state = sum(v.numel() for s in optimizer.state.values() for v in s.values() if v.dim() > 0)
    print(f"rank {rank}: params[:3] = {params[:3].tolist()}, optimizer state: {state} numbers")
    dist.destroy_process_group()
