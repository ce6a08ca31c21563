"""Notebook 10's checkers: the reference answers pass, realistic wrong answers get a hint
(at most report.MAX_LINES lines, no line of the checker's code)."""

import math

import numpy as np
import pytest
import torch
from check_reports import shown_report, standard_tests

from course_lib.check.nb10 import (
    bytes_per_rank,
    figures,
    global_norm,
    owned_range,
    reference_bytes,
)
from course_lib.core.collectives import chunk_bounds


def owned_reference(numel, world_size, rank):
    base, extra = divmod(numel, world_size)
    start = rank * base + min(rank, extra)  # the first `extra` ranks hold one more
    return start, start + base + (1 if rank < extra else 0)


def owned_floor(numel, world_size, rank):
    size = numel // world_size
    return rank * size, (rank + 1) * size


def owned_rest_on_last(numel, world_size, rank):
    size = numel // world_size
    end = numel if rank == world_size - 1 else (rank + 1) * size
    return rank * size, end


def owned_float(numel, world_size, rank):
    size = numel / world_size  # a float
    return round(rank * size), round((rank + 1) * size)  # noqa: RUF046 - whole but unequal


def owned_true_division(numel, world_size, rank):
    return rank * numel / world_size, (rank + 1) * numel / world_size


def owned_in_tensors(numel, world_size, rank):
    base, extra = divmod(numel, world_size)
    sizes = torch.full((world_size,), base) + (torch.arange(world_size) < extra).long()
    ends = sizes.cumsum(0)
    return ends[rank] - sizes[rank], ends[rank]  # 0-d integer tensors


def owned_in_numpy(numel, world_size, rank):
    start, end = owned_reference(numel, world_size, rank)
    return np.int64(start), np.int64(end)


def owned_float_tensors(numel, world_size, rank):
    start, end = owned_reference(numel, world_size, rank)
    return torch.tensor(float(start)), torch.tensor(float(end))


def owned_with_a_gap(numel, world_size, rank):
    start, end = owned_reference(numel, world_size, rank)
    return (start + 1, end + 1) if rank == 1 else (start, end)


FIRST_RANK_SHORT = ("10 elements on 4 ranks: rank 0 gets (0, 2), expected (0, 3); the extra "
                    "elements go to the first ranks")
OWNED_RANGE_MISTAKES = [
    (owned_floor, "must be owned by exactly one rank"),
    (owned_rest_on_last, FIRST_RANK_SHORT),
    (owned_float, FIRST_RANK_SHORT),  # whole but unequal chunks: the same first difference
    (owned_float_tensors, "got (tensor(0.), tensor(3.)): / gives a float, // does not"),
    (lambda numel, world_size, rank: ("0", str(numel)), "a str is not a whole number"),
    (owned_with_a_gap, "rank 0 ends at 3, rank 1 starts at 4: the chunks must follow each"),
    (lambda numel, world_size, rank: (0, numel), "must be owned by exactly one rank"),
    (owned_true_division, "start and end must be whole numbers (int), got (0.0, 3.0)"),
    (lambda numel, world_size, rank: slice(0, numel), "return the pair (start, end)"),
    (lambda numel, world_size, rank: chunk_bounds(numel, world_size)[rank],
     "uses the library's chunk_bounds"),
]


def bytes_reference(num_params, world_size, stage):
    params, grads, state = 4 * num_params, 4 * num_params, 8 * num_params
    if stage >= 1:
        state /= world_size  # ZeRO-1: optimizer state sharded
    if stage >= 2:
        grads /= world_size  # ZeRO-2: gradients too
    if stage >= 3:
        params /= world_size  # ZeRO-3 (FSDP): parameters too
    return params + grads + state


def bytes_stage2_forgets_grads(num_params, world_size, stage):
    return bytes_reference(num_params, world_size, 1 if stage == 2 else stage)


def bytes_shards_everything(num_params, world_size, stage):
    return 16 * num_params / (world_size if stage else 1)


def bytes_no_stage_3(num_params, world_size, stage):
    if stage == 0:
        return 16 * num_params
    elif stage == 1:
        return 8 * num_params + 8 * num_params / world_size
    elif stage == 2:
        return 4 * num_params + 12 * num_params / world_size  # stage 3: falls off the end


