"""Wrong: divides by the number of ranks at the end: the mean, not the sum."""

import torch
import torch.distributed as dist


def ring_all_reduce(tensor, group=None):
    """Leave the sum over all ranks in ``tensor``, in place, on every rank."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    right, left = (rank + 1) % n, (rank - 1) % n  # my neighbours on the ring
    flat = tensor.reshape(-1)  # (numel,): a view, or a copy if tensor is not contiguous
    chunks = torch.tensor_split(flat, n)  # n views of flat, (numel/n,) each, the first longer

    def exchange(send_chunk, recv_into):  # send right and receive from the left at once
        sending = dist.isend(send_chunk, dst=right, group=group)
        receiving = dist.irecv(recv_into, src=left, group=group)
        sending.wait()
        receiving.wait()

    # Reduce-scatter: at step s I pass chunk r-s-1 on and add the left's chunk r-s-2 to mine,
    # so after n-1 steps my chunk r holds the sum over every rank.
    for step in range(n - 1):
        mine = chunks[(rank - step - 2) % n]  # the chunk the left neighbour sends me now
        incoming = torch.empty_like(mine)  # (chunk,) lands here first, then is added
        exchange(chunks[(rank - step - 1) % n], incoming)
        mine += incoming  # my partial sum + everything the left has summed so far
    # All-gather: pass the finished chunks round; each arrives straight in its place.
    for step in range(n - 1):
        exchange(chunks[(rank - step) % n], chunks[(rank - step - 1) % n])
    if flat.data_ptr() != tensor.data_ptr():  # reshape made a copy: put the sum back
        tensor.copy_(flat.view(tensor.shape))
    tensor /= n  # average the gradients
    return tensor

