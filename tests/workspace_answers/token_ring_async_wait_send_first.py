"""Wrong: waits for the isend before starting the irecv: blocking again, and a deadlock."""

import torch
import torch.distributed as dist


def pass_token_async(token, group):
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if n == 1:
        return token.clone()
    incoming = torch.empty_like(token)
    dist.isend(token, dst=(rank + 1) % n, group=group).wait()
    dist.irecv(incoming, src=(rank - 1) % n, group=group).wait()
    return incoming
