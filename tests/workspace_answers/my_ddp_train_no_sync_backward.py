"""Wrong: no_sync() wraps the backward only, after a forward outside it.

    torchrun --nproc-per-node 3 workspace/my_ddp_train.py

Any world size that gives every rank whole optimizer steps (with the defaults: 1, 2, 3, 4, 6,
12); Gloo on CPUs, NCCL with one GPU per process. ``main()`` starts the process group, calls
``train(Config())`` and ends the group; a checker calls ``train(config)`` inside its own group.
"""

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from course_lib.tasks import toy


@dataclass
class Config:
    """One run. Each optimizer step sees world_size x accum_steps x micro_batch examples."""

    epochs: int = 2  # passes over the dataset
    dataset_size: int = 96  # examples in the dataset
    micro_batch: int = 4  # examples per micro-step on each rank
    accum_steps: int = 2  # micro-steps per optimizer step
    lr: float = 0.1  # SGD's learning rate
    seed: int = 0  # the model's weights, the data and the sampler's shuffle
    checkpoint: str = "workspace/ddp_checkpoint.pt"  # rank 0 writes the model here at the end


def make_dataset(config):
    x, y = toy.two_moons(config.dataset_size, seed=config.seed + 1)  # (size, 2), (size,)
    return TensorDataset(x, y)


def make_model(config):
    return toy.make_mlp(hidden=16, norm="layer", seed=config.seed)  # the same on every rank


def my_device():
    """This rank's GPU when the group runs on NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def train(config):
    """Train in the process group already started. Returns {"model": the trained module
    (without DDP), "losses": the loss of each optimizer step, averaged over every rank}."""
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), my_device()
    model = DDP(make_model(config).to(device),
                device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    dataset = make_dataset(config)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=config.seed)
    loader = DataLoader(dataset, batch_size=config.micro_batch, sampler=sampler)
    losses = []
    for epoch in range(config.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        step_loss = torch.zeros((), device=device)
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % config.accum_steps == 0  # this micro-step ends an optimizer step
            loss = F.cross_entropy(model(x.to(device)), y.to(device)) / config.accum_steps
            with contextlib.nullcontext() if last else model.no_sync():
                loss.backward()
            step_loss += loss.detach()
            if last:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                dist.all_reduce(step_loss)  # the sum of every rank's mean
                losses.append(step_loss.item() / world_size)  # the mean over the global batch
                step_loss = torch.zeros((), device=device)
    if rank == 0:
        torch.save(model.module.state_dict(), config.checkpoint)  # one writer: rank 0
    dist.barrier()  # nobody goes on before the file is complete
    return {"model": model.module, "losses": losses}


def main():
    """What torchrun runs on each rank: start the process group, train, end the group."""
    gpus = torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
    dist.init_process_group("nccl" if gpus else "gloo")  # torchrun set the rest
    if gpus:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    result = train(Config())
    if dist.get_rank() == 0:
        losses = ", ".join(f"{v:.4f}" for v in result["losses"])
        print(f"{dist.get_world_size()} processes, losses per step: {losses}")
    dist.destroy_process_group()


if __name__ == "__main__":  # torchrun --nproc-per-node 3 workspace/my_ddp_train.py
    main()
