"""Notebook 10's checkers: the reference answers pass, realistic wrong answers get a hint
(at most report.MAX_LINES lines, no line of the checker's code)."""

import math

import torch
from check_reports import standard_tests

from course_lib.check.nb10 import bytes_per_rank, global_norm, owned_range, reference_bytes
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


OWNED_RANGE_MISTAKES = [
    (owned_floor, "must be owned by exactly one rank"),
    (owned_rest_on_last, "got [(0, 2), (2, 4), (4, 6), (6, 10)]; the extra elements go to "
                         "the first ranks"),
    (owned_float, "got [(0, 2), (2, 5), (5, 8), (8, 10)]; the extra elements go to the first"),
    (lambda numel, world_size, rank: (0, numel), "must be owned by exactly one rank"),
    (owned_true_division, "start and end must be whole numbers (int)"),
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
    (bytes_stage2_forgets_grads, "stage 2 divides the optimizer state and the gradients"),
    (bytes_shards_everything, "stage 1 divides the optimizer state by"),
    (lambda p, n, stage: 12 * p, "stage 0 is plain data parallelism"),
    (bytes_no_stage_3, "return a number of bytes for every stage (stage 3 here); your code "
                       "returned None"),
    (lambda p, n, stage: str(16 * p), "your code returned the str"),
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


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((owned_range, [owned_reference], OWNED_RANGE_MISTAKES),
                   (bytes_per_rank, [bytes_reference], BYTES_PER_RANK_MISTAKES),
                   (global_norm, [norm_reference,
                                  lambda shards: torch.stack([(s ** 2).sum() for s in shards])
                                  .sum().sqrt(),
                                  lambda shards: sum(s.pow(2).sum() for s in shards) ** 0.5],
                    GLOBAL_NORM_MISTAKES))
