"""Notebook 09's checkers: the reference answers pass, realistic wrong answers get a hint."""

import os

import pytest
import torch

from course_lib.check.core import ExerciseError
from course_lib.check.nb09 import atomic_save, sampler_by_hand


def indices_reference(size, world_size, rank, epoch, seed):
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(size, generator=g).tolist()
    total = -(-size // world_size) * world_size
    order += order[: total - size]  # pad by repeating the first indices
    return order[rank:total:world_size]


def indices_without_epoch(size, world_size, rank, epoch, seed):
    return indices_reference(size, world_size, rank, 0, seed)


def indices_without_padding(size, world_size, rank, epoch, seed):
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(size, generator=g).tolist()[rank::world_size]


def indices_in_blocks(size, world_size, rank, epoch, seed):
    strided = [indices_reference(size, world_size, r, epoch, seed) for r in range(world_size)]
    everything = [i for r in range(len(strided[0])) for i in (s[r] for s in strided)]
    per_rank = len(strided[0])
    return everything[rank * per_rank:(rank + 1) * per_rank]


def test_sampler_reference(capsys):
    sampler_by_hand(indices_reference)
    assert capsys.readouterr().out == "Exercise 9.1: correct.\n"


@pytest.mark.parametrize("wrong, hint", [
    (indices_without_epoch, "seed \\+ epoch"),
    (indices_without_padding, "padded"),
    (indices_in_blocks, "every world_size-th index"),
])
def test_sampler_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        sampler_by_hand(wrong)


def save_reference(obj, path):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)  # atomic: the old file or the new one, never half of one


def save_in_place(obj, path):
    torch.save(obj, path)


def save_never_renamed(obj, path):
    torch.save(obj, path + ".tmp")


def save_swallowing_errors(obj, path):
    try:
        save_reference(obj, path)
    except OSError:
        pass


def test_atomic_save_reference(capsys):
    atomic_save(save_reference)
    assert capsys.readouterr().out == "Exercise 9.2: correct.\n"
    assert torch.save.__name__ == "save"  # the checker put torch.save back


@pytest.mark.parametrize("wrong, hint", [
    (save_in_place, "destroyed the previous checkpoint"),
    (save_never_renamed, "there is no file at path"),
    (save_swallowing_errors, "did not reach the caller"),
])
def test_atomic_save_wrong_answers(wrong, hint):
    real_save = torch.save
    with pytest.raises(ExerciseError, match=hint):
        atomic_save(wrong)
    assert torch.save is real_save


def test_atomic_save_not_done(capsys):
    def hole(obj, path):
        raise NotImplementedError("Exercise 9.2")

    atomic_save(hole)
    assert "Exercise 9.2: not done yet" in capsys.readouterr().out
