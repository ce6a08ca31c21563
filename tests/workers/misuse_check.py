"""Misuse of the course's engines, each against one process running every rank's batch and,
where it applies, against torch DDP; launched on 2 processes by tests/test_engine_misuse.py.

Each case runs on every rank alike (an error is raised on every rank at the same point, so no
rank waits for another). A run ends in a gradient or parameters, compared with the one-process
run (the worst difference over the ranks), or in an error, whose message is kept. Every rank
hands back its own results; the models are small for test speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.nn.parallel import DistributedDataParallel

from course_lib.core.buckets import BucketedDataParallel
from course_lib.core.data_parallel import AllReducePerParameter
from course_lib.core.fully_shard import bytes_sent, finish_gradient_sync, full_state_dict
from course_lib.core.fully_shard import fully_shard as our_fully_shard
from course_lib.core.overlap import OverlapDataParallel
from course_lib.core.zero2 import Zero2
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import worker

SMALL_MB = 0.0002  # about 200 bytes: a bucket per layer or two
WRAPPERS = {"allreduce": AllReducePerParameter, "bucketed": BucketedDataParallel,
            "overlap": OverlapDataParallel}


class Net(nn.Module):
    """x (batch, 4) -> (batch, 2). ``reg``: a layer only the loss's regulariser uses, outside
    forward; ``extra``: a layer forward uses only when asked."""

    def __init__(self, extra: bool = False, reg: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)
        self.extra = nn.Linear(8, 8) if extra else None
        self.reg = nn.Linear(4, 4) if reg else None

    def forward(self, x: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        h = torch.tanh(self.a(x))  # (batch, 8)
        if use_extra:
            h = h + self.extra(h)
        return self.b(h)


def batch(rank: int, step: int = 0, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch: x (4, 4), y (4, 2)."""
    g = torch.Generator().manual_seed(1000 * step + 100 * micro + rank)
    return torch.randn(4, 4, generator=g), torch.randn(4, 2, generator=g)


def worst(value: float, group) -> float:
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def grads_of(module: nn.Module) -> dict:
    return {n: None if p.grad is None else p.grad.detach().clone()
            for n, p in module.named_parameters()}


def difference(ours: dict, reference: dict, group) -> float:
    """The worst difference over names and ranks; inf when one has a tensor the other lacks."""
    found = 0.0
    for name, want in reference.items():
        got = ours.get(name)
        if (got is None) != (want is None):
            found = float("inf")
        elif got is not None:
            found = max(found, (got.double() - want.double()).abs().max().item())
    return worst(found, group)


def attempt(run) -> dict:
    """``run()``'s value, or the message of the error it raised."""
    try:
        return {"value": run()}
    except (RuntimeError, TypeError, ValueError) as error:
        return {"error": f"{type(error).__name__}: {error}"}


def settle(outcome: dict, reference, group) -> dict:
    """An outcome whose value is gradients: their worst difference with ``reference``."""
    if "value" in outcome:
        return {"difference": difference(outcome["value"], reference, group)}
    return outcome


def wrap(kind: str, module: nn.Module, group, find_unused: bool = False):
    if kind == "ddp":
        return DistributedDataParallel(module, process_group=group, bucket_cap_mb=SMALL_MB,
                                       find_unused_parameters=find_unused)
    options = {} if kind == "allreduce" else {"bucket_cap_mb": SMALL_MB}
    return WRAPPERS[kind](module, group, find_unused_parameters=find_unused, **options)


def finish(model) -> None:
    if not isinstance(model, DistributedDataParallel):
        model.finish_gradient_sync()


def one_process(world_size: int, backward, make=Net) -> dict:
    """The reference gradients: ``backward(model, loss)`` on one model, ``loss(x, y)`` being
    a rank's loss divided by the world size (the mean over the ranks, added up)."""
    model = make()

    def loss(x, y):
        return F.mse_loss(model(x), y) / world_size

    backward(model, loss)
    return grads_of(model)


# ---- DDP's wrappers ----------------------------------------------------------------------------


