"""Flat gradient buckets: many small gradients packed into a few large tensors (notebook 08).

One all-reduce of a 25 MB tensor is much cheaper than five hundred all-reduces of 50 KB each:
every collective pays a fixed start-up cost (latency) besides the time per byte. So
``course_lib.core.data_parallel`` packs the gradients into flat buckets, as torch DDP does:

    order  = parameters in REVERSE order of registration (backward makes the last layer's
             gradients first, so the first bucket is complete first)
    bucket = consecutive parameters of one dtype and device, closed before it would pass
             ``bucket_bytes`` (a single parameter larger than that gets a bucket of its own)

``plan_buckets`` is the pure rule (easy to test); ``make_buckets`` builds the buffers;
``copy_grad_in`` and ``copy_grads_out`` move gradients between ``.grad`` and a bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

import torch

MB = 1024 * 1024  # bytes in a megabyte, as torch DDP counts bucket_cap_mb


def plan_buckets(nbytes: Sequence[int], keys: Sequence[Hashable],
                 bucket_bytes: int) -> list[list[int]]:
    """Group tensor positions ``0..n-1`` (in the given order) into buckets.

    nbytes[i]: size of tensor i; keys[i]: its (dtype, device), which a flat buffer cannot mix.
    A bucket is closed when the next tensor has another key or would take it past
    ``bucket_bytes``; a tensor larger than ``bucket_bytes`` sits alone in its bucket.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes; "
                         "pass bucket_mb > 0 (torch DDP's default is 25)")
    if len(nbytes) != len(keys):
        raise ValueError(f"{len(nbytes)} sizes but {len(keys)} keys; pass one key per tensor")
    buckets: list[list[int]] = []
    filled = 0  # bytes already in the open bucket
    for i, (size, key) in enumerate(zip(nbytes, keys, strict=True)):
        starts_new = (not buckets or key != keys[buckets[-1][-1]]
                      or filled + size > bucket_bytes)
        if starts_new:
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += size
    return buckets


@dataclass
class Bucket:
    """One flat buffer and the parameters whose gradients it carries."""

    index: int  # position in launch order: bucket 0 is all-reduced first
    params: list[torch.nn.Parameter]  # in the order they lie in the buffer
    names: list[str]  # their names in the model, for timelines and errors
    buffer: torch.Tensor  # (total numel,) the gradients, flat, one after another
    slots: list[torch.Tensor] = field(default_factory=list)  # views of buffer, one per param
    ready: list[bool] = field(default_factory=list)  # gradient copied in during this step
    waiting: int = 0  # gradients not yet copied in during this step

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.waiting = len(self.params)

    def complete(self) -> bool:
        return self.waiting == 0

    def describe(self) -> dict:
        """A JSON-friendly summary: what is in the bucket and how big it is."""
        size = self.buffer.element_size()
        return {"index": self.index, "names": list(self.names), "bytes": self.nbytes,
                "param_bytes": [p.numel() * size for p in self.params],
                "dtype": str(self.buffer.dtype)}


def make_buckets(named_params: Sequence[tuple[str, torch.nn.Parameter]],
                 bucket_bytes: int) -> list[Bucket]:
    """Buckets for the parameters that need gradients, last-registered parameter first."""
    todo = [(n, p) for n, p in named_params if p.requires_grad][::-1]  # backward order
    sizes = [p.numel() * p.element_size() for _, p in todo]
    keys = [(p.dtype, p.device) for _, p in todo]
    buckets = []
    for index, members in enumerate(plan_buckets(sizes, keys, bucket_bytes)):
        params = [todo[i][1] for i in members]
        total = sum(p.numel() for p in params)
        buffer = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)  # (total,)
        pieces = buffer.split([p.numel() for p in params])  # consecutive, (numel_i,) each
        slots = [piece.view(p.shape) for piece, p in zip(pieces, params, strict=True)]
        bucket = Bucket(index, params, [todo[i][0] for i in members], buffer, slots)
        bucket.reset()
        buckets.append(bucket)
    return buckets


def copy_grad_in(bucket: Bucket, i: int, world_size: int) -> None:
    """Copy parameter i's gradient into its slot, divided by ``world_size`` on the way.

    No gradient (the parameter took no part in this rank's forward) counts as zeros, so that
    the bucket is still complete and every rank launches the same collectives.
    """
    if bucket.ready[i]:
        return
    grad, slot = bucket.params[i].grad, bucket.slots[i]
    if grad is None:
        slot.zero_()
    elif grad.is_sparse:
        raise TypeError(f"parameter {bucket.names[i]} has a sparse gradient; buckets hold dense "
                        "gradients only (use nn.Embedding(sparse=False))")
    else:
        torch.div(grad, world_size, out=slot)  # the sum over ranks of g / N is the mean
    bucket.ready[i] = True
    bucket.waiting -= 1


def copy_grads_out(bucket: Bucket, as_views: bool = False) -> None:
    """Hand the averaged gradients in the buffer to each parameter's ``.grad``.

    as_views=False: copy them into ``.grad``. as_views=True: ``.grad`` becomes the slot itself,
    a view of the buffer (no copy; torch DDP's ``gradient_as_bucket_view=True``). The next
    backward then adds into the buffer, or makes a new ``.grad`` after ``zero_grad()``.
    """
    for p, slot in zip(bucket.params, bucket.slots, strict=True):
        if as_views:
            if p.grad is not slot:
                p.grad = slot  # the mean, without a copy
        elif p.grad is None:
            p.grad = slot.clone()  # a copy: the buffer is reused next step
        else:
            p.grad.copy_(slot)


def parameters_in_graph(loss: torch.Tensor) -> set[int]:
    """``id`` of every leaf tensor that ``loss.backward()`` will give a gradient to.

    Walks the autograd graph from ``loss`` back to the leaves (``AccumulateGrad`` nodes hold
    them), as torch DDP does with ``find_unused_parameters=True``. A parameter not found took
    no part in this forward: its gradient will not come, so its bucket need not wait for it.
    """
    found: set[int] = set()
    seen: list = []  # every node visited (kept alive, so that their ids stay unique)
    seen_ids: set[int] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen_ids:
            continue
        seen.append(node)
        seen_ids.add(id(node))
        leaf = getattr(node, "variable", None)  # set on AccumulateGrad nodes only
        if leaf is not None:
            found.add(id(leaf))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found
