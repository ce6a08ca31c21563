"""Data parallelism by hand, step 2: gradients packed into flat buckets (notebook 08).

One all-reduce of a 25 MB tensor costs far less than five hundred all-reduces of 50 kB: each
collective pays a fixed start-up cost (latency) besides the time per byte. So, as torch DDP
does, the gradients are copied into a few flat tensors ("buckets") and each bucket is
all-reduced once:

    model = BucketedDataParallel(module, process_group=group, bucket_cap_mb=25)  # as step 1
    ...; loss.backward(); model.finish_gradient_sync(); optimizer.step()

Buckets hold consecutive parameters in REVERSE order of registration (backward makes the last
layer's gradients first) of one dtype and device, closed before they would pass
``bucket_cap_mb`` (a parameter larger than that sits alone). ``bucket_cap_mb=None``: one bucket
for everything (DDP reads None as its default, 25).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from course_lib.core.data_parallel import AllReducePerParameter, grads_to_sync

MB = 1024 * 1024  # bytes in a megabyte, as torch DDP counts bucket_cap_mb


def plan_buckets(nbytes: Sequence[int], keys: Sequence[Hashable],
                 cap_bytes: float) -> list[list[int]]:
    """Group tensors ``0..n-1`` (in order) into buckets: a new bucket when the next tensor has
    another key (dtype, device) or would take the open bucket past ``cap_bytes``."""
    if not cap_bytes > 0:
        raise ValueError(f"the bucket size must be positive, got {cap_bytes} bytes; pass "
                         "bucket_cap_mb > 0 (torch DDP uses 25) or None for one bucket")
    buckets, filled = [], 0
    for i, (size, key) in enumerate(zip(nbytes, keys, strict=True)):
        if not buckets or key != keys[buckets[-1][-1]] or filled + size > cap_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += size
    return buckets


@dataclass
class Bucket:
    """One flat tensor and the parameters whose gradients travel in it."""

    params: list[nn.Parameter]  # in the order they lie in the buffer
    buffer: torch.Tensor  # (total numel,) their gradients, one after another
    slots: list[torch.Tensor]  # views of buffer, one per parameter, in its shape
    waiting: int = 0  # gradients not copied in yet in this step (overlap.py counts them)
    position: dict[int, int] = field(init=False)  # id(parameter) -> its index in params

    def __post_init__(self) -> None:
        self.position = {id(p): i for i, p in enumerate(self.params)}  # once, not per hook

    def slot(self, param: nn.Parameter) -> torch.Tensor:
        return self.slots[self.position[id(param)]]


def make_buckets(params: list[nn.Parameter], bucket_cap_mb: float | None) -> list[Bucket]:
    """Buckets for ``params`` in the given order (pass them last layer first)."""
    cap = float("inf") if bucket_cap_mb is None else bucket_cap_mb * MB
    sizes = [p.numel() * p.element_size() for p in params]
    keys = [(p.dtype, p.device) for p in params]
    buckets = []
    for members in plan_buckets(sizes, keys, cap):
        chosen = [params[i] for i in members]
        buffer = torch.zeros(sum(p.numel() for p in chosen), dtype=chosen[0].dtype,
                             device=chosen[0].device)  # (total numel,)
        pieces = buffer.split([p.numel() for p in chosen])  # (numel_i,) each, consecutive
        slots = [x.view(p.shape) for x, p in zip(pieces, chosen, strict=True)]
        buckets.append(Bucket(chosen, buffer, slots))
    return buckets


class BucketedDataParallel(AllReducePerParameter):
    """Average gradients over the ranks: after backward, one all-reduce per bucket.

    ``all_reduce``: ``dist.all_reduce``, the default of all three wrappers, as in DDP: the
    fastest here, and step 3 needs its ``async_op=True``. ``all_reduce=ring_all_reduce`` sends
    each bucket round notebook 06's ring."""

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None,
                 bucket_cap_mb: float | None = 25.0, all_reduce=dist.all_reduce,
                 find_unused_parameters: bool = False):
        super().__init__(module, process_group, all_reduce, find_unused_parameters)
        self.buckets = make_buckets(self.params[::-1], bucket_cap_mb)  # NEW: last layer first

    def finish_gradient_sync(self) -> None:
        """After ``loss.backward()``: every ``.grad`` becomes the mean over the ranks."""
        self.take_pending_sync()
        grads = dict(grads_to_sync(self.params, self.process_group,
                                   self.find_unused_parameters))  # parameter -> its gradient
        for bucket in self.buckets:
            for param, slot in zip(bucket.params, bucket.slots, strict=True):
                if param in grads:
                    slot.copy_(grads[param])  # NEW: many gradients into one flat tensor
                else:
                    slot.zero_()  # no rank used it: it stays out of the result
            self.all_reduce(bucket.buffer, group=self.process_group)  # NEW: one per bucket
            bucket.buffer.div_(self.world_size)  # the sum / N: the mean
            copy_out(bucket, skip=[p for p in bucket.params if p not in grads])


def copy_out(bucket: Bucket, skip: list[nn.Parameter]) -> None:
    """Each parameter's mean gradient from the bucket into its ``.grad`` (a copy: the bucket
    is reused next step). ``skip``: parameters no rank used, whose ``.grad`` stays None."""
    for param, slot in zip(bucket.params, bucket.slots, strict=True):
        if any(param is s for s in skip):
            continue
        if param.grad is None:
            param.grad = slot.clone()
        else:
            param.grad.copy_(slot)
