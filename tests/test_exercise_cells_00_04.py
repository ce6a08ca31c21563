"""The exercise cells of notebooks 00-04, each run on its own in a kernel whose names were all
cleared (``%reset -f``) just before, as a learner who opens the notebook at its exercises may
(one kernel for them all: each cell starts from no names at all, whatever ran before):

- as in the notebook (answered): each prints its "correct" line;
- as in the student copy (open): each prints its "not done yet" line;
- with a wrong answer or a name from an earlier cell: a short red report, no traceback.
"""

import re
from pathlib import Path

import nbformat
import pytest
from notebook_kernel import errors, fresh_kernel, stdout

from course_lib.check import student_copy as student_copies
from course_lib.check.checker import not_done_line, passed_line
from course_lib.check.report import MAX_LINES, RUN_FROM_THE_TOP

ROOT = Path(__file__).resolve().parent.parent

NOTEBOOKS = ["00_start_here", "01_gradients", "02_batches_and_memory",
             "03_gradient_accumulation", "04_data_parallel_in_one_process"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def exercise_cells(nb):
    """Exercise id -> the cell that calls its checker; and the student copy."""
    made = student_copies.make_student_copy(nb, "notebook")
    return {exercise_id: min(cells) for exercise_id, cells in made.checker_cells.items()}, made


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """One kernel for the module (starting one costs 4 s of CPU)."""
    with fresh_kernel(tmp_path_factory.mktemp("kernel")) as started:
        yield started


def run_alone(kernel, source: str):
    assert not kernel.run("%reset -f").failed
    return kernel.run(source)


def shown(cell) -> str:
    return "\n".join(ANSI.sub("", line) for e in errors(cell) for line in e.traceback)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_each_exercise_cell_runs_on_its_own(name, kernel):
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    cells, made = exercise_cells(nb)
    # the copy without the note on top (its cell 1): the notebook's cell numbers
    student = [made.notebook.cells[0], *made.notebook.cells[2:]]
    for exercise_id, i in cells.items():
        answered = run_alone(kernel, nb.cells[i].source)
        assert not answered.failed, shown(answered)
        assert passed_line(exercise_id) in stdout(answered).split("\n")
        still_open = run_alone(kernel, student[i].source)
        assert not still_open.failed, shown(still_open)
        assert not_done_line(exercise_id) in stdout(still_open).split("\n")


def test_a_wrong_answer_and_a_missing_name_give_short_reports(kernel):
    nb = nbformat.read(ROOT / "notebooks" / "03_gradient_accumulation.ipynb", as_version=4)
    cells, made = exercise_cells(nb)
    source = nb.cells[cells["3.2"]].source
    solution = "    return loss_sum / global_tokens  # one denominator for every micro-batch"
    assert solution in source
    wrong = run_alone(kernel, source.replace(solution, "    return loss_sum / global_tokens"
                                                       " / accum_steps"))
    report = shown(wrong).split("\n")
    assert wrong.failed and len(report) <= MAX_LINES
    assert report[0] == "Exercise 3.2: not right yet."
    assert "3 times too small" in " ".join(report) and "File " not in shown(wrong)
    missing = run_alone(kernel, source.replace(solution, "    return rel(loss_sum, 1)"))
    report = shown(missing).split("\n")
    assert missing.failed and len(report) <= MAX_LINES
    assert "NameError: name 'rel' is not defined" in report
    assert RUN_FROM_THE_TOP in " ".join(report)
    stronger = run_alone(kernel, 'from course_lib import check\ncheck.hint("3.2")')
    assert stdout(stronger).startswith("Exercise 3.2, hint 1 of 2:")
