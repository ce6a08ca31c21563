"""Checkers for the exercises of notebook 10 (beyond data parallel)."""

from __future__ import annotations

import math
import numbers

import torch

from course_lib.check.answers import call, expect_type
from course_lib.check.cases import zero_cases
from course_lib.check.checker import ExerciseError, exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_file
from course_lib.check.mp.learner import find_learner_file
from course_lib.check.mp.tracer import ALL_REDUCES
from course_lib.check.mp.verdict import Advice
from course_lib.check.own_work import expect_own_code
from course_lib.check.shard_trace import traced_shards
from course_lib.core.collectives import chunk_bounds
from course_lib.runtime.workspace import record_pass

RANGE_CASES = ((12, 4), (10, 4), (7, 3), (3, 4), (26574, 4), (5, 1))  # (numel, world size)


def whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def owned_pair(owned, numel: int, world_size: int, rank: int) -> tuple[int, int]:
    got = call(owned, numel, world_size, rank)
    expect_type(got, (tuple, list), "return the pair (start, end)")
    expect(len(got) == 2, f"return two numbers, (start, end); your code returned {len(got)}")
    expect(all(whole(v) for v in got), f"start and end must be whole numbers (int), got "
                                       f"{tuple(got)}: / gives a float, // does not")
    return int(got[0]), int(got[1])


@exercise("10.1")
def owned_range(owned) -> None:
    """``owned(numel, world_size, rank)`` returns ``(start, end)`` of rank's chunk."""
    expect_own_code(owned, chunk_bounds, "work out the bounds yourself, with divmod")
    for numel, world_size in RANGE_CASES:
        got = [owned_pair(owned, numel, world_size, r) for r in range(world_size)]
        want = chunk_bounds(numel, world_size)
        if got == [tuple(b) for b in want]:
            continue
        covered = sum(end - start for start, end in got)
        expect(covered == numel, f"{numel} elements on {world_size} ranks: your chunks cover "
                                 f"{covered}; every element must be owned by exactly one rank")
        expect(got[0][0] == 0 and all(got[r][1] == got[r + 1][0] for r in range(world_size - 1)),
               f"the chunks must follow each other without gaps: got {got}")
        expect(False, f"{numel} elements on {world_size} ranks: expected {want}, got {got}; "
                      "the extra elements go to the first ranks, one each")


def reference_bytes(num_params: int, world_size: int, stage: int) -> float:
    """fp32 parameters (4 bytes), fp32 gradients (4), AdamW's two moments (8)."""
    params, grads, state = 4.0 * num_params, 4.0 * num_params, 8.0 * num_params
    shards = {0: (params, grads, state), 1: (params, grads, state / world_size),
              2: (params, grads / world_size, state / world_size),
              3: (params / world_size, grads / world_size, state / world_size)}
    return sum(shards[stage])


@exercise("10.2")
def bytes_per_rank(model) -> None:
    """``model(num_params, world_size, stage)``: bytes per rank for ZeRO stage 0..3."""
    expect_own_code(model, reference_bytes, "write the sum yourself")
    for num_params, world_size in ((1_000_000, 4), (26574, 2), (7_000_000_000, 8)):
        for stage in range(4):
            got = call(model, num_params, world_size, stage)
            expect_type(got, (int, float), f"return a number of bytes for every stage "
                                           f"(stage {stage} here)")
            want = reference_bytes(num_params, world_size, stage)
            if math.isclose(float(got), want, rel_tol=1e-9):
                continue
            expect(stage != 0, f"stage 0 is plain data parallelism: every rank holds all of "
                               f"it, expected {want:.0f} bytes, got {float(got):.0f}")
            names = {1: "the optimizer state", 2: "the optimizer state and the gradients",
                     3: "the optimizer state, the gradients and the parameters"}
            expect(False, f"stage {stage}, {num_params} parameters on {world_size} ranks: "
                          f"expected {want:.0f} bytes, got {float(got):.0f}; stage {stage} "
                          f"divides {names[stage]} by the world size, and keeps the rest whole")


