"""The mechanism every exercise checker shares (see ``course_lib/check/__init__.py``)."""

from __future__ import annotations

import functools
from typing import Callable


class ExerciseError(AssertionError):
    """The answer runs but is wrong; the message says what to look at."""


def passed_line(exercise_id: str) -> str:
    return f"Exercise {exercise_id}: correct."


def not_done_line(exercise_id: str) -> str:
    return f"Exercise {exercise_id}: not done yet (replace the ... and run the cell again)."


def exercise(exercise_id: str) -> Callable:
    """Decorate a checker: print the fixed lines, let a wrong answer raise with its hint.

    The checker itself raises ``ExerciseError`` for a wrong answer and returns normally for a
    right one. A ``NotImplementedError`` raised while it calls the learner's code means
    "not done yet".
    """

    def wrap(checker: Callable) -> Callable:
        @functools.wraps(checker)
        def run(*args, **kwargs) -> bool:
            try:
                checker(*args, **kwargs)
            except NotImplementedError:
                print(not_done_line(exercise_id))
                return False
            print(passed_line(exercise_id))
            return True

        run.exercise_id = exercise_id
        return run

    return wrap


def expect(condition: bool, hint: str) -> None:
    """Raise ``ExerciseError(hint)`` unless ``condition`` holds."""
    if not condition:
        raise ExerciseError(hint)
