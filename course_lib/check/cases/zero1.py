"""Exercise 10.4, a ZeRO-1 step: ``make_shard_optimizer(flat_params, optimizer_class, group,
**options)`` and ``zero1_step(flat_params, flat_grad, optimizer, group)`` in the learner's file.

Rank side: each case gives every rank the same flat parameters (float64), makes the learner's
optimizer once, then takes a few steps. Each rank's gradient is its own: that of a quadratic
whose target and weights depend on the rank and the step, taken at the rank's current
parameters. Each rank also reports what its optimizer holds: how many values, which part of
``flat_params`` each of its tensors is a view of, and whether a tensor that is not a view (a
copy) changed in the steps. On 3 and 4 processes a case runs on a group of ranks [1, 2] or
[1, 3].

Kernel side: ``reference`` is plain data parallelism (the mean gradient, a whole optimizer over
all the parameters), computed from the same seeds.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.check import cases
from course_lib.check.answers import close
from course_lib.check.cases import global_rank_sentence, members, ring_share, with_group_case
from course_lib.check.checker import ExerciseError, expect
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.tracer import ALL_REDUCES, COLLECTIVES, Tracer
from course_lib.check.mp.verdict import Advice
from course_lib.core.collectives import chunk_bounds

STEPS = 2
CASES = ((23, "SGD with momentum"), (10, "AdamW"), (3, "SGD with momentum"))  # (values, ...):
# on 3 and 4 ranks the ring cuts 10 values unlike chunks of ceil(10 / N) each


def case_specs(world_size: int, options: dict) -> list[dict]:
    specs = [{"name": f"{numel} values, {optimizer}", "numel": numel, "optimizer": optimizer}
             for numel, optimizer in CASES]
    return with_group_case(specs, world_size, {"name": "23 values, AdamW", "numel": 23,
                                               "optimizer": "AdamW"})


def initial_parameters(spec: dict) -> torch.Tensor:
    g = torch.Generator().manual_seed(spec["seed"])
    return torch.randn(spec["numel"], generator=g, dtype=torch.float64)  # (numel,)


def local_gradient(spec: dict, rank: int, step: int, params: torch.Tensor) -> torch.Tensor:
    """Rank ``rank``'s gradient at ``step``: of sum(w * (p - target)^2) / 2, at ``params``."""
    g = torch.Generator().manual_seed(1000 * spec["seed"] + 100 * step + rank)
    target = torch.randn(spec["numel"], generator=g, dtype=torch.float64)
    weight = torch.rand(spec["numel"], generator=g, dtype=torch.float64) + 0.5
    return weight * (params.detach() - target)  # (numel,)


def reference(spec: dict, world_size: int, grad_scale: float = 1.0) -> list[list[float]]:
    """Plain data parallelism: the parameters after each step."""
    params = torch.nn.Parameter(initial_parameters(spec))
    optimizer_class, options = cases.OPTIMIZERS[spec["optimizer"]]
    optimizer, after = optimizer_class([params], **options), []
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
    optimizer_class, optimizer_options = cases.OPTIMIZERS[spec["optimizer"]]
    after, holds = [], {}
    with tracer.watching(spec["name"], members(spec)) as log:
        optimizer = learner.make_shard_optimizer(flat, optimizer_class, group,
                                                 **optimizer_options)
        is_optimizer = isinstance(optimizer, torch.optim.Optimizer)
        at_start = [t.detach().clone() for t in held(optimizer)] if is_optimizer else []
        for step in range(STEPS if is_optimizer else 0):
            learner.zero1_step(flat, local_gradient(spec, rank, step, flat), optimizer, group)
            after.append(flat.tolist())
        if is_optimizer:
            holds = what_it_holds(optimizer, flat, at_start)
    return {"is_optimizer": is_optimizer, "returned": type(optimizer).__name__, "after": after,
            "chunk": list(chunk_bounds(spec["numel"], n)[rank]), **holds, **log.summary()}


# ---- the judge (in the kernel) --------------------------------------------------------------

def _values(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:4])) + (", ..." if len(numbers) > 4 else "")
    return f"value{'s' if len(numbers) > 1 else ''} {shown}"


def ring_mismatch(s: dict, rank: int, n: int, numel: int) -> str:
    """What is wrong when a rank's view is not the chunk ring_reduce_scatter sums for it."""
    ring, views = list(chunk_bounds(numel, n)[rank]), s["views"]
    if "ring_reduce_scatter" not in s["library"] or len(views) != 1 or views[0] == ring:
        return ""
    return (f"rank {rank}'s optimizer works on values {views[0][0]}..{views[0][1]} (end "
            f"excluded), but ring_reduce_scatter leaves rank {rank} the sum of "
            f"{ring[0]}..{ring[1]}: the chunks are not cut as the ring cuts")


