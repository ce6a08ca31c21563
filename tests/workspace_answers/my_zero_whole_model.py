"""Wrong: plain data parallelism: an all-reduce and an optimizer over every value."""

import torch
import torch.distributed as dist

from course_lib.core.collectives import ring_all_reduce


def make_shard_optimizer(flat_params, optimizer_class, group=None, **options):
    return optimizer_class([torch.nn.Parameter(flat_params)], **options)  # every value


def zero1_step(flat_params, flat_grad, optimizer, group=None):
    ring_all_reduce(flat_grad, group)  # the sum over the ranks, everywhere
    params = optimizer.param_groups[0]["params"][0]
    params.grad = flat_grad / dist.get_world_size(group)
    optimizer.step()
