"""The mechanism every exercise checker shares (see ``course_lib/check/__init__.py``).

A checker is a function decorated with ``@exercise("N.M")`` that calls the learner's code and
raises ``ExerciseError`` (through ``expect``) when the answer is wrong. The decorator turns
what happens into what the learner sees:

- right: it prints ``Exercise N.M: correct.`` and returns None (in a student copy it then shows
  the learner's answer beside the course's, ``reference.show_beside``, unless the checker
  returned ``KEEP_HIDDEN``: a right answer with a better one still to find);
- ``NotImplementedError`` (the open exercise's marked line): it prints the "not done yet" line;
- ``ExerciseError``: the cell fails and shows the hint in red, a few lines, no checker code;
- any other error: if the learner's code raised it, the cell shows the learner's line and the
  error (``LearnerCodeError``); if the checker could not use what the learner's code
  returned, it says so. Neither shows the checker's code.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from course_lib.check import report
from course_lib.check.reference import show_beside
from course_lib.runtime.workspace import unlock


@dataclass(frozen=True)
class Ladder:
    """The hints ``check.hint("N.M")`` gives, one per call: a nudge toward the idea, then a
    pointer to the place and the tool. Neither holds the answer: ``check.reveal`` does."""

    nudge: str | None = None
    pointer: str | None = None


LADDERS: dict[str, Ladder] = {}  # exercise id -> its hints
HINTS_FILE = Path(__file__).with_name("hints.md")  # every exercise's nudge and pointer
RUNG = re.compile(r"^(Nudge|Pointer):\n(.+?)(?:\n\n|\n?\Z)", re.M | re.S)


@functools.cache
def written_ladders() -> dict[str, Ladder]:
    """``{exercise id: Ladder}`` from hints.md: a ``## N.M`` heading, then a ``Nudge:`` and a
    ``Pointer:`` paragraph each, whose lines are joined with spaces."""
    ladders = {}
    for section in HINTS_FILE.read_text(encoding="utf-8").split("\n## ")[1:]:
        rungs = {name: " ".join(text.split("\n")) for name, text in RUNG.findall(section)}
        ladders[section.split()[0]] = Ladder(rungs.get("Nudge"), rungs.get("Pointer"))
    return ladders


class ExerciseError(AssertionError):
    """The answer runs but is wrong; the message is the hint that says what to look at."""

    def __init__(self, hint: str, raised: bool = False):
        super().__init__(hint)
        self.hint = hint
        self.raised = raised  # the learner's own code raised (in a launched file)
        self.exercise_id: str | None = None  # set by @exercise

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback: the hint, no checker code."""
        what = "your code raised an error." if self.raised else "not right yet."
        return report.wrong_answer_lines(self.exercise_id, self.hint,
                                         has_hints(self.exercise_id), what)


class LearnerCodeError(ExerciseError):
    """The learner's code raised ``error``; shown with the learner's lines only."""

    def __init__(self, error: BaseException, during: str | None = None, hint: str = ""):
        if isinstance(error, NameError) and not hint:
            hint = report.RUN_FROM_THE_TOP
        super().__init__(" ".join(filter(None, [report.error_line(error), hint])))
        self.hint, self.error, self.during = hint, error, during

    def _render_traceback_(self) -> list[str]:
        return report.code_error_lines(self.exercise_id, self.error, self.during, self.hint,
                                       has_hints(self.exercise_id))


def has_hints(exercise_id: str | None) -> bool:
    ladder = LADDERS.get(exercise_id or "")
    return bool(ladder and (ladder.nudge or ladder.pointer))


def passed_line(exercise_id: str) -> str:
    return f"Exercise {exercise_id}: correct."


KEEP_HIDDEN = "keep the course's answer hidden"  # a checker's return: passed, not yet shown
AS_GIVEN = "the code as given"  # a NotImplementedError's message: the given code, untouched


def not_done_line(exercise_id: str, as_given: bool = False) -> str:
    if as_given:  # a student version: code to fix, not a line to replace
        return (f"Exercise {exercise_id}: not done yet (this is the code as given: change it, "
                "and the checker runs on your version; the notebook's text says how to see the "
                "first report on the given code).")
    return (f"Exercise {exercise_id}: not done yet (replace the line that raises "
            "NotImplementedError with your code, then run the cell again).")


def exercise(exercise_id: str, nudge: str | None = None, pointer: str | None = None) -> Callable:
    """Decorate a checker of exercise ``exercise_id`` ("3.1"); see the module docstring.

    What ``check.hint("3.1")`` prints, the first call and the second, is the exercise's section
    of hints.md: the checker's own hints name the symptom and its cause; the nudge points at
    the idea, the pointer at the place and the tool. None of them writes the code. ``nudge``
    and ``pointer`` replace that section (the tests' own made-up exercises use them).
    """

    def wrap(checker: Callable) -> Callable:
        LADDERS[exercise_id] = (Ladder(nudge, pointer) if nudge or pointer
                                else written_ladders().get(exercise_id, Ladder()))

        @functools.wraps(checker)
        def run(*args, **kwargs) -> None:
            try:
                shown = checker(*args, **kwargs)
            except NotImplementedError as error:
                print(not_done_line(exercise_id, as_given=str(error) == AS_GIVEN))
                return
            except ExerciseError as error:
                error.exercise_id = error.exercise_id or exercise_id
                raise
            except Exception as error:  # every error becomes a short report
                raise as_exercise_error(error, exercise_id) from error
            print(passed_line(exercise_id))
            unlock(exercise_id)  # the library's code of this exercise may show in full now
            if args and shown is not KEEP_HIDDEN:
                show_beside(exercise_id, args[0])

        run.exercise_id = exercise_id
        return run

    return wrap


def as_exercise_error(error: Exception, exercise_id: str) -> ExerciseError:
    """An error that escaped a checker, as the learner should see it."""
    if report.learner_frames(error.__traceback__):
        reported = LearnerCodeError(error)
    else:  # raised in the checker's code, on something the learner's code returned
        advice = ("a function that ends without `return` gives None" if "NoneType" in
                  str(error) else "check the kind of value it returns (a whole number or a "
                  "float, a list or a tensor, ...)")
        reported = ExerciseError(f"the checker could not use what your code returned "
                                 f"({report.error_line(error)}): {advice}")
    reported.exercise_id = exercise_id
    return reported


def expect(condition: bool, hint: str) -> None:
    """Raise ``ExerciseError(hint)`` unless ``condition`` holds."""
    if not condition:
        raise ExerciseError(hint)


def raise_if_not_done(output: str) -> None:
    """For a checker that runs the learner's file in other processes: if the run's ``output``
    shows the file's open exercise (its marked line raised), report "not done yet"."""
    if "NotImplementedError" in output:
        raise NotImplementedError("the exercise's file is still open")
