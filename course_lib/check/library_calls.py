"""Catch an answer that calls the course's own solution instead of computing it.

Some exercises have their answer in ``course_lib`` (``ring_viz.bytes_sent_per_rank`` is
exercise 6.2's count). An answer that calls it would pass without teaching anything, so a
checker runs the learner's function under ``sys.setprofile`` and fails it, with a hint, when
one of the listed functions is entered, however it was imported:

    got = call_without({ring_viz.bytes_sent_per_rank: "ring_viz.bytes_sent_per_rank"},
                       count_fn, 4000, 4, 4)
"""

from __future__ import annotations

import inspect
import sys
from typing import Callable

from course_lib.check.answers import call
from course_lib.check.core import ExerciseError


def _code_of(function: Callable):
    return inspect.unwrap(function).__code__


def call_without(solutions: dict[Callable, str], function, *args, **kwargs):
    """``answers.call(function, *args, **kwargs)``; ``ExerciseError`` if it entered one of
    ``solutions`` (function -> the name the hint gives it)."""
    names = {_code_of(f): name for f, name in solutions.items()}
    entered: list[str] = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code in names and not entered:
            entered.append(names[frame.f_code])

    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        result = call(function, *args, **kwargs)
    finally:
        sys.setprofile(previous)
    if entered:
        raise ExerciseError(f"your code calls the course's own {entered[0]}, which is the "
                            "answer itself: work it out in your own code")
    return result
