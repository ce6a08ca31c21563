"""Data parallelism by hand, step 1: one all-reduce per gradient (notebook 07).

    model = AllReducePerParameter(module, process_group=group)   # rank 0's weights everywhere
    for k, (x, y) in enumerate(micro_batches):
        with model.no_sync() if k < accum_steps - 1 else nullcontext():  # talk once per step
            loss = loss_fn(model(x), y) / accum_steps
            loss.backward()                           # gradients add up in .grad, locally
    model.finish_gradient_sync()                      # every .grad: the mean over the ranks
    optimizer.step()                                  # same gradients -> same weights everywhere

Shaped like ``torch.nn.parallel.DistributedDataParallel``, with its keywords
(``process_group=``, ``find_unused_parameters=``; the bucketed wrappers also take
``bucket_cap_mb=``): it wraps the module; when built, it checks that every rank wraps alike
parameters and broadcasts rank 0's; at each ``forward`` it decides whether the coming backward
syncs (``no_sync()`` must wrap the forward too, as in DDP), and refuses a model changed since it
was wrapped (another dtype or device, a parameter frozen, unfrozen, added or replaced;
``model_change.py``): convert and freeze first, then wrap. Unlike DDP, the sync is an explicit
call after ``loss.backward()``, so that you can read what it does. Buckets come next
(``buckets.py``), then buckets sent while backward runs (``overlap.py``).

The all-reduce, the same default in all three wrappers: ``torch.distributed.all_reduce``, as in
DDP, because it is the fastest here and step 3 needs its ``async_op=True``. Pass
``all_reduce=ring_all_reduce`` (notebook 06's ring, ``collectives.py``) to steps 1 and 2 to
train with the ring; any ``all_reduce(tensor, group=...)`` that leaves the sum in place will do.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from course_lib.core.messages import check_same_shapes
from course_lib.core.model_change import changed_after_wrapping, layout_of, what_changed

SAME_MODEL = ("Every rank must wrap the same model: the same parameters and buffers, with the "
              "same shapes and dtypes, in the same order")


def broadcast_parameters(module: nn.Module, group: dist.ProcessGroup | None = None,
                         src: int = 0) -> None:
    """Give every rank the parameters and buffers of rank ``src`` of ``group``."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, group=group, group_src=src)  # overwritten in place


def mark_unused(params: list[nn.Parameter], group: dist.ProcessGroup | None) -> list[bool]:
    """For each parameter: True when no rank has its gradient (no rank used it)."""
    used = torch.tensor([p.grad is not None for p in params], dtype=torch.int32,
                        device=params[0].device)  # (params,)
    dist.all_reduce(used, group=group)  # how many ranks used each parameter
    return [count == 0 for count in used.tolist()]


def grads_to_sync(params: list[nn.Parameter], group: dist.ProcessGroup | None,
                  find_unused_parameters: bool) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """Each parameter with the gradient to all-reduce, last layer first (backward's order).
    A parameter this rank did not use counts as a zero gradient: every rank must join every
    all-reduce. With ``find_unused_parameters``, one that no rank used is left out."""
    params = params[::-1]
    unused = mark_unused(params, group) if find_unused_parameters else [False] * len(params)
    return [(p, p.grad if p.grad is not None else torch.zeros_like(p))
            for p, skip in zip(params, unused, strict=True) if not skip]


class AllReducePerParameter(nn.Module):
    """Average gradients over the ranks of ``process_group``: one all-reduce per parameter.

    ``all_reduce``: ``dist.all_reduce``, the default of all three wrappers, as in DDP: the
    fastest here, and step 3 needs its ``async_op=True``. ``all_reduce=ring_all_reduce`` trains
    with notebook 06's ring. No shape check per call: the one when built covers every gradient.
    """

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None,
                 all_reduce=dist.all_reduce, find_unused_parameters: bool = False):
        super().__init__()
        self.module, self.process_group, self.all_reduce = module, process_group, all_reduce
        self.world_size = dist.get_world_size(process_group)
        self.params = [p for p in module.parameters() if p.requires_grad]  # tied ones once
        self.names = {id(p): name for name, p in module.named_parameters()}  # for errors
        self.layout = layout_of(module.named_parameters())  # the model as it is wrapped
        # find_unused_parameters: a parameter no rank used keeps .grad None, as in DDP
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True  # False inside no_sync()
        self.sync_pending = False  # a forward outside no_sync() ran: its backward must sync
        tensors = [*module.parameters(), *module.buffers()]
        check_same_shapes(tensors, process_group, SAME_MODEL)  # one small all_gather, once
        broadcast_parameters(module, process_group)  # every rank starts from rank 0's weights

    def forward(self, *inputs, **kwargs):
        change = what_changed(self.layout, self.module.named_parameters())
        if change:
            raise changed_after_wrapping(type(self).__name__, change)
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

    def take_pending_sync(self) -> None:
        """The sync that the last forward asked for starts now; raise if no forward outside
        no_sync() ran since the last sync (no backward made gradients to sync)."""
        if not self.sync_pending:
            raise RuntimeError("finish_gradient_sync() without a forward outside no_sync() "
                               "since the last sync: run the last micro-step's forward and "
                               "backward outside no_sync()")
        self.sync_pending = False

    def finish_gradient_sync(self) -> None:
        """After ``loss.backward()``: every ``.grad`` becomes the mean over the ranks."""
        self.take_pending_sync()
        for param, grad in grads_to_sync(self.params, self.process_group,
                                         self.find_unused_parameters):
            self.all_reduce(grad, group=self.process_group)  # the sum over the ranks, in place
            param.grad = grad.div_(self.world_size)  # / N: the mean, as DDP computes it
