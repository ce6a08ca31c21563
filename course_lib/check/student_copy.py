"""Make the student copy of a notebook: every solution block becomes one marked line.

In an exercise cell the lines from ``# BEGIN SOLUTION`` to ``# END SOLUTION`` become, at the
block's indentation::

    raise NotImplementedError("Exercise 3.1: replace this line with your code")

Replacing that line with an answer works whether the function returns a value or changes
tensors in place. The checker call after the function catches the NotImplementedError and
prints "Exercise 3.1: not done yet ...", so a copy runs top to bottom without an error.

A cell that starts with ``%%writefile workspace/NAME.py`` (a file the learner's processes run)
gets the same line; the file then raises when run, and its checker, a later call that names
``NAME.py``, reports "not done yet".

Where the learner starts from given code rather than a blank (the capstone's buggy trainer), a
student version follows the solution block at its indentation, each line commented out::

    # BEGIN SOLUTION
    return float(loss_sum / global_tokens)
    # END SOLUTION
    # BEGIN STUDENT VERSION
    # return float(loss_sum / (accum_steps * world_size))
    # END STUDENT VERSION

The student copy then holds those lines, uncommented, in place of the whole: the code runs as
given, and its checker says what is still wrong.

A cell that shows library code an exercise mirrors, ``show(fn, exercise="N.M")``, loses its
saved output: run in the copy, it shows the outline only until the exercise is passed.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import nbformat

from course_lib.check.exercise_cells import (
    MalformedNotebook,
    cells_in_scope,
    check_not_called,
    checker_calls,
    checker_ids,
    enclosing_function,
    markdown_exercise,
    parse,
    top_level_owner,
    written_file,
)

ROOT = Path(__file__).resolve().parents[2]  # the repository
BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
GIVEN_BEGIN, GIVEN_END = "# BEGIN STUDENT VERSION", "# END STUDENT VERSION"
MARKERS = (BEGIN, END, GIVEN_BEGIN, GIVEN_END)
NOTE = ("> **Your copy.** The exercises at the end are open. In each one, replace the line "
        '`raise NotImplementedError("Exercise N.M: replace this line with your code")` with '
        "your code (as many lines as you need, indented like it) and run the cell: its checker "
        'prints `correct`, or what is off. Stuck? `check.hint("N.M")` gives a nudge, a second '
        'call a pointer, and `check.reveal("N.M")` the course\'s answer when you decide to see '
        "it. Library code that an exercise asks you to write shows only its signature until you "
        "pass (then yours and ours side by side). Run the notebook from the top first (Run > Run "
        "All Cells): the exercises use what the cells above define. `scripts/start.sh --student` "
        "keeps this copy and your files in `workspace/`; `scripts/start.sh --student --reset` "
        "moves them to `previous/` and gives you fresh ones.")

__all__ = ["BEGIN", "END", "GIVEN_BEGIN", "GIVEN_END", "NOTE", "Block", "MalformedNotebook",
           "StudentCopy", "make_student_copy", "marked_line", "reference_lines"]


def shows_an_answer(tree: ast.Module) -> bool:
    """Whether a cell calls ``show(..., exercise=...)`` (or ``show_file``): library code that
    is an exercise's answer, whose saved output must not reach the student copy."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and any(k.arg == "exercise" for k in node.keywords):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in ("show", "show_file"):
                return True
    return False


def marked_line(exercise_id: str) -> str:
    """The line that stands for a solution block in the student copy (without indentation)."""
    return f'raise NotImplementedError("Exercise {exercise_id}: replace this line with your code")'


@dataclass
class Block:
    """One solution block: lines ``begin`` to ``end`` (markers included) of code cell ``cell``."""

    cell: int
    begin: int
    end: int
    indent: str
    lines: list[str]  # the solution code between the markers
    function: str = ""  # the function the block sits in ("" in a %%writefile cell)
    exercise_id: str = ""
    given: list[str] | None = None  # the student version's lines, uncommented, if it has one

    def hole(self) -> list[str]:
        return self.given or [self.indent + marked_line(self.exercise_id)]


def reference_lines(lines: list[str]) -> list[str]:
    """A reference cell's lines as they run: no markers, no commented student version."""
    kept, inside = [], False
    for line in lines:
        text = line.strip()
        inside = (inside or text == GIVEN_BEGIN) and text != GIVEN_END
        if not inside and text not in MARKERS:
            kept.append(line)
    return kept


