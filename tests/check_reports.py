"""What a learner sees when an exercise checker rejects an answer (for tests/test_check_nb*.py).

    lines = report_of(nb03.uneven_weights, lambda sizes: [1] * len(sizes))

runs the checker on the answer, expects it to fail, and returns the lines IPython would show
(colours removed), after asserting that there are at most ``report.MAX_LINES`` of them and
that none holds a line of the checkers' code.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from course_lib.check import answers, checker, own_work, report
from course_lib.check.checker import ExerciseError

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SHARED = [checker, report, answers, own_work]


def rendered(error: BaseException) -> list[str]:
    """The lines IPython shows for ``error``, colours removed."""
    return [ANSI.sub("", line) for line in error._render_traceback_()]


def code_lines(module) -> set[str]:
    """Every line of code (stripped, longer than 12 characters) of a module's file."""
    lines = Path(inspect.getfile(module)).read_text().split("\n")
    return {line.strip() for line in lines
            if len(line.strip()) > 12 and not line.strip().startswith(("#", '"'))}


def checked_lines(error: ExerciseError, *modules) -> list[str]:
    """The lines ``error`` shows, after asserting there are at most ``report.MAX_LINES`` and
    that none holds a line of code of ``modules`` or of the shared checker modules."""
    lines = rendered(error)
    assert 1 < len(lines) <= report.MAX_LINES, lines
    shown = "\n".join(lines)
    leaked = [line for m in [*SHARED, *modules] for line in code_lines(m) if line in shown]
    assert not leaked, f"checker code in the report: {leaked}"
    return lines


def report_of(checker, *answer, modules=(), **kwargs) -> list[str]:
    """The report ``checker(*answer, **kwargs)`` shows, checked by ``checked_lines`` against
    the checker's module and ``modules``."""
    with pytest.raises(ExerciseError) as caught:
        checker(*answer, **kwargs)
    module = inspect.getmodule(inspect.unwrap(checker))
    return checked_lines(caught.value, module, *modules)


def hint_of(checker, *answer) -> str:
    """The report of a wrong answer as one line of text: its lines joined by spaces, except
    after a line that ends in a hyphen (the report wraps "micro-batch" there)."""
    text = ""
    for line in report_of(checker, *answer):
        text += line if not text or text.endswith("-") else " " + line
    return text


def shown_report(checker, answer, *modules, **kwargs) -> str:
    """The report of ``checker(answer, **kwargs)`` as one line of text, checked as
    ``report_of`` checks it (``modules``: more files whose code must not show)."""
    return " ".join(line.strip() for line in report_of(checker, answer, modules=modules,
                                                        **kwargs))


def file_hint(checker, path: str, **kwargs) -> str:
    """The hint a multi-process checker gives the learner's file at ``path`` (``checker(path,
    **kwargs)`` must fail), after asserting that no pass was recorded for it."""
    from course_lib.runtime.workspace import has_passed

    with pytest.raises(ExerciseError) as caught:
        checker(path, **kwargs)
    assert not has_passed(checker.exercise_id, path)
    return str(caught.value)


def assert_hint_only(checker, answer, hint: str, mistakes) -> str:
    """``checker(answer)`` fails with a report (checked as ``report_of`` checks it) that holds
    ``hint`` and no other hint of ``mistakes``, (answer, hint) pairs; returns it as one line."""
    shown = hint_of(checker, answer)
    assert hint in shown, shown
    assert not [other for _, other in mistakes if other != hint and other in shown], shown
    return shown


def assert_not_done(capsys, *checkers) -> None:
    """Each checker prints its "not done yet" line for an answer that is still open."""
    def hole(*args, **kwargs):
        raise NotImplementedError("Exercise: replace this line with your code")

    for open_one in checkers:
        open_one(hole)
    out = capsys.readouterr().out
    for open_one in checkers:
        assert f"Exercise {open_one.exercise_id}: not done yet" in out, out


def assert_passes(capsys, checker, *answer) -> None:
    """``checker(*answer)`` prints that the exercise is correct, and nothing else."""
    checker(*answer)
    assert capsys.readouterr().out == f"Exercise {checker.exercise_id}: correct.\n"


def standard_tests(*exercises) -> tuple:
    """The tests every function exercise gets, for ``exercises``: (checker, right answers,
    [(wrong answer, its hint)], words no hint may say). Each right answer passes; each wrong
    one gets its hint and no other's, giving nothing away; an open answer is not done yet.
    Assign the three to names starting with ``test_`` in a test module."""
    right = [pytest.param(checker, answer, id=f"{checker.exercise_id}-{i}")
             for checker, answers, *_ in exercises for i, answer in enumerate(answers)]
    wrong = [pytest.param(checker, answer, hint, mistakes, never, id=f"{checker.exercise_id}-{i}")
             for checker, _, mistakes, *rest in exercises for never in [rest[0] if rest else ()]
             for i, (answer, hint) in enumerate(mistakes)]

    @pytest.mark.parametrize("checker, answer", right)
    def right_answers(capsys, checker, answer):
        assert_passes(capsys, checker, answer)

    @pytest.mark.parametrize("checker, answer, hint, mistakes, never", wrong)
    def wrong_answers(checker, answer, hint, mistakes, never):
        shown = assert_hint_only(checker, answer, hint, mistakes)
        assert not [words for words in never if words in shown], shown

    def open_answers(capsys):
        assert_not_done(capsys, *(checker for checker, *_ in exercises))

    return right_answers, wrong_answers, open_answers
