"""Wrong: looks the right neighbour up in a list, which the last rank runs off the end of."""

import torch
import torch.distributed as dist


def pass_token(token, group):
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    ranks = list(range(n))
    left = ranks[rank - 1]
    right = ranks[rank + 1]
    incoming = torch.empty_like(token)
    if rank % 2 == 0:
        dist.send(token, dst=right, group=group)
        dist.recv(incoming, src=left, group=group)
    else:
        dist.recv(incoming, src=left, group=group)
        dist.send(token, dst=right, group=group)
    return incoming