def regulariser(w) -> dict:
    """find_unused_parameters=True and a loss that also uses ``reg.weight``, outside forward:
    each rank's loss is its mean squared error plus 0.1 |reg.weight|^2."""
    def backward(model, loss):
        for r in range(w.world_size):
            (loss(*batch(r)) + 0.1 * model.reg.weight.square().sum() / w.world_size).backward()

    reference = one_process(w.world_size, backward, lambda: Net(reg=True))
    found = {}
    for kind in ("ddp", *WRAPPERS):
        def run(kind=kind):
            model = wrap(kind, Net(reg=True), w.group, find_unused=True)
            module = getattr(model, "module", model)
            x, y = batch(w.rank)
            (F.mse_loss(model(x), y) + 0.1 * module.reg.weight.square().sum()).backward()
            finish(model)
            return grads_of(module)
        found[kind] = settle(attempt(run), reference, w.group)
    return found


def retain_graph(w) -> dict:
    """One forward, two backward through the same graph (retain_graph=True), one sync."""
    def backward(model, loss):
        total = sum(loss(*batch(r)) for r in range(w.world_size))
        total.backward(retain_graph=True)
        total.backward()

    reference = one_process(w.world_size, backward)
    found = {}
    for kind in ("ddp", *WRAPPERS):
        def run(kind=kind):
            model = wrap(kind, Net(), w.group)
            loss = F.mse_loss(model(batch(w.rank)[0]), batch(w.rank)[1])
            loss.backward(retain_graph=True)
            loss.backward()
            finish(model)
            return grads_of(getattr(model, "module", model))
        found[kind] = settle(attempt(run), reference, w.group)
    return found


def two_forwards(w) -> dict:
    """Two synced forward-backward pairs, then one sync: as two micro-steps without no_sync."""
    def backward(model, loss):
        for micro in range(2):
            sum(loss(*batch(r, micro=micro)) for r in range(w.world_size)).backward()

    reference = one_process(w.world_size, backward)
    found = {}
    for kind in ("ddp", *WRAPPERS):
        def run(kind=kind):
            model = wrap(kind, Net(), w.group)
            for micro in range(2):
                x, y = batch(w.rank, micro=micro)
                F.mse_loss(model(x), y).backward()
            finish(model)
            return grads_of(getattr(model, "module", model))
        found[kind] = settle(attempt(run), reference, w.group)
    return found


def changed_after_wrapping(w) -> dict:
    """The model converted to float64, or a parameter frozen, after it was wrapped: two steps
    of AdamW with weight decay. The step (0 or 1) at which each run refused is kept."""
    found = {}
    for change in ("double", "freeze"):
        reference = Net()
        if change == "double":
            reference.double()
        else:
            reference.a.weight.requires_grad_(False)
        for kind in ("ddp", *WRAPPERS):
            found[f"{change} {kind}"] = changed_run(w, kind, change, reference)
        found[f"{change} zero2"] = changed_zero2(w, change, reference)
    return found


def changed_run(w, kind: str, change: str, reference: nn.Module) -> dict:
    model = wrap(kind, Net(), w.group)
    module = getattr(model, "module", model)
    if change == "double":
        model.double()
    else:
        module.a.weight.requires_grad_(False)
    dtype = module.b.weight.dtype
    for step in range(2):
        module.zero_grad()
        x, y = batch(w.rank, step)
        outcome = attempt(lambda x=x, y=y: F.mse_loss(model(x.to(dtype)),
                                                       y.to(dtype)).backward())
        if "error" in outcome:
            return {**outcome, "step": step}
        finish(model)
    grads = grads_of(module)
    reference.zero_grad()
    for r in range(w.world_size):
        x, y = batch(r, 1)
        (F.mse_loss(reference(x.to(dtype)), y.to(dtype)) / w.world_size).backward()
    return {"difference": difference(grads, grads_of(reference), w.group)}


def changed_zero2(w, change: str, reference: nn.Module) -> dict:
    module = Net()
    opt = Zero2(module.parameters(), torch.optim.AdamW, process_group=w.group,
                bucket_cap_mb=SMALL_MB, lr=0.01, weight_decay=0.1)
    if change == "double":
        module.double()
    else:
        module.a.weight.requires_grad_(False)
    dtype = module.b.weight.dtype
    for step in range(2):
        x, y = batch(w.rank, step)
        F.mse_loss(module(x.to(dtype)), y.to(dtype)).backward()
        outcome = attempt(opt.step)
        if "error" in outcome:
            return {**outcome, "step": step}
    return {"completed": True}


