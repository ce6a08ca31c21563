"""Pass a token round the ring: rank r sends to rank r + 1 and receives from rank r - 1."""

import torch
import torch.distributed as dist


def pass_token(token, group):
    """Blocking send/recv, ordered so that every send meets a posted recv."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if n == 1:
        return token.clone()  # alone on the ring: my right neighbour is me
    right, left = (rank + 1) % n, (rank - 1) % n
    incoming = torch.empty_like(token)  # same shape and dtype as what the left sends
    if rank % 2 == 0:  # even ranks send first...
        dist.send(token, dst=right, group=group)
        dist.recv(incoming, src=left, group=group)
    else:  # ...odd ranks receive first, so every send finds a recv waiting for it
        dist.recv(incoming, src=left, group=group)
        dist.send(token, dst=right, group=group)
    return incoming


def pass_token_async(token, group):
    """isend/irecv: start both messages, then wait for both; no ordering needed."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if n == 1:
        return token.clone()
    incoming = torch.empty_like(token)
    sending = dist.isend(token, dst=(rank + 1) % n, group=group)
    receiving = dist.irecv(incoming, src=(rank - 1) % n, group=group)
    sending.wait()  # the token may be changed again only once it is sent
    receiving.wait()  # incoming holds the left neighbour's token only after this
    return incoming


if __name__ == "__main__":  # python -m torch.distributed.run --nproc_per_node 3 token_ring.py
    dist.init_process_group("gloo")
    me, size = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor([float(me)])
    got = pass_token(mine, dist.group.WORLD)
    got_async = pass_token_async(mine, dist.group.WORLD)
    ok = got.item() == got_async.item() == (me - 1) % size
    print(f"rank {me}: got {got.item():.0f} and {got_async.item():.0f} from rank "
          f"{(me - 1) % size}: {'ok' if ok else 'WRONG'}")
    dist.destroy_process_group()
