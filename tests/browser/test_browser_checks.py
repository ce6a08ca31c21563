"""The browser test's reasoning without a browser: expectations read from a saved notebook, and
every kind of difference between them and a page that ``page_problems`` must report."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nb_expectations import page_problems, read_expectation

FIXTURE = Path(__file__).resolve().parent / "fixture_plot_slider_launch.ipynb"
SLIDER_TEXT = "VBox(children=(IntSlider(value=3, description='n', max=10, min=1), Output()))"


def saved_notebook(tmp_path: Path, widget_state: bool = False) -> Path:
    """A small executed notebook: markdown, a plot, a slider, a 2-rank launch, an empty cell."""
    v4 = nbformat.v4
    plot = v4.new_code_cell("plt.show()", execution_count=1, outputs=[v4.new_output(
        "display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})])
    slider = v4.new_code_cell("display(box)", execution_count=2, outputs=[v4.new_output(
        "display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "m1"},
                              "text/plain": SLIDER_TEXT})])
    launch = v4.new_code_cell("run = launch(...)", execution_count=3, outputs=[
        v4.new_output("stream", name="stdout", text="[rank 1] hello\n[rank 0] hello\n")])
    nb = v4.new_notebook(cells=[v4.new_markdown_cell("# Title"), plot, slider, launch,
                                v4.new_code_cell("")])
    if widget_state:
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {
            "m2": {"model_name": "FloatSliderModel", "state": {}}}}}
    path = tmp_path / "saved.ipynb"
    path.write_text(json.dumps(nb))
    return path


def page_like(expected) -> list[dict]:
    """The page JupyterLab shows when everything went right."""
    cells = []
    for c in expected.cells:
        text = "".join(f"[rank {r}] hello\n" for r in c.ranks)
        cells.append({"kind": c.kind, "prompt": f"[{c.index}]:" if c.must_run else "[ ]:",
                      "errors": [], "images": c.png_count, "images_loaded": c.png_count,
                      "text": text, "sliders": int(c.shows_slider)})
    return cells


def test_expectations_come_from_saved_outputs(tmp_path):
    expected = read_expectation(saved_notebook(tmp_path))
    assert [c.png_count for c in expected.cells] == [0, 1, 0, 0, 0]
    assert expected.slider_cell.index == 2
    assert [c.index for c in expected.multi_rank_cells] == [3]
    assert expected.cells[3].ranks == (0, 1)
    assert [c.must_run for c in expected.cells] == [False, True, True, True, False]
    assert not expected.slider_in_state
    assert expected.saved_unrun == []


def test_cells_saved_without_running_are_named(tmp_path):
    path = saved_notebook(tmp_path)
    nb = json.loads(path.read_text())
    nb["cells"][3]["execution_count"] = None
    path.write_text(json.dumps(nb))
    assert read_expectation(path).saved_unrun == [3]


def test_slider_found_in_saved_widget_state(tmp_path):
    assert read_expectation(saved_notebook(tmp_path, widget_state=True)).slider_in_state


def test_fixture_notebook_exercises_every_check():
    """The fixture keeps the harness honest: a plot, a slider, lines from two ranks, and two
    exercise reports (a wrong answer, a launched file that raises), the only errors it holds."""
    expected = read_expectation(FIXTURE)
    assert expected.png_total >= 1
    assert expected.slider_cell is not None and expected.slider_in_state
    assert [c.ranks for c in expected.multi_rank_cells] == [(0, 1)]
    reports = expected.report_cells
    assert [c.index for c in expected.cells if c.error_allowed] == sorted(reports)
    assert len(reports) == 2 and all(len(lines) >= 3 for lines in reports.values())
    assert "IndexError: list index out of range" in reports[max(reports)]


def test_a_page_that_matches_has_no_problems(tmp_path):
    expected = read_expectation(saved_notebook(tmp_path))
    assert page_problems(expected, page_like(expected)) == []


@pytest.mark.parametrize("change, says", [
    (lambda cells: cells[3].update(errors=["Traceback ... LaunchError: rank 1 failed"]),
     "cell 3 shows an error"),
    (lambda cells: cells[1].update(images=0, images_loaded=0), "page shows 0 image(s)"),
    (lambda cells: cells[1].update(images_loaded=0), "1 image(s), 0 loaded"),
    (lambda cells: cells[3].update(text="[rank 0] hello\n"), "no streamed lines from rank(s) [1]"),
    (lambda cells: cells[3].update(prompt="[ ]:"), "cells [3] never ran"),
    (lambda cells: cells.pop(), "the page shows 4 cells, the notebook has 5"),
])
def test_each_difference_is_reported(tmp_path, change, says):
    expected = read_expectation(saved_notebook(tmp_path))
    cells = page_like(expected)
    change(cells)
    problems = page_problems(expected, cells)
    assert len(problems) == 1 and says in problems[0], problems
