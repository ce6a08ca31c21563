"""The course's answer to an exercise: given on purpose, or shown beside the learner's once
they pass.

    check.reveal("6.3")  # the answer, because the learner asked for it

The answers are the solution blocks of the reference notebooks (``notebooks/NN_*.ipynb``), read
with the code that makes the student copies (``student_copy.py``), so what is revealed is what
nbval runs. In a student copy a passing checker calls ``show_beside``: the learner's code and
the course's, as a diff. Either way the exercise is *unlocked* (``runtime/workspace.py``): the
library code it mirrors shows in full from then on (``lessons/show.py``).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import os
import re
from pathlib import Path

from course_lib.check.exercise_cells import parse, top_level_owner, written_file
from course_lib.check.student_copy import ROOT, make_student_copy, reference_lines
from course_lib.lessons.show import code_block, display
from course_lib.runtime.workspace import is_student_copy, unlock

NOTEBOOKS = ROOT / "notebooks"
_ID = re.compile(r"^(\d{1,2})\.(\d{1,2})$")


def exercise_number(text) -> str:
    """``"6.3"`` from ``"6.3"``, ``"06.3"`` or ``" 6.3 "``; ValueError saying how to write it."""
    match = _ID.match(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not an exercise number: write it as a string, notebook "
                         'dot exercise, e.g. "3.3"')
    return f"{int(match[1])}.{int(match[2])}"


class Node(dict):
    """A notebook's JSON with nbformat's attribute access (``nb.cells[0].source``)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value) -> None:
        self[name] = value


def read_notebook(path: Path) -> Node:
    """A saved notebook (format 4), read as JSON: what ``nbformat.read(path, as_version=4)``
    gives, without importing nbformat, which validates with jsonschema and takes 2 s of CPU
    to import: a kernel pays that at its first passed exercise (``show_beside``)."""
    def node(value):
        if isinstance(value, dict):
            return Node({key: node(v) for key, v in value.items()})
        return [node(v) for v in value] if isinstance(value, list) else value

    nb = node(json.loads(Path(path).read_text(encoding="utf-8")))
    if nb.get("nbformat") != 4:
        raise ValueError(f"{path} is not a notebook of format 4")
    for cell in nb.cells:
        if isinstance(cell.source, list):  # a saved cell's lines, each with its newline
            cell.source = "".join(cell.source)
    return nb


def reference_answer(exercise_id: str) -> str | None:
    """The course's answer to ``exercise_id``: the function (or the whole file) its solution
    blocks sit in, markers removed; None when no notebook has that exercise."""
    notebook = int(exercise_id.split(".")[0])
    for path in sorted(NOTEBOOKS.glob(f"{notebook:02d}*_*.ipynb")):  # 06 and 06b, ...
        nb = read_notebook(path)
        blocks = [b for b in make_student_copy(nb, path.name).blocks
                  if b.exercise_id == exercise_id]
        if blocks:
            pieces = dict.fromkeys(_piece(nb.cells[b.cell].source, b.begin) for b in blocks)
            return "\n\n\n".join(pieces)
    return None


@functools.cache
def given_file(name: str) -> str | None:
    """``workspace/NAME`` as the student copy hands it out (after its ``%%writefile`` line),
    when it hands out code to fix (a student version); None otherwise."""
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")):
        nb = read_notebook(path)
        made = make_student_copy(nb, path.name)
        for block in made.blocks:
            if block.given and written_file(nb.cells[block.cell].source) == f"workspace/{name}":
                shift = len(made.notebook.cells) - len(nb.cells)  # the copy's note, if any
                return made.notebook.cells[block.cell + shift].source.split("\n", 1)[1]
    return None


def _piece(source: str, begin: int) -> str:
    """The part of a cell that holds the block starting at line ``begin`` (0-based): the
    top-level function or class around it, or the whole file of a ``%%writefile`` cell."""
    lines = reference_lines(source.split("\n"))
    if written_file(source):
        return "\n".join(lines[1:]).strip("\n")
    full = source.split("\n")
    owner = top_level_owner(parse(source, "a reference notebook"), begin + 2)
    first = min([owner.lineno, *(d.lineno for d in owner.decorator_list)])
    segment = "\n".join(full[first - 1: owner.end_lineno])
    return "\n".join(reference_lines(segment.split("\n"))).strip("\n")


def reveal(exercise_id) -> None:
    """Print the course's answer to exercise ``exercise_id`` (a string, "6.3"): only when you
    ask for it, since it gives the exercise away."""
    try:
        exercise_id = exercise_number(exercise_id)
    except ValueError as error:
        print(error)
        return
    answer = reference_answer(exercise_id)
    if answer is None:
        print(f"There is no exercise {exercise_id} in the notebooks.")
        return
    print(f"Exercise {exercise_id}: the course's answer, because you asked for it. Read it, "
          "close it, then write yours: the checker still checks your own code.")
    display(code_block(answer))
    unlock(exercise_id, "revealed")


def learner_text(answer) -> str | None:
    """The learner's code a checker was given: a file's text, or a function's source."""
    if isinstance(answer, (str, os.PathLike)):
        path = Path(answer)
        return path.read_text() if path.suffix == ".py" and path.is_file() else None
    try:
        return inspect.getsource(inspect.unwrap(answer))
    except (TypeError, OSError):
        return None


def show_beside(exercise_id: str, answer) -> None:
    """In a student copy, after a pass: the learner's code beside the course's, a diff."""
    if not is_student_copy():
        return
    theirs, ours = learner_text(answer), reference_answer(exercise_id)
    if theirs is None or ours is None:
        return
    if theirs.strip() == ours.strip():
        print("Your code is the course's, line for line.")
        return
    lines = difflib.unified_diff(ours.strip().split("\n"), theirs.strip().split("\n"),
                                 "the course's", "yours", lineterm="", n=3)
    print("Yours beside the course's: a diff, '-' the course's lines, '+' yours. Both pass; "
          "the checker tests what the code does, not how it is written.")
    display(code_block("\n".join(lines), "diff"))
