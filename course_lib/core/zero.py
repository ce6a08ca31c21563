"""ZeRO stage 1 from the two halves of the ring: each rank keeps 1/N of the optimizer state
(notebook 10, beyond data parallel).

    optimizer = Zero1(model.parameters(), torch.optim.AdamW, process_group=group, lr=1e-3)
    loss.backward()        # local gradients: no wrapper, no all-reduce
    optimizer.step()       # reduce-scatter the gradients, update my chunk, all-gather
    optimizer.zero_grad()

Shaped like ``torch.distributed.optim.ZeroRedundancyOptimizer`` (the same first three
arguments): it wraps any ``torch.optim`` class and has ``param_groups`` (a scheduler can change
``lr``), ``step(closure=None)``, ``zero_grad()`` and ``state_dict()`` (this rank's shard). Every
parameter becomes a view into one flat vector, cut into N chunks as the ring cuts tensors; rank
r OWNS chunk r and keeps optimizer state for it alone. One step:

    1. ring_reduce_scatter(flat grads)   chunk r of rank r: the SUM over the ranks
    2. divide by N                       the mean, as an all-reduce would have given
    3. the optimizer, on chunk r only    its state holds numel / N values
    4. ring_all_gather(flat params)      every rank gets every chunk from its owner

Steps 1 and 4 are the two halves of the ring all-reduce: the same bytes as plain data
parallelism, for 1/N of the optimizer state. Beside them each step makes two small
``dist.all_reduce`` calls: one int32 per parameter tensor (which parameters have a gradient on
some rank) and one float64 (the squared gradient norm, for clipping): few bytes, but two more
start-up latencies per step. The chunk cuts through parameters, so the inner optimizer sees
pieces of them: right for element-wise optimizers (SGD, Adam, AdamW, ...). A parameter no rank
has a gradient for is left alone by the step, as torch's optimizers do.

The flat vector is fixed when Zero1 is built, so convert or move the model first: a later
``model.to(...)`` gives the parameters new memory, which ``step()`` refuses, as
``add_param_group`` does (pass every group to ``Zero1(...)``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from course_lib.core.collectives import chunk_bounds, ring_all_gather, ring_reduce_scatter
from course_lib.core.messages import ByteCounter


def flatten_into_views(params: list[nn.Parameter]) -> torch.Tensor:
    """Copy the parameters into one flat tensor and make each parameter a view into it."""
    if len({(p.dtype, p.device) for p in params}) > 1:
        raise ValueError("Zero1 keeps every parameter in one flat tensor, so they need one "
                         "dtype and device: convert the model first (model.to(dtype))")
    flat = torch.cat([p.detach().reshape(-1) for p in params])  # (numel,)
    offset = 0
    for p in params:
        p.data = flat[offset:offset + p.numel()].view_as(p)  # same numbers, shared memory
        offset += p.numel()
    return flat


class Zero1(torch.optim.Optimizer):
    """An optimizer whose state lives on the owner of each chunk of the flat parameters."""

    def __init__(self, params, optimizer_class=torch.optim.AdamW,
                 process_group: dist.ProcessGroup | None = None,
                 max_grad_norm: float | None = None, counter: ByteCounter | None = None,
                 **defaults):
        self.sharded = False  # add_param_group works until the flat vector is cut, below
        super().__init__(params, defaults)  # self.param_groups: every parameter, as usual
        self.process_group, self.max_grad_norm = process_group, max_grad_norm
        self.counter = counter  # what this rank sends
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.params = [p for g in self.param_groups for p in g["params"]]
        self.flat = flatten_into_views(self.params)  # (numel,) every parameter, every rank
        self.addresses = [p.data_ptr() for p in self.params]  # where each view starts
        self.flat_grad = torch.zeros_like(self.flat)  # (numel,)
        self.start, self.end = chunk_bounds(self.flat.numel(), self.world_size)[self.rank]
        self.pieces = self.my_pieces()  # (parameter, its piece in my chunk, where in flat)
        self.inner = optimizer_class([  # the wrapped optimizer: my pieces, each group's options
            {**{k: v for k, v in g.items() if k != "params"},
             "params": [piece for p, piece, _ in self.pieces if any(p is q for q in g["params"])]}
            for g in self.param_groups], **defaults)  # a keyword it does not know fails here
        for mine, group in zip(self.inner.param_groups, self.param_groups, strict=True):
            group.update({k: v for k, v in mine.items() if k not in group})  # its defaults
        self.last_grad_norm = None  # the global gradient norm of the last step
        self.sharded = True

    def add_param_group(self, param_group: dict) -> None:
        """Only while building: every parameter's place in the flat vector is fixed after."""
        if self.sharded:
            raise RuntimeError("Zero1 cannot take a parameter group once built: every "
                               "parameter already has its place in the flat vector. Pass "
                               "every group to Zero1(...) when you build it")
        super().add_param_group(param_group)

    def my_pieces(self) -> list[tuple[nn.Parameter, nn.Parameter, slice]]:
        """For each parameter that overlaps my chunk: the overlap, as a parameter of its own."""
        pieces, offset = [], 0
        for p in self.params:
            lo, hi = max(offset, self.start), min(offset + p.numel(), self.end)
            if lo < hi:
                pieces.append((p, nn.Parameter(self.flat[lo:hi]), slice(lo, hi)))
            offset += p.numel()
        return pieces

    @torch.no_grad()
    def step(self, closure=None):
        """Average the gradients, update my chunk, share it. Returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():  # as torch's optimizers: the closure runs backward
                loss = closure()
        self.check_views()
        used = self.gather_grads()  # flat_grad = my local gradients; who has one anywhere
        ring_reduce_scatter(self.flat_grad, self.process_group, self.counter)  # 1. the sum
        my_grad = self.flat_grad[self.start:self.end]
        my_grad.div_(self.world_size)  # 2. the sum / N: the mean gradient
        self.clip(my_grad)
        for p, piece, where in self.pieces:  # 3. my pieces get their mean gradient
            piece.grad = self.flat_grad[where] if used[id(p)] else None  # None: left alone
        for mine, group in zip(self.inner.param_groups, self.param_groups, strict=True):
            mine.update({k: v for k, v in group.items() if k != "params"})  # lr, ...
        self.inner.step()  # updates my chunk of self.flat in place
        ring_all_gather(self.flat, self.process_group, self.counter)  # 4. every chunk, to all
        return loss

    def check_views(self) -> None:
        """Refuse to step when a parameter is no longer a view of the flat vector: the step
        would update the flat vector and leave the parameter as it is, silently."""
        if [p.data_ptr() for p in self.params] != self.addresses:
            raise RuntimeError("the parameters no longer live in Zero1's flat vector: "
                               "something gave them new memory after Zero1 was built "
                               "(model.to(dtype or device), p.data = ...). Convert or move "
                               "the model first, then build Zero1")

    def gather_grads(self) -> dict[int, bool]:
        """Copy each local gradient into flat_grad (zeros where None); return, per parameter
        id, whether any rank has a gradient for it (one small all-reduce)."""
        offset, used = 0, []
        for p in self.params:
            piece = self.flat_grad[offset:offset + p.numel()]
            if p.grad is None:
                piece.zero_()  # not used on this rank: adds nothing to the sum
            else:
                piece.copy_(p.grad.reshape(-1))
            used.append(p.grad is not None)
            offset += p.numel()
        counts = torch.tensor(used, dtype=torch.int32, device=self.flat.device)
        dist.all_reduce(counts, group=self.process_group)  # how many ranks have each gradient
        return {id(p): c > 0 for p, c in zip(self.params, counts.tolist(), strict=True)}

    def clip(self, my_grad: torch.Tensor) -> None:
        """Scale the mean gradient so that its global norm is at most ``max_grad_norm``, as
        ``clip_grad_norm_`` would. Norms do not add up over chunks; squares do."""
        squares = (my_grad.double() ** 2).sum().reshape(1)  # (1,) my chunk's share
        dist.all_reduce(squares, group=self.process_group)  # the sum over every chunk
        self.last_grad_norm = float(squares.sqrt())
        if self.max_grad_norm is not None:
            my_grad.mul_(min(1.0, self.max_grad_norm / (self.last_grad_norm + 1e-6)))

    def state_dict(self) -> dict:
        """This rank's shard of the optimizer state (each rank saves its own)."""
        return {"inner": self.inner.state_dict(), "owned": (self.start, self.end),
                "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        if tuple(state["owned"]) != (self.start, self.end):
            raise ValueError(f"this shard was saved by the owner of {tuple(state['owned'])} "
                             f"of {state['world_size']} ranks; this rank owns "
                             f"{(self.start, self.end)}: load each rank's own file")
        self.inner.load_state_dict(state["inner"])
