"""Notebook 10's checkers: the reference answers pass, realistic wrong answers get a hint."""

import math

import pytest
import torch

from course_lib.check.core import ExerciseError
from course_lib.check.nb10 import bytes_per_rank, global_norm, owned_range


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


def test_owned_reference(capsys):
    owned_range(owned_reference)
    assert capsys.readouterr().out == "Exercise 10.1: correct.\n"


@pytest.mark.parametrize("wrong, hint", [
    (owned_floor, "must be owned by exactly one rank"),
    (owned_rest_on_last, "first numel % world_size ranks get one more"),
    (lambda numel, world_size, rank: (0, numel), "must be owned by exactly one rank"),
])
def test_owned_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        owned_range(wrong)


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


def test_bytes_reference(capsys):
    bytes_per_rank(bytes_reference)
    assert capsys.readouterr().out == "Exercise 10.2: correct.\n"


@pytest.mark.parametrize("wrong, hint", [
    (bytes_stage2_forgets_grads, "stage 2 divides the optimizer state and the gradients"),
    (bytes_shards_everything, "stage 1 divides the optimizer state by"),
    (lambda p, n, stage: 12 * p, "stage 0 is plain data parallelism"),
])
def test_bytes_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        bytes_per_rank(wrong)


def test_global_norm_reference(capsys):
    global_norm(lambda shards: math.sqrt(sum(float(s.norm()) ** 2 for s in shards)))
    assert capsys.readouterr().out == "Exercise 10.3: correct.\n"


@pytest.mark.parametrize("wrong, hint", [
    (lambda shards: sum(float(s.norm()) for s in shards), "norms do not add up"),
    (lambda shards: sum(float(s.norm()) ** 2 for s in shards), "expected"),
    (lambda shards: float(torch.stack([s.norm() for s in shards]).mean()), "expected"),
])
def test_global_norm_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        global_norm(wrong)
