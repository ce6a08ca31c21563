"""Notebook 00's checkers against the reference answers and realistic wrong ones (no processes:
the answers hand back what launch would).

Both exercises are about using launch, so there is no "calls the course's own solution" case.
"""

import pytest
from check_reports import assert_hint_only, assert_not_done, assert_passes, hint_of

from course_lib.check.nb00 import caught_failure, hello_on_three
from course_lib.runtime.launch import LaunchError, LaunchResult


def run_with_ranks(ranks):
    return LaunchResult(0, "", [{"rank": r} for r in ranks], 1.0)


def test_hello_on_three_reference(capsys):
    assert_passes(capsys, hello_on_three, lambda: run_with_ranks([0, 1, 2]))


def forgot_return():
    run_with_ranks([0, 1, 2])  # launched, but the function ends without return


HELLO_MISTAKES = [
    (lambda: run_with_ranks([0, 1]), "the run had 2 process(es), not three"),
    (lambda: run_with_ranks([0, 1, 2]).result, "(a LaunchResult), not a part of it; your code "
                                                "returned a list of 3 item(s)"),
    (forgot_return, "your code returned None (a function that ends without `return`"),
    (lambda: LaunchResult(0, "[rank 0] joined", None, 1.0),
     "the module you launched is not course_lib.demos.hello"),
    (lambda: LaunchResult(0, "", {"total": 3}, 1.0), "does not hold the ranks' reports"),
]


@pytest.mark.parametrize("wrong, hint", HELLO_MISTAKES)
def test_hello_on_three_wrong_answers(wrong, hint):
    assert_hint_only(hello_on_three, wrong, hint, HELLO_MISTAKES)


def test_caught_failure_reference(capsys):
    assert_passes(capsys, caught_failure, lambda: LaunchError("rank 2 failed (exit code 1) in ..."))


def not_caught():
    raise LaunchError("rank 2 failed (exit code 1) in ...")  # the learner's line, shown


def caught_and_dropped():
    try:
        raise LaunchError("rank 2 failed (exit code 1) in ...")
    except LaunchError:
        pass


CAUGHT_MISTAKES = [
    (lambda: LaunchError("rank 1 failed (exit code 1) in ..."), "not about rank 2"),
    (lambda: str(LaunchError("rank 2 failed")), "not its message or another kind of error; "
                                                 "your code returned the str"),
    (lambda: RuntimeError("rank 2 failed"), "your code returned the RuntimeError"),
    (caught_and_dropped, "your function returned None"),
]


@pytest.mark.parametrize("wrong, hint", CAUGHT_MISTAKES)
def test_caught_failure_wrong_answers(wrong, hint):
    assert_hint_only(caught_failure, wrong, hint, CAUGHT_MISTAKES)


def test_an_uncaught_failure_shows_the_learners_line():
    shown = hint_of(caught_failure, not_caught)
    assert 'raise LaunchError("rank 2 failed (exit code 1) in ...")' in shown
    assert "the LaunchError escaped your function" in shown


def test_not_done_yet(capsys):
    assert_not_done(capsys, hello_on_three, caught_failure)
