"""The ZeRO-1 step's cases (exercise 10.4), run by ``course_lib.check.mp.program``.

Each case gives every rank the same flat parameters (float64) and calls the learner's
``make_shard_optimizer(flat_params, optimizer_class, group, **options)`` once, then
``zero1_step(flat_params, flat_grad, optimizer, group)`` for a few steps. Each rank's gradient
is its own: that of a quadratic whose target and weights depend on the rank and the step, taken
at the rank's current parameters. ``reference`` is plain data parallelism (the mean gradient, a
whole optimizer over all the parameters), computed in the kernel from the same seeds. Each rank
also reports what its optimizer holds: how many values, which part of ``flat_params`` each of its
tensors is a view of, and whether a tensor that is not a view (a copy) changed in the steps.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.check.mp.tracer import Tracer
from course_lib.core.collectives import chunk_bounds

STEPS = 2
DEADLINE_S = 60.0  # a launch takes a few steps: more than the usual startup time
OPTIMIZERS = {"SGD with momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
              "AdamW": (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.01})}
CASES = (  # (number of values, optimizer)
    (23, "SGD with momentum"),
    (24, "AdamW"),
    (3, "SGD with momentum"),
)


def case_specs(world_size: int, options: dict) -> list[dict]:
    return [{"name": f"{numel} values, {optimizer}", "numel": numel, "optimizer": optimizer,
             "seed": i, "ranks": world_size} for i, (numel, optimizer) in enumerate(CASES)]


def initial_parameters(spec: dict) -> torch.Tensor:
    g = torch.Generator().manual_seed(spec["seed"])
    return torch.randn(spec["numel"], generator=g, dtype=torch.float64)  # (numel,)


def local_gradient(spec: dict, rank: int, step: int, params: torch.Tensor) -> torch.Tensor:
    """Rank ``rank``'s gradient at ``step``: of sum(w * (p - target)^2) / 2, at ``params``."""
    g = torch.Generator().manual_seed(1000 * spec["seed"] + 100 * step + rank)
    target = torch.randn(spec["numel"], generator=g, dtype=torch.float64)
    weight = torch.rand(spec["numel"], generator=g, dtype=torch.float64) + 0.5
    return weight * (params.detach() - target)  # (numel,)


def make_optimizer(spec: dict, params: list) -> torch.optim.Optimizer:
    optimizer_class, options = OPTIMIZERS[spec["optimizer"]]
    return optimizer_class(params, **options)


def reference(spec: dict, world_size: int, grad_scale: float = 1.0) -> list[list[float]]:
    """Plain data parallelism: the parameters after each step."""
    params = torch.nn.Parameter(initial_parameters(spec))
    optimizer = make_optimizer(spec, [params])
    after = []
    for step in range(STEPS):
        grads = [local_gradient(spec, r, step, params) for r in range(world_size)]
        params.grad = torch.stack(grads).mean(0) * grad_scale  # what the all-reduce averages
        optimizer.step()
        after.append(params.detach().tolist())
    return after


def view_bounds(tensor: torch.Tensor, flat: torch.Tensor) -> list | None:
    """[start, end) of ``flat`` that ``tensor`` is a view of, or None for a tensor of its own."""
    if tensor.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr():
        return None
    start = tensor.storage_offset() - flat.storage_offset()
    return [start, start + tensor.numel()]


def held(optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def what_it_holds(optimizer, flat: torch.Tensor, at_start: list[torch.Tensor]) -> dict:
    """The values the optimizer holds, the views among its tensors, and whether a copy moved."""
    tensors = held(optimizer)
    bounds = [view_bounds(t, flat) for t in tensors]
    return {"held": sum(t.numel() for t in tensors),
            "views": [b for b in bounds if b is not None],
            "copies": sum(b is None for b in bounds),
            "copy_moved": any(b is None and not torch.equal(t.detach(), t0)
                              for t, b, t0 in zip(tensors, bounds, at_start, strict=True))}


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    flat = initial_parameters(spec)
    optimizer_class, optimizer_options = OPTIMIZERS[spec["optimizer"]]
    after, holds = [], {}
    with tracer.watching(spec["name"], range(spec["ranks"])) as log:
        optimizer = learner.make_shard_optimizer(flat, optimizer_class, group,
                                                 **optimizer_options)
        is_optimizer = isinstance(optimizer, torch.optim.Optimizer)
        at_start = [t.detach().clone() for t in held(optimizer)] if is_optimizer else []
        for step in range(STEPS if is_optimizer else 0):
            learner.zero1_step(flat, local_gradient(spec, rank, step, flat), optimizer, group)
            after.append(flat.tolist())
        if is_optimizer:
            holds = what_it_holds(optimizer, flat, at_start)
    return {"name": spec["name"], "ranks": spec["ranks"], "is_optimizer": is_optimizer,
            "returned": type(optimizer).__name__, "after": after,
            "chunk": list(chunk_bounds(spec["numel"], n)[rank]), **holds, **log.summary()}