# ---- ZeRO-2 ------------------------------------------------------------------------------------


def zero2_accumulation(w) -> dict:
    """One step of two micro-steps; ``extra`` unused in the first (on every rank, or on rank 1
    in the second too), its bucket-mates used in both. Zero2 and DDP (find_unused_parameters)
    against one process: the parameters after two SGD steps with momentum."""
    found = {}
    for name, uses in (("unused in micro-step 0", lambda rank, micro: micro == 1),
                       ("used on rank 0 only, micro-step 1", lambda rank, micro: micro == 1
                        and rank == 0)):
        runs = {}
        for kind in ("one process", "ddp", "zero2"):
            module = Net(extra=True)
            if kind == "zero2":
                model, opt = module, Zero2(module.parameters(), torch.optim.SGD,
                                           process_group=w.group, bucket_cap_mb=25, lr=0.1,
                                           momentum=0.9)
            else:
                model = module if kind == "one process" else DistributedDataParallel(
                    module, process_group=w.group, find_unused_parameters=True)
                opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
            ranks = range(w.world_size) if kind == "one process" else [w.rank]
            for step in range(2):
                for micro in range(2):
                    for r in ranks:
                        x, y = batch(r, step, micro)
                        loss = F.mse_loss(model(x, use_extra=uses(r, micro)), y) / 2
                        (loss / len(ranks)).backward()
                opt.step()
                opt.zero_grad()
            runs[kind] = {n: p.detach().clone() for n, p in module.named_parameters()}
        found[name] = {kind: difference(runs[kind], runs["one process"], w.group)
                       for kind in ("ddp", "zero2")}
    return found


def zero2_retain_graph(w) -> float:
    """Zero2 with two backward through one graph: each is reduced, both reach the step."""
    runs = {}
    for kind in ("one process", "zero2"):
        module = Net()
        ranks = range(w.world_size) if kind == "one process" else [w.rank]
        opt = (torch.optim.SGD(module.parameters(), lr=0.1) if kind == "one process" else
               Zero2(module.parameters(), torch.optim.SGD, process_group=w.group,
                     bucket_cap_mb=SMALL_MB, lr=0.1))
        loss = sum(F.mse_loss(module(batch(r)[0]), batch(r)[1]) for r in ranks) / len(ranks)
        loss.backward(retain_graph=True)
        loss.backward()
        opt.step()
        runs[kind] = {n: p.detach().clone() for n, p in module.named_parameters()}
    return difference(runs["zero2"], runs["one process"], w.group)


# ---- fully_shard -------------------------------------------------------------------------------


@dataclass
class BlockOutput:
    h: torch.Tensor  # (batch, 8)
    note: str


class Opaque:
    """An object the output search cannot look into."""

    def __init__(self, h: torch.Tensor):
        self.h = h


class Block(nn.Module):
    def __init__(self, returns: str = "dataclass"):
        super().__init__()
        self.linear, self.returns = nn.Linear(8, 8), returns

    def forward(self, h):
        h = torch.tanh(self.linear(h))
        return {"dataclass": BlockOutput(h, "kept"), "opaque": Opaque(h)}.get(self.returns, h)


class ShardNet(nn.Module):
    """x (batch, 4) -> (batch, 2) through two blocks that return ``BlockOutput`` (or
    ``Opaque``, or the tensor). ``bonus`` is used on rank 0 only; ``spare`` by no rank."""

    def __init__(self, returns: str = "dataclass"):
        super().__init__()
        torch.manual_seed(0)
        self.into, self.out = nn.Linear(4, 8), nn.Linear(8, 2)
        self.blocks = nn.ModuleList([Block(returns), Block(returns)])
        self.bonus, self.spare = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor, rank: int = 1) -> torch.Tensor:
        h = self.into(x)
        for block in self.blocks:
            out = block(h)
            h = out if torch.is_tensor(out) else out.h  # a BlockOutput's or an Opaque's
        return self.out(h) * (self.bonus if rank == 0 else 1)


