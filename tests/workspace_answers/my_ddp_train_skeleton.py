"""The exercise as handed out. A complete, minimal training script with torch DDP (exercise 9.3).

    torchrun --nproc-per-node 3 workspace/my_ddp_train.py

Any world size that gives every rank whole optimizer steps (with the defaults: 1, 2, 3, 4, 6,
12); Gloo on CPUs, NCCL with one GPU per process. ``main()`` starts the process group, calls
``train(Config())`` and ends the group; a checker calls ``train(config)`` inside its own group.
"""

import contextlib  # noqa: F401
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: F401
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: F401
from torch.utils.data import DataLoader, TensorDataset  # noqa: F401
from torch.utils.data.distributed import DistributedSampler  # noqa: F401

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
    raise NotImplementedError("Exercise 9.3: replace this line with your code")


def main():
    """What torchrun runs on each rank: start the process group, train, end the group."""
    raise NotImplementedError("Exercise 9.3: replace this line with your code")


if __name__ == "__main__":  # torchrun --nproc-per-node 3 workspace/my_ddp_train.py
    main()
