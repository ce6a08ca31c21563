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
Every rank reduces the same buckets in the same order, each after every earlier one. Each
backward is reduced on its own: the first hook of a backward queues ``end_of_backward`` on
autograd's engine (as DDP and FSDP2 do), which reduce-scatters the buckets this backward left
incomplete, a missing gradient counting as zeros. So under accumulation every micro-step's
gradients reach ``piece.grad``, a parameter unused in one micro-step included. The flat
buffers are fixed when ``Zero2`` is built: ``step`` refuses parameters that are no longer views
of them, or frozen since (convert, move and freeze the model first).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

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
        self.sharded = False  # add_param_group works until the buckets are made, below
        super().__init__(params, defaults)
        self.process_group, self.counter = process_group, counter  # counter: what I send
        self.bucket_hook = bucket_hook or partial(reduce_scatter_bucket, counter=counter)
        self.rank, self.world_size = dist.get_rank(process_group), dist.get_world_size(
            process_group)
        self.buckets, inner_groups = [], []
        for group in self.param_groups:  # a bucket never mixes groups (lr, weight decay, ...)
            trained = [p for p in group["params"] if p.requires_grad]  # frozen: left alone
            last_first = trained[::-1]  # backward makes the last layer's first
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
        self.names = {p: f"param group {g}, parameter {i} (shape {tuple(p.shape)})"
                      for g, group in enumerate(self.param_groups)
                      for i, p in enumerate(group["params"])}  # for errors
        self.built = {p: (p.data_ptr(), p.dtype, p.requires_grad) for p in self.names}
        self.reduced = 0  # buckets reduce-scattered in this backward, in order
        self.in_backward = False  # True from a backward's first gradient to its end
        for p in self.place:
            p.register_post_accumulate_grad_hook(self.gradient_ready)
        self.sharded = True

    def add_param_group(self, param_group: dict) -> None:
        """Only while building: every parameter's place in a bucket is fixed after."""
        if self.sharded:
            raise RuntimeError("Zero2 cannot take a parameter group once built: every "
                               "parameter already has its place in a bucket. Pass every group "
                               "to Zero2(...) when you build it")
        super().add_param_group(param_group)

    def gradient_ready(self, param: nn.Parameter) -> None:
        """Hook: copy ``param.grad`` into its bucket and free it; reduce what is complete."""
        if not self.in_backward:  # its first gradient: reduce what is left when it ends
            self.in_backward = True
            Variable._execution_engine.queue_callback(self.end_of_backward)
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
        self.reduced += 1

    def end_of_backward(self) -> None:
        """Reduce-scatter, in order, the buckets this backward left (a parameter it did not
        reach counts as zeros); the next backward starts afresh."""
        for bucket in self.buckets[self.reduced:]:
            self.reduce_scatter(bucket)
        self.reduced, self.in_backward = 0, False

    def finish_gradient_sync(self) -> None:
        """After backward: every bucket was reduced by then (``end_of_backward``); kept so that
        a loop written for the course's other wrappers runs unchanged."""
        if self.in_backward:  # a backward's end did not come (it raised): reduce what it left
            self.end_of_backward()

    def check_unchanged(self) -> None:
        """Refuse to step parameters that are no longer views of the flat buffers, or whose
        dtype or requires_grad changed since Zero2 was built: the step would miss them."""
        for p in self.names:  # in the order the parameters were given
            address, dtype, trained = self.built[p]
            if (p.data_ptr(), p.dtype, p.requires_grad) != (address, dtype, trained):
                if trained != p.requires_grad:
                    now = ("frozen (requires_grad_(False)): it would still get a gradient of "
                           "zeros, which momentum and weight decay act on" if trained else
                           "trained (requires_grad_(True)): no bucket holds it, nothing would "
                           "step it")
                else:
                    now = (f"{p.dtype}, in other memory: the step would update Zero2's flat "
                           "buffer, not it")
                raise RuntimeError(f"Zero2: {self.names[p]} changed after Zero2 was built; it "
                                   f"is now {now}. Make every change first (model.to(dtype or "
                                   "device), requires_grad_(), p.data = ...), then build Zero2")

    @torch.no_grad()
    def step(self, closure=None):
        """Step my pieces, then all-gather every bucket. Returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.check_unchanged()
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
