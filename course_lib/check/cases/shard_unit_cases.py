"""ZeRO-3's moments for one wrapped module: the cases of exercise 10.7, run by
``course_lib.check.mp.program``.

Each case builds the same small float64 model on every rank (a first layer, two residual
blocks, a last layer), wraps the blocks and then the root with the course's ``fully_shard``
machinery (``shard_module``), whose ``FlatShard`` calls the learner's ``unshard(unit)``,
``reshard(unit)`` and ``reduce_grad(unit)`` at its moments: before the module computes (in
forward, and again in backward), after forward, and when backward has left the module's whole
gradient in ``unit.full.grad``. Right after each call the case looks at what the call left
(memory behind ``unit.full``, this rank's own place in it, ``unit.full.grad``,
``unit.shard.grad``) and stops with a ``CaseFinding`` that says what is wrong. Each rank trains
on its own batches with SGD with momentum over ``model.parameters()`` (the shards);
``reference`` is plain data parallelism (the mean gradient, an unsharded model), computed here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.check.mp.learner import CaseFinding
from course_lib.check.mp.tracer import Tracer
from course_lib.core.flat_shard import FlatShard
from course_lib.core.fully_shard import shard_module

FEATURES, WIDTH, CLASSES, BATCH, STEPS = 4, 6, 3, 5, 2
LR, MOMENTUM = 0.1, 0.9


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.layer(h))


class Net(nn.Module):
    """``twice``: block 0 computes again after block 1 (a module used twice in forward)."""

    def __init__(self, twice: bool):
        super().__init__()
        self.first, self.last = nn.Linear(FEATURES, WIDTH), nn.Linear(WIDTH, CLASSES)
        self.blocks, self.twice = nn.ModuleList([Block(), Block()]), twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks[1](self.blocks[0](torch.tanh(self.first(x))))
        return self.last(self.blocks[0](h) if self.twice else h)


def case_specs(world_size: int, options: dict) -> list[dict]:
    return [{"name": "2 steps, two blocks and the root", "twice": False, "seed": 0,
             "ranks": world_size},
            {"name": "2 steps, block 0 used twice in forward", "twice": True, "seed": 1,
             "ranks": world_size}]


def make_model(spec: dict) -> Net:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"])
        return Net(spec["twice"]).double()


def batch(spec: dict, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * spec["seed"] + 100 * step + rank)
    return (torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64),
            torch.randint(0, CLASSES, (BATCH,), generator=g))


def reference(spec: dict, grad_scale: float = 1.0) -> tuple[list, dict]:
    """Plain data parallelism: each step's loss on each rank, and the parameters at the end
    (``grad_scale`` N: stepped with the sum of the ranks' gradients)."""
    model = make_model(spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        mine = [F.cross_entropy(model(x), y) for x, y in
                (batch(spec, rank, step) for rank in range(spec["ranks"]))]
        (sum(mine) / spec["ranks"] * grad_scale).backward()  # the mean over the ranks
        optimizer.step()
        losses.append([loss.item() for loss in mine])
    return losses, {k: v.detach().tolist() for k, v in model.named_parameters()}


def bytes_of(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()


class LearnerShard(FlatShard):
    """A flat shard whose gather, free and reduce-scatter are the learner's functions."""

    learner = None  # the learner's module: set before the model is wrapped
    name = None  # the wrapped module's name, once the case knows it

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.made = self.full, self.full.untyped_storage()._cdata  # the tensor and its memory

    def reshard(self) -> None:
        if self.name is None:  # FlatShard.__init__: the unit starts without memory
            return super().reshard()
        self.learner.reshard(self)
        self.expect_freed("after its forward, reshard(unit)", "the parameters are whole only "
                          "while the module computes")
        return None

    def unshard(self, async_op: bool = False) -> None:
        self.learner.unshard(self)
        self.expect_same_tensor("unshard")
        whole = self.full.numel() * self.full.element_size()
        if bytes_of(self.full) != whole:
            raise CaseFinding(f"after unshard(unit) for {self.name}, unit.full has "
                              f"{bytes_of(self.full)} bytes of memory: its "
                              f"{self.full.numel()} values need {whole}")
        r, s = self.rank, self.shard_numel
        if not torch.equal(self.full.detach()[r * s:(r + 1) * s],
                           self.shard.detach().to(self.full.dtype)):
            raise CaseFinding(f"after unshard(unit) for {self.name}, rank {r}'s own place in "
                              f"unit.full (values {r * s}..{(r + 1) * s - 1}) does not hold "
                              "its shard")

    def reduce_grad(self, full: torch.Tensor) -> None:
        self.learner.reduce_grad(self)
        if self.full.grad is not None:
            raise CaseFinding(f"after reduce_grad(unit) for {self.name}, unit.full.grad still "
                              f"holds this rank's whole gradient ({bytes_of(self.full.grad)} "
                              "bytes): once reduced, nothing needs it")
        self.expect_freed("after reduce_grad(unit)", "backward is done with the parameters "
                          "until the next forward")
        if self.shard.grad is None:
            raise CaseFinding(f"after reduce_grad(unit) for {self.name}, unit.shard.grad is "
                              "None: the mean of this rank's chunk goes there, for the "
                              "optimizer to step")

    def expect_same_tensor(self, after: str) -> None:
        if self.full is not self.made[0]:
            raise CaseFinding(f"{after}(unit) for {self.name} put a new tensor in unit.full: "
                              "the module's parameters are views of the one the unit made, and "
                              "its gradient arrives there")
        if self.full.untyped_storage()._cdata != self.made[1]:
            raise CaseFinding(f"{after}(unit) for {self.name} gave unit.full other memory: the "
                              "views autograd saved for backward keep the old memory, and all "
                              "its values, alive")

    def expect_freed(self, when: str, why: str) -> None:
        self.expect_same_tensor("reshard" if "reshard" in when else "reduce_grad")
        if bytes_of(self.full) > 0:
            raise CaseFinding(f"{when} for {self.name}, unit.full still holds "
                              f"{bytes_of(self.full)} bytes: {why}")


def wrap(model: Net, learner, group) -> None:
    LearnerShard.learner = learner
    for i, block in enumerate(model.blocks):
        shard_module(block, LearnerShard, group, True, None)
        block.shard_state.name = f"blocks.{i}"
    shard_module(model, LearnerShard, group, True, None)
    model.shard_state.name = "the root"


def backward(loss: torch.Tensor) -> None:
    try:
        loss.backward()
    except RuntimeError as e:
        if "inplace" not in str(e):  # "modified by an inplace operation", "... modified inplace"
            raise
        raise CaseFinding("backward could not use the parameters it saved in forward: the "
                          "gather before backward wrote into unit.full as autograd sees it "
                          "(each in-place write is a new version of the tensor), and autograd "
                          "refuses views saved from an older version") from None


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank = dist.get_rank(group)
    model = make_model(spec)
    losses = []
    with tracer.watching(spec["name"], range(spec["ranks"])):
        wrap(model, learner, group)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        for step in range(STEPS):
            x, y = batch(spec, rank, step)
            loss = F.cross_entropy(model(x), y)
            backward(loss)
            model.finish_gradient_sync()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    params = {k: v.tolist() for k, v in model.full_state_dict().items()}
    return {"name": spec["name"], "ranks": spec["ranks"], "losses": losses, "params": params}
