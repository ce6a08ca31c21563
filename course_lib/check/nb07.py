"""Checkers for the exercises of notebook 07 (data-parallel training)."""

from __future__ import annotations

import math

import torch

from course_lib.check.core import exercise, expect
from course_lib.tasks.batching import micro_batch_slice

SHARD_CASES = ((32, 2, 1), (32, 2, 4), (32, 4, 2), (24, 3, 2), (8, 1, 8))  # (global, N, K)


def rows_of(answer, global_size: int) -> list[int] | None:
    """The example indices a slice or range names, or None for anything else."""
    if isinstance(answer, slice):
        return list(range(global_size))[answer]
    if isinstance(answer, range):
        return list(answer)
    return None


@exercise("7.1")
def shard_rows(rows_fn) -> None:
    """``rows_fn(global_size, rank, k, world_size, accum_steps)``: the rows of one micro-batch."""
    for global_size, world, accum in SHARD_CASES:
        for rank in range(world):
            for k in range(accum):
                got = rows_of(rows_fn(global_size, rank, k, world, accum), global_size)
                expect(got is not None, "return a slice (or a range) of rows of the batch")
                want = rows_of(micro_batch_slice(global_size, rank, k, world, accum),
                               global_size)
                size = global_size // (world * accum)
                expect(len(got) == size,
                       f"a micro-batch holds global / (world_size x accum_steps) = {size} "
                       f"examples (global {global_size}, N={world}, K={accum}), got {len(got)}")
                expect(got == want,
                       f"rank {rank}, micro-step {k} (global {global_size}, N={world}, "
                       f"K={accum}): expected rows {want[0]}..{want[-1]}, got "
                       f"{got[0]}..{got[-1]}. Rank r owns the contiguous block r of the batch "
                       "and walks through it in K micro-steps")


def _as_float(value) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


@exercise("7.2")
def scale_loss(scale_fn) -> None:
    """``scale_fn(loss_sum, local_tokens, global_tokens, world_size)``: what to backpropagate.

    The gradient sync averages over ranks, so the average of the scaled losses must be the
    mean loss over every token of the global batch.
    """
    cases = (([3.0, 5.0], [10, 30]), ([2.0, 4.0, 1.0, 9.0], [7, 11, 3, 19]), ([6.0], [12]))
    for loss_sums, tokens in cases:
        world, global_tokens = len(tokens), sum(tokens)
        scaled = [_as_float(scale_fn(torch.tensor(s, dtype=torch.float64), t, global_tokens,
                                     world)) for s, t in zip(loss_sums, tokens, strict=True)]
        averaged = sum(scaled) / world  # what the all-reduce and the division by N leave
        right = sum(loss_sums) / global_tokens  # the mean over every token of the batch
        mean_of_means = sum(s / t for s, t in zip(loss_sums, tokens, strict=True)) / world
        if world > 1:
            expect(not math.isclose(averaged, mean_of_means, rel_tol=1e-9),
                   "each rank divided by its own token count: that averages the ranks' means, "
                   "and tokens on ranks with fewer tokens weigh more; divide by global_tokens")
            expect(not math.isclose(averaged * world, right, rel_tol=1e-9),
                   "off by a factor world_size: the sync averages over ranks (divides by N), "
                   "so multiply by world_size")
        expect(math.isclose(averaged, right, rel_tol=1e-9),
               f"with token losses {loss_sums} and counts {tokens} the ranks' average should "
               f"be the global token mean {right:.6f}, got {averaged:.6f}: backpropagate "
               "loss_sum x world_size / global_tokens")
