"""The exercise as handed out."""

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401

from course_lib.core.collectives import ring_all_reduce as library_ring
from course_lib.runtime.workspace import mine_or_library

ring_all_reduce = mine_or_library("my_ring", "ring_all_reduce", "6.3", library_ring)


def broadcast_parameters(model, group=None):
    raise NotImplementedError("Exercise 7.3: replace this line with your code")


def data_parallel_step(model, optimizer, micro_batches, loss_fn, group=None):
    raise NotImplementedError("Exercise 7.3: replace this line with your code")