@dataclass
class StudentCopy:
    """The copy and what was changed; cell numbers are the notebook's (the copy has the note
    inserted at index 1)."""

    notebook: nbformat.NotebookNode
    blocks: list[Block]
    checks: dict[str, int]  # exercise id -> number of cells that call its checker
    cleared: set[int] = field(default_factory=set)  # cells whose outputs are cleared
    checker_cells: dict[str, set[int]] = field(default_factory=dict)  # exercise id -> cells


def find_blocks(lines: list[str], cell: int, where: str) -> list[Block]:
    """Pair the markers of one cell; every way they can be misplaced is an error."""
    blocks, open_at, given_until = [], None, -1
    for i, line in enumerate(lines):
        text = line.strip()
        if i <= given_until:
            continue  # the student version of the block before: read with it
        if any(word in text for word in ("BEGIN SOLUTION", "END SOLUTION", "STUDENT VERSION")) \
                and text not in (BEGIN, END):
            raise MalformedNotebook(f"{where}, line {i + 1}: write the marker exactly as "
                                    f"'{BEGIN}' or '{END}' (a student version right after "
                                    f"the block), not {text!r}")
        if text == BEGIN:
            if open_at is not None:
                raise MalformedNotebook(f"{where}, line {i + 1}: '{BEGIN}' again before "
                                        f"'{END}' (blocks cannot nest)")
            open_at = i
        elif text == END:
            if open_at is None:
                raise MalformedNotebook(f"{where}, line {i + 1}: '{END}' without '{BEGIN}'")
            blocks.append(make_block(lines, cell, open_at, i, where))
            given_until = add_student_version(blocks[-1], lines, where)
            open_at = None
    if open_at is not None:
        raise MalformedNotebook(f"{where}, line {open_at + 1}: '{BEGIN}' without '{END}'")
    return blocks


def make_block(lines: list[str], cell: int, begin: int, end: int, where: str) -> Block:
    indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
    if not lines[end].startswith(indent) or \
            len(lines[end]) - len(lines[end].lstrip()) != len(indent):
        raise MalformedNotebook(f"{where}, line {end + 1}: '{END}' is not indented like its "
                                f"'{BEGIN}' on line {begin + 1}")
    body = lines[begin + 1: end]
    if not any(line.strip() for line in body):
        raise MalformedNotebook(f"{where}, line {begin + 1}: empty solution block")
    for j, line in enumerate(body, start=begin + 2):
        if line.strip() and not line.startswith(indent):
            raise MalformedNotebook(f"{where}, line {j}: solution code is indented less than "
                                    f"its '{BEGIN}' marker; indent the markers like the code")
    if all(not line.strip() or line.strip().startswith("#") for line in body):
        raise MalformedNotebook(f"{where}, line {begin + 1}: the solution block holds only "
                                "comments")
    return Block(cell, begin, end, indent, body)


def add_student_version(block: Block, lines: list[str], where: str) -> int:
    """Read the student version right after ``block``'s end marker, if there is one: the block
    then spans it too. Returns the index of its last line (the end marker's if none)."""
    at = block.end + 1
    if at >= len(lines) or lines[at].strip() != GIVEN_BEGIN:
        return block.end
    if lines[at] != block.indent + GIVEN_BEGIN:
        raise MalformedNotebook(f"{where}, line {at + 1}: indent '{GIVEN_BEGIN}' like its "
                                f"'{BEGIN}'")
    close = next((j for j in range(at + 1, len(lines)) if lines[j].strip() == GIVEN_END), None)
    if close is None or lines[close] != block.indent + GIVEN_END:
        raise MalformedNotebook(f"{where}, line {at + 1}: '{GIVEN_BEGIN}' without a "
                                f"'{GIVEN_END}' indented like it")
    given = []
    for j in range(at + 1, close):
        line = lines[j]
        if line.strip() and not (line.startswith(block.indent + "# ")
                                 or line == block.indent + "#"):
            raise MalformedNotebook(f"{where}, line {j + 1}: a student version's lines are "
                                    f"commented out, '{block.indent}# ' then the code")
        code = line[len(block.indent) + 2:]  # "    # y = 3" -> "y = 3"; a bare "#" -> ""
        given.append(block.indent + code if code else "")
    if not any(line.strip() for line in given):
        raise MalformedNotebook(f"{where}, line {at + 1}: an empty student version")
    block.given, block.end = given, close
    return close


def first_code_line(block: Block) -> int:
    """1-based line number in the cell of the block's first line that is not blank or comment."""
    for j, line in enumerate(block.lines):
        if line.strip() and not line.strip().startswith("#"):
            return block.begin + 2 + j
    raise AssertionError("make_block refuses blocks without code")


