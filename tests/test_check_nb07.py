"""Notebook 07's checkers: the reference answers pass, realistic wrong answers get a hint
(at most report.MAX_LINES lines, no line of the checker's code); exercise 7.3's judge on what
a launch reports (the launches themselves: test_check_file_exercises.py)."""

import re

import numpy as np
import pytest
import torch
from check_reports import shown_report, standard_tests

from course_lib.check import nb07
from course_lib.check.cases import dp_step
from course_lib.check.checker import ExerciseError
from course_lib.check.hints import hint_text
from course_lib.check.mp.learner import LearnerFile
from course_lib.check.mp.runner import RankResult, Run
from course_lib.check.mp.verdict import collective_message
from course_lib.check.nb07 import scale_loss, shard_rows
from course_lib.core.accumulation import scale_by_global_tokens
from course_lib.tasks import batching
from course_lib.tasks.batching import micro_batch_slice


def reference_rows(global_size, rank, k, world_size, accum_steps):
    size = global_size // (world_size * accum_steps)
    start = (rank * accum_steps + k) * size
    return slice(start, start + size)


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


def numpy_bounds(global_size, rank, k, world_size, accum_steps):
    size = np.int64(global_size // (world_size * accum_steps))
    start = (rank * accum_steps + k) * size
    return slice(start, start + size)


def tensor_bounds(global_size, rank, k, world_size, accum_steps):
    rows = reference_rows(global_size, rank, k, world_size, accum_steps)
    return slice(torch.tensor(rows.start), torch.tensor(rows.stop))


def float_tensor_bounds(global_size, rank, k, world_size, accum_steps):
    rows = reference_rows(global_size, rank, k, world_size, accum_steps)
    return slice(torch.tensor(float(rows.start)), torch.tensor(float(rows.stop)))


def library_rows(global_size, rank, k, world_size, accum_steps):
    return micro_batch_slice(global_size, rank, k, world_size, accum_steps)


def library_through_module(global_size, rank, k, world_size, accum_steps):
    return batching.micro_batch_slice(global_size, rank, k, world_size, accum_steps)


ITSELF = "uses the library's micro_batch_slice, which is the answer itself"
SHARD_ROWS_MISTAKES = [
    (interleaved, "Rank r owns the contiguous block r"),
    (forgot_accumulation, "cut into world_size x accum_steps equal parts"),
    (lambda g, r, k, n, a: list(range(g))[reference_rows(g, r, k, n, a)], "return a slice"),
    (float_bounds, "the slice's bounds must be whole numbers (int): / gives a float"),
    (float_tensor_bounds, "the slice's bounds must be whole numbers (int): / gives a float"),
    (lambda g, r, k, n, a: slice(str(reference_rows(g, r, k, n, a).start), None),
     "the slice's bounds must be whole numbers (int): a str is not a whole number"),
    (library_rows, ITSELF),
    (library_through_module, ITSELF),
    (micro_batch_slice, ITSELF),
]


SCALE_LOSS_MISTAKES = [
    (lambda s, local, total, n: s / local, "its own token count"),
    (lambda s, local, total, n: s / total, "off by a factor world_size"),
    (lambda s, local, total, n: s / local / n, "every token of the global batch must count"),
    (lambda s, local, total, n: s / total / n, "every token of the global batch must count"),
    (lambda s, local, total, n: s.item() * n / total, "the plain number"),  # right value
    (lambda s, local, total, n: (s * n / total).detach(), "cut off from the model"),
    (lambda s, local, total, n: torch.tensor(s.item() * n / total, requires_grad=True),
     "your tensor is a new one"),
    (lambda s, local, total, n: scale_by_global_tokens(s, total, n),
     "uses the library's scale_by_global_tokens"),
]


def test_a_loss_just_off_shows_two_different_figures():
    text = shown_report(scale_loss, lambda s, local, total, n: s * n / total * (1 + 1e-8))
    expected = text.split("global token mean ")[1].split(",")[0]
    got = text.split(", got ")[1].split(":")[0]
    assert expected != got and float(expected) == pytest.approx(float(got), rel=1e-6), text


def test_no_hint_gives_the_formula():
    """The hints name the mistake; the factor itself is the exercise."""
    ladder = [hint_text("7.2", rung) for rung in (1, 2)]
    for hint in ladder + [shown_report(scale_loss, wrong, nb07) for wrong in (
            lambda s, local, total, n: s / local, lambda s, local, total, n: s / total,
            lambda s, local, total, n: s / total / n)]:
        assert "world_size / global" not in hint and "x world_size" not in hint, hint


# ---- exercise 7.3's judge, on what a launch would report (no launch) ------------------

def spec_of(world_size: int, accum_steps: int) -> dict:
    return next(s for s in dp_step.case_specs(world_size, {})
                if s["accum_steps"] == accum_steps)


def every_rank(params, world_size: int) -> dict:
    """What the launch would report: every rank of the case ended with ``params``."""
    return {rank: {"params": params} for rank in range(world_size)}


@pytest.mark.parametrize("world_size, factor, words", [
    (3, 3, "the gradient is 3 times too large: either the ring's sum"),  # N = K = 3
    (2, 6, "the gradient is 6 times too large: not divided by the world size (the ring"),
])
def test_a_gradient_too_large_by_a_known_factor_is_named(world_size, factor, words):
    spec = spec_of(world_size, 3)
    got = dp_step.reference_parameters(spec, world_size, factor)
    with pytest.raises(ExerciseError, match=re.escape(words)):
        dp_step.name_step_mistake(spec, every_rank(got, world_size), world_size)


def test_gradients_kept_from_the_step_before_are_named():
    spec = spec_of(2, 1)
    got = dp_step.reference_parameters(spec, 2, keep_grads=True)
    with pytest.raises(ExerciseError, match="step 2 used the gradients of step 1 as well"):
        dp_step.name_step_mistake(spec, every_rank(got, 2), 2)


def broadcast_summary(collectives: list[str]) -> dict:
    """Rank 1 after broadcast_parameters left its own starting weights in place."""
    return {"broadcast_right": False, "broadcast_kept_own": True, "broadcast_missed": [0, 1],
            "parameter_tensors": 4, "collectives": collectives, "broadcast_values": 26}


@pytest.mark.parametrize("collectives, words, not_words", [
    (["broadcast"] * 4, "though it called dist.broadcast: the tensors it broadcast were not the "
                        "parameters themselves", "nothing gave it rank 0's"),
    ([], "nothing gave it rank 0's", "though it called"),
])
def test_own_weights_after_the_broadcast_name_whether_it_was_called(collectives, words,
                                                                    not_words):
    by_rank = {0: {"broadcast_right": True, "library_broadcast": False, "broadcast_values": 26},
               1: broadcast_summary(collectives)}
    with pytest.raises(ExerciseError) as caught:
        dp_step.judge_broadcast({}, by_rank, 2)
    assert words in str(caught.value) and not_words not in str(caught.value)


def rank_in(op: str, calls: int, rank: int) -> RankResult:
    """A rank stopped by the group's timeout inside its ``calls``-th ``op`` of the case."""
    status = {"case": "K = 1", "op": op, "line": 18, "collectives": {op: calls}}
    return RankResult(rank, True, [], {"kind": "timeout"}, status, {})


def test_every_rank_in_the_same_broadcast_is_told_the_arguments_disagree():
    """Each rank broadcasting from itself (src=rank): every rank waits in its first call."""
    run = Run(2, [rank_in("broadcast", 1, 0), rank_in("broadcast", 1, 1)], None, 12.0)
    message = collective_message(run, LearnerFile("workspace/my_dp_step.py", ()))
    assert "every rank waits in broadcast (line 18), the same call on each" in message
    assert "their arguments disagree (the src" in message and "never called" not in message


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((shard_rows, [reference_rows, lambda *a: range(reference_rows(*a).start,
                                                                  reference_rows(*a).stop),
                                 numpy_bounds, tensor_bounds],
                    SHARD_ROWS_MISTAKES),
                   (scale_loss, [lambda s, local, total, n: s * n / total], SCALE_LOSS_MISTAKES))
