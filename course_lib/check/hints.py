"""``check.hint("3.3")``: the exercise's hints, one rung per call.

The checker's own report names the symptom and its cause. Then, on request:

1. ``check.hint("3.3")``: a nudge toward the idea, no code;
2. ``check.hint("3.3")`` again: a pointer to the place and the tool, still no code;
3. ``check.reveal("3.3")``: the course's answer, given on purpose (``reference.py``).

The first two are written in ``hints.md`` (a section per exercise, read by its checker's
``@exercise("3.3")``); the module of notebook 03 (``course_lib.check.nb03``) is imported the
first time one of its exercises is asked for.
"""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path

from course_lib.check.checker import LADDERS
from course_lib.check.reference import exercise_number

ASKED: dict[str, int] = {}  # exercise id -> how many hints this kernel gave


def _checker_modules(notebook: int) -> list[str]:
    """The checker modules of notebook ``notebook``: ``course_lib.check.nb06``, ``...nb06b``."""
    folder = Path(__file__).resolve().parent
    return [f"course_lib.check.{path.stem}"
            for path in sorted(folder.glob(f"nb{notebook:02d}*.py"))]


def _notebook_exercises(notebook: int) -> list[str]:
    return sorted((i for i in LADDERS if i.split(".")[0] == str(notebook)),
                  key=lambda i: int(i.split(".")[1]))


def _known(exercise_id: str) -> str | None:
    """None when ``exercise_id`` has a checker; else the sentence that says it has none."""
    notebook = int(exercise_id.split(".")[0])
    if exercise_id not in LADDERS:  # nb10.py, and nb10b.py for a notebook 10b, ...
        for module in _checker_modules(notebook):
            importlib.import_module(module)
    if exercise_id in LADDERS:
        return None
    known = _notebook_exercises(notebook)
    if not known:
        return f"There is no exercise {exercise_id}: notebook {notebook:02d} has none."
    return (f"There is no exercise {exercise_id}. The exercises of notebook {notebook:02d} "
            f"are: {', '.join(known)}.")


def hint_text(exercise_id, rung: int = 1) -> str:
    """Hint number ``rung`` (1: the nudge, 2 or more: the pointer) of ``exercise_id``, or a
    message that says why there is none."""
    try:
        exercise_id = exercise_number(exercise_id)
    except ValueError as error:
        return f"{error}, e.g. check.hint(\"3.3\")"
    unknown = _known(exercise_id)
    if unknown:
        return unknown
    ladder = LADDERS[exercise_id]
    reveal = (f'That is the last hint. check.reveal("{exercise_id}") shows the course\'s answer '
              "(it gives the exercise away: try once more first).")
    if rung <= 1 and ladder.nudge:
        return (f"Exercise {exercise_id}, hint 1 of 2: {ladder.nudge}\n"
                f'Ask again, check.hint("{exercise_id}"), for a pointer to where and with what.')
    if ladder.pointer:
        return f"Exercise {exercise_id}, hint 2 of 2: {ladder.pointer}\n{reveal}"
    return (f"Exercise {exercise_id} has no more hints: read its checker's report again, and "
            f"the exercise's text above the cell.\n{reveal}")


def hint(exercise_id) -> None:
    """Print the next hint of exercise ``exercise_id``, e.g. ``check.hint("3.3")``: a nudge
    the first time, a pointer after."""
    try:
        key = exercise_number(exercise_id)
    except ValueError:
        key = str(exercise_id)
    ASKED[key] = ASKED.get(key, 0) + 1
    for paragraph in hint_text(exercise_id, ASKED[key]).split("\n"):
        print(textwrap.fill(paragraph, 90))