def shard_run(w, wrap_root: bool, returns: str = "dataclass", steps: int = 2) -> dict:
    """AdamW steps of ``ShardNet``, its blocks wrapped (and the root, or not): the parameters
    at full size; with ``w`` None, one process on every rank's batch."""
    model = ShardNet(returns)
    if w is not None:
        for block in model.blocks:
            our_fully_shard(block, process_group=w.group)
        if wrap_root:
            our_fully_shard(model, process_group=w.group)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    ranks = range(2) if w is None else [w.rank]
    for step in range(steps):
        for r in ranks:
            x, y = batch(r, step)
            (F.mse_loss(model(x, rank=r), y) / len(ranks)).backward()
        if w is not None:
            model.finish_gradient_sync() if wrap_root else finish_gradient_sync(model, w.group)
        opt.step()
        opt.zero_grad()
    if w is None:
        return {n: p.detach().clone() for n, p in model.named_parameters()}
    return full_state_dict(model)


def shard_checks(w) -> dict:
    reference = shard_run(None, False)
    whole = shard_run(w, True)  # spare: a zero gradient in the root's flat shard, moved by
    del whole["spare"]  # weight decay, where one process leaves it (fully_shard.py's table)
    found = {"dataclass output": difference(whole, {n: t for n, t in reference.items()
                                                   if n != "spare"}, w.group),
             "leftover used on rank 0 only": difference(shard_run(w, False, "tensor"),
                                                        reference, w.group)}
    found["opaque output"] = attempt(lambda: shard_run(w, True, "opaque", steps=1))
    for change in ("double", "freeze"):
        model = ShardNet()
        for block in model.blocks:
            our_fully_shard(block, process_group=w.group)
        our_fully_shard(model, process_group=w.group)
        if change == "double":
            model.double()
        else:
            model.blocks[1].requires_grad_(False)
        x = batch(w.rank)[0].to(model.flat_shard.dtype)
        found[f"{change} after fully_shard"] = attempt(lambda m=model, x=x: m(x).sum().backward())
    return found


def accumulation_without_sync(w) -> dict:
    """Two steps of two micro-steps, the first without gradient sync: ours and torch's
    ``fully_shard`` (both through set_requires_gradient_sync), against one process; and what
    ours sent, with and without the sync off."""
    runs, sent = {}, {}
    for kind in ("ours", "ours syncing", "torch", "one process"):
        model = Net()
        if kind != "one process":
            shard = (lambda m: torch_fully_shard(m)) if kind == "torch" else (
                lambda m: our_fully_shard(m, process_group=w.group))
            shard(model.a)
            shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        ranks = range(w.world_size) if kind == "one process" else [w.rank]
        for step in range(2):
            for micro in range(2):
                if kind in ("ours", "torch"):
                    model.set_requires_gradient_sync(micro == 1)
                for r in ranks:
                    x, y = batch(r, step, micro)
                    (F.mse_loss(model(x), y) / 2 / len(ranks)).backward()
            if kind.startswith("ours"):
                model.finish_gradient_sync()
            opt.step()
            opt.zero_grad()
        if kind == "torch":
            runs[kind] = {n: p.full_tensor() for n, p in model.named_parameters()}
        elif kind.startswith("ours"):
            runs[kind], sent[kind] = full_state_dict(model), bytes_sent(model)
        else:
            runs[kind] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"vs one process": difference(runs["ours"], runs["one process"], w.group),
            "vs torch": difference(runs["ours"], runs["torch"], w.group),
            "torch vs one process": difference(runs["torch"], runs["one process"], w.group),
            "sent": sent["ours"], "sent syncing": sent["ours syncing"]}


def main() -> None:
    with worker(seed=0) as w:
        result = {"regulariser": regulariser(w), "retain_graph": retain_graph(w),
                  "two_forwards": two_forwards(w), "changed": changed_after_wrapping(w),
                  "zero2_accumulation": zero2_accumulation(w),
                  "zero2_retain_graph": zero2_retain_graph(w), "shard": shard_checks(w),
                  "no_sync": accumulation_without_sync(w)}
        everyone = [None] * w.world_size
        dist.all_gather_object(everyone, result, group=w.group)
        save_result({"world_size": w.world_size, "ranks": everyone})


if __name__ == "__main__":
    main()
