"""The student copy of every notebook: what it changes, and its exercises, open and answered.

For each ``notebooks/NN*_*.ipynb`` found when the tests are collected (``06b_`` too), the copy
that ``scripts/make_student_notebooks.py`` writes

(a) differs from its notebook only in its solution blocks (each now one marked line), the
    cleared outputs of the exercise cells and the note on top; a notebook whose exercises are
    questions without code to write (``QUESTIONS_ONLY``: no solution block, no checker) is
    copied as it is, without the note (there is no line to replace);
(b) run in a kernel as fresh as a learner's (below), the notebook's first code cell (its
    setup) and then the exercise cells (the code cells after the "## Exercises" heading),
    prints each exercise's "not done yet" line, no "correct" line and no error;
(c) then, in the same kernel, as a learner goes on, the exercise cells again with every
    marked line replaced by the reference answer print every exercise's "correct" line, and,
    as the kernel works in a student copy's folder, say the answer is the course's line for
    line (a pass shows theirs beside ours).

The other cells are not run here: nbval runs them in the notebooks, which the copies share.
So an exercise cell may use only what the setup cell makes (or say where a name comes from
with ``check.needs``): any error in (b) or (c) fails the test.

The notebooks a test process runs share one kernel (a new one and its imports cost 4 s of
CPU), begun for each as a kernel of its own would begin, as far as the cells can tell
(``ReusedKernel``): no names; the test's own folder as the working directory, so the manifest,
``workspace/``, its pass records and unlocks are this notebook's; the environment the kernel
started with (``COURSE_CHECK_WORLD_SIZES``, set for (c), is gone again for the next (b), which
checks it); no module loaded from another notebook's ``workspace/``; no hint asked for yet
(``hints.ASKED``). What stays is what a kernel does once and alike for every notebook: the
hints read from hints.md, nb03's case made from constants, the shell's short ``NameError``
report (how an error looks; any error fails), the agent server (each agent it forks gets its
launch's own environment and folder). The setup cell seeds every generator and sets threads,
printing and plot style again. A run that fails, a warning on stderr included, hands its
kernel to no one: the next notebook gets a new one.
"""

import functools
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from notebook_kernel import ReusedKernel, errors, stdout

