"""Shared by the checker tests of notebooks 07 and 10: what a learner sees of a wrong answer."""

import re
from pathlib import Path

import pytest

from course_lib.check import report
from course_lib.check.core import ExerciseError

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def code_lines(*modules) -> set[str]:
    """Every line of code of these modules (stripped), to be kept out of reports."""
    return {line.strip() for m in modules for line in Path(m.__file__).read_text().split("\n")
            if len(line.strip()) > 12 and not line.strip().startswith(("#", '"'))}


def shown_report(checker, answer, *checker_modules, **kwargs) -> str:
    """The hint a wrong ``answer`` gets, after checking that the learner would see at most
    ``report.MAX_LINES`` lines and no line of the checker's code."""
    with pytest.raises(ExerciseError) as caught:
        checker(answer, **kwargs)
    lines = [ANSI.sub("", line) for line in caught.value._render_traceback_()]
    assert 1 < len(lines) <= report.MAX_LINES, lines
    shown = "\n".join(lines)
    leaked = [line for line in code_lines(*checker_modules) if line in shown]
    assert not leaked, f"checker code in the report: {leaked}"
    return " ".join(line.strip() for line in lines)
