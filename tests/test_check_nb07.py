"""Notebook 07's checkers: the reference answers pass, realistic wrong answers get a hint
(at most report.MAX_LINES lines, no line of the checker's code)."""

import pytest
from check_reports import shown_report

from course_lib.check import nb07, own_work
from course_lib.check.hints import hint_text
from course_lib.check.nb07 import scale_loss, shard_rows
from course_lib.core.accumulation import scale_by_global_tokens
from course_lib.tasks import batching
from course_lib.tasks.batching import micro_batch_slice


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


def float_bounds(global_size, rank, k, world_size, accum_steps):
    size = global_size / (world_size * accum_steps)  # a float, even when it divides
    start = (rank * accum_steps + k) * size
    return slice(start, start + size)


def library_rows(global_size, rank, k, world_size, accum_steps):
    return micro_batch_slice(global_size, rank, k, world_size, accum_steps)


def library_through_module(global_size, rank, k, world_size, accum_steps):
    return batching.micro_batch_slice(global_size, rank, k, world_size, accum_steps)


@pytest.mark.parametrize("wrong, words", [
    (interleaved, "Rank r owns the contiguous block r"),
    (forgot_accumulation, "cut into world_size x accum_steps equal parts"),
    (lambda g, r, k, n, a: list(range(g))[reference_rows(g, r, k, n, a)], "return a slice"),
    (float_bounds, "the slice's bounds must be whole numbers (int)"),
    (library_rows, "uses the library's micro_batch_slice, which is the answer itself"),
    (library_through_module, "uses the library's micro_batch_slice"),
    (micro_batch_slice, "uses the library's micro_batch_slice"),
])
def test_shard_wrong_answers(wrong, words):
    hint = shown_report(shard_rows, wrong, nb07, own_work)
    assert words in hint, hint


def test_scale_reference(capsys):
    scale_loss(lambda s, local, total, n: s * n / total)
    assert capsys.readouterr().out == "Exercise 7.2: correct.\n"


@pytest.mark.parametrize("wrong, words", [
    (lambda s, local, total, n: s / local, "its own token count"),
    (lambda s, local, total, n: s / total, "off by a factor world_size"),
    (lambda s, local, total, n: s / local / n, "every token of the global batch must count"),
    (lambda s, local, total, n: s / total / n, "every token of the global batch must count"),
    (lambda s, local, total, n: s.item() * n / total, "the plain number"),  # right value
    (lambda s, local, total, n: (s * n / total).detach(), "cut off from the model"),
    (lambda s, local, total, n: scale_by_global_tokens(s, total, n),
     "uses the library's scale_by_global_tokens"),
])
def test_scale_wrong_answers(wrong, words):
    hint = shown_report(scale_loss, wrong, nb07, own_work)
    assert words in hint, hint


def test_no_hint_gives_the_formula():
    """The hints name the mistake; the factor itself is the exercise."""
    for hint in [hint_text("7.2")] + [shown_report(scale_loss, wrong, nb07) for wrong in (
            lambda s, local, total, n: s / local, lambda s, local, total, n: s / total,
            lambda s, local, total, n: s / total / n)]:
        assert "world_size / global" not in hint and "x world_size" not in hint, hint


def test_not_done(capsys):
    def hole(*args):
        raise NotImplementedError("Exercise 7.x")

    shard_rows(hole)
    scale_loss(hole)
    out = capsys.readouterr().out
    assert "Exercise 7.1: not done yet" in out and "Exercise 7.2: not done yet" in out
