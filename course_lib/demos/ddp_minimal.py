"""A complete, minimal training script with torch DDP: nothing of the course's own machinery
(notebook 09).

    torchrun --standalone --nproc-per-node 2 course_lib/demos/ddp_minimal.py
    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.ddp_minimal

Any world size that divides 256, Gloo on CPUs, NCCL with one GPU per process. Each rank trains
on its own block of every batch; DDP averages the gradients during backward.
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.runtime.launch import save_result  # hands results to a notebook; else nothing
from course_lib.tasks import toy

STEPS, BATCH, LR = 20, 256, 0.1


def main() -> None:
    gpus_enough = torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
    dist.init_process_group("nccl" if gpus_enough else "gloo")  # torchrun set the rest
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])  # which GPU on this machine
    device = torch.device("cuda", local_rank) if gpus_enough else torch.device("cpu")
    model = toy.make_mlp(hidden=32, norm="layer", seed=0).to(device)
    model = DDP(model, device_ids=[local_rank] if gpus_enough else None)  # broadcasts rank 0's
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = toy.two_moons(BATCH * STEPS, seed=1)  # (5120, 2), (5120,): the same on every rank
    per_rank = BATCH // world_size
    losses = []
    for step in range(STEPS):
        rows = slice(step * BATCH + rank * per_rank, step * BATCH + (rank + 1) * per_rank)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[rows].to(device)), y[rows].to(device))  # my block
        loss.backward()  # DDP all-reduces the gradients in buckets, during backward
        optimizer.step()  # the same averaged gradient on every rank: the same weights
        losses.append(loss.item())  # this rank's share of the batch only
    if rank == 0:
        print(f"rank 0 of {world_size}: {STEPS} steps, its own last loss {losses[-1]:.4f}")
    weights = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    save_result({"world_size": world_size, "params": weights.cpu().tolist()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
