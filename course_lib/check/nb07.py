"""Checkers for the exercises of notebook 07 (data-parallel training)."""

from __future__ import annotations

import math

import torch

from course_lib.check.answers import expect_tensor_with_grad
from course_lib.check.cases import dp_step
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_exercise
from course_lib.check.nb10 import figures, fractional, not_whole, whole
from course_lib.check.own_work import ANSWER_ITSELF, call_own
from course_lib.core.accumulation import scale_by_global_tokens
from course_lib.tasks.batching import micro_batch_slice

SHARD_CASES = ((32, 2, 1), (32, 2, 4), (32, 4, 2), (24, 3, 2), (8, 1, 8))  # (global, N, K)


def rows_of(answer, global_size: int) -> list[int] | None:
    """The example indices a slice or range names, or None for anything else."""
    if isinstance(answer, slice):
        return list(range(global_size))[answer]
    if isinstance(answer, range):
        return list(answer)
    return None


def bounds_of(answer) -> list:
    """The bounds a slice or range was given (None left out); [] for anything else."""
    if not isinstance(answer, (slice, range)):
        return []  # judged by rows_of
    return [v for v in (answer.start, answer.stop, answer.step) if v is not None]


@exercise("7.1")
def shard_rows(rows_fn) -> None:
    """``rows_fn(global_size, rank, k, world_size, accum_steps)``: the rows of one micro-batch."""
    for global_size, world, accum in SHARD_CASES:
        for rank in range(world):
            for k in range(accum):
                answer = call_own(rows_fn, global_size, rank, k, world, accum,
                                  library=[micro_batch_slice], hint=ANSWER_ITSELF +
                                  "work out the rows yourself, from the sizes")
                bounds = bounds_of(answer)
                expect(not any(fractional(v) for v in bounds),
                       "the slice's bounds must be whole numbers (int): / gives a float even "
                       "when it divides exactly")
                expect(all(whole(v) for v in bounds), f"the slice's bounds must be whole "
                                                      f"numbers (int): {not_whole(bounds)}")
                got = rows_of(answer, global_size)
                expect(got is not None, "return a slice (or a range) of rows of the batch")
                want = rows_of(micro_batch_slice(global_size, rank, k, world, accum),
                               global_size)
                size = global_size // (world * accum)
                expect(len(got) == size,
                       f"a micro-batch holds {size} examples here (global {global_size}, "
                       f"N={world}, K={accum}), yours {len(got)}: the batch is cut into "
                       "world_size x accum_steps equal parts")
                expect(got == want,
                       f"rank {rank}, micro-step {k} (global {global_size}, N={world}, "
                       f"K={accum}): expected rows {want[0]}..{want[-1]}, got "
                       f"{got[0]}..{got[-1]}. Rank r owns the contiguous block r of the batch "
                       "and walks through it in K micro-steps")


def _as_float(value) -> float:
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def scaled_losses(scale_fn, loss_sums, tokens) -> list[float]:
    """Each rank's loss to backpropagate; checks that backward can go through it."""
    world, global_tokens = len(tokens), sum(tokens)
    scaled = []
    for s, t in zip(loss_sums, tokens, strict=True):
        loss_sum = torch.tensor(s, dtype=torch.float64, requires_grad=True)
        loss = call_own(scale_fn, loss_sum, t, global_tokens, world,
                        library=[scale_by_global_tokens],
                        hint=ANSWER_ITSELF + "write the scaling yourself")
        expect_tensor_with_grad(loss, "return the loss to call backward on, computed from "
                                      "loss_sum")
        expect(loss.numel() == 1, f"return one number (a 0-d tensor), not {tuple(loss.shape)}")
        scaled.append(_as_float(loss))
    return scaled


@exercise("7.2")
def scale_loss(scale_fn) -> None:
    """``scale_fn(loss_sum, local_tokens, global_tokens, world_size)``: what to backpropagate.

    The gradient sync averages over ranks, so the average of the scaled losses must be the
    mean loss over every token of the global batch.
    """
    cases = (([3.0, 5.0], [10, 30]), ([2.0, 4.0, 1.0, 9.0], [7, 11, 3, 19]), ([6.0], [12]))
    for loss_sums, tokens in cases:
        world, global_tokens = len(tokens), sum(tokens)
        scaled = scaled_losses(scale_fn, loss_sums, tokens)
        averaged = sum(scaled) / world  # what the all-reduce and the division by N leave
        right = sum(loss_sums) / global_tokens  # the mean over every token of the batch
        mean_of_means = sum(s / t for s, t in zip(loss_sums, tokens, strict=True)) / world
        if world > 1:
            expect(not math.isclose(averaged, mean_of_means, rel_tol=1e-9),
                   "each rank divided by its own token count: that averages the ranks' means, "
                   "and tokens on ranks with fewer tokens weigh more")
            expect(not math.isclose(averaged * world, right, rel_tol=1e-9),
                   f"off by a factor world_size ({world} times too small): the sync averages "
                   "over the ranks, so it divides once more than you planned for")
        shown, expected = figures(averaged, right)
        expect(math.isclose(averaged, right, rel_tol=1e-9),
               f"with token losses {loss_sums} and counts {tokens} the ranks' average should "
               f"be the global token mean {expected}, got {shown}: every token of the "
               "global batch must count once, with the same weight")


# ---- one data-parallel step: the learner's own file, launched on 2, 3 and 4 processes -----

@exercise("7.3")
def my_dp_step(path: str = dp_step.EXERCISE.file, world_sizes=WORLD_SIZES) -> None:
    """``broadcast_parameters`` and ``data_parallel_step`` in the learner's file."""
    check_exercise(dp_step.EXERCISE, path, world_sizes)
