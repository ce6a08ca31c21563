"""Wrong: averages the gradients after every micro-batch's backward."""

import torch
import torch.distributed as dist

from course_lib.core.collectives import ring_all_reduce as library_ring
from course_lib.runtime.workspace import mine_or_library

# my ring of exercise 6.3 once it passed, else the library's
ring_all_reduce = mine_or_library("my_ring", "ring_all_reduce", "6.3", library_ring)


def broadcast_parameters(model, group=None):
    """Give every rank rank 0's parameters, in place."""
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=0, group=group)  # rank 0 sends, the others receive


def data_parallel_step(model, optimizer, micro_batches, loss_fn, group=None):
    """One optimizer step on this rank's micro-batches; the gradients averaged over ranks."""
    world_size, accum_steps = dist.get_world_size(group), len(micro_batches)
    optimizer.zero_grad()
    for batch in micro_batches:
        loss = loss_fn(model, batch) / accum_steps  # K means add up to one mean
        loss.backward()
        for p in model.parameters():  # keep every rank's .grad averaged as it grows
            ring_all_reduce(p.grad, group)
            p.grad /= world_size
    optimizer.step()

