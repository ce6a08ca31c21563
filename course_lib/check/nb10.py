"""Checkers for the exercises of notebook 10 (beyond data parallel)."""

from __future__ import annotations

import math
import numbers

import torch

from course_lib.check.answers import expect_type
from course_lib.check.cases import zero1
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_exercise
from course_lib.check.own_work import ANSWER_ITSELF, call_own
from course_lib.check.shard_trace import traced_shards
from course_lib.core.collectives import chunk_bounds

RANGE_CASES = ((12, 4), (10, 4), (7, 3), (3, 4), (26574, 4), (5, 1))  # (numel, world size)


def whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def owned_pair(owned, numel: int, world_size: int, rank: int) -> tuple[int, int]:
    got = call_own(owned, numel, world_size, rank, library=[chunk_bounds],
                   hint=ANSWER_ITSELF + "work out the bounds yourself, with divmod")
    expect_type(got, (tuple, list), "return the pair (start, end)")
    expect(len(got) == 2, f"return two numbers, (start, end); your code returned {len(got)}")
    expect(all(whole(v) for v in got), f"start and end must be whole numbers (int), got "
                                       f"{tuple(got)}: / gives a float, // does not")
    return int(got[0]), int(got[1])


@exercise("10.1")
def owned_range(owned) -> None:
    """``owned(numel, world_size, rank)`` returns ``(start, end)`` of rank's chunk."""
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
    for num_params, world_size in ((1_000_000, 4), (26574, 2), (7_000_000_000, 8)):
        for stage in range(4):
            got = call_own(model, num_params, world_size, stage, library=[reference_bytes],
                           hint=ANSWER_ITSELF + "write the sum yourself")
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
    g = torch.Generator().manual_seed(0)
    for sizes in ((5, 5), (3, 4, 5), (1, 10, 2, 7)):
        shards = [torch.randn(n, generator=g, dtype=torch.float64) for n in sizes]
        traced, log = traced_shards(shards)
        got = call_own(norm_of_shards, traced, hint=ANSWER_ITSELF + "combine one number per "
                       "rank yourself", library=[torch.nn.utils.get_total_norm,
                                                 torch.nn.utils.clip_grad_norm_])
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

@exercise("10.4")
def my_zero(path: str = zero1.EXERCISE.file, world_sizes=WORLD_SIZES) -> None:
    """``make_shard_optimizer`` and ``zero1_step`` in the learner's file."""
    check_exercise(zero1.EXERCISE, path, world_sizes)