@exercise("10.3")
def global_norm(norm_of_shards) -> None:
    """``norm_of_shards(shards)``: the norm of the whole gradient from one number per shard."""
    for name in ("get_total_norm", "clip_grad_norm_"):
        expect_own_code(norm_of_shards, getattr(torch.nn.utils, name),
                        "combine one number per rank yourself", name)
    g = torch.Generator().manual_seed(0)
    for sizes in ((5, 5), (3, 4, 5), (1, 10, 2, 7)):
        shards = [torch.randn(n, generator=g, dtype=torch.float64) for n in sizes]
        traced, log = traced_shards(shards)
        got = call(norm_of_shards, traced)
        expect(not log.mixed, f"your code puts the shards' values together ({log.mixed[:1]}): "
                              "no rank holds the other ranks' chunks; each rank may send ONE "
                              "number, computed from its own chunk")
        expect_type(got, (int, float, torch.Tensor), "return the norm, one number")
        expect(not isinstance(got, torch.Tensor) or got.numel() == 1,
               "return the norm, one number (a float or a 0-d tensor)")
        got = float(got)
        want = float(torch.cat(shards).norm())
        summed = sum(float(s.norm()) for s in shards)
        expect(not math.isclose(got, summed, rel_tol=1e-9),
               "you added the shards' norms, and norms do not add up: the norm of [3, 4] is 5, "
               "not 3 + 4")
        expect(not math.isclose(got, want ** 2, rel_tol=1e-9),
               "that is the SQUARED norm of the whole gradient: one step is missing")
        expect(math.isclose(got, want, rel_tol=1e-9),
               f"expected {want:.6f} (the norm of all shards put together), got {got:.6f}")


# ---- a ZeRO-1 step: the learner's own file, launched on 2, 3 and 4 processes -------------

MY_ZERO_FILE = "workspace/my_zero.py"
ZERO_CASES = "course_lib.check.cases.zero_cases"
SAME_HALVES = ("every rank must call ring_reduce_scatter and then ring_all_gather on the "
               "whole flat tensor, once per step")
ZERO_ADVICE = Advice.unpaired(SAME_HALVES)


def _values(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:4])) + (", ..." if len(numbers) > 4 else "")
    return f"value{'s' if len(numbers) > 1 else ''} {shown}"


