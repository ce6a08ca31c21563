"""ZeRO stage 2 (notebook 10b): gradients reduce-scattered while backward runs; each rank
keeps only its shard's gradient and optimizer state.

    optimizer = Zero2(model.parameters(), torch.optim.AdamW, process_group=group, lr=1e-3)
    loss.backward()                     # hooks reduce-scatter each bucket as soon as it is full
    optimizer.step(); optimizer.zero_grad()  # my shard steps; all-gather the parameters

Zero1 (zero.py) keeps every full gradient until the step. Here (as in OverlapDataParallel)
each parameter's hook (``register_post_accumulate_grad_hook``) copies the final gradient into
its bucket and frees ``.grad``; once a bucket is complete, ``bucket_hook`` (by default
``reduce_scatter_bucket``: ``ring_reduce_scatter``, then the mean of my chunk) adds my chunk's
mean to my piece's gradient, and the bucket's buffer is freed. Buckets hold consecutive
parameters of one param group, last layer first (backward's order), padded to N equal chunks;
rank r's inner optimizer steps chunk r of every bucket (element-wise optimizers: SGD, AdamW,
...). Then ``ring_all_gather`` gives every rank every chunk: the parameters are whole again.

Per rank, fp32 AdamW: parameters 4 bytes each, gradients 4/N, optimizer state 8/N. Sent: a
reduce-scatter and an all-gather, (N-1)/N each: one all-reduce, as plain data parallelism
(Gloo's ``reduce_scatter_single`` all-reduces, then slices: twice the bytes).
Every rank reduces the same buckets in the same order, each after every earlier one;
``finish_gradient_sync`` (``step`` calls it) reduces what backward left.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from course_lib.core.buckets import MB, plan_buckets
from course_lib.core.collectives import ring_all_gather, ring_reduce_scatter
from course_lib.core.messages import ByteCounter


@dataclass
class Bucket:
    """Consecutive parameters, as views of one padded flat tensor, and this rank's chunk."""

    params: list[nn.Parameter]
    offsets: list[int]  # where each parameter starts in flat
    flat: torch.Tensor  # (N*s,) the parameters' values, then zeros
    piece: nn.Parameter  # (s,) my chunk of flat (a view): what the inner optimizer steps
    grads: torch.Tensor | None = None  # (N*s,) while backward fills it; None otherwise
    waiting: int = 0  # gradients not in yet in this backward


