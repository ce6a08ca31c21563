"""The numbers under ``fully_shard`` (notebook 10b, ZeRO-3): one wrapped module's parameters
kept as 1/N of one flat vector per rank, whole only while the module computes.

    the parameters p1, p2, ... (numel values), flattened in order, padded with zeros to
    N x s values, s = ceil(numel / N); rank r keeps values [r*s, (r+1)*s):
    shard  (s,)    nn.Parameter in the parameters' dtype: what the optimizer steps; its .grad
                   (s,) is the mean over the ranks of those values' gradients
    full   (N*s,)  in param_dtype: gathered before the module computes, freed right after;
                   each parameter is a view of it meanwhile; its gradient is reduced in it

A module's three moments are functions of its ``FlatShard``, the unit (exercise 10.7 writes
them): ``unshard`` gathers ``full``, ``reshard`` frees its memory but keeps the tensor, so the
views autograd saved for backward see the numbers again after the next gather, and
``reduce_grad`` keeps my chunk's mean of ``full.grad``. ``full`` is one autograd leaf: every use
of every view adds its gradient into ``full.grad``, and autograd calls ``reduce_grad`` once per
backward, when all are in. With ``requires_gradient_sync`` False (FSDP2's
``set_requires_gradient_sync(False)``) it is not called: ``full.grad`` stays, and the next
backward adds to it. ``FlatShard``'s methods of the same names call them.

All-gather: ``dist.all_gather_single``, a ring on Gloo as on NCCL, which can run in the
background (prefetch.py). Reduce-scatter: Gloo's runs an all-reduce and keeps a slice (twice the
bytes), so we use the course's ``ring_reduce_scatter``, which blocks backward while it runs.
``counter`` counts what this rank sends: a module gathered for forward and for backward and
reduce-scattered once sends 3 x (N-1)/N of its bytes per step, 1.5x plain data parallelism's.
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
        self.param_dtype = param_dtype or flat.dtype  # compute, gather and reduce in this dtype
        if reduce_dtype not in (None, self.param_dtype):
            raise ValueError(f"fully_shard reduces the gradients in the dtype it computes in, "
                             f"param_dtype ({self.param_dtype}); a reduce_dtype of its own "
                             f"({reduce_dtype}), which FSDP2 takes, is not supported here: "
                             "leave reduce_dtype None")
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

    def unshard(self, async_op: bool = False) -> dist.Work | None:
        """Gather ``full`` (the function ``unshard``) and wait for it; with ``async_op``, return
        the gather's handle instead (prefetch.py, ``module.unshard(async_op=True)``)."""
        if self.is_unsharded():
            return None
        unshard(self)  # the module's function: the gather runs, its handle in self.pending
        if async_op:
            return self.pending
        self.wait_for_unshard()
        return None

    def reshard(self) -> None:
        """Free ``full``'s memory (the function ``reshard``)."""
        reshard(self)  # the module's function: full's memory freed, the tensor kept

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

    def reduce_grad(self, full: torch.Tensor) -> None:
        """Hook: ``full.grad`` holds every use's gradient (the function ``reduce_grad``)."""
        reduce_grad(self)


@torch.no_grad()
def unshard(unit: FlatShard) -> None:
    """Before the module computes: give ``unit.full`` (N*s,) its memory back and fill it with
    every rank's shard, rank r's ``unit.shard`` (s,) at values r*s .. (r+1)*s. A module used
    twice is whole already. The all-gather runs in the background: the module waits for it
    (``unit.pending``) before it computes, so that a prefetch can start it earlier."""
    if unit.is_unsharded():
        return
    full = unit.full.data  # the same memory; writes here are not versions autograd counts
    full.untyped_storage().resize_(full.numel() * full.element_size())  # N*s values again
    r, s = unit.rank, unit.shard_numel
    mine = full[r * s:(r + 1) * s]  # (s,) my place, in full's dtype
    mine.copy_(unit.shard.detach())  # my shard in it
    for _ in range(unit.world_size - 1):
        unit.counter.add(mine)  # the ring: N-1 shards out of this rank
    unit.pending = dist.all_gather_single(full, mine, group=unit.process_group, async_op=True)


def reshard(unit: FlatShard) -> None:
    """After the module computed: free ``unit.full``'s memory, but keep the tensor (autograd
    saved views of it for backward; the next ``unshard`` fills them again)."""
    unit.full.untyped_storage().resize_(0)  # 0 bytes; the tensor and its views stay


@torch.no_grad()
def reduce_grad(unit: FlatShard) -> None:
    """Backward is done with the module: ``unit.full.grad`` (N*s,) holds this rank's gradient
    of all its values. Leave the mean over the ranks of my chunk in ``unit.shard.grad`` (s,),
    added to what an earlier backward left there; free both full-size tensors."""
    grad = unit.full.grad  # (N*s,) every use's gradient, added up
    unit.full.grad = None  # the whole gradient lives on only until it is reduced
    ring_reduce_scatter(grad, unit.process_group, unit.counter, check=False)  # my chunk: a sum
    r, s = unit.rank, unit.shard_numel
    mean = grad[r * s:(r + 1) * s] / unit.world_size  # (s,) a new tensor: grad can go
    if unit.shard.grad is None:
        unit.shard.grad = torch.zeros_like(unit.shard)  # in the shard's dtype (fp32 under bf16)
    unit.shard.grad += mean  # several backward passes, one step: their gradients add up
    unit.reshard()  # the parameters too, until the next forward