def judge_setup(by_rank: dict, n: int, numel: int) -> None:
    """What make_shard_optimizer built: an optimizer over this rank's share of the values."""
    expect(by_rank[0]["is_optimizer"], f"make_shard_optimizer must return the optimizer (a "
                                       f"torch.optim optimizer); it returned a "
                                       f"{by_rank[0]['returned']}")
    share = -(-numel // n)  # ceil(numel / N): the most values a chunk of an even cut holds
    for rank in range(n):
        count = by_rank[rank]["held"]
        expect(count < numel or count <= share,
               f"rank {rank}'s optimizer holds all {numel} values: ZeRO-1 gives each rank the "
               "optimizer state of its own chunk only, 1/N of it")
        expect(count <= share, f"rank {rank}'s optimizer holds {count} of the {numel} values, "
                               f"more than its share of 1/N ({share} at most on {n} ranks)")
    if any(by_rank[rank]["copies"] for rank in range(n)):
        return  # a copy: judged by its values
    owners = [[r for r in range(n) for a, b in by_rank[r]["views"] if a <= i < b]
              for i in range(numel)]
    shared = [i for i in range(numel) if len(owners[i]) > 1]
    if shared:
        first, second = owners[shared[0]][:2]
        raise ExerciseError(f"ranks {first} and {second} both update {_values(shared)}: each "
                            "value needs one owner, whose update the other ranks get")
    free = [i for i in range(numel) if not owners[i]]
    cut = next((m for r in range(n) if (m := ring_mismatch(by_rank[r], r, n, numel))), "")
    expect(not free, f"no rank's optimizer holds {_values(free)} of the {numel}: no rank "
                     f"updates {'it' if len(free) == 1 else 'them'}" +
                     (f"; and {cut}" if cut else ""))


def judge_messages(by_rank: dict, n: int, numel: int) -> None:
    """No all-reduce; a reduce-scatter and an all-gather's bytes, or values, per step."""
    for rank in range(n):
        s = by_rank[rank]
        expect(not ALL_REDUCES & {*s["collectives"], *s["library"]},
               "zero1_step all-reduces: every rank gets the sum of every value, when ZeRO-1 "
               "needs only its own chunk's sum (a reduce-scatter) and then the other chunks' "
               "new values (an all-gather)")
        handed = sum(k for call, _, k in s["handed"] if call in COLLECTIVES)
        expect(handed <= 2 * STEPS * numel, f"rank {rank} handed collectives {handed} values in "
               f"{STEPS} steps of {numel} values: a reduce-scatter and an all-gather move each "
               "value once each step")
    if not any(by_rank[r]["collectives"] for r in range(n)):
        found = ring_share([by_rank[r]["bytes_sent"] // STEPS for r in range(n)], numel, 8, 2)
        expect(found is None, f"in each step, {found}")


def judge_rank(spec: dict, s: dict, rank: int, n: int, step: int) -> None:
    """Name why rank ``rank``'s parameters after ``step`` are not plain data parallelism's."""
    want = reference(spec, n)
    before = torch.tensor(want[step - 1] if step else initial_parameters(spec).tolist())
    got = torch.tensor(s["after"][step])
    if s["held"] and torch.equal(got, before):
        expect(not (s["copies"] and s["copy_moved"]),
               f"after step {step + 1}, rank {rank}'s flat_params did not change, yet its "
               "optimizer updated the tensor it holds: that tensor is a copy of the chunk "
               "(.clone(), torch.tensor(...), ...), not a view of flat_params, so no update "
               "reaches the parameters")
        expect(False, f"after step {step + 1}, rank {rank}'s flat_params did not change at "
                      "all: its optimizer updated nothing that is part of them (a step changes "
                      "only the tensors it holds that have a .grad)")
    start, end = s["views"][0] if len(s["views"]) == 1 else s["chunk"]
    outside = torch.cat([got[:start], got[end:]])
    expect(not torch.equal(outside, torch.cat([before[:start], before[end:]])),
           f"after step {step + 1}, rank {rank}'s own chunk is updated but the other values "
           "are still the old ones: no rank got the other chunks from their owners")
    summed = reference(spec, n, grad_scale=n)[step]
    expect(not close(got, summed), f"the step used {cases.SUMMED}")
    expect(not close(got, reference(spec, n, grad_scale=1 / n)[step]),
           f"after step {step + 1}, rank {rank}'s step used the mean gradient divided by {n} "
           "again, N times too small: the reduce-scatter's sum divided once by the group's "
           "size is the mean")
    cases.fail_with_gap(got, want[step], f"rank {rank}", step)


def judge(spec: dict, by_rank: dict, run) -> None:
    n, want = len(by_rank), reference(spec, len(by_rank))
    judge_setup(by_rank, n, spec["numel"])
    judge_messages(by_rank, n, spec["numel"])
    for step in range(STEPS):
        for rank in range(n):
            if not close(by_rank[rank]["after"][step], want[step]):
                cut = next((m for r in range(n)  # any rank's chunk, not only this one's
                            if (m := ring_mismatch(by_rank[r], r, n, spec["numel"]))), "")
                expect(not cut, f"after step {step + 1}, rank {rank}'s parameters differ from "
                                f"plain data parallelism: {cut}")
                judge_rank(spec, by_rank[rank], rank, n, step)
    for rank in range(1, n):
        expect(by_rank[rank]["after"] == by_rank[0]["after"],
               f"rank {rank}'s parameters are not rank 0's, bit for bit")


EXERCISE = FileExercise(
    "10.4", "workspace/my_zero.py", ("make_shard_optimizer", "zero1_step"), __name__,
    Advice.unpaired("every rank must call ring_reduce_scatter and then ring_all_gather on the "
                    "whole flat tensor, once per step"), judge,
    library={"course_lib.core.zero": "that is the course's ZeRO-1: write the step yourself, "
                                     "from the ring's two halves"},
    explain=lambda error, text: global_rank_sentence(error, text), deadline_s=60.0,
    entry="check.nb10.my_zero")
