"""Wrong: the library's data-parallel wrapper does the work."""

from contextlib import nullcontext

import torch
import torch.distributed as dist

from course_lib.core.data_parallel import AllReducePerParameter


def broadcast_parameters(model, group=None):
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=0, group=group)


def data_parallel_step(model, optimizer, micro_batches, loss_fn, group=None):
    wrapped = AllReducePerParameter(model, group)  # averages the gradients for me
    optimizer.zero_grad()
    for k, batch in enumerate(micro_batches):
        last = k == len(micro_batches) - 1
        with nullcontext() if last else wrapped.no_sync():
            (loss_fn(wrapped, batch) / len(micro_batches)).backward()
    wrapped.finish_gradient_sync()
    optimizer.step()