from course_lib.check import student_copy as student_copies
from course_lib.check.checker import not_done_line, passed_line
from course_lib.check.mp.harness import WORLD_SIZES_ENV
from course_lib.runtime.workspace import STUDENT_MANIFEST

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
QUESTIONS_ONLY = {"06b_cost_model_and_fast_ring"}  # exercises to answer, no code to write
FORGET_HINTS = """\
import sys
if "course_lib.check.hints" in sys.modules:  # imported by an earlier notebook
    sys.modules["course_lib.check.hints"].ASKED.clear()"""


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> Path:
    """The copies of every notebook, written by one run of the script's command line."""
    out = tmp_path_factory.mktemp("student")
    made = subprocess.run([sys.executable, "scripts/make_student_notebooks.py", "--out",
                           str(out), *map(str, NOTEBOOKS)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    return out


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """The kernel the notebooks share, begun afresh for each (see the module's docstring)."""
    shared = ReusedKernel(tmp_path_factory.mktemp("kernel"), forget=FORGET_HINTS)
    try:
        yield shared
    finally:
        shared.close()


def student_copy(source: Path, out: Path):
    """The copy the command line wrote, the notebook, and what the copy changed."""
    student = nbformat.read(out / source.name, as_version=4)
    original = nbformat.read(source, as_version=4)
    return student, original, student_copies.make_student_copy(original, str(source))


def without_note(student, made):
    """The copy without the note on top, so that its cells have the notebook's numbers (a copy
    with no solution block has no note)."""
    nb = nbformat.from_dict(student)
    if made.blocks:
        assert nb.cells[1].source == student_copies.NOTE
        del nb.cells[1]
    else:
        assert student_copies.NOTE not in {c.source for c in nb.cells}
    return nb


def as_written(block) -> list[str]:
    """A block as the reference notebook writes it: markers, solution, commented student
    version (if it has one)."""
    marked = [block.indent + student_copies.BEGIN, *block.lines, block.indent + student_copies.END]
    if block.given:
        commented = [block.indent + "# " + line[len(block.indent):] if line else
                     block.indent + "#" for line in block.given]
        marked += [block.indent + student_copies.GIVEN_BEGIN, *commented,
                   block.indent + student_copies.GIVEN_END]
    return marked


def fill_in(student, made, markers: bool):
    """The copy without its note, each marked line (or student version) replaced by its
    solution block (as the reference writes it when ``markers``)."""
    nb = without_note(student, made)
    for i in sorted({b.cell for b in made.blocks}):
        blocks = sorted((b for b in made.blocks if b.cell == i), key=lambda b: b.begin)
        lines, old, at = [], nb.cells[i].source.split("\n"), 0
        while at < len(old):
            block = blocks[0] if blocks else None
            stands_for = block.hole() if block else None  # the marked line, or what is given
            if block and old[at:at + len(stands_for)] == stands_for:
                blocks.pop(0)
                lines += as_written(block) if markers else block.lines
                at += len(stands_for)
            else:
                lines.append(old[at])
                at += 1
        assert not blocks, f"cell {i}: a marked line is missing"
        nb.cells[i].source = "\n".join(lines)
    return nb


@pytest.mark.parametrize("source", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_copy_changes_only_solutions_and_exercise_outputs(source, copies):
    student, original, made = student_copy(source, copies)
    assert made.blocks or source.stem in QUESTIONS_ONLY, "a notebook without exercises"
    assert not any("SOLUTION" in c.source for c in student.cells)
    assert {b.cell for b in made.blocks} <= made.cleared
    restored = fill_in(student, made, markers=True)
    assert len(restored.cells) == len(original.cells)
    for i, (mine, theirs) in enumerate(zip(restored.cells, original.cells, strict=True)):
        assert (mine.cell_type, mine.source) == (theirs.cell_type, theirs.source), f"cell {i}"
        if i in made.cleared:
            assert mine.outputs == [] and mine.execution_count is None, f"cell {i}"
        elif mine.cell_type == "code":
            assert (mine.outputs, mine.execution_count) == (theirs.outputs,
                                                            theirs.execution_count), f"cell {i}"


def exercise_cells(nb) -> list[int]:
    """The code cells after the markdown line "## Exercises"."""
    starts = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
              and any(line.strip() == "## Exercises" for line in c.source.split("\n"))]
    assert len(starts) == 1, "the notebook needs one '## Exercises' heading"
    return [i for i in range(starts[0] + 1, len(nb.cells)) if nb.cells[i].cell_type == "code"]


def run_exercises(kernel, nb) -> dict:
    """Run the exercise cells of ``nb`` in ``kernel``; the cells, by index."""
    return {i: kernel.run(nb.cells[i].source) for i in exercise_cells(nb)}


def assert_exercises_say(cells: dict, made, mode: str) -> None:
    """Every exercise's checker printed its "not done yet" line (mode "open") or its "correct"
    line (mode "answered"), never the other; no cell failed or wrote to stderr."""
    failed = {i: f"{e.ename}: {e.evalue}" for i, c in cells.items() for e in errors(c)}
    assert not failed, f"exercise cells that failed ({mode}): {failed}"
    for i, cell in cells.items():
        assert not [o for o in cell.outputs if o.get("name") == "stderr"], f"cell {i} ({mode})"
    for exercise_id, checker_cells in made.checker_cells.items():
        assert checker_cells <= set(cells), f"{exercise_id}: a checker outside the exercises"
        given = any(b.given for b in made.blocks if b.exercise_id == exercise_id)
        said = functools.partial(not_done_line, as_given=given)  # code to fix, or a hole
        want, unwant = (said, passed_line) if mode == "open" else (passed_line, said)
        for i in checker_cells:
            printed = stdout(cells[i]).split("\n")
            assert want(exercise_id) in printed, f"cell {i} ({mode}): {printed}"
            assert unwant(exercise_id) not in printed, f"cell {i} ({mode}): {printed}"
            if mode == "answered":  # theirs (here the course's own) beside ours
                assert "Your code is the course's, line for line." in printed, printed


@pytest.mark.parametrize("source", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_open_exercises_say_not_done_yet_then_correct_once_answered(source, tmp_path, kernels):
    """(b), then (c) in the same kernel. Answered, a multi-process checker launches the
    learner's file on 2 processes only: the answers are the notebook's own
    (test_copy_changes_only_...), which nbval checks on 2, 3 and 4."""
    made = student_copies.make_student_copy(nbformat.read(source, as_version=4), str(source))
    student = made.notebook  # the copy the command line writes: test_copy_changes_only_...
    opened, answered = without_note(student, made), fill_in(student, made, markers=False)
    setup = next(i for i, c in enumerate(opened.cells)  # (a Colab or Kaggle cell comes first)
                 if c.cell_type == "code" and "setup_notebook(" in c.source)
    (tmp_path / STUDENT_MANIFEST).write_text("{}")  # the kernel works in a student copy's folder
    with kernels.run_in(tmp_path) as kernel:
        left = stdout(kernel.run(f"print(__import__('os').environ.get({WORLD_SIZES_ENV!r}))"))
        assert left == f"{kernels.environ.get(WORLD_SIZES_ENV)}\n", "set by the notebook before"
        ran = kernel.run(opened.cells[setup].source)
        assert not errors(ran), f"the setup cell failed: {errors(ran)}"
        assert not [o for o in ran.outputs if o.get("name") == "stderr"], "the setup cell"
        assert_exercises_say(run_exercises(kernel, opened), made, "open")
        kernel.run(f"import os\nos.environ[{WORLD_SIZES_ENV!r}] = '2'")
        assert_exercises_say(run_exercises(kernel, answered), made, "answered")


def test_every_notebook_is_collected():
    names = {p.name for p in NOTEBOOKS}
    assert "00_start_here.ipynb" in names and len(names) >= 13
    assert "06b_cost_model_and_fast_ring.ipynb" in names  # NN*_: a letter after the number too
    assert all(name[:2].isdigit() for name in names)


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_exercise_cell_imports_the_check_it_calls(source):
    """A learner reruns one exercise cell after a restart: it must not need an earlier one."""
    cells = nbformat.read(source, as_version=4).cells
    for index, cell in enumerate(c for c in cells if c.cell_type == "code"):
        called = {".".join(word.split("(")[0].split(".")[:2]) for word in cell.source.split()
                  if word.startswith("check.nb")}  # check.nb07.scale_loss(... -> check.nb07
        for name in called:
            assert f"import course_lib.{name}" in cell.source, f"code cell {index} calls {name}"
            assert "from course_lib import check" in cell.source, f"code cell {index}"
