"""Wrong: uses dist.all_reduce instead of writing the ring."""

import torch.distributed as dist


def ring_all_reduce(tensor, group=None):
    dist.all_reduce(tensor, group=group)
    return tensor
