"""One data-parallel training step: broadcast, accumulate, average with my ring (exercise 7.3)."""

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
        loss.backward()  # adds into .grad, no communication
    for p in model.parameters():  # after the last micro-batch only: one sync per step
        ring_all_reduce(p.grad, group)  # the sum over the ranks
        p.grad /= world_size  # the mean: what one process with the whole batch gets
    optimizer.step()


if __name__ == "__main__":  # torchrun --nproc-per-node 3 workspace/my_dp_step.py
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)  # every rank starts from other weights: the broadcast fixes it
    model = torch.nn.Linear(4, 1)
    broadcast_parameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)  # each rank its own data
    batches = [(torch.randn(2, 4), torch.randn(2, 1)) for _ in range(3)]  # K = 3 micro-batches
    data_parallel_step(model, optimizer, batches,
                       lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]))
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    print(f"rank {rank}: weights after one step sum to {float(weights.sum()):.6f}")
    dist.destroy_process_group()
