"""What the browser should show for a notebook, read from its saved outputs, and the check.

The saved notebook is the record of a clean run (``scripts/execute_notebooks.sh``), so it says
how many plots each cell draws, which cells stream lines from which ranks, which cells may end
in an error, and whether there is a slider to move. ``page_problems`` compares that with what
JupyterLab shows (the cells as ``lab_page.read_cells`` reads them from the page).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
RANK_LINE = re.compile(r"^\[rank (\d+)\] ", re.MULTILINE)  # how the launcher prefixes lines
SLIDER_REPR = re.compile(r"\b\w*Slider\(")  # text/plain of a displayed ipywidgets slider
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
NOT_RUN_PROMPTS = ("[ ]:", "[*]:", "")  # a cell's prompt in JupyterLab until it has run


@dataclass
class CellExpectation:
    index: int  # position among all cells, markdown included (as in the page)
    kind: str  # "code", "markdown" or "raw"
    must_run: bool  # a non-empty code cell: Run All must give it an execution count
    png_count: int  # image/png outputs saved for this cell: plots the page must show
    ranks: tuple[int, ...]  # ranks whose "[rank R] " lines the saved output holds
    error_allowed: bool  # the saved run ended this cell in an error on purpose
    shows_slider: bool  # the saved output displays an ipywidgets slider
    saved_unrun: bool = False  # a non-empty code cell saved without an execution count
    report_lines: tuple[str, ...] = ()  # the lines of its saved error, colours removed


@dataclass
class NotebookExpectation:
    path: Path
    cells: list[CellExpectation]
    slider_in_state: bool  # the saved widget state holds a slider model

    @property
    def has_slider(self) -> bool:
        return self.slider_in_state or self.slider_cell is not None

    @property
    def png_total(self) -> int:
        return sum(c.png_count for c in self.cells)

    @property
    def slider_cell(self) -> CellExpectation | None:
        """The first cell that displays a slider, or None when the notebook has none."""
        return next((c for c in self.cells if c.shows_slider), None)

    @property
    def saved_unrun(self) -> list[int]:
        """Cells saved without being run: the saved notebook then promises nothing about them."""
        return [c.index for c in self.cells if c.saved_unrun]

    @property
    def report_cells(self) -> dict[int, list[str]]:
        """Cells that end in an error on purpose (an exercise's report): their lines."""
        return {c.index: list(c.report_lines) for c in self.cells if c.report_lines}

    @property
    def multi_rank_cells(self) -> list[CellExpectation]:
        """Cells whose saved output streamed lines from rank 1 (a multi-process launch)."""
        return [c for c in self.cells if 1 in c.ranks]


def output_text(output: dict) -> str:
    """The text a learner reads in one saved output (stream, plain text or error)."""
    if output["output_type"] == "stream":
        return "".join(output.get("text", ""))
    if output["output_type"] == "error":
        return f"{output.get('ename', '')}: {output.get('evalue', '')}"
    return "".join(output.get("data", {}).get("text/plain", ""))


def slider_model_ids(notebook: dict) -> set[str]:
    """Ids of the slider models in the saved widget state (empty if none was saved)."""
    state = notebook.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {})
    return {model_id for model_id, model in state.get("state", {}).items()
            if model.get("model_name", "").endswith("SliderModel")}


def shows_slider(outputs: list[dict]) -> bool:
    for output in outputs:
        data = output.get("data", {})
        if WIDGET_VIEW in data and SLIDER_REPR.search("".join(data.get("text/plain", ""))):
            return True
    return False


def cell_expectation(index: int, cell: dict) -> CellExpectation:
    source = "".join(cell.get("source", ""))
    if cell["cell_type"] != "code":
        return CellExpectation(index, cell["cell_type"], False, 0, (), False, False)
    outputs = cell.get("outputs", [])
    text = "\n".join(output_text(o) for o in outputs)
    ranks = tuple(sorted({int(r) for r in RANK_LINE.findall(text)}))
    pngs = sum(1 for o in outputs if "image/png" in o.get("data", {}))
    errored = any(o["output_type"] == "error" for o in outputs)
    must_run = bool(source.strip())
    report = tuple(ANSI.sub("", line).rstrip() for o in outputs if o["output_type"] == "error"
                   for line in o.get("traceback", []) if line.strip())
    return CellExpectation(index, "code", must_run, pngs, ranks, errored, shows_slider(outputs),
                           must_run and cell.get("execution_count") is None, report)


def read_expectation(path: Path) -> NotebookExpectation:
    """Expectations for every cell of the saved notebook at ``path``."""
    notebook = json.loads(path.read_text())
    cells = [cell_expectation(i, cell) for i, cell in enumerate(notebook["cells"])]
    return NotebookExpectation(path, cells, bool(slider_model_ids(notebook)))


def page_problems(expected: NotebookExpectation, cells: list[dict]) -> list[str]:
    """Every way the page differs from what the saved notebook promises, as sentences."""
    if len(cells) != len(expected.cells):
        return [f"the page shows {len(cells)} cells, the notebook has {len(expected.cells)}"]
    problems = []
    unrun = [c.index for c in expected.cells
             if c.must_run and cells[c.index]["prompt"] in NOT_RUN_PROMPTS]
    if unrun:
        problems.append(f"cells {unrun} never ran: Run All stopped early")
    for want in expected.cells:
        got = cells[want.index]
        where = f"cell {want.index}"
        if got["errors"] and not want.error_allowed:
            problems.append(f"{where} shows an error or stderr output:\n{got['errors'][0]}")
        if got["images"] != want.png_count or got["images_loaded"] != want.png_count:
            problems.append(f"{where}: the saved notebook has {want.png_count} plot(s); the "
                            f"page shows {got['images']} image(s), {got['images_loaded']} "
                            "loaded")
        seen = {int(r) for r in RANK_LINE.findall(got["text"])}
        missing = sorted(set(want.ranks) - seen)
        if missing:
            problems.append(f"{where}: no streamed lines from rank(s) {missing}; the saved run "
                            f"had lines from ranks {list(want.ranks)}")
    return problems
