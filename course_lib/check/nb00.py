"""Checkers for the exercises of notebook 00 (start here)."""

from course_lib.check.core import exercise, expect
from course_lib.runtime.launch import LaunchError, LaunchResult


@exercise("0.1")
def hello_on_three(make_run) -> None:
    run = make_run()
    expect(isinstance(run, LaunchResult), "return the object that launch(...) returns")
    expect(run.result is not None, "the run handed back no result: launch course_lib.demos.hello")
    ranks = sorted(r["rank"] for r in run.result)
    expect(ranks == [0, 1, 2], f"expected reports from ranks [0, 1, 2], got {ranks}: "
                               "pass nproc=3")


@exercise("0.2")
def caught_failure(make_error) -> None:
    error = make_error()
    expect(isinstance(error, LaunchError),
           f"return the LaunchError you caught, not {type(error).__name__}")
    expect("rank 2 failed" in str(error),
           "the error should name rank 2: run course_lib.demos.faults with "
           "args=['--mode', 'raise', '--rank', '2'] on 3 processes")
