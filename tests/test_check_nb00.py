"""Notebook 00's checkers against the reference answers and realistic wrong ones (no processes:
the answers hand back what launch would).

Both exercises are about using launch, so there is no "calls the course's own solution" case.
"""

from check_reports import hint_of, standard_tests

from course_lib.check.nb00 import caught_failure, hello_on_three
from course_lib.runtime.launch import LaunchError, LaunchResult


def run_with_ranks(ranks):
    return LaunchResult(0, "", [{"rank": r} for r in ranks], 1.0)


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


def test_an_uncaught_failure_shows_the_learners_line():
    shown = hint_of(caught_failure, not_caught)
    assert 'raise LaunchError("rank 2 failed (exit code 1) in ...")' in shown
    assert "the LaunchError escaped your function" in shown


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((hello_on_three, [lambda: run_with_ranks([0, 1, 2])], HELLO_MISTAKES),
                   (caught_failure, [lambda: LaunchError("rank 2 failed (exit code 1) in ...")],
                    CAUGHT_MISTAKES))
