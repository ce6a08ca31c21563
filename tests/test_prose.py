"""The notebooks' prose, read without running anything: short sentences, short cells, and no
figure from a run written into the text.

- **Rhythm.** Each notebook's markdown averages at most ``MAX_MEAN_WORDS`` words a sentence;
  no markdown cell holds more than ``MAX_CELL_WORDS`` words; few sentences run past
  ``LONG_SENTENCE`` words. Code, math, tables and headings are not counted; a list item or a
  paragraph ends a sentence as a full stop does.
- **No run figure in prose.** nbval compares outputs, never markdown, so a figure copied from a
  run into the text goes stale at the next re-run. A markdown cell may not quote a figure that
  a ``[time]`` line of the same notebook printed, unless the code itself writes it (a setting,
  a bound); a sentence that depends on a run is printed by the code beside its figure.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
MAX_MEAN_WORDS = 20  # d2l's multi-GPU chapter reads at about 20 words a sentence
MAX_CELL_WORDS = 200  # about one screen: one idea per cell
LONG_SENTENCE = 40
MAX_LONG_SENTENCES = 3  # per notebook
WORD = re.compile(r"[A-Za-z0-9`'][\w`'.,/+-]*")
SENTENCE_END = re.compile(
    r"(?<=[.!?])\s+(?=[A-Z`*(\"'0-9])"  # a full stop and the next sentence
    r"|\n\s*\n"                          # a paragraph
    r"|\n\s*(?:[-*]|\d+\.)\s+"           # a list item
    r"|:\s*\n")                          # a colon that ends a line, a list after it
TIME_FIGURE = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")  # 24.4, 1.37: a measured decimal


def markdown_cells(notebook: dict) -> list[str]:
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown"]


def prose(markdown: str) -> str:
    """The sentences of a markdown cell: no code, math, tables, headings, link targets."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " X ", text, flags=re.S)
    text = re.sub(r"\$[^$\n]+\$", " X ", text)
    text = re.sub(r"<[^>]+>", " ", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return "\n".join(line for line in text.splitlines()  # "Open in Colab": navigation
                     if not line.lstrip().startswith(("|", "#", "Open in Colab ·")))


def sentence_lengths(markdown: str) -> list[int]:
    """Words in each sentence of a markdown cell."""
    lengths = [len(WORD.findall(part)) for part in SENTENCE_END.split(prose(markdown))]
    return [n for n in lengths if n]


def read(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_sentences_are_short_on_average_and_few_are_long(path):
    lengths = [n for cell in markdown_cells(read(path)) for n in sentence_lengths(cell)]
    mean = sum(lengths) / len(lengths)
    long_ones = [n for n in lengths if n > LONG_SENTENCE]
    assert mean <= MAX_MEAN_WORDS, f"{path.stem}: {mean:.1f} words a sentence on average"
    assert len(long_ones) <= MAX_LONG_SENTENCES, \
        f"{path.stem}: {len(long_ones)} sentences over {LONG_SENTENCE} words: {long_ones}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_markdown_cell_is_over_a_screen_of_words(path):
    found = [(index, words) for index, words in enumerate(
        sum(sentence_lengths(cell)) for cell in markdown_cells(read(path)))
        if words > MAX_CELL_WORDS]
    assert not found, f"{path.stem}: markdown cells (index, words) over {MAX_CELL_WORDS}: {found}"


def timed_figures(notebook: dict) -> set[str]:
    """The decimal figures the notebook's ``[time]`` lines printed in its saved run."""
    found = set()
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            text = output.get("text", output.get("data", {}).get("text/plain", ""))
            for line in ("".join(text) if isinstance(text, list) else text).splitlines():
                if "[time]" in line:
                    found.update(TIME_FIGURE.findall(line.split("[time]", 1)[1]))
    return found


def written_in_code(notebook: dict) -> set[str]:
    """Decimal figures the code cells write themselves: settings and bounds, not measurements."""
    return {figure for cell in notebook["cells"] if cell["cell_type"] == "code"
            for figure in TIME_FIGURE.findall("".join(cell["source"]))}


def quoted_run_figures(notebook: dict) -> list[str]:
    timed = timed_figures(notebook) - written_in_code(notebook)
    return [f"{figure} in: {line.strip()}" for cell in markdown_cells(notebook)
            for line in prose(cell).splitlines()
            for figure in TIME_FIGURE.findall(line) if figure in timed]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_markdown_quotes_a_figure_a_timing_line_printed(path):
    found = quoted_run_figures(read(path))
    assert not found, (f"{path.stem}: the text quotes figures from this run; print the "
                       "sentence from the code beside its figure instead:\n" + "\n".join(found))


def test_sentences_are_split_at_stops_paragraphs_and_list_items():
    cell = "One two three. Four five.\n\n- six seven\n- eight\n\nNine `ten` $x^2$ eleven:\n- a"
    assert sentence_lengths(cell) == [3, 2, 2, 1, 4, 1]
    assert sentence_lengths("```python\nx = 1\n```\n| a | b |\n# Title\nWords here.") == [2]


def test_a_quoted_timing_figure_is_caught_and_others_are_not():
    run = {"cell_type": "code", "source": [], "outputs": [
        {"output_type": "stream", "name": "stdout",
         "text": "[time] overlap: median step 24.4 ms\nloss 2.6537\n"}]}
    quoting = {"cell_type": "markdown", "source": ["Overlap took 24.4 ms here."]}
    general = {"cell_type": "markdown", "source": ["The loss starts at 2.6537; see 1.5x."]}
    assert quoted_run_figures({"cells": [run, quoting]}) == [
        "24.4 in: Overlap took 24.4 ms here."]
    assert quoted_run_figures({"cells": [run, general]}) == []
    setting = {**run, "source": ["LINK_MS = 24.4  # a setting, printed in the timing line"]}
    assert quoted_run_figures({"cells": [setting, quoting]}) == []
