"""Checkers for the exercises of notebook 10 (beyond data parallel)."""

from __future__ import annotations

import math
import numbers
import operator

import torch

from course_lib.check.answers import expect_type
from course_lib.check.cases import zero1
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_exercise
from course_lib.check.own_work import ANSWER_ITSELF, call_own
from course_lib.check.shard_trace import traced_shards
from course_lib.core.collectives import chunk_bounds

FP32_AGREEMENT = 1e-5  # float32 keeps about 7 digits; a few sums of squares lose a little
RANGE_CASES = ((12, 4), (10, 4), (7, 3), (3, 4), (26574, 4), (5, 1))  # (numel, world size)


def whole(value) -> bool:
    """An int, or what stands for one where Python wants an index (a numpy integer, an
    integer tensor of one element); True and False do not count."""
    if isinstance(value, bool) or type(value).__name__ == "bool" or (
            torch.is_tensor(value) and value.dtype == torch.bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def fractional(value) -> bool:
    """A float of any kind (Python's, numpy's, a floating-point tensor): what / gives."""
    if torch.is_tensor(value):
        return value.is_floating_point()
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)


def not_whole(values) -> str:
    """Why ``values`` are not whole numbers, in the learner's terms."""
    if any(fractional(v) for v in values):
        return "/ gives a float, // does not"
    kinds = sorted({type(v).__name__ for v in values if not whole(v)})
    return f"a {' or '.join(kinds)} is not a whole number"


def figures(got: float, want: float) -> tuple[str, str]:
    """``got`` and ``want`` written with as many digits as it takes to tell them apart."""
    for digits in range(6, 18):
        shown = f"{got:.{digits}g}", f"{want:.{digits}g}"
        if shown[0] != shown[1]:
            return shown
    return shown


def owned_pair(owned, numel: int, world_size: int, rank: int) -> tuple[int, int]:
    got = call_own(owned, numel, world_size, rank, library=[chunk_bounds],
                   hint=ANSWER_ITSELF + "work out the bounds yourself, with divmod")
    expect_type(got, (tuple, list), "return the pair (start, end)")
    expect(len(got) == 2, f"return two numbers, (start, end); your code returned {len(got)}")
    expect(all(whole(v) for v in got), f"start and end must be whole numbers (int), got "
                                       f"{tuple(got)}: {not_whole(got)}")
    return int(got[0]), int(got[1])


@exercise("10.1")
def owned_range(owned) -> None:
    """``owned(numel, world_size, rank)`` returns ``(start, end)`` of rank's chunk."""
    for numel, world_size in RANGE_CASES:
        got = [owned_pair(owned, numel, world_size, r) for r in range(world_size)]
        want = [tuple(b) for b in chunk_bounds(numel, world_size)]
        if got == want:
            continue
        covered = sum(end - start for start, end in got)
        expect(covered == numel, f"{numel} elements on {world_size} ranks: your chunks cover "
                                 f"{covered}; every element must be owned by exactly one rank")
        expect(got[0][0] == 0, f"{numel} elements on {world_size} ranks: rank 0 starts at "
                               f"{got[0][0]}: the first chunk starts at element 0")
        for r in range(world_size - 1):
            expect(got[r][1] == got[r + 1][0],
                   f"{numel} elements on {world_size} ranks: rank {r} ends at {got[r][1]}, rank "
                   f"{r + 1} starts at {got[r + 1][0]}: the chunks must follow each other "
                   "without gaps or overlaps")
        rank = next(r for r in range(world_size) if got[r] != want[r])
        expect(False, f"{numel} elements on {world_size} ranks: rank {rank} gets {got[rank]}, "
                      f"expected {want[rank]}; the extra elements go to the first ranks, one "
                      "each")


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
            got = number_of_bytes(got, stage)
            want = reference_bytes(num_params, world_size, stage)
            if math.isclose(got, want, rel_tol=1e-9):
                continue
            many = "many" if got > want else "few"
            expect(stage != 0, f"stage 0, {num_params} parameters: your {got:.0f} bytes are too "
                               f"{many}; stage 0 is plain data parallelism: every rank holds all "
                               "of it, parameters, gradients and optimizer state, whole")
            names = {1: "the optimizer state", 2: "the optimizer state and the gradients",
                     3: "the optimizer state, the gradients and the parameters"}
            expect(False, f"stage {stage}, {num_params} parameters on {world_size} ranks: "
                          f"your {got:.0f} bytes are too {many}; stage {stage} divides "
                          f"{names[stage]} by the world size, and keeps the rest whole")


def number_of_bytes(got, stage: int) -> float:
    """What the learner's function returned, as a float: any real number, or a tensor of one."""
    if torch.is_tensor(got) and got.numel() == 1 and got.dtype != torch.bool:
        return float(got)
    expect_type(got, numbers.Real, f"return a number of bytes for every stage "
                                   f"(stage {stage} here)")
    return float(got)


@exercise("10.3")
def global_norm(norm_of_shards) -> None:
    """``norm_of_shards(shards)``: the norm of the whole gradient from one number per shard."""
    g = torch.Generator().manual_seed(0)
    for sizes in ((5, 5), (3, 4, 5), (1, 10, 2, 7)):
        shards = [torch.randn(n, generator=g) for n in sizes]  # fp32, as ZeRO's gradients
        traced, log = traced_shards(shards)
        got = call_own(norm_of_shards, traced, hint=ANSWER_ITSELF + "combine one number per "
                       "rank yourself", library=[torch.nn.utils.get_total_norm,
                                                 torch.nn.utils.clip_grad_norm_])
        expect(not log.mixed, f"your code puts the shards' values together ({log.mixed[:1]}): "
                              "no rank holds the other ranks' chunks; each rank may send ONE "
                              "number, computed from its own chunk")
        expect_type(got, (numbers.Real, torch.Tensor), "return the norm, one number")
        expect(not isinstance(got, torch.Tensor) or got.numel() == 1,
               "return the norm, one number (a float or a 0-d tensor)")
        got = float(got)
        want = float(torch.cat(shards).double().norm())
        summed = sum(float(s.double().norm()) for s in shards)
        # fp32 shards: any order of the sums, in fp32 or fp64, agrees to about 1e-7 relative
        expect(not math.isclose(got, summed, rel_tol=FP32_AGREEMENT),
               "you added the shards' norms, and norms do not add up: the norm of [3, 4] is 5, "
               "not 3 + 4")
        expect(not math.isclose(got, want ** 2, rel_tol=FP32_AGREEMENT),
               "that is the SQUARED norm of the whole gradient: one step is missing")
        shown, expected = figures(got, want)
        expect(math.isclose(got, want, rel_tol=FP32_AGREEMENT),
               f"expected {expected} (the norm of all shards put together), got {shown}")


# ---- a ZeRO-1 step: the learner's own file, launched on 2, 3 and 4 processes -------------

@exercise("10.4")
def my_zero(path: str = zero1.EXERCISE.file, world_sizes=WORLD_SIZES) -> None:
    """``make_shard_optimizer`` and ``zero1_step`` in the learner's file."""
    check_exercise(zero1.EXERCISE, path, world_sizes)