BYTES_PER_RANK_MISTAKES = [
    (bytes_stage2_forgets_grads, "stage 2, 1000000 parameters on 4 ranks: your 10000000 bytes "
                                 "are too many; stage 2 divides the optimizer state and the"),
    (bytes_shards_everything, "stage 1 divides the optimizer state by"),
    (lambda p, n, stage: 12 * p, "your 12000000 bytes are too few; stage 0 is plain data"),
    (bytes_no_stage_3, "return a number of bytes for every stage (stage 3 here); your code "
                       "returned None"),
    (lambda p, n, stage: str(16 * p), "your code returned the str"),
    (lambda p, n, stage: torch.tensor([16.0 * p] * 2), "your code returned a tensor of shape"),
    (lambda p, n, stage: reference_bytes(p, n, stage), "uses the library's reference_bytes"),
]


def norm_reference(shards):
    return math.sqrt(sum(float(s.norm()) ** 2 for s in shards))


GLOBAL_NORM_MISTAKES = [
    (lambda shards: sum(float(s.norm()) for s in shards), "norms do not add up"),
    (lambda shards: sum(float(s.norm()) ** 2 for s in shards), "the SQUARED norm"),
    (lambda shards: float(torch.stack([s.norm() for s in shards]).mean()),
     "(the norm of all shards put together)"),
    (lambda shards: torch.cat(shards).norm(), "your code puts the shards' values together"),
    (lambda shards: torch.cat([s.reshape(-1) for s in shards]).norm(),
     "your code puts the shards' values together"),
    (lambda shards: [s.norm() for s in shards], "return the norm, one number"),
    (lambda shards: torch.nn.utils.get_total_norm(shards), "uses the library's get_total_norm"),
]


def norm_accumulated_in_fp32(shards):
    total = torch.tensor(0.0)
    for s in shards:
        total += (s ** 2).sum()
    return total.sqrt()


def norm_of_a_buffer(shards):
    local = torch.zeros(len(shards))  # one slot per rank, as an all-reduce would fill it
    for r, s in enumerate(shards):
        local[r] = s.pow(2).sum()
    return local.sum().sqrt()


def norm_of_norms(shards):
    norms = torch.tensor([torch.linalg.vector_norm(s).item() for s in shards])
    return torch.linalg.vector_norm(norms)


def norm_slightly_off(shards):
    return norm_reference(shards) * (1 + 1e-4)


@pytest.mark.parametrize("got, want", [(3.494032, 3.4940321), (0.1, 0.1000001), (2.0, 3.0)])
def test_figures_tell_two_numbers_apart(got, want):
    shown, expected = figures(got, want)
    assert shown != expected and float(shown) == pytest.approx(got, rel=1e-12)


def test_a_norm_just_outside_the_tolerance_shows_two_different_figures():
    text = shown_report(global_norm, norm_slightly_off)
    expected, got = text.split("expected ")[1].split(" (the norm")[0], text.split("got ")[1]
    assert expected not in got, text


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((owned_range, [owned_reference, owned_in_tensors, owned_in_numpy],
                    OWNED_RANGE_MISTAKES, ["expected [("]),
                   (bytes_per_rank, [bytes_reference,
                                     lambda p, n, s: torch.tensor(bytes_reference(p, n, s),
                                                                  dtype=torch.float64),
                                     lambda p, n, s: np.float64(bytes_reference(p, n, s))],
                    BYTES_PER_RANK_MISTAKES, ["expected"]),
                   (global_norm, [norm_reference,
                                  lambda shards: torch.stack([(s ** 2).sum() for s in shards])
                                  .sum().sqrt(),
                                  lambda shards: sum(s.pow(2).sum() for s in shards) ** 0.5,
                                  norm_accumulated_in_fp32, norm_of_a_buffer, norm_of_norms,
                                  lambda shards: torch.tensor([float(s.pow(2).sum())
                                                               for s in shards]).sum().sqrt()],
                    GLOBAL_NORM_MISTAKES))
