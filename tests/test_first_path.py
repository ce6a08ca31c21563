"""The first path through the course, read from the course's own text (nothing is run).

- **Markers.** Every deeper dive says so where it starts, with one line: the first line of a
  whole notebook's title cell, or of a section's heading cell, is
  ``> **Deeper dive** · skip it on a first pass; <what it adds, or when to come back>.``
- **Course maps.** The maps of README.md and notebook 00 list every notebook, linked to its
  file, with its path (first pass, deeper dive, or both), and the markers agree with them.
- **The guide's minutes.** In notebooks/README.md, the first pass takes at most 8 hours alone;
  no self-paced figure is below its two estimates (teach-in plus a quarter, and a count of the
  notebook's content); every slot of the agendas lasts what its notebooks' teach-in minutes add
  up to, and the two days together teach every part of the course once.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = {p.name.split("_")[0]: p for p in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]*_*.ipynb"))}
GUIDE = NOTEBOOK_DIR / "README.md"

MARKER = "> **Deeper dive** · skip it on a first pass; "
MARKER_TEXT = re.compile(r"> \*\*Deeper dive\*\* · skip it on a first pass; \S[^\n]*\.", re.S)
FIRST_PASS_BUDGET_MIN = 8 * 60  # the first pass, alone

# The course's split (its design): whole notebooks that are deeper dives, and the notebooks
# split in two, with the section titles (a phrase of each heading) on either side.
DEEPER_NOTEBOOKS = {"06b", "08", "10", "10b", "11"}
SPLIT_SECTIONS = {
    "03": {"first pass": ["The manual loop", "Forgetting the scale", "Variable-length sequences",
                          "What accumulation costs"],
           "deeper dive": ["An uneven last micro-batch", "BatchNorm is not equivalent",
                           "Dropout's random masks", "Clip only after the last micro-step",
                           "The scheduler steps once per optimizer step",
                           "Accumulate in float32", "Mixed precision"]},
    "09": {"first pass": ["What DDP does", "no_sync", "DistributedSampler", "checkpoint"],
           "deeper dive": ["SyncBatchNorm", "Several machines", "NCCL", "hang", "Windows"]},
}

# The content count of a notebook, in minutes (the guide states the same rates).
WORDS_A_MINUTE = 130  # markdown, read carefully
CODE_LINES_A_MINUTE = 20  # code cells, read and run
SHORT_EXERCISE_MIN = 5
FILE_EXERCISE_MIN = 20  # a %%writefile exercise; a room gives it 15-25 minutes
SELF_PACED_FACTOR = 1.25  # alone: teach-in minutes plus a quarter


def kind_of(stem: str) -> str:
    if stem in DEEPER_NOTEBOOKS:
        return "deeper dive"
    return "split" if stem in SPLIT_SECTIONS else "first pass"


def cells(stem: str) -> list[dict]:
    return json.loads(NOTEBOOKS[stem].read_text())["cells"]


def headings(stem: str) -> list[tuple[int, str, str]]:
    """(level, title, first non-blank line after it in its cell) for every markdown heading."""
    found = []
    for cell in cells(stem):
        if cell["cell_type"] != "markdown":
            continue
        lines = "".join(cell["source"]).split("\n")
        in_code = False
        for i, line in enumerate(lines):
            in_code ^= line.startswith("```")
            heading = None if in_code else re.match(r"(#{1,6})\s+(.*)", line)
            if heading:
                after = next((rest for rest in lines[i + 1:] if rest.strip()), "")
                found.append((len(heading.group(1)), heading.group(2).strip(), after))
    return found


def marked(after: str) -> bool:
    return after.startswith(MARKER)


# --- markers ----------------------------------------------------------------------------------


def test_every_notebook_of_the_course_split_exists():
    assert DEEPER_NOTEBOOKS | set(SPLIT_SECTIONS) <= set(NOTEBOOKS)


@pytest.mark.parametrize("stem", sorted(NOTEBOOKS))
def test_a_notebook_title_carries_the_marker_exactly_when_it_is_a_deeper_dive(stem):
    level, title, after = headings(stem)[0]
    assert level == 1, f"{stem}: the first heading is not the notebook's title"
    if kind_of(stem) == "deeper dive":
        assert marked(after), (f"{stem} is a deeper dive: its title cell's first line must be "
                               f"'{MARKER}<what it adds>.'; it is {after!r}")
    else:
        assert not marked(after), f"{stem} is on the first pass, but its title says deeper dive"


def marker_paragraphs(stem: str) -> list[str]:
    """Each marker with the lines that continue it (a long clause wraps), joined with spaces."""
    found = []
    for cell in cells(stem):
        if cell["cell_type"] == "markdown":
            for paragraph in re.split(r"\n\s*\n", "".join(cell["source"])):
                lines = paragraph.split("\n")
                for start, line in enumerate(lines):
                    if line.startswith("> **Deeper dive**"):
                        rest = [more.lstrip("> ") for more in lines[start + 1:]]
                        found.append(" ".join([line, *rest]).strip())
    return found


@pytest.mark.parametrize("stem", sorted(NOTEBOOKS))
def test_every_marker_is_well_formed_and_opens_a_heading(stem):
    at_headings = sum(marked(after) for _, _, after in headings(stem))
    anywhere = marker_paragraphs(stem)
    wrong = [text for text in anywhere if not MARKER_TEXT.fullmatch(text)]
    assert not wrong, f"{stem}: a marker must read '{MARKER}<one short clause>.': {wrong}"
    assert len(anywhere) == at_headings, f"{stem}: a marker that does not open a section"


@pytest.mark.parametrize("stem", sorted(NOTEBOOKS))
def test_only_split_notebooks_have_deeper_dive_sections(stem):
    sections = [title for level, title, after in headings(stem) if level > 1 and marked(after)]
    if kind_of(stem) == "split":
        assert sections, f"{stem}: its deeper-dive sections carry no marker"
    else:
        assert not sections, f"{stem} is not split, yet these sections are marked: {sections}"


@pytest.mark.parametrize("stem,path,phrase", [
    (stem, path, phrase) for stem, sides in SPLIT_SECTIONS.items()
    for path, phrases in sides.items() for phrase in phrases])
def test_split_notebooks_mark_their_deeper_dive_sections(stem, path, phrase):
    found = [(title, after) for level, title, after in headings(stem)
             if level > 1 and phrase.lower() in title.lower()]
    assert found, f"{stem}: no section heading contains {phrase!r} (renamed? update this test)"
    for title, after in found:
        if path == "deeper dive":
            assert marked(after), f"{stem}, '{title}': its first line must be '{MARKER}...'"
        else:
            assert not marked(after), f"{stem}, '{title}' is on the first pass, yet marked"


# --- course maps ------------------------------------------------------------------------------


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of the markdown tables in ``text`` (headers included)."""
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in text.splitlines()
            if line.lstrip().startswith("|") and not re.match(r"\s*\|[-| :]+\|\s*$", line)]


