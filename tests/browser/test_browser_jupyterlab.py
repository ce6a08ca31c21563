"""A learner's view: open course notebooks in JupyterLab in a real browser and Run All.

For each notebook, what must be seen is read from its saved outputs (nb_expectations.py): no
error anywhere, every saved plot as an image in the page, lines from every rank where the saved
run had them, and, when there is a slider, its output changes when the slider moves. Where a
cell ends in an exercise's report on purpose (the fixture has two), each line of the saved
report is a line of its own in the page, and its text reads at 4.5:1 or better on the error
box, in the light and the dark theme (error_reports.py).
Screenshots go to test-artifacts/browser/NOTEBOOK/.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest
from error_reports import report_problems
from lab_page import (
    STDERR_MIME,
    clear_outputs,
    move_first_slider,
    open_notebook,
    read_cells,
    run_all_cells,
    screenshot_cell,
    wait_until_run_ends,
)
from lab_server import shut_down_kernels
from nb_expectations import NotebookExpectation, page_problems, read_expectation

REPO_ROOT = Path(__file__).resolve().parents[2]
# a plot, a slider with an interactive output and a 2-process launch, to prove the harness
FIXTURE = Path(__file__).resolve().parent / "fixture_plot_slider_launch.ipynb"
# More notebooks from notebooks/, comma-separated: COURSE_BROWSER_NOTEBOOKS=00_start_here,05_...
EXTRA_ENV = "COURSE_BROWSER_NOTEBOOKS"
EXTRA = [n.strip().removesuffix(".ipynb") for n in os.environ.get(EXTRA_ENV, "").split(",")]
NOTEBOOKS = [
    REPO_ROOT / "notebooks" / "03_gradient_accumulation.ipynb",  # plots and a slider
    REPO_ROOT / "notebooks" / "07_data_parallel_training.ipynb",  # multi-process training
    *[REPO_ROOT / "notebooks" / f"{name}.ipynb" for name in EXTRA if name],
    FIXTURE,
]
RUN_TIMEOUT_S = 420  # Run All of the slowest notebook on a 2-core machine, with room to spare
WIDGET_FRONT_END = "@jupyter-widgets/jupyterlab-manager"
INLINE_IMAGE = re.compile(r"data:image/[a-z+]+;base64,[A-Za-z0-9+/=]+")


def notebook_param(path: Path):
    """A notebook still being written is skipped, by name, before JupyterLab starts."""
    missing = pytest.mark.skipif(not path.exists(),
                                 reason=f"{path.relative_to(REPO_ROOT)} does not exist yet")
    return pytest.param(path, id=path.stem, marks=missing)


def readable(fingerprint: str) -> str:
    """An output fingerprint with each inline image replaced by a short digest of it."""
    return INLINE_IMAGE.sub(
        lambda m: f"<image sha1 {hashlib.sha1(m.group().encode()).hexdigest()[:12]}>",
        fingerprint)


def slider_index(expected: NotebookExpectation, cells: list[dict]) -> int | None:
    """The cell whose slider the test moves: the saved notebook's, else the page's first."""
    if expected.slider_cell is not None:
        return expected.slider_cell.index
    return next((i for i, c in enumerate(cells) if c["sliders"]), None)


def missing_slider(expected: NotebookExpectation, cells: list[dict]) -> list[str]:
    """A problem when the saved notebook shows a slider and the page does not."""
    index = slider_index(expected, cells)
    if index is not None and cells[index]["sliders"]:
        return []
    shown = cells[index]["text"].strip()[:300] if index is not None else "(no cell)"
    return [f"the saved notebook has a slider but the page shows none (cell {index} shows: "
            f"{shown!r}); is the widget front-end {WIDGET_FRONT_END} installed and enabled in "
            "JupyterLab?"]


def slider_problems(page, index: int, out: Path) -> list[str]:
    """Move the slider in cell ``index``; its output must change and show no error."""
    screenshot_cell(page, index, str(out / "4_slider_before.png"))
    before, after, how = move_first_slider(page, index)
    screenshot_cell(page, index, str(out / "5_slider_after.png"))
    (out / "slider_move.txt").write_text(f"cell {index}, moved by {how}\n--- output before:\n"
                                         f"{readable(before)}\n--- output after:\n"
                                         f"{readable(after)}\n")
    if after == before:
        return [f"cell {index}: moving the slider (keyboard, then mouse drag) did not change "
                f"its output; output stayed {before.strip()[:300]!r}"]
    errors = read_cells(page)[index]["errors"]
    if errors:
        return [f"cell {index}: after moving the slider ({how}) the output shows an "
                f"error:\n{errors[0]}"]
    return []


def save_evidence(page, expected: NotebookExpectation, out: Path) -> None:
    """Screenshots of the top of the notebook, the first plot and a cell with rank lines."""
    page.screenshot(path=str(out / "1_after_run_all.png"))
    plots = [c.index for c in expected.cells if c.png_count]
    if plots:
        screenshot_cell(page, plots[0], str(out / "2_first_plot.png"))
    with_ranks = expected.multi_rank_cells or [c for c in expected.cells if c.ranks]
    if with_ranks:
        screenshot_cell(page, with_ranks[0].index, str(out / "3_rank_lines.png"))


def save_failure_screenshots(page, out: Path) -> None:
    """The page as it was, and the first cell that shows an error or never ran."""
    try:
        page.screenshot(path=str(out / "failure.png"))
        cells = read_cells(page)
        bad = [i for i, c in enumerate(cells) if c["errors"]]
        bad += [i for i, c in enumerate(cells) if c["kind"] == "code" and c["prompt"] == "[ ]:"]
        if bad:
            screenshot_cell(page, bad[0], str(out / f"failure_cell_{bad[0]}.png"))
    except Exception as error:  # the test's own failure matters more
        (out / "failure_screenshot_error.txt").write_text(repr(error))


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 180)
@pytest.mark.parametrize("notebook", [notebook_param(p) for p in NOTEBOOKS])
def test_notebook_runs_in_jupyterlab(notebook: Path, lab, browser, artifacts):
    expected = read_expectation(notebook)
    assert not expected.saved_unrun, (
        f"{notebook.name}: cells {expected.saved_unrun} were saved without being run, so the "
        "saved notebook cannot say what the page must show; run scripts/execute_notebooks.sh "
        f"notebooks/{notebook.name} first")
    out = artifacts / notebook.stem
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    print(f"screenshots: {out}")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    console = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    try:
        open_notebook(page, lab.url, notebook.name)
        clear_outputs(page)
        run_all_cells(page)
        must_run = [c.index for c in expected.cells if c.must_run]
        cells = wait_until_run_ends(page, must_run, RUN_TIMEOUT_S)
        save_evidence(page, expected, out)
        problems = page_problems(expected, cells)
        if expected.report_cells:  # an exercise's report: its lines apart, readable in both
            problems += report_problems(page, STDERR_MIME, expected.report_cells)  # themes
        if expected.has_slider:  # a missing widget front-end explains the rest: say it first
            problems = missing_slider(expected, cells) + problems
            if not problems:
                problems = slider_problems(page, slider_index(expected, cells), out)
        assert not problems, (f"{notebook.name} in JupyterLab (screenshots in {out}):\n- "
                              + "\n- ".join(problems))
    except BaseException:
        save_failure_screenshots(page, out)
        raise
    finally:
        (out / "browser_console.log").write_text("\n".join(console))
        shut_down_kernels(lab.url)  # its launched workers end with it
        context.close()

