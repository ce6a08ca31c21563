"""Data parallelism by hand, step 1: one all-reduce per gradient (notebook 07).

    model = AllReducePerParameter(module, group)     # rank 0's weights, broadcast to every rank
    for k, (x, y) in enumerate(micro_batches):
        with model.no_sync() if k < accum_steps - 1 else nullcontext():  # talk once per step
            loss = loss_fn(model(x), y) / accum_steps
            loss.backward()                           # gradients add up in .grad, locally
    model.finish_gradient_sync()                      # every .grad: the mean over the ranks
    optimizer.step()                                  # same gradients -> same weights everywhere

Shaped like ``torch.nn.parallel.DistributedDataParallel``: it wraps the module, broadcasts
rank 0's parameters when built, and decides at each ``forward`` whether the coming backward
syncs (``no_sync()`` must wrap the forward too, as in DDP). Unlike DDP, the sync is an explicit
call after ``loss.backward()``, so that you can read what it does. Buckets come next
(``buckets.py``), then buckets sent while backward runs (``overlap.py``).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from course_lib.core.collectives import ring_all_reduce


def broadcast_parameters(module: nn.Module, group=None, src: int = 0) -> None:
    """Give every rank the parameters and buffers of rank ``src``."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=src, group=group)  # overwritten in place


def mark_unused(params: list[nn.Parameter], group) -> list[bool]:
    """For each parameter: True when no rank has its gradient (no rank used it)."""
    used = torch.tensor([p.grad is not None for p in params], dtype=torch.int32,
                        device=params[0].device)  # (params,)
    dist.all_reduce(used, group=group)  # how many ranks used each parameter
    return [count == 0 for count in used.tolist()]


class AllReducePerParameter(nn.Module):
    """Average gradients over the ranks of ``group``: one all-reduce per parameter."""

    def __init__(self, module: nn.Module, group=None, all_reduce=ring_all_reduce,
                 find_unused_parameters: bool = False):
        super().__init__()
        self.module, self.group, self.all_reduce = module, group, all_reduce
        self.world_size = dist.get_world_size(group)
        self.params = [p for p in module.parameters() if p.requires_grad]  # tied ones once
        self.find_unused_parameters = find_unused_parameters  # a parameter no rank used:
        self.require_backward_grad_sync = True  # ... keeps .grad None, as DDP does
        self.sync_pending = False  # a forward outside no_sync() ran: its backward must sync
        broadcast_parameters(module, group)  # every rank starts from rank 0's weights

    def forward(self, *inputs, **kwargs):
        self.sync_pending = self.require_backward_grad_sync  # decided here, as in DDP
        return self.module(*inputs, **kwargs)

    @contextmanager
    def no_sync(self):
        """Inside, forward and backward only accumulate gradients locally."""
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = True

    def grads_to_sync(self) -> list[tuple[nn.Parameter, torch.Tensor]]:
        """Each parameter with the gradient to all-reduce, last layer first (backward's order).
        A parameter this rank did not use counts as a zero gradient: every rank must join
        every all-reduce. Raises if no forward outside no_sync() came first."""
        if not self.sync_pending:
            raise RuntimeError("finish_gradient_sync() without a forward outside no_sync() "
                               "since the last sync: run the last micro-step's forward and "
                               "backward outside no_sync()")
        self.sync_pending = False
        params = self.params[::-1]
        unused = (mark_unused(params, self.group)
                  if self.find_unused_parameters else [False] * len(params))
        return [(p, p.grad if p.grad is not None else torch.zeros_like(p))
                for p, skip in zip(params, unused, strict=True) if not skip]

    def finish_gradient_sync(self) -> None:
        """After ``loss.backward()``: every ``.grad`` becomes the mean over the ranks."""
        for param, grad in self.grads_to_sync():
            self.all_reduce(grad, group=self.group)  # the sum over the ranks, in place
            param.grad = grad.div_(self.world_size)  # / N: the mean, as DDP computes it
