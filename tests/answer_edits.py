"""The learner's files of the file exercises, as tests feed them to the checkers.

The reference answer of ``workspace/NAME.py`` is the notebook's own ``%%writefile`` cell (what
nbval runs), and the skeleton is the student copy of that cell, made by the student-copy code
itself. A wrong answer is the reference with a few edits, each a (right text, wrong text) pair
that names the mistake on the line where it is made::

    MISTAKES = {"the mean, not the sum": [("return tensor", "return tensor.div_(n)")]}
    workspace.put(edited(reference("my_ring.py"), MISTAKES["the mean, not the sum"]),
                  "my_ring.py")
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import nbformat

from course_lib.check.exercise_cells import written_file
from course_lib.check.student_copy import make_student_copy, reference_lines

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@functools.cache
def _files() -> dict[str, tuple[str, str]]:
    """workspace file name -> (the reference text, the student copy's text)."""
    files = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        copy = make_student_copy(nb, path.name).notebook
        shift = 1 if len(copy.cells) == len(nb.cells) + 1 else 0  # the copy's note
        for i, cell in enumerate(nb.cells):
            name = written_file(cell.source) if cell.cell_type == "code" else None
            if name:
                body = cell.source.split("\n", 1)[1]
                reference_text = "\n".join(reference_lines(body.split("\n")))
                student_text = copy.cells[i + shift].source.split("\n", 1)[1]
                files[Path(name).name] = (reference_text + "\n", student_text + "\n")
    return files


def reference(name: str) -> str:
    """The reference text of ``workspace/NAME`` ("my_ring.py"), from its notebook."""
    return _files()[name][0]


def skeleton(name: str) -> str:
    """``workspace/NAME`` as a student copy hands it out: the marked line in each block."""
    return _files()[name][1]


def edited(text: str, edits) -> str:
    """``text`` with each (right, wrong) pair of ``edits`` applied; each right text must occur
    exactly once, so that an edit cannot silently stop applying when the reference changes."""
    for right, wrong in edits:
        count = text.count(right)
        assert count == 1, f"{count} places hold {right!r}: make the edit's text unique"
        text = text.replace(right, wrong)
    return text


def line_of(text: str, piece: str) -> int:
    """The number of the first line of ``text`` that holds ``piece``."""
    return next(i for i, line in enumerate(text.split("\n"), 1) if piece in line)


def with_lines(words: str, text: str) -> str:
    """``words`` with each ``{line:PIECE}`` replaced by the number of the line of ``text``
    that holds PIECE first: what a hint about that text says."""
    return re.sub(r"\{line:([^}]*)\}", lambda m: str(line_of(text, m.group(1))), words)
