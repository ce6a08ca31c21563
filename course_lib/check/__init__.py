"""Self-checking exercises: one module of checkers per notebook (``check.nb03`` for 03, ...).

A checker prints one fixed line when the answer is right, raises ``ExerciseError`` with a hint
when it is wrong, and prints a fixed "not done yet" line while the exercise still raises
``NotImplementedError`` (so student copies run top to bottom).
"""

from course_lib.check.core import ExerciseError, exercise, not_done_line, passed_line

__all__ = ["ExerciseError", "exercise", "not_done_line", "passed_line"]
