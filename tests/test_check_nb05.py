"""Notebook 05's checkers: the reference answers pass, realistic wrong answers get a hint."""

import pytest

from course_lib.check.core import ExerciseError
from course_lib.check.nb05 import reduce_scatter_by_hand, two_point_fit


def reference_reduce_scatter(before):
    n = len(before)
    return [[sum(before[src][r] for src in range(n))] for r in range(n)]


def test_reduce_scatter_reference(capsys):
    reduce_scatter_by_hand(reference_reduce_scatter)
    assert capsys.readouterr().out == "Exercise 5.1: correct.\n"


def column_sums(before):
    return [sum(col) for col in zip(*before, strict=True)]


@pytest.mark.parametrize("wrong, hint", [
    (lambda before: [column_sums(before) for _ in before], "that is all-reduce"),
    (lambda before: [[before[r][r]] for r in range(len(before))], "only its own chunk"),
    (lambda before: [[column_sums(before)[(r + 1) % len(before)]] for r in range(len(before))],
     "rank r gets the sum over ranks of chunk r"),
    (lambda before: [column_sums(before)[r:r + 2] for r in range(len(before))],
     "each rank ends with one number"),
])
def test_reduce_scatter_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        reduce_scatter_by_hand(wrong)


def test_reduce_scatter_not_done(capsys):
    def hole(before):
        raise NotImplementedError("Exercise 5.1")

    reduce_scatter_by_hand(hole)
    assert "Exercise 5.1: not done yet" in capsys.readouterr().out


def reference_fit(n1, t1, n2, t2):
    beta = (t2 - t1) / (n2 - n1)
    return t1 - beta * n1, beta


def test_two_point_fit_reference(capsys):
    two_point_fit(reference_fit)
    assert capsys.readouterr().out == "Exercise 5.2: correct.\n"


@pytest.mark.parametrize("wrong, hint", [
    (lambda n1, t1, n2, t2: reference_fit(n1, t1, n2, t2)[::-1], "swapped"),
    (lambda n1, t1, n2, t2: (t1, (t2 - t1) / (n2 - n1)), "take away its bytes' cost"),
    (lambda n1, t1, n2, t2: (t1 - t2 / n2 * n1, t2 / n2), "the slope"),
    (lambda n1, t1, n2, t2: [t1, t2], "return a pair"),
])
def test_two_point_fit_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        two_point_fit(wrong)
