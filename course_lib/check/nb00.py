"""Checkers for the exercises of notebook 00 (start here)."""

from course_lib.check.answers import call, expect_type
from course_lib.check.checker import LearnerCodeError, exercise, expect
from course_lib.runtime.launch import LaunchError, LaunchResult


@exercise("0.1", pointer="launch(...) takes the module's name as a string, the number of "
                             "processes as nproc=..., and quiet=True keeps the ranks' lines "
                             "out of the notebook. Return the object it returns, not one of "
                             "its fields.")
def hello_on_three(make_run) -> None:
    run = call(make_run)
    expect_type(run, LaunchResult, "return the object that launch(...) returns (a "
                                   "LaunchResult), not a part of it")
    expect(run.result is not None, "the run handed back no result: the module to launch is "
                                   "course_lib.demos.hello, whose rank 0 gathers every report")
    expect(isinstance(run.result, list) and all(isinstance(r, dict) and "rank" in r
                                                for r in run.result),
           "the result does not hold the ranks' reports: launch course_lib.demos.hello")
    ranks = sorted(r["rank"] for r in run.result)
    expect(ranks == [0, 1, 2], f"reports came from ranks {ranks}, so the run had "
                               f"{len(ranks)} process(es): ask launch for three")


@exercise("0.2", pointer="launch raises LaunchError when a rank fails. Put the launch(...) "
                             "call inside try:, and under `except LaunchError as error:` "
                             "return the error. The arguments for the module go in args=[...], "
                             "as strings.")
def caught_failure(make_error) -> None:
    try:
        error = make_error()
    except LaunchError as escaped:  # the learner's code did not catch it: show their line
        raise LearnerCodeError(escaped, during=f"{getattr(make_error, '__name__', '')}()",
                               hint="the run failed as planned, but the error escaped your "
                                    "function: catch it and return it") from escaped
    expect(error is not None, "your function returned None: did the run fail? If it did not, "
                              "nothing was caught; if it did, return the error you caught")
    expect_type(error, LaunchError, "return the LaunchError itself (the exception object you "
                                    "caught), not its message or another kind of error")
    expect("rank 2 failed" in str(error),
           "the error you caught is not about rank 2: the fault should be planted in rank 2 "
           "(the module's --rank argument), on three processes")