def section(text: str, heading: str) -> str:
    """From the heading line that starts with ``heading`` to the next heading of its level."""
    start = text.index("\n" + heading) + 1
    level = heading.split(" ")[0]
    end = text.find("\n" + level + " ", start + len(heading))
    return text[start:end if end > 0 else len(text)]


def course_maps() -> dict[str, tuple[str, str]]:
    readme = section((ROOT / "README.md").read_text(), "## Course map")
    in_00 = next("".join(c["source"]) for c in cells("00")
                 if c["cell_type"] == "markdown" and "The course map" in "".join(c["source"]))
    return {"README.md": (readme, "notebooks/"), "notebook 00": (in_00, "")}


@pytest.mark.parametrize("where", ["README.md", "notebook 00"])
def test_course_map_lists_every_notebook_linked_with_its_path(where):
    text, prefix = course_maps()[where]
    header, *rows = [row for row in table_rows(text) if row[0] == "#" or row[0] in NOTEBOOKS]
    assert header[0] == "#" and "path" in header, f"{where}: the map has no 'path' column"
    by_stem = {row[0]: row for row in rows}
    assert sorted(by_stem) == sorted(NOTEBOOKS), f"{where}: the map lists {sorted(by_stem)}"
    for stem, row in by_stem.items():
        link = f"]({prefix}{NOTEBOOKS[stem].name})"
        assert any(link in cell for cell in row), f"{where}: {stem} is not linked to its file"
        path = row[header.index("path")]
        if kind_of(stem) == "split":
            assert path.startswith("first pass; deeper dive: "), f"{where}, {stem}: {path!r}"
        else:
            assert path == kind_of(stem), f"{where}, {stem}: path {path!r}"