def judge_zero_setup(summary: dict, by_rank: dict, n: int, numel: int) -> None:
    """What make_shard_optimizer built: an optimizer over this rank's share of the values."""
    expect(summary["is_optimizer"], f"make_shard_optimizer must return the optimizer (a "
                                    f"torch.optim optimizer); it returned a "
                                    f"{summary['returned']}")
    share = -(-numel // n)  # ceil(numel / N): the most values a chunk of an even cut holds
    for rank in range(n):
        held = by_rank[rank]["held"]
        expect(held < numel or held <= share,
               f"rank {rank}'s optimizer holds all {numel} values: ZeRO-1 gives each rank the "
               "optimizer state of its own chunk only, 1/N of it")
        expect(held <= share, f"rank {rank}'s optimizer holds {held} of the {numel} values, "
                              f"more than its share of 1/N ({share} at most on {n} ranks)")
    if not any(by_rank[rank]["copies"] for rank in range(n)):  # a copy: judged by its values
        judge_owners(summary, by_rank, n, numel)


def ring_mismatch(summary: dict, views: list, rank: int, n: int, numel: int) -> str:
    """What is wrong when a rank's view is not the chunk ring_reduce_scatter sums for it."""
    ring = list(chunk_bounds(numel, n)[rank])
    if "ring_reduce_scatter" not in summary["library"] or len(views) != 1 or views[0] == ring:
        return ""
    return (f"rank {rank}'s optimizer works on values {views[0][0]}..{views[0][1]} (end "
            f"excluded), but ring_reduce_scatter leaves rank {rank} the sum of "
            f"{ring[0]}..{ring[1]}: the chunks are not cut as the ring cuts")


def judge_owners(summary: dict, by_rank: dict, n: int, numel: int) -> None:
    """Every shard a view of flat_params: each value must be held by exactly one rank."""
    owners = [[r for r in range(n) for a, b in by_rank[r]["views"] if a <= i < b]
              for i in range(numel)]
    shared = [i for i in range(numel) if len(owners[i]) > 1]
    if shared:
        first, second = owners[shared[0]][:2]
        raise ExerciseError(f"ranks {first} and {second} both update {_values(shared)}: each "
                            "value needs one owner, whose update the other ranks get")
    free = [i for i in range(numel) if not owners[i]]
    cut = next((m for r in range(n)
                if (m := ring_mismatch(summary, by_rank[r]["views"], r, n, numel))), "")
    them = "it" if len(free) == 1 else "them"
    expect(not free, f"no rank's optimizer holds {_values(free)} of the {numel}: no rank "
                     f"updates {them}" + (f"; and {cut}" if cut else ""))


def judge_zero_calls(summary: dict) -> None:
    reduced = ALL_REDUCES & {*summary["collectives"], *summary["library"]}
    expect(not reduced,
           "zero1_step all-reduces: every rank gets the sum of every value, when ZeRO-1 needs "
           "only its own chunk's sum (a reduce-scatter) and then the other chunks' new values "
           "(an all-gather)")


def nothing_changed(s: dict, rank: int, step: int) -> str:
    if s["copies"] and s["copy_moved"]:
        return (f"after step {step + 1}, rank {rank}'s flat_params did not change, yet its "
                "optimizer updated the tensor it holds: that tensor is a copy of the chunk "
                "(.clone(), torch.tensor(...), ...), not a view of flat_params, so no update "
                "reaches the parameters")
    return (f"after step {step + 1}, rank {rank}'s flat_params did not change at all: its "
            "optimizer updated nothing that is part of them (a step changes only the tensors "
            "it holds that have a .grad)")


def judge_zero_rank(spec: dict, summary: dict, by_rank: dict, rank: int, step: int) -> None:
    """Name why rank ``rank``'s parameters after ``step`` are not plain data parallelism's."""
    n, s = summary["ranks"], by_rank[rank]
    want = torch.tensor(zero_cases.reference(spec, n)[step])
    before = torch.tensor(zero_cases.reference(spec, n)[step - 1] if step else
                          zero_cases.initial_parameters(spec).tolist())
    got = torch.tensor(s["after"][step])
    expect(s["held"] == 0 or not torch.equal(got, before), nothing_changed(s, rank, step))
    cut = ring_mismatch(summary, s["views"], rank, n, spec["numel"])
    expect(not cut, f"after step {step + 1}, rank {rank}'s parameters differ from plain data "
                    f"parallelism: {cut}")
    start, end = s["views"][0] if len(s["views"]) == 1 else s["chunk"]
    outside = torch.cat([got[:start], got[end:]])
    expect(not torch.equal(outside, torch.cat([before[:start], before[end:]])),
           f"after step {step + 1}, rank {rank}'s own chunk is updated but the other values "
           "are still the old ones: no rank got the other chunks from their owners")
    summed = zero_cases.reference(spec, n, grad_scale=n)[step]
    expect(not torch.allclose(got, torch.tensor(summed), rtol=1e-9, atol=1e-12),
           "the step used the SUM of the ranks' gradients: the reduce-scatter adds them up, "
           "and plain data parallelism steps with their mean")
    gap = float((got - want).abs().max())
    expect(False, f"after step {step + 1}, rank {rank}'s parameters differ from plain data "
                  f"parallelism by up to {gap:.2e}")


def judge_zero_values(spec: dict, summary: dict, by_rank: dict) -> None:
    n = summary["ranks"]
    want = zero_cases.reference(spec, n)
    for step in range(zero_cases.STEPS):
        for rank in range(n):
            got = torch.tensor(by_rank[rank]["after"][step])
            if not torch.allclose(got, torch.tensor(want[step]), rtol=1e-9, atol=1e-12):
                judge_zero_rank(spec, summary, by_rank, rank, step)
    for rank in range(1, n):
        expect(by_rank[rank]["after"] == by_rank[0]["after"],
               f"rank {rank}'s parameters are not rank 0's, bit for bit")


def judge_zero_case(summary: dict, by_rank: dict, run) -> None:
    n = summary["ranks"]
    spec = {s["name"]: s for s in zero_cases.case_specs(n, {})}[summary["name"]]
    judge_zero_setup(summary, by_rank, n, spec["numel"])
    judge_zero_calls(summary)
    judge_zero_values(spec, summary, by_rank)


@exercise("10.4")
def my_zero(path: str = MY_ZERO_FILE, world_sizes=WORLD_SIZES) -> None:
    """``make_shard_optimizer`` and ``zero1_step`` in the learner's file."""
    learner = find_learner_file(path, ("make_shard_optimizer", "zero1_step"))
    check_file(learner, ZERO_CASES, {}, world_sizes, ZERO_ADVICE, judge_zero_case,
               deadline_s=zero_cases.DEADLINE_S)
    record_pass("10.4", path)
