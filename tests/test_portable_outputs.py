"""Saved outputs that every CPU prints alike, read without running anything.

A figure at floating-point rounding level (a relative error of 3e-07, a loss gap of 2e-07)
changes its digits with the CPU's vector instructions: AVX-512 or AVX2, Intel or AMD, another
BLAS. nbval compares every saved line, so such a figure may only appear masked: printed by
``rounding()`` as ``~3e-07``, which ``notebooks/nbval_sanitize.cfg`` blanks, beside the bound the
cell asserts (``(below 1e-6)``), which every CPU meets.

A figure below ``LEVEL`` is treated so: float32 rounds at 1e-7, float16 and bfloat16 at 1e-3 to
1e-2, and an effect of Adam's ``eps`` sits between them. A figure printed in fixed form as all zeros
(``0.0000``) hides which of these it is, and may print as ``-0.0000`` elsewhere: print an exact
zero as ``0``.

After the sanitize rules are applied to a saved output, any figure below ``LEVEL`` still shown
fails, unless it is a bound written by hand: a power of ten (``1e-6``, not Python's ``1e-06``)
right after a word that makes it one (``below``, ``at most``, ``rtol`` ...), or one with a one-digit
exponent anywhere (``1e-8 in float16``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_lib.lessons.notebook_setup import rounding

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
SANITIZE_CFG = ROOT / "notebooks" / "nbval_sanitize.cfg"
LEVEL = 1e-3  # rounding level for the 16-bit floats (float16 eps 9.8e-4), and float32's below
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[eE]([-+]?\d+)(?![\w.])")
TINY_DECIMAL = re.compile(r"(?<![\w.])0\.0{5,}[1-9]\d*")  # 0.0000003: the same, unscientific
FIXED_ZERO = re.compile(r"(?<![\w.])-?0\.0{3,}(?![\d])")  # 0.0000: a figure rounded away
BOUND_WORD = re.compile(r"(below|under|above|at most|at least|within|than|rtol|atol|"
                        r"tolerance|equal to|<=|>=|<|>)[ =]*$")


def sanitize_rules(path: Path = SANITIZE_CFG) -> list[tuple[re.Pattern, str]]:
    """The (regex, replace) pairs of an nbval sanitize file, in order."""
    rules, pattern = [], None
    for line in path.read_text().splitlines():
        if line.startswith("regex: "):
            pattern = re.compile(line[len("regex: "):])
        elif line.startswith("replace: ") and pattern is not None:
            rules.append((pattern, line[len("replace: "):]))
            pattern = None
    return rules


def sanitized(text: str, rules) -> str:
    for pattern, replace in rules:
        text = pattern.sub(replace, text)
    return text


def is_written_bound(line: str, match: re.Match) -> bool:
    """A power of ten written by hand: Python's format pads the exponent (1e-06), a literal in
    the text does not (1e-6); 1e-12 looks the same either way, so it needs a bound word."""
    mantissa, exponent = match.group(1), match.group(2).lstrip("+-")
    if mantissa != "1" or (len(exponent) > 1 and exponent.startswith("0")):
        return False
    return len(exponent) == 1 or BOUND_WORD.search(line[:match.start()].rstrip(" (")) is not None


def unmasked_figures(text: str, rules) -> list[str]:
    """Figures below LEVEL that a sanitized ``text`` still shows (bounds written by hand pass)."""
    found = []
    for line in sanitized(text, rules).splitlines():
        for match in FIGURE.finditer(line):
            value = float(match.group(0))
            if 0 < value < LEVEL and not is_written_bound(line, match):
                found.append(f"{match.group(0)} in: {line.strip()}")
        found += [f"{m.group(0)} in: {line.strip()}" for pattern in (TINY_DECIMAL, FIXED_ZERO)
                  for m in pattern.finditer(line)]
    return found


def output_text(output: dict) -> str:
    text = output.get("text", output.get("data", {}).get("text/plain", ""))
    return "".join(text) if isinstance(text, list) else text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_saved_output_shows_an_unmasked_rounding_level_figure(path):
    rules = sanitize_rules()
    notebook = json.loads(path.read_text())
    found = [f"cell {index}: {figure}"
             for index, cell in enumerate(notebook["cells"]) if cell["cell_type"] == "code"
             for output in cell.get("outputs", [])
             for figure in unmasked_figures(output_text(output), rules)]
    assert not found, (f"{path.name} prints figures whose digits change with the CPU; print "
                       "them with rounding() beside the bound the cell asserts:\n"
                       + "\n".join(found))


@pytest.mark.parametrize("line", [
    "relative error 3e-07 (at most 1e-6)",      # a measured figure, unmasked
    "max difference 1e-07 (below 1e-5)",        # Python's format: a measured figure
    "scaled first: 9.997e-09",
    "differ by 0.0000003",
    "at most 2e-07 (rtol 1e-5)",
    "error 1e-12 after 8 steps",                               # no bound word: measured
    "Adam     parameters off by  1.4e-04: hidden",             # eps-level, no bound beside it
    "float16 relative error 2e-04 (below 1e-3)",               # float16 rounding, unmasked
    "largest gap after step 1: 0.0000",                        # rounded away, fixed form
])
def test_a_rounding_level_figure_is_caught(line):
    assert len(unmasked_figures(line, sanitize_rules())) == 1


@pytest.mark.parametrize("line", [
    f"relative error {rounding(3.2e-7)} (at most 1e-6)",
    f"max difference to 1 process {rounding(0.0)} (below 1e-5)",
    f"best error {rounding(9.0e-13)} (below 1e-9: about ten digits)",
    "checked: float64: equal to 1e-12",
    "checked: float64: equal within 1e-12 (rtol and atol)",
    "parameters == big batch (rtol=1e-5, atol=1e-5)",
    "bfloat16 relative error 2.6e-03 (below 2^-7 = 7.8e-03)",  # far above rounding level
    "largest difference to DDP 0.0e+00",                       # exactly zero: any CPU
    "[time] step 3e-07 s",
    "1e-8 in float16: 0.0",                                    # a literal, not a figure
    "largest gap after steps 1, 4, 8: 0, 0, 0",                # an exact zero, as 0
    f"Adam     parameters off by {rounding(1.4e-4)} (below 1e-3): hidden",
])
def test_masked_figures_bounds_and_large_figures_pass(line):
    assert unmasked_figures(line, sanitize_rules()) == []


def test_the_sanitize_rule_masks_what_rounding_prints_and_nothing_else():
    rules = sanitize_rules()
    for value in (3.2e-7, 1e-12, 0.0, 6e-8):
        assert sanitized(f"error {rounding(value)} (below 1e-6)", rules) == \
            "error ~ROUNDING (below 1e-6)"
    assert sanitized("about ~0.5 of the step", rules) == "about ~0.5 of the step"
    assert sanitized("error 3e-07", rules) == "error 3e-07"
    assert rounding(0.0) == "~0" and rounding(2.6e-7) == "~3e-07"
