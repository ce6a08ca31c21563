"""The data-parallel step's cases (exercise 7.3), run by ``course_lib.check.mp.program``.

Each rank builds a tiny float64 model from its OWN seed (only rank 0's is the model to train),
calls the learner's ``broadcast_parameters(model, group)``, then takes a few optimizer steps
with ``data_parallel_step(model, optimizer, micro_batches, loss_fn, group)``: plain SGD, a mean
squared error, rank r's K micro-batches cut from the step's global batch as notebook 07 cuts
them (rank r owns block r). While a step runs, the learner's module-level ``ring_all_reduce``
is wrapped: every call notes how many micro-batch losses were computed so far and how many
numbers it reduced. The checker compares the parameters with one process taking the same steps
on the whole batch (``reference_parameters``), computed in the kernel from the same seeds.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from course_lib.check.mp.tracer import Tracer
from course_lib.core import data_parallel

STEPS, MICRO_BATCH, LR = 2, 2, 0.1
DEADLINE_S = 60.0  # a launch trains several small steps: more than the usual startup time
CASES = (  # (name, accumulation steps K)
    ("1 micro-batch per step (K = 1)", 1),
    ("3 micro-batches per step (K = 3)", 3),
)


def case_specs(world_size: int, options: dict) -> list[dict]:
    return [{"name": name, "accum_steps": k, "seed": i, "ranks": world_size}
            for i, (name, k) in enumerate(CASES)]


def make_model(seed: int) -> nn.Module:
    """A 3 -> 4 -> 2 MLP in float64: 26 parameters in 4 tensors."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def rank_seed(spec: dict, rank: int) -> int:
    return 100 * spec["seed"] + rank  # every rank starts from other weights


def global_batch(spec: dict, world_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's N x K x B examples: x (rows, 3), y (rows, 2)."""
    rows = world_size * spec["accum_steps"] * MICRO_BATCH
    g = torch.Generator().manual_seed(1000 * spec["seed"] + step)
    return (torch.randn(rows, 3, generator=g, dtype=torch.float64),
            torch.randn(rows, 2, generator=g, dtype=torch.float64))


def micro_batches(spec: dict, world_size: int, rank: int, step: int) -> list:
    """Rank ``rank``'s K micro-batches: its contiguous block, cut in K."""
    x, y = global_batch(spec, world_size, step)
    k, b = spec["accum_steps"], MICRO_BATCH
    rows = [slice((rank * k + i) * b, (rank * k + i + 1) * b) for i in range(k)]  # B each
    return [(x[r], y[r]) for r in rows]


def mse(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def tensors(model: nn.Module) -> list[list[float]]:
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def differing(got: list, want: list) -> list[int]:
    """The positions of the parameter tensors that differ between two ``tensors`` lists."""
    return [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b]


def flat(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def reference_parameters(spec: dict, world_size: int, loss_scale: float = 1.0,
                         keep_grads: bool = False) -> list[float]:
    """One process, the whole batch each step, from rank 0's weights. A known mistake's
    result: the loss times ``loss_scale`` (not 1), or ``keep_grads`` (.grad never zeroed)."""
    model = make_model(rank_seed(spec, 0))
    for step in range(STEPS):
        if not keep_grads:
            model.zero_grad()
        (mse(model, global_batch(spec, world_size, step)) * loss_scale).backward()
        with torch.no_grad():  # plain SGD's step, as torch.optim.SGD(lr=LR) takes it (without
            for p in model.parameters():  # building one: its first one imports for seconds)
                p.add_(p.grad, alpha=-LR)
    return flat(model)


class SyncCounter:
    """Wraps the learner's ``ring_all_reduce``: (micro-batch losses so far, numbers reduced)."""

    def __init__(self, learner):
        self.learner, self.original = learner, getattr(learner, "ring_all_reduce", None)
        self.losses, self.calls = 0, []

    def loss_fn(self, model, batch):
        self.losses += 1
        return mse(model, batch)

    def __enter__(self):
        if callable(self.original):
            def counted(tensor, *args, **kwargs):
                numel = tensor.numel() if isinstance(tensor, torch.Tensor) else 0
                self.calls.append([self.losses, numel])
                return self.original(tensor, *args, **kwargs)

            self.learner.ring_all_reduce = counted
        return self

    def __exit__(self, *exc):
        if self.original is not None:
            self.learner.ring_all_reduce = self.original


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    model = make_model(rank_seed(spec, rank))
    mine, rank0 = tensors(model), tensors(make_model(rank_seed(spec, 0)))
    steps = []
    with tracer.watching(spec["name"], range(spec["ranks"])) as log:
        learner.broadcast_parameters(model, group)
        after_broadcast = tensors(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        for step in range(STEPS):
            with SyncCounter(learner) as counter:
                learner.data_parallel_step(model, optimizer,
                                           micro_batches(spec, n, rank, step),
                                           counter.loss_fn, group)
            steps.append({"losses": counter.losses, "syncs": counter.calls})
    return {"name": spec["name"], "ranks": spec["ranks"], "accum_steps": spec["accum_steps"],
            "library_broadcast": learner.broadcast_parameters is
            data_parallel.broadcast_parameters,
            "library_wrapper": any(v is data_parallel.AllReducePerParameter
                                   for v in vars(learner).values()),
            "has_ring": callable(getattr(learner, "ring_all_reduce", None)),
            "broadcast_kept_own": after_broadcast == mine and mine != rank0,
            "broadcast_right": after_broadcast == rank0, "parameter_tensors": len(rank0),
            "broadcast_missed": differing(after_broadcast, rank0), "steps": steps,
            "params": flat(model), **log.summary()}