# --- the instructor guide's minutes -------------------------------------------------------------


PARTS = ("first pass", "deeper dive")


def minutes(cell: str) -> int | None:
    if cell == "—":
        return None
    value = re.fullmatch(r"(\d+) min", cell)
    assert value, f"guide: {cell!r} is neither 'N min' nor '—'"
    return int(value.group(1))


def time_table() -> tuple[dict[str, dict[str, int | None]], list[str]]:
    """Notebook -> {"teach in: first pass": minutes, ...}, and the table's 'all' row."""
    rows = table_rows(section(GUIDE.read_text(), "### Time per notebook"))
    header = next(row for row in rows if "teach in: first pass" in row)
    table, total = {}, None
    for row in rows[rows.index(header) + 1:]:
        if row[0] == "all":
            total = row
            continue
        stem = row[0].split(" ")[0]
        table[stem] = {name: minutes(row[header.index(name)]) for name in header[2:]}
    return table, [header, total]


def content_minutes(stem: str) -> float:
    """Reading, running and the exercises of a whole notebook, at the rates above."""
    words = code = 0
    exercises: dict[str, bool] = {}  # exercise id -> written in a %%writefile cell
    current = None
    for cell in cells(stem):
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            words += len(re.sub(r"```.*?```", " ", text, flags=re.S).split())
            for exercise in re.findall(r"\*\*Exercise (\d+b?\.\d+)", text):
                current = exercise
                exercises[current] = False
        else:
            code += sum(1 for line in text.splitlines() if line.strip())
            if current and text.startswith("%%writefile"):
                exercises[current] = True
    files = sum(exercises.values())
    return (words / WORDS_A_MINUTE + code / CODE_LINES_A_MINUTE
            + SHORT_EXERCISE_MIN * (len(exercises) - files) + FILE_EXERCISE_MIN * files)


def test_the_guide_prices_every_notebook_on_its_paths():
    table, _ = time_table()
    assert sorted(table) == sorted(NOTEBOOKS)
    for stem, row in table.items():
        for what in ("teach in", "self-paced"):
            has = tuple(row[f"{what}: {part}"] is not None for part in PARTS)
            want = {"first pass": (True, False), "deeper dive": (False, True),
                    "split": (True, True)}[kind_of(stem)]
            assert has == want, f"guide, {stem}: {what} given for {has}, the path is {want}"


def test_the_first_pass_takes_at_most_eight_hours_alone():
    table, (header, total) = time_table()
    first_pass = sum(row["self-paced: first pass"] or 0 for row in table.values())
    assert first_pass <= FIRST_PASS_BUDGET_MIN, f"the first pass takes {first_pass} min alone"
    for name in header[2:]:
        column = sum(row[name] or 0 for row in table.values())
        assert total[header.index(name)] == f"{column} min", f"guide: the 'all' row of {name}"


