"""Exercise checkers of notebook 00 against the reference and wrong answers (no processes)."""

import pytest

from course_lib.check.core import ExerciseError
from course_lib.check.nb00 import caught_failure, hello_on_three
from course_lib.runtime.launch import LaunchError, LaunchResult


def run_with_ranks(ranks):
    return LaunchResult(0, "", [{"rank": r} for r in ranks], 1.0)


def test_hello_on_three(capsys):
    hello_on_three(lambda: run_with_ranks([0, 1, 2]))
    assert capsys.readouterr().out == "Exercise 0.1: correct.\n"
    with pytest.raises(ExerciseError, match="pass nproc=3"):
        hello_on_three(lambda: run_with_ranks([0, 1]))
    with pytest.raises(ExerciseError, match="return the object"):
        hello_on_three(lambda: [0, 1, 2])


def test_not_done_yet(capsys):
    def hole():
        raise NotImplementedError("Exercise 0.1")

    hello_on_three(hole)
    assert "Exercise 0.1: not done yet" in capsys.readouterr().out


def test_caught_failure():
    caught_failure(lambda: LaunchError("rank 2 failed (exit code 1) in ..."))
    with pytest.raises(ExerciseError, match="name rank 2"):
        caught_failure(lambda: LaunchError("rank 1 failed (exit code 1) in ..."))
    with pytest.raises(ExerciseError, match="not RuntimeError"):
        caught_failure(lambda: RuntimeError("rank 2 failed"))
