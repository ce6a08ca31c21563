"""Self-checking exercises: one module of checkers per notebook (``check.nb03`` for 03, ...).

In a notebook::

    from course_lib import check
    import course_lib.check.nb03

    check.nb03.accumulate(my_accumulate)  # prints "Exercise 3.1: correct." or fails with a hint
    check.hint("3.1")  # a nudge; again: a pointer
    check.reveal("3.1")  # the course's answer, on purpose
    check.needs(model="section 2")  # stop early, saying where a missing name comes from

A checker prints one fixed line when the answer is right, fails the cell with a short red hint
when it is wrong (no traceback through the checker), and prints a fixed "not done yet" line
while the exercise still raises ``NotImplementedError`` (so student copies run top to bottom).
Importing this package inside IPython also makes a bare ``NameError`` say "run the notebook
from the top first" (``notebook.py``).
"""

import importlib

from course_lib.check.checker import (
    ExerciseError,
    LearnerCodeError,
    exercise,
    expect,
    not_done_line,
    passed_line,
    raise_if_not_done,
)
from course_lib.check.hints import hint
from course_lib.check.notebook import MissingNameError, install_name_error_help, needs
from course_lib.check.reference import reveal

install_name_error_help()

# The answer helpers need torch, imported only when one is first used: making a student copy
# (scripts/make_student_notebooks.py, the website) reads notebooks and never imports it.
ANSWER_HELPERS = ("call", "describe", "expect_tensor_with_grad", "expect_type")


def __getattr__(name: str):
    if name in ANSWER_HELPERS:
        value = getattr(importlib.import_module("course_lib.check.answers"), name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ExerciseError", "LearnerCodeError", "MissingNameError", "call", "describe",
           "exercise", "expect", "expect_tensor_with_grad", "expect_type", "hint",
           "install_name_error_help", "needs", "not_done_line", "passed_line",
           "raise_if_not_done", "reveal"]
