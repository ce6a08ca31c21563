"""Notebook 07's checkers: the reference answers pass, realistic wrong answers get a hint."""

import pytest

from course_lib.check.core import ExerciseError
from course_lib.check.nb07 import scale_loss, shard_rows


def reference_rows(global_size, rank, k, world_size, accum_steps):
    size = global_size // (world_size * accum_steps)
    start = (rank * accum_steps + k) * size
    return slice(start, start + size)


def test_shard_reference(capsys):
    shard_rows(reference_rows)
    shard_rows(lambda *a: range(reference_rows(*a).start, reference_rows(*a).stop))
    assert capsys.readouterr().out == "Exercise 7.1: correct.\nExercise 7.1: correct.\n"


def interleaved(global_size, rank, k, world_size, accum_steps):
    size = global_size // (world_size * accum_steps)
    start = (k * world_size + rank) * size  # micro-step major: not the course's blocks
    return slice(start, start + size)


def forgot_accumulation(global_size, rank, k, world_size, accum_steps):
    size = global_size // world_size  # the whole block of the rank, every micro-step
    return slice(rank * size, (rank + 1) * size)


@pytest.mark.parametrize("wrong, hint", [
    (interleaved, "contiguous block r"),
    (forgot_accumulation, "global / \\(world_size x accum_steps\\)"),
    (lambda g, r, k, n, a: list(range(g))[reference_rows(g, r, k, n, a)], "return a slice"),
])
def test_shard_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        shard_rows(wrong)


def test_scale_reference(capsys):
    scale_loss(lambda s, local, total, n: s * n / total)
    assert capsys.readouterr().out == "Exercise 7.2: correct.\n"


@pytest.mark.parametrize("wrong, hint", [
    (lambda s, local, total, n: s / local, "its own token count"),
    (lambda s, local, total, n: s / total, "off by a factor world_size"),
    (lambda s, local, total, n: s / local / n, "backpropagate loss_sum x world_size"),
    (lambda s, local, total, n: s / total / n, "backpropagate loss_sum x world_size"),
])
def test_scale_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        scale_loss(wrong)


def test_not_done(capsys):
    def hole(*args):
        raise NotImplementedError("Exercise 7.x")

    shard_rows(hole)
    scale_loss(hole)
    out = capsys.readouterr().out
    assert "Exercise 7.1: not done yet" in out and "Exercise 7.2: not done yet" in out