def make_bucket(params: list[nn.Parameter], rank: int, world_size: int) -> Bucket:
    numel = sum(p.numel() for p in params)
    s = -(-numel // world_size)  # ceil(numel / N): the chunk of each rank
    flat = torch.zeros(world_size * s, dtype=params[0].dtype, device=params[0].device)
    offsets = [sum(p.numel() for p in params[:i]) for i in range(len(params))]
    for p, start in zip(params, offsets, strict=True):
        flat[start:start + p.numel()] = p.detach().reshape(-1)
        p.data = flat[start:start + p.numel()].view_as(p)  # same numbers, flat's memory
    piece = nn.Parameter(flat[rank * s:(rank + 1) * s])  # (s,) a view: steps update flat
    return Bucket(params, offsets, flat, piece, waiting=len(params))


def reduce_scatter_bucket(grads: torch.Tensor, piece: nn.Parameter,
                          group: dist.ProcessGroup | None = None,
                          counter: ByteCounter | None = None) -> None:
    """ZeRO-2's hook: ``grads`` (N*s,), this rank's gradient of a complete bucket -> the mean
    over the ranks of my chunk, added to ``piece.grad`` (s,)."""
    rank, n, s = dist.get_rank(group), dist.get_world_size(group), piece.numel()
    ring_reduce_scatter(grads, group, counter)  # my chunk: the sum over the ranks
    mean = grads[rank * s:(rank + 1) * s] / n  # (s,) a new tensor: grads can be freed
    piece.grad = mean if piece.grad is None else piece.grad + mean  # several backward, one step


class Zero2(torch.optim.Optimizer):
    """An optimizer that reduce-scatters gradients in backward and keeps 1/N of them."""

    def __init__(self, params, optimizer_class=torch.optim.AdamW,
                 process_group: dist.ProcessGroup | None = None,
                 bucket_cap_mb: float = 25.0, counter: ByteCounter | None = None,
                 bucket_hook=None, **defaults):
        super().__init__(params, defaults)
        self.process_group, self.counter = process_group, counter  # counter: what I send
        self.bucket_hook = bucket_hook or partial(reduce_scatter_bucket, counter=counter)
        self.rank, self.world_size = dist.get_rank(process_group), dist.get_world_size(
            process_group)
        self.buckets, inner_groups = [], []
        for group in self.param_groups:  # a bucket never mixes groups (lr, weight decay, ...)
            last_first = group["params"][::-1]  # backward makes the last layer's first
            plan = plan_buckets([p.numel() * p.element_size() for p in last_first],
                                [(p.dtype, p.device) for p in last_first], bucket_cap_mb * MB)
            mine = [make_bucket([last_first[i] for i in b], self.rank, self.world_size)
                    for b in plan]
            self.buckets += mine
            inner_groups.append({**group, "params": [b.piece for b in mine]})
        self.inner = optimizer_class(inner_groups, **defaults)
        for mine, group in zip(self.inner.param_groups, self.param_groups, strict=True):
            group.update({k: v for k, v in mine.items() if k not in group})  # its defaults
        self.place = {p: (b, start) for b in self.buckets  # parameter -> its bucket, offset
                      for p, start in zip(b.params, b.offsets, strict=True)}
        self.reduced = 0  # buckets reduce-scattered in this backward, in order
        for p in self.place:
            p.register_post_accumulate_grad_hook(self.gradient_ready)

    def gradient_ready(self, param: nn.Parameter) -> None:
        """Hook: copy ``param.grad`` into its bucket and free it; reduce what is complete."""
        bucket, start = self.place[param]
        if bucket.grads is None:
            bucket.grads = torch.zeros_like(bucket.flat)  # (N*s,) zeros: padding adds nothing
        bucket.grads[start:start + param.numel()].copy_(param.grad.reshape(-1))
        param.grad = None  # the full-size gradient lives on only in the bucket, until reduced
        bucket.waiting -= 1
        while self.reduced < len(self.buckets) and self.buckets[self.reduced].waiting == 0:
            self.reduce_scatter(self.buckets[self.reduced])  # strictly in order, on every rank

    def reduce_scatter(self, bucket: Bucket) -> None:
        """The bucket's gradients through the hook; the full-size buffer is freed."""
        grads = bucket.grads if bucket.grads is not None else torch.zeros_like(bucket.flat)
        self.bucket_hook(grads, bucket.piece, self.process_group)  # my chunk's mean, kept
        bucket.grads, bucket.waiting = None, len(bucket.params)  # ready for the next backward
        self.reduced = (self.reduced + 1) % len(self.buckets)  # all done: the next backward

    def finish_gradient_sync(self) -> None:
        """After backward: reduce-scatter, in order, the buckets it left incomplete."""
        if self.reduced == 0 and all(b.grads is None for b in self.buckets):
            return  # every bucket was reduced in backward (or no backward came)
        for bucket in self.buckets[self.reduced:]:
            self.reduce_scatter(bucket)  # a missing gradient counts as zeros

    @torch.no_grad()
    def step(self, closure=None):
        """Step my pieces, then all-gather every bucket. Returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.finish_gradient_sync()
        for mine, group in zip(self.inner.param_groups, self.param_groups, strict=True):
            mine.update({k: v for k, v in group.items() if k != "params"})  # lr, ...
        self.inner.step()  # updates my chunk of each flat, in place
        for bucket in self.buckets:
            ring_all_gather(bucket.flat, self.process_group, self.counter)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none)  # my pieces' gradients; the parameters have none

    def state_dict(self) -> dict:
        return self.inner.state_dict()  # this rank's shard: each rank saves its own

    def load_state_dict(self, state_dict: dict) -> None:
        self.inner.load_state_dict(state_dict)
