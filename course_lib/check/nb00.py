"""Checkers for the exercises of notebook 00 (start here)."""

from course_lib.check.answers import call, expect_type
from course_lib.check.checker import LearnerCodeError, exercise, expect
from course_lib.runtime.launch import LaunchError, LaunchResult


@exercise("0.1")
def hello_on_three(make_run) -> None:
    run = call(make_run)
    expect_type(run, LaunchResult, "return the object that launch(...) returns (a "
                                   "LaunchResult), not a part of it")
    expect(run.result is not None, "the run handed back no result: the module you launched is "
                                   "not course_lib.demos.hello, whose rank 0 gathers every "
                                   "rank's report")
    expect(isinstance(run.result, list) and all(isinstance(r, dict) and "rank" in r
                                                for r in run.result),
           "the result does not hold the ranks' reports: it comes from another module than "
           "course_lib.demos.hello")
    ranks = sorted(r["rank"] for r in run.result)
    expect(ranks == [0, 1, 2], f"reports came from ranks {ranks}, so the run had "
                               f"{len(ranks)} process(es), not three")


@exercise("0.2")
def caught_failure(make_error) -> None:
    try:
        error = make_error()
    except LaunchError as escaped:  # the learner's code did not catch it: show their line
        raise LearnerCodeError(escaped, during=f"{getattr(make_error, '__name__', '')}()",
                               hint="the run failed as planned, but the LaunchError "
                                    "escaped your function: nothing in it catches the "
                                    "error") from escaped
    expect(error is not None, "your function returned None: either the run did not fail, so "
                              "there was nothing to catch, or the error you caught is not "
                              "returned")
    expect_type(error, LaunchError, "return the LaunchError itself (the exception object you "
                                    "caught), not its message or another kind of error")
    expect("rank 2 failed" in str(error),
           "the error you caught is not about rank 2: the fault was planted in another "
           "rank; the module's --rank argument and the number of processes decide where")
