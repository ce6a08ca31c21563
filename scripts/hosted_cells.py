"""Every notebook's way onto Colab and Kaggle, the same in all of them.

    python scripts/hosted_cells.py --check    list the notebooks that are not current (exit 1)
    python scripts/hosted_cells.py --write    make them current

Both parts are made from the repository address in pyproject.toml ([project.urls]) by
course_lib/runtime/hosted.py:
- the title cell's line of links, right under the title: "[Open in Colab](...) · [Open in
  Kaggle](...)", each opening the notebook's student copy;
- the first code cell, which on Colab or Kaggle clones the course and runs hosted.py, and
  anywhere else does nothing. Re-execute the notebooks after --write changed them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib.runtime.hosted import open_links, repository, setup_cell  # noqa: E402

LINKS_START = "[Open in Colab]("
SETUP_START = "# Colab or Kaggle only:"
SETUP_ID = "hosted-setup"


def source_lines(text: str) -> list[str]:
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + [lines[-1]]


def with_links(title: str, links: str) -> str:
    """The title cell with ``links`` as a paragraph of its own (replacing an older line): right
    under the title, or under the quoted line a deeper dive opens with."""
    lines = title.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith(LINKS_START)), None)
    if at is not None:
        del lines[at - 1:at + 1]  # the links and the empty line before them
    at = 1
    while at + 1 < len(lines) and lines[at] == "" and lines[at + 1].startswith(">"):
        at += 1
        while at < len(lines) and lines[at].startswith(">"):  # a deeper dive's marker
            at += 1
    return "\n".join([*lines[:at], "", links, *lines[at:]])


def current(notebook: dict, name: str, repo: str) -> dict:
    """``notebook`` with its links and its setup cell as they should be."""
    cells = [c for c in notebook["cells"]
             if not (c["cell_type"] == "code" and "".join(c["source"]).startswith(SETUP_START))]
    title = cells[0]
    title["source"] = source_lines(with_links("".join(title["source"]), open_links(repo, name)))
    first_code = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    old = next((c for c in notebook["cells"] if c.get("id") == SETUP_ID), {})
    cell = {"cell_type": "code", "execution_count": old.get("execution_count"),  # as run
            "id": SETUP_ID, "metadata": old.get("metadata", {}),
            "outputs": old.get("outputs", []), "source": source_lines(setup_cell(repo))}
    cells.insert(first_code, cell)
    return {**notebook, "cells": cells}


def text(notebook: dict) -> str:
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true")
    action.add_argument("--write", action="store_true")
    options = parser.parse_args()
    repo, stale = repository(ROOT), []
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")):
        before = path.read_text()
        after = text(current(json.loads(before), path.name, repo))
        if after != before:
            stale.append(path.relative_to(ROOT))
            if options.write:
                path.write_text(after)
    verb = "updated" if options.write else "not current (python scripts/hosted_cells.py --write)"
    for path in stale:
        print(f"{path}: {verb}")
    return 1 if stale and options.check else 0


if __name__ == "__main__":
    sys.exit(main())