@pytest.mark.parametrize("stem", sorted(NOTEBOOKS))
def test_self_paced_minutes_are_no_less_than_either_estimate(stem):
    row = time_table()[0][stem]
    for part in PARTS:
        teach, alone = row[f"teach in: {part}"], row[f"self-paced: {part}"]
        if teach is not None:
            floor = 5 * math.ceil(SELF_PACED_FACTOR * teach / 5)
            assert alone >= floor, f"{stem}, {part}: {alone} min alone, below {floor}"
    content = content_minutes(stem)
    alone = sum(row[f"self-paced: {part}"] or 0 for part in PARTS)
    assert alone >= content, f"{stem}: {alone} min alone, its content counts {content:.0f}"


def test_the_guide_states_the_rates_this_test_uses():
    text = " ".join(section(GUIDE.read_text(), "### Time per notebook").split())
    for stated in (f"{WORDS_A_MINUTE} words a minute", f"{CODE_LINES_A_MINUTE} lines a minute",
                   f"{SHORT_EXERCISE_MIN} minutes for each short exercise",
                   f"{FILE_EXERCISE_MIN} for each file exercise", "plus a quarter"):
        assert stated in text, f"guide: the rates changed? {stated!r} is not said"


def agendas(heading: str) -> list[list[list[str]]]:
    """The agenda tables (time | notebook | what to do | exercises) under ``heading``."""
    tables, current = [], None
    for row in table_rows(section(GUIDE.read_text(), heading)):
        if row[:2] == ["time", "notebook"]:
            current = []
            tables.append(current)
        elif current is not None:
            current.append(row)
    assert tables, f"guide: no agenda table under {heading!r}"
    return tables


def clock(text: str) -> int:
    hours, mins = text.split(":")
    return 60 * int(hours) + int(mins)


def slot_parts(notebook_cell: str) -> list[tuple[str, str | None]]:
    """``03 (first pass)`` -> [("03", "first pass")]; ``06b`` -> [("06b", None)]."""
    return re.findall(r"\b(\d\db?)\b(?:\s*\((first pass|deeper dive)\))?", notebook_cell)


def check_slots(table: list[list[str]], prices) -> list[tuple[str, str]]:
    """Assert every slot lasts its price; the parts the table teaches."""
    taught = []
    assert table[-1][1] == "end", "an agenda ends with an 'end' row"
    for row, after in zip(table[:-1], table[1:], strict=True):
        length = clock(after[0]) - clock(row[0])
        assert length > 0, f"agenda: {row[0]} to {after[0]}"
        if row[1] in ("break", "lunch"):
            continue
        parts = slot_parts(row[1])
        assert parts, f"agenda {row[0]}: no notebook in {row[1]!r}"
        price = 0
        for stem, part in parts:
            for one in ([part] if part else [p for p in PARTS if prices[stem][p] is not None]):
                assert prices[stem][one] is not None, f"agenda {row[0]}: {stem} has no {one}"
                price += prices[stem][one]
                taught.append((stem, one))
        assert length == price, (f"agenda {row[0]} ({row[1]}): {length} min for what the guide "
                                 f"prices at {price} min")
    return taught


def teach_prices() -> dict[str, dict[str, int | None]]:
    return {stem: {part: row[f"teach in: {part}"] for part in PARTS}
            for stem, row in time_table()[0].items()}


def test_the_three_hour_workshop_fits_its_minutes():
    (table,) = agendas("### A 3-hour workshop")
    check_slots(table, teach_prices())
    assert clock(table[-1][0]) - clock(table[0][0]) == 180


def test_the_two_days_fit_their_minutes_and_teach_every_part_once():
    prices = teach_prices()
    day1, day2 = agendas("### A two-day workshop")
    first, second = check_slots(day1, prices), check_slots(day2, prices)
    every = sorted((stem, part) for stem, row in prices.items() for part in PARTS
                   if row[part] is not None)
    assert sorted(first + second) == every, "the two days teach each part exactly once"
    assert all(part == "first pass" for _, part in first), "day 1 is the first pass"
