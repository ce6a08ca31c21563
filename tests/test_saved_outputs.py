"""What a reader sees in the saved notebooks, without running them.

Every notebook's saved outputs are read (one test per notebook, so each failing one shows by
name) and fail on:

- an echoed ``True`` or ``False``: an ``execute_result`` whose text is exactly that (a checker
  or a function whose value the cell did not mean to show);
- an empty progress widget: a widget view saved with no text, or only the widget's bare repr
  (``IntProgress(value=0, max=1)``), which is all a reader sees outside a live kernel; or a
  progress bar whose saved state stopped before its end (value < max);
- an error: a saved ``error`` output, traceback text in a stream (``Traceback (most recent
  call last)``, ``File "...", line N``), or a line that starts with ``SomethingError:``;
- progress residue: a ``[progress] N/N`` line (a finished run's bar goes away).

Across the course, at most ``MAX_BARE_VERDICTS`` lines print a threshold claim as a bare verdict
(``error below 1e-9: True``): where the measured number is the lesson, the line prints the
number the assert checks beside its threshold.

Two markers say that an error is what the text calls for:

- a cell that raises on purpose carries nbval's marker, the cell tag ``raises-exception`` or a
  line ``# NBVAL_RAISES_EXCEPTION`` (``scripts/check_notebook.py`` accepts the same); then any
  of the above may show;
- a drill that makes a run fail on purpose catches the failure in the cell itself (``try:`` /
  ``except LaunchError``), asserts it happened, and prints a summary line or two (notebook
  00's fault drill, notebook 09's crash drill). Such a cell may print ``XError:`` lines, never a
  traceback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
BARE_WIDGET_REPR = re.compile(r"^\w+\(.*\)$", re.S)  # IntProgress(value=0, max=1)
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*File \".*\", line \d+", re.M)
ERROR_LINE = re.compile(r"^(\[rank \d+\] )?\w*(Error|Exception): ", re.M)
CATCHES = re.compile(r"^\s*except\b", re.M)
PROGRESS = re.compile(r"^(\[rank \d+\] )?\[progress\] (\d+)/\2\b", re.M)  # a finished bar
# "error below 1e-9: True", "(rtol 1e-5): True": a threshold, then a bare verdict
BARE_VERDICT = re.compile(r"(below|above|within|at most|at least|rtol|<=|>=|<|>)[^:\n]*:"
                          r"\s*(True|False)\b")
MAX_BARE_VERDICTS = 3


def text_of(output: dict) -> str:
    text = output.get("text", output.get("data", {}).get("text/plain", ""))
    return "".join(text) if isinstance(text, list) else text


def may_show_an_error(cell: dict) -> bool:
    return ("raises-exception" in cell.get("metadata", {}).get("tags", [])
            or "# NBVAL_RAISES_EXCEPTION" in "".join(cell["source"]).splitlines())


def catches_a_failure(cell: dict) -> bool:
    return bool(CATCHES.search("".join(cell["source"])))


def unfinished_bars(notebook: dict) -> dict[str, str]:
    """Saved progress-bar models that stopped before their end: model id -> description."""
    state = notebook.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {})
    bars = {}
    for model_id, model in state.get("state", {}).items():
        fields = model.get("state", {})
        if model.get("model_name", "").endswith("ProgressModel") and \
                fields.get("value", 0) < fields.get("max", 0):
            bars[model_id] = f"{fields.get('value')}/{fields.get('max')}"
    return bars


def output_problems(output: dict, cell: dict, unfinished: dict[str, str]) -> list[str]:
    kind, text = output["output_type"], text_of(output)
    found = []
    if kind == "execute_result" and text.strip() in ("True", "False"):
        found.append(f"echoes {text.strip()}")
    if PROGRESS.search(text):
        found.append(f"progress residue ({PROGRESS.search(text).group(0).strip()})")
    if kind == "display_data" and WIDGET_VIEW in output.get("data", {}):
        model_id = output["data"][WIDGET_VIEW].get("model_id")
        if not text.strip() or BARE_WIDGET_REPR.match(text.strip()):
            found.append(f"an empty progress widget ({text.strip() or 'no text'})")
        if model_id in unfinished:
            found.append(f"a progress bar saved unfinished ({unfinished[model_id]})")
    if not may_show_an_error(cell):
        if kind == "error":
            found.append(f"a saved error: {output.get('ename')}: {output.get('evalue')}")
        elif kind == "stream" and TRACEBACK.search(text):
            line = TRACEBACK.search(text).group(0).strip()
            found.append(f"traceback text in its {output.get('name')} ({line})")
        elif kind == "stream" and ERROR_LINE.search(text) and not catches_a_failure(cell):
            line = ERROR_LINE.search(text).group(0).strip()
            found.append(f"an error line in its {output.get('name')} ({line})")
    return found


def saved_output_problems(path: Path) -> list[str]:
    notebook = json.loads(path.read_text())
    unfinished = unfinished_bars(notebook)
    found = []
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            found += [f"cell {index}: {p}" for p in output_problems(output, cell, unfinished)]
    return sorted(set(found), key=found.index)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_saved_outputs_show_nothing_unintended(path):
    found = saved_output_problems(path)
    assert not found, f"{path.name}:\n" + "\n".join(found)


def bare_verdicts(path: Path) -> list[str]:
    """The saved lines of ``path`` that print a threshold claim as a bare True or False."""
    notebook = json.loads(path.read_text())
    return [f"{path.stem} cell {i}: {line.strip()}" for i, cell in enumerate(notebook["cells"])
            if cell["cell_type"] == "code" for output in cell.get("outputs", [])
            for line in text_of(output).split("\n") if BARE_VERDICT.search(line)]


def test_threshold_claims_print_the_measured_number_not_a_bare_verdict():
    found = [line for path in NOTEBOOKS for line in bare_verdicts(path)]
    assert len(found) <= MAX_BARE_VERDICTS, "\n".join(found)


def test_a_bare_verdict_is_recognised():
    assert BARE_VERDICT.search("float64 best error below 1e-9: True")
    assert BARE_VERDICT.search("2 processes == 1 process (rtol 1e-5): True")
    assert not BARE_VERDICT.search("float64: best error 2e-11 (below 1e-9)")
    assert not BARE_VERDICT.search("rank 0 holds [0.0, 1.0]  correct: True")


def test_every_notebook_is_read():
    assert len(NOTEBOOKS) >= 13 and NOTEBOOKS[0].name.startswith("00_")
    assert "06b_cost_model_and_fast_ring" in {p.stem for p in NOTEBOOKS}  # NN*_ globs it


def notebook_with(outputs: list[dict], tags=(), source="x = 1", widgets=None) -> dict:
    cell = {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": [source],
            "outputs": outputs, "execution_count": 1}
    return {"cells": [cell], "metadata": {"widgets": {WIDGET_STATE: {"state": widgets or {}}}}}


def problems_in(notebook: dict, tmp_path) -> list[str]:
    path = tmp_path / "00_probe.ipynb"
    path.write_text(json.dumps(notebook))
    return saved_output_problems(path)


ECHO = {"output_type": "execute_result", "data": {"text/plain": "True"}, "metadata": {}}
EMPTY_BAR = {"output_type": "display_data", "metadata": {},
             "data": {WIDGET_VIEW: {"model_id": "m1"}, "text/plain": "IntProgress(value=0, max=1)"}}
ERROR = {"output_type": "error", "ename": "ValueError", "evalue": "bad", "traceback": []}
STREAM_TRACEBACK = {"output_type": "stream", "name": "stdout",
                    "text": "Traceback (most recent call last):\n  File \"x.py\", line 3\n"}


@pytest.mark.parametrize("output, problem", [
    (ECHO, "echoes True"),
    (EMPTY_BAR, "an empty progress widget"),
    ({**EMPTY_BAR, "data": {WIDGET_VIEW: {"model_id": "m1"}}}, "an empty progress widget"),
    (ERROR, "a saved error: ValueError: bad"),
    (STREAM_TRACEBACK, "traceback text in its stdout"),
    ({**STREAM_TRACEBACK, "text": "[progress] 8/8 steps\n"}, "progress residue"),
    ({**STREAM_TRACEBACK, "text": "[rank 1] RuntimeError: peer closed\n"}, "an error line"),
])
def test_each_problem_is_caught(output, problem, tmp_path):
    found = problems_in(notebook_with([output]), tmp_path)
    assert len(found) == 1 and problem in found[0]


def test_an_unfinished_bar_is_caught_and_a_finished_one_with_text_is_not(tmp_path):
    bar = {"output_type": "display_data", "metadata": {},
           "data": {WIDGET_VIEW: {"model_id": "m1"}, "text/plain": "[progress] 3/8 steps"}}
    state = {"model_name": "IntProgressModel", "state": {"value": 3, "max": 8}}
    assert problems_in(notebook_with([bar], widgets={"m1": state}), tmp_path) == [
        "cell 0: a progress bar saved unfinished (3/8)"]
    done = {"model_name": "IntProgressModel", "state": {"value": 8, "max": 8}}
    assert problems_in(notebook_with([bar], widgets={"m1": done}), tmp_path) == []


def test_a_marked_error_and_plain_results_pass(tmp_path):
    assert problems_in(notebook_with([ERROR], tags=["raises-exception"]), tmp_path) == []
    marked = "# NBVAL_RAISES_EXCEPTION\nraise ValueError('bad')"
    assert problems_in(notebook_with([STREAM_TRACEBACK], source=marked), tmp_path) == []
    caught = "try:\n    run()\nexcept LaunchError as error:\n    print(error)"
    summary = {"output_type": "stream", "name": "stdout", "text": "[rank 1] RuntimeError: x\n"}
    assert problems_in(notebook_with([summary], source=caught), tmp_path) == []
    assert problems_in(notebook_with([STREAM_TRACEBACK], source=caught), tmp_path) != []
    fine = [{"output_type": "execute_result", "data": {"text/plain": "True or False"}},
            {"output_type": "stream", "name": "stdout", "text": "no Error here: fine\n"}]
    assert problems_in(notebook_with(fine), tmp_path) == []
