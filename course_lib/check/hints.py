"""``check.hint("3.3")``: the second, stronger hint of an exercise.

Checkers register it with their decorator, ``@exercise("3.3", second_hint="...")``; the
module of notebook 03 (``course_lib.check.nb03``) is imported the first time one of its
exercises is asked for.
"""

from __future__ import annotations

import importlib
import re
import textwrap

from course_lib.check.checker import SECOND_HINTS

_ID = re.compile(r"^(\d{1,2})\.(\d{1,2})$")


def _notebook_exercises(notebook: int) -> list[str]:
    return sorted((i for i in SECOND_HINTS if i.split(".")[0] == str(notebook)),
                  key=lambda i: int(i.split(".")[1]))


def hint_text(exercise_id) -> str:
    """The second hint of ``exercise_id`` ("3.3"), or a message that says why there is none."""
    match = _ID.match(str(exercise_id).strip())
    if not match:
        return (f"{exercise_id!r} is not an exercise number: write it as a string, notebook "
                'dot exercise, e.g. check.hint("3.3")')
    exercise_id = f"{int(match[1])}.{int(match[2])}"
    notebook = int(match[1])
    if exercise_id not in SECOND_HINTS:
        module = f"course_lib.check.nb{notebook:02d}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:
                raise  # the module exists but something it imports is missing
    if exercise_id not in SECOND_HINTS:
        known = _notebook_exercises(notebook)
        if not known:
            return f"There is no exercise {exercise_id}: notebook {notebook:02d} has none."
        return (f"There is no exercise {exercise_id}. The exercises of notebook "
                f"{notebook:02d} are: {', '.join(known)}.")
    second = SECOND_HINTS[exercise_id]
    if not second:
        return (f"Exercise {exercise_id} has no second hint yet: read its checker's hint "
                "again, and the exercise's text above the cell.")
    return f"Exercise {exercise_id}, a stronger hint: {second}"


def hint(exercise_id) -> None:
    """Print the second hint of exercise ``exercise_id``, e.g. ``check.hint("3.3")``."""
    print(textwrap.fill(hint_text(exercise_id), 90))
