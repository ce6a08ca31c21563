"""The student copy of every notebook runs top to bottom with its exercises open.

For each ``notebooks/NN_*.ipynb`` found when the tests are collected, the copy that
``scripts/make_student_notebooks.py`` writes must: keep no line of any solution block, have the
outputs of its exercise cells cleared, run top to bottom in a fresh kernel of this environment
without an error or a stderr line, and print each exercise's "not done yet" line (once per
checker call) and no "correct" line. Slow: each copy runs as long as its notebook (minus the
exercises), so deselect with ``-m "not slow"`` while working on something else.
"""

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import ipykernel.kernelspec
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from course_lib.check.core import not_done_line, passed_line

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT_S = 600  # one cell; a notebook's whole run is bounded by the test timeout
NOTEBOOK_TIMEOUT_S = 1200

sys.path.insert(0, str(ROOT / "scripts"))  # the script and the modules beside it
import student_copies as msn  # noqa: E402


class CurrentEnvironmentKernels(KernelSpecManager):
    """Every kernel name means ipykernel on this interpreter (as nbval --nbval-current-env)."""

    def get_kernel_spec(self, kernel_name):
        return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                      **ipykernel.kernelspec.get_kernel_dict())


def write_student_copy(source: Path, out: Path) -> Path:
    """The student copy of one notebook, written by the script's command line."""
    made = subprocess.run([sys.executable, "scripts/make_student_notebooks.py", "--out",
                           str(out), str(source)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    return out / source.name


def code_lines(nb, skip_blocks: bool) -> Counter:
    """Stripped lines of every code cell (outside solution blocks when ``skip_blocks``)."""
    lines, inside = Counter(), False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for line in cell.source.split("\n"):
            marker = line.strip() in (msn.BEGIN, msn.END)
            inside = (line.strip() == msn.BEGIN) if marker else inside
            if not (skip_blocks and (inside or marker)):
                lines[line.strip()] += 1
    return lines


def check_written_copy(original, student, made) -> None:
    """Static checks: no solution left, exercise cells cleared."""
    allowed = code_lines(original, skip_blocks=True)  # lines the copy may legitimately hold
    present = code_lines(student, skip_blocks=False)
    for block in made.blocks:
        for line in filter(None, (s.strip() for s in block.lines)):
            assert present[line] <= allowed[line], (
                f"solution line {line!r} (exercise {block.exercise_id}) is in the copy")
    assert not any(m in c.source for c in student.cells for m in ("BEGIN SOLUTION",
                                                                  "END SOLUTION"))
    holes = [c for c in student.cells if "replace this line with your code" in c.source]
    assert len(holes) == len({b.cell for b in made.blocks})
    assert all(c.outputs == [] and c.execution_count is None for c in holes)


def expected_errors(nb) -> set[int]:
    """Cells that raise on purpose; nbclient knows the tag, not nbval's comment marker."""
    cells = set()
    for i, cell in enumerate(nb.cells):
        tags = cell.metadata.setdefault("tags", [])
        if "# NBVAL_RAISES_EXCEPTION" in cell.source.split("\n") and cell.cell_type == "code":
            tags.append("raises-exception")
        if "raises-exception" in tags:
            cells.add(i)
    return cells


def execute(nb, folder: Path) -> float:
    """Run ``nb`` top to bottom in a fresh kernel; returns the seconds it took."""
    km = KernelManager(kernel_name="python3", kernel_spec_manager=CurrentEnvironmentKernels())
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, allow_errors=False,
                            resources={"metadata": {"path": str(folder)}})
    start = time.monotonic()
    client.execute(stderr=subprocess.DEVNULL)  # the kernel's own log; cells' stderr is kept
    return time.monotonic() - start


@pytest.mark.slow
@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
@pytest.mark.parametrize("source", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_student_copy_runs_with_every_exercise_open(source, tmp_path):
    student_dir = tmp_path / "student"
    student = nbformat.read(write_student_copy(source, student_dir), as_version=4)
    original = nbformat.read(source, as_version=4)
    made = msn.make_student_copy(original, str(source))
    check_written_copy(original, student, made)

    raising = expected_errors(student)
    seconds = execute(student, student_dir)
    print(f"[time] student copy of {source.name}: {seconds:.0f} s")
    for i, cell in enumerate(student.cells):
        for out in cell.get("outputs", []):
            assert out.output_type != "error" or i in raising, f"cell {i}: {out.get('evalue')}"
            assert out.get("name") != "stderr", f"cell {i} wrote to stderr: {out.get('text')}"
    printed = "".join(out.get("text", "") for cell in student.cells
                      for out in cell.get("outputs", []) if out.get("name") == "stdout")
    lines = printed.split("\n")
    for exercise_id, calls in made.checks.items():
        assert lines.count(not_done_line(exercise_id)) == calls, exercise_id
        assert passed_line(exercise_id) not in lines, exercise_id


def test_every_notebook_is_collected():
    names = {p.name for p in NOTEBOOKS}
    assert "00_start_here.ipynb" in names
    assert all(os.path.basename(p)[:2].isdigit() for p in names)