def exercise_id_of(calls, nb, block: Block, check_dir: Path, what: str, where: str) -> str:
    """The one exercise number the checker calls (or the text above the cell) give."""
    ids = {checker_ids(c.module, check_dir).get(c.name) or markdown_exercise(nb.cells, block.cell)
           for _, c in calls}
    if None in ids or len(ids) != 1:
        raise MalformedNotebook(f"{where}: cannot tell the exercise number of {what}; "
                                'decorate its checker with @exercise("N.M")')
    return ids.pop()


def resolve_function(block: Block, nb, trees: dict, check_dir: Path, name: str) -> list[int]:
    """A block in a function: name its exercise, return the cells of the checker calls."""
    where = f"{name}, cell {block.cell}"
    line = first_code_line(block)
    function, owner = enclosing_function(trees[block.cell], line), \
        top_level_owner(trees[block.cell], line)
    if function is None or owner is None:
        raise MalformedNotebook(f"{where}, line {block.begin + 1}: the solution block is not "
                                "inside a function; its marked line would stop the cell at top "
                                "level. Put the solution in a function the checker calls")
    block.function = function
    cells = cells_in_scope(trees, block.cell, owner.name)
    check_not_called(owner, trees, cells, name)
    calls = [(i, c) for i in cells for c in checker_calls(trees[i]) if owner.name in c.names]
    own = checker_calls(trees[block.cell])
    if not calls and len(own) == 1:
        calls = [(block.cell, own[0])]
    if not calls:
        raise MalformedNotebook(f"{where}: no checker call receives {owner.name}; add e.g. "
                                f"check.nbNN.name({owner.name}) after it")
    block.exercise_id = exercise_id_of(calls, nb, block, check_dir, owner.name, where)
    return [i for i, _ in calls]


def resolve_file(block: Block, nb, trees: dict, check_dir: Path, name: str) -> list[int]:
    """A block in a ``%%writefile`` cell: its checker is a later call that names the file."""
    where = f"{name}, cell {block.cell}"
    path = written_file(nb.cells[block.cell].source)
    base = Path(path).name
    calls = []
    for i in sorted(trees):
        if i <= block.cell:
            continue
        if written_file(nb.cells[i].source) == path:
            break  # the file is written again: later calls check that one
        calls += [(i, c) for c in checker_calls(trees[i]) if base in c.text]
    if not calls:
        raise MalformedNotebook(f'{where}: no checker call names {base}; add e.g. '
                                f'check.nbNN.name("{path}") in a cell after it')
    block.exercise_id = exercise_id_of(calls, nb, block, check_dir, path, where)
    return [i for i, _ in calls]


def make_student_copy(nb, name: str = "notebook", check_dir: Path | None = None) -> StudentCopy:
    """The student copy of ``nb`` (not changed), its solution blocks and checker calls."""
    check_dir = check_dir or ROOT / "course_lib" / "check"
    nb = copy.deepcopy(nb)
    trees = {i: parse(c.source, f"{name}, cell {i}")
             for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    kernel_trees = {i: t for i, t in trees.items() if not written_file(nb.cells[i].source)}
    blocks, clear, checks = [], set(), {}
    for i in sorted(trees):
        for block in find_blocks(nb.cells[i].source.split("\n"), i, f"{name}, cell {i}"):
            resolve = resolve_function if i in kernel_trees else resolve_file
            call_cells = resolve(block, nb, kernel_trees, check_dir, name)
            blocks.append(block)
            clear.update([i, *call_cells])
            checks.setdefault(block.exercise_id, set()).update(call_cells)
    for i in sorted({b.cell for b in blocks}):
        lines = nb.cells[i].source.split("\n")
        for block in sorted((b for b in blocks if b.cell == i), key=lambda b: -b.begin):
            lines[block.begin: block.end + 1] = block.hole()
        nb.cells[i].source = "\n".join(lines)
        parse(nb.cells[i].source, f"{name}, cell {i} (with its marked line)")
    clear.update(i for i, tree in kernel_trees.items() if shows_an_answer(tree))
    for i in clear:
        nb.cells[i].outputs, nb.cells[i].execution_count = [], None
        nb.cells[i].metadata.pop("execution", None)
    if blocks:  # a markdown cell, of the class the other cells are (nbformat's or plain JSON's)
        note = type(nb.cells[0])(cell_type="markdown", id="student-copy-note", metadata={},
                                 source=NOTE)
        if nb.nbformat_minor < 5:  # cell ids came with format 4.5
            del note["id"]
        nb.cells.insert(1, note)
    return StudentCopy(nb, blocks, {k: len(v) for k, v in checks.items()}, clear, checks)
