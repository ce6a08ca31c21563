"""Wrong: takes rank and size from the default group, not from the group it is given."""

import torch
import torch.distributed as dist


def pass_token(token, group):
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return token.clone()
    incoming = torch.empty_like(token)
    if rank % 2 == 0:
        dist.send(token, dst=(rank + 1) % n)
        dist.recv(incoming, src=(rank - 1) % n)
    else:
        dist.recv(incoming, src=(rank - 1) % n)
        dist.send(token, dst=(rank + 1) % n)
    return incoming
