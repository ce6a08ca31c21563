"""The numbers under ``fully_shard`` (notebook 10, ZeRO-3): one wrapped module's parameters
kept as 1/N of one flat vector per rank, whole only while the module computes.

    the parameters p1, p2, ... (numel values), flattened in order, padded with zeros to
    N x s values, s = ceil(numel / N); rank r keeps values [r*s, (r+1)*s):
    shard  (s,)    nn.Parameter in the parameters' dtype: what the optimizer steps; its .grad
                   (s,) is the mean over the ranks of those values' gradients
    full   (N*s,)  in param_dtype: gathered before the module computes, freed right after;
                   each parameter is a view of it meanwhile

``reshard()`` frees ``full``'s memory but keeps the tensor (0 bytes), so the views autograd
saved for backward see the numbers again after the next ``unshard()``. ``full`` is one autograd
leaf: every use of every view adds its gradient into ``full.grad``, and autograd calls
``reduce_grad`` once per backward, when all are in (a module used twice is complete only after
its first use's backward). There rank r keeps the mean of chunk r and frees the rest. With
``requires_gradient_sync`` False (FSDP2's ``set_requires_gradient_sync(False)``) it is not
called: ``full.grad`` stays, and the next backward adds to it, until one with sync reduces all.

Collectives (torch 2.13). All-gather: ``dist.all_gather_single``, a ring on Gloo as on NCCL
(each rank sends N-1 shards to its neighbour), which can run in the background (prefetch.py).
Reduce-scatter: Gloo has none; ``dist.reduce_scatter_single`` (and the list form) runs Gloo's
all-reduce on a full-size copy and keeps a slice: twice the bytes. So we use the course's
``ring_reduce_scatter`` ((N-1)/N of the tensor sent), which blocks backward while it runs.
``counter`` counts what this rank sends: a module gathered for forward and for backward and
reduce-scattered once sends 3 x (N-1)/N of its bytes per step, 1.5x plain data parallelism's
all-reduce, 2 x (N-1)/N.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from course_lib.core.collectives import ring_reduce_scatter
from course_lib.core.messages import ByteCounter


def parameter_places(module: nn.Module) -> dict[nn.Parameter, list[tuple[nn.Module, str, str]]]:
    """Each parameter of ``module`` (not the shards of wrapped sub-modules) with the places that
    hold it: (owner, attribute, name from ``module``). A tied weight has two."""
    places: dict[nn.Parameter, list] = {}
    for prefix, owner in module.named_modules():
        for attribute, param in owner._parameters.items():
            if param is not None and not getattr(param, "is_flat_shard", False):
                name = f"{prefix}.{attribute}" if prefix else attribute
                places.setdefault(param, []).append((owner, attribute, name))
    return places


class FlatShard:
    """One wrapped module's parameters: this rank's shard, and the full vector while needed."""

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None,
                 param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None):
        self.process_group, self.counter = process_group, ByteCounter()  # what I sent for it
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.places = list(parameter_places(module).items())
        params = [p for p, _ in self.places]
        if not params or len({(p.dtype, p.device, p.requires_grad) for p in params}) > 1:
            raise ValueError("fully_shard keeps a module's parameters in one flat vector: it "
                             "needs one or more, of one dtype, device and requires_grad")
        self.shapes, self.numels = [p.shape for p in params], [p.numel() for p in params]
        numel, n = sum(self.numels), self.world_size
        self.shard_numel = s = -(-numel // n)  # ceil(numel / N): N shards hold every value
        self.padding = n * s - numel
        flat = torch.zeros(n * s, dtype=params[0].dtype, device=params[0].device)  # (N*s,)
        torch.cat([p.detach().reshape(-1) for p in params], out=flat[:numel])
        self.shard = nn.Parameter(flat[self.rank * s:(self.rank + 1) * s].clone(),  # (s,)
                                  requires_grad=params[0].requires_grad)
        self.shard.is_flat_shard = True  # parameter_places and full_state_dict know it
        self.param_dtype = param_dtype or flat.dtype  # compute and all-gather in this dtype
        self.reduce_dtype = reduce_dtype or self.param_dtype  # reduce-scatter in this one
        self.full = torch.empty(n * s, dtype=self.param_dtype, device=flat.device)  # (N*s,)
        self.reshard()  # no memory until the module computes
        self.pending = None  # the handle of an all-gather started early, not yet waited for
        self.requires_gradient_sync = True  # False: backward keeps full.grad, reduces nothing
        if self.shard.requires_grad:
            self.full.requires_grad_(True)  # a leaf: the views' gradients add up in full.grad
            self.full.register_post_accumulate_grad_hook(self.gradient_done)
        for _, where in self.places:
            for owner, attribute, _ in where:
                del owner._parameters[attribute]  # the views take their place when computing

    def is_unsharded(self) -> bool:
        return self.full.untyped_storage().nbytes() > 0

    @torch.no_grad()
    def unshard(self, async_op: bool = False) -> dist.Work | None:
        """All-gather ``full`` from every rank's shard, cast to param_dtype before it is sent
        (bf16: half the bytes). Returns the collective's handle with ``async_op``."""
        if self.is_unsharded():
            return None
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        mine = self.shard.detach().to(self.param_dtype)  # (s,)
        for _ in range(self.world_size - 1):
            self.counter.add(mine)  # the ring: N-1 shards out of this rank
        # .data: the numbers change, not autograd's version counter: saved views stay usable
        return dist.all_gather_single(self.full.data, mine, group=self.process_group,
                                      async_op=async_op)

    def reshard(self) -> None:
        """Free ``full``'s memory (the tensor and its views stay, with nothing behind them)."""
        self.full.untyped_storage().resize_(0)

    def wait_for_unshard(self) -> None:
        """Wait for an all-gather started early (prefetch.py, ``module.unshard(async_op=True)``)."""
        if self.pending is not None:
            self.pending.wait()  # its numbers are in full now
            self.pending = None

    # The moments fully_shard's hooks call (prefetch.py adds to them)
    def before_forward(self) -> None:
        self.wait_for_unshard()
        self.unshard()
        self.install_views()

    def after_forward(self, reshard: bool) -> None:
        if reshard:
            self.reshard()

    def before_backward(self) -> None:
        self.wait_for_unshard()
        self.unshard()  # the views saved for backward see the numbers again

    def gradient_done(self, full: torch.Tensor) -> None:
        """Hook: every use's gradient is in ``full.grad``. Reduce it, or keep it whole while
        gradient sync is off (the next backward adds to it)."""
        if self.requires_gradient_sync:
            self.reduce_grad(full)
        else:
            self.reshard()  # the parameters only: full.grad is a tensor of its own

    def install_views(self) -> None:
        """Every place that held a parameter now holds its view of ``full``: one view per
        parameter, so a tied weight's places share it. One ``split``: in backward, one autograd
        node writes every view's gradient into one (N*s,) gradient of ``full``."""
        pieces = self.full.split([*self.numels, self.padding])[:-1]  # the padding comes last
        for (_, where), piece, shape in zip(self.places, pieces, self.shapes, strict=True):
            view = piece.view(shape)
            for owner, attribute, _ in where:
                setattr(owner, attribute, view)  # a plain attribute, not a parameter

    @torch.no_grad()
    def reduce_grad(self, full: torch.Tensor) -> None:
        """Hook: ``full.grad`` (N*s,) holds every use's gradient. Keep my shard's mean."""
        grad = full.grad.to(self.reduce_dtype)  # (N*s,) the same tensor when no cast is needed
        full.grad = None  # the full-size gradient is freed once reduced
        ring_reduce_scatter(grad, self.process_group, self.counter, check=False)
        s, r = self.shard_numel, self.rank
        mean = grad[r * s:(r + 1) * s].div(self.world_size).to(self.shard.dtype)  # (s,) new
        if self.shard.grad is None:
            self.shard.grad = mean
        else:
            self.shard.grad += mean  # gradient accumulation: several backward, one step
        self.reshard()
