"""ZeRO stage 1 from the two halves of the ring: each rank keeps 1/N of the optimizer state
(notebook 10, beyond data parallel).

    from course_lib.core.zero import Zero1
    opt = Zero1(model.parameters(), group, torch.optim.AdamW, lr=1e-3)
    loss.backward()               # as in plain data parallelism: local gradients
    opt.step(max_norm=1.0)        # reduce-scatter, clip, update my shard, all-gather
    opt.zero_grad()
    opt.state_bytes()             # optimizer state on this rank: about 1/N of plain DP's

Plain data parallelism keeps a whole AdamW on every rank: two more numbers per parameter
(``exp_avg``, ``exp_avg_sq``), on every rank, the same everywhere. ZeRO-1 stops repeating them:

    flat  = every parameter in one vector, (numel,); rank r OWNS chunk r = chunk_bounds(...)[r]
    1. ring_reduce_scatter(flat grads)   chunk r of rank r now holds the SUM over ranks
    2. divide by N                       the mean, as an all-reduce would have given
    3. AdamW on chunk r only             its state has numel / N entries
    4. ring_all_gather(flat params)      every rank gets every updated chunk from its owner

Steps 1 and 4 are the two halves of the ring all-reduce (``course_lib.core.collectives``): ZeRO-1
sends exactly the bytes of one all-reduce, and saves (N - 1) / N of the optimizer state.

The model's parameters become views into one flat buffer (``p.data`` is re-pointed), so the
all-gather writes straight into them and the optimizer updates its chunk in place. Gradients
are copied into a flat buffer at each step (real implementations make them views too).
Any world size (1 included), CPU tensors under Gloo, GPU tensors under NCCL.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from course_lib.core.collectives import (
    ByteCounter,
    chunk_bounds,
    ring_all_gather,
    ring_reduce_scatter,
)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor the optimizer keeps (AdamW: exp_avg, exp_avg_sq, step)."""
    return sum(value.numel() * value.element_size()
               for state in optimizer.state.values() for value in state.values()
               if isinstance(value, torch.Tensor))


def flatten_into_views(params: list[nn.Parameter]) -> torch.Tensor:
    """Copy the parameters into one flat buffer and make each parameter a view into it."""
    first = params[0]
    odd = [tuple(p.shape) for p in params if p.dtype != first.dtype or p.device != first.device]
    if odd:
        raise ValueError(f"Zero1 puts every parameter in one flat buffer, so they need one "
                         f"dtype and device; parameters of shapes {odd[:3]} differ from "
                         f"{first.dtype} on {first.device}: convert the model first")
    flat = torch.cat([p.detach().reshape(-1) for p in params])  # (numel,)
    offset = 0
    for p in params:
        p.data = flat[offset:offset + p.numel()].view_as(p)  # same numbers, shared storage
        offset += p.numel()
    return flat


class Zero1:
    """An optimizer whose state lives on the owner of each chunk of the flat parameters."""

    def __init__(self, params, group=None, optimizer_class=torch.optim.AdamW, **options):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("Zero1 got no parameter with requires_grad=True")
        self.group = dist.group.WORLD if group is None else group
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.flat = flatten_into_views(self.params)  # (numel,) every rank, every parameter
        self.flat_grad = torch.zeros_like(self.flat)  # (numel,)
        self.start, self.end = chunk_bounds(self.flat.numel(), self.world_size)[self.rank]
        # the chunk this rank owns: a Parameter that shares memory with self.flat
        self.shard = nn.Parameter(self.flat[self.start:self.end], requires_grad=True)
        self.optimizer = optimizer_class([self.shard], **options)  # state for 1/N only
        self.counter = ByteCounter()  # bytes this rank sent, over every step

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, max_norm: float | None = None) -> float:
        """Average gradients, update my chunk, share it; returns the global gradient norm."""
        offset = 0
        for p in self.params:
            piece = self.flat_grad[offset:offset + p.numel()]  # p's place in the flat vector
            if p.grad is None:
                piece.zero_()  # unused on this rank: contributes nothing to the sum
            else:
                piece.copy_(p.grad.reshape(-1))
            offset += p.numel()
        ring_reduce_scatter(self.flat_grad, group=self.group, counter=self.counter)
        my_grad = self.flat_grad[self.start:self.end]
        my_grad.div_(self.world_size)  # the sum over ranks / N: the mean gradient
        norm = self.global_grad_norm(my_grad)
        if max_norm is not None and norm > max_norm:
            my_grad.mul_(max_norm / (norm + 1e-6))  # as torch.nn.utils.clip_grad_norm_
        self.shard.grad = my_grad
        self.optimizer.step()  # updates self.flat[start:end] in place
        self.shard.grad = None
        ring_all_gather(self.flat, group=self.group, counter=self.counter)  # every chunk
        return norm

    def global_grad_norm(self, my_grad: torch.Tensor) -> float:
        """The norm of the whole mean gradient, from each rank's chunk: sqrt of the summed
        squares (norms do not add; squares do)."""
        squares = (my_grad.double() ** 2).sum().reshape(1)  # (1,) my chunk's share
        dist.all_reduce(squares, group=self.group)
        return math.sqrt(float(squares))

    def state_bytes(self) -> int:
        """Optimizer state on this rank (measured from the tensors the optimizer holds)."""
        return state_bytes(self.optimizer)

    def owned(self) -> tuple[int, int]:
        """``(start, end)`` of the flat parameters whose optimizer state lives here."""
        return self.start, self.end
