"""Lay out the website's source: the student copies of the notebooks, the READMEs, the config.

    python site/stage.py SRC      (scripts/build_site.sh runs it with the course's Python)

Writes into SRC, touching only files whose bytes change (so that Sphinx re-reads only those):

- ``README.md``, the front page, and ``course_lib/README.md``, ``course_lib/runtime/README.md``,
  which it links to; a link to a file that is not a page of the site (the instructors' guide,
  ``notebooks/README.md``, which shows how solutions are marked) goes to the file in the
  repository, ``$SITE_REPOSITORY_URL``, or, when that is not set, becomes plain text;
- ``notebooks/NN_*.ipynb``: each notebook's student copy (``make_student_copy``: no solution,
  no solution marker, the exercises open as a learner meets them) with its saved outputs;
  the copy's note for a learner at their own copy becomes one for a reader of the website;
  widget state that no saved widget shows is dropped (a page without widgets then loads no
  widget code); and a link to a heading written JupyterLab's way (``#4.-What-a-message``)
  is rewritten to the heading's anchor on the website;
- ``_toc.yml``: the front page, then the notebooks in course order (their names' order);
- the Jupyter Book configuration and its local extension, from this folder.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import sys
from pathlib import Path

import nbformat

from course_lib.check.student_copy import NOTE, MalformedNotebook, make_student_copy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PAGES = ["README.md", "course_lib/README.md", "course_lib/runtime/README.md"]
CONFIG = ["_config.yml", "course_site.py", "_static/course.css", "_static/mathjax2_api.js"]
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SITE_NOTE = (
    "> **On this page** the notebook is shown as a learner meets it, with the outputs it "
    "printed when it was run and its exercises left open: in each, the line "
    '`raise NotImplementedError("Exercise N.M: replace this line with your code")` is where '
    "your code goes. To run it and do the exercises, get the course and run "
    "`scripts/start.sh --student` (see the front page).")
ANCHOR = re.compile(r"\]\(([^)#\s]*\.ipynb|)#([^)\s]+)\)")
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s:#]+)(#[^)\s]*)?\)")  # [text](relative/path#anchor)


def notebooks() -> list[Path]:
    """The course's notebooks in course order (00, 01, ..., 06, 06b, 07, ...)."""
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def write(path: Path, data: str) -> None:
    """Write ``data`` unless the file already holds it (an unchanged page is not rebuilt)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != data:
        path.write_text(data, encoding="utf-8")


def slug(heading: str) -> str:
    """The anchor MyST gives a heading (``myst_heading_anchors``), as GitHub does."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace(" ", "-"))


def headings(nb) -> dict[str, str]:
    """JupyterLab's anchor of each heading of ``nb`` (spaces become dashes) -> MyST's."""
    found = {}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for title in re.findall(r"^#{1,6}\s+(.+?)\s*$", cell.source, flags=re.M):
                found[title.replace(" ", "-")] = slug(title)
    return found


def fix_anchors(text: str, own: dict[str, str], others: dict[str, dict[str, str]]) -> str:
    """Rewrite links to a course notebook's heading written JupyterLab's way."""
    def replace(match: re.Match) -> str:
        target, anchor = match.groups()
        anchors = others.get(target, {}) if target else own
        return f"]({target}#{anchors.get(anchor, anchor)})"
    return ANCHOR.sub(replace, text)


def fix_links(text: str, page: str, on_site: set[str]) -> str:
    """A link to a file that is not a page of the site goes to the repository's copy (or,
    with no repository known, leaves its text only)."""
    repository = os.environ.get("SITE_REPOSITORY_URL", "").rstrip("/")

    def replace(match: re.Match) -> str:
        label, target, anchor = match.group(1), match.group(2), match.group(3) or ""
        path = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
        if path in on_site or path.startswith("../"):
            return match.group(0)
        return f"[{label}]({repository}/blob/HEAD/{path}{anchor})" if repository else label
    return LINK.sub(replace, text)


def shown_widgets(nb) -> dict:
    """The notebook's widget state, cut to the models its saved widget views need."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    todo = [out.data[WIDGET_VIEW]["model_id"] for cell in nb.cells
            for out in cell.get("outputs", []) if WIDGET_VIEW in out.get("data", {})]
    needed = set()
    while todo:
        model = todo.pop()
        if model in state and model not in needed:
            needed.add(model)
            todo += re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state[model]))
    return {key: value for key, value in state.items() if key in needed}


def student_page(path: Path, anchors: dict[str, dict[str, str]], on_site: set[str]) -> str:
    copy = make_student_copy(nbformat.read(path, as_version=4), str(path)).notebook
    for cell in copy.cells:
        if cell.cell_type == "markdown":
            cell.source = SITE_NOTE if cell.source == NOTE else fix_links(
                fix_anchors(cell.source, anchors[path.name], anchors),
                f"notebooks/{path.name}", on_site)
    state = shown_widgets(copy)
    widgets = copy.metadata.pop("widgets", {})
    if state:
        copy.metadata["widgets"] = {WIDGET_STATE: {**widgets[WIDGET_STATE], "state": state}}
    return nbformat.writes(copy) + "\n"


def toc(names: list[str]) -> str:
    chapters = "".join(f"      - file: notebooks/{name}\n" for name in names)
    return ("# Written by site/stage.py: the notebooks in course order.\n"
            "format: jb-book\nroot: README\nparts:\n"
            "  - caption: The course\n    chapters:\n" + chapters +
            "  - caption: The library\n    chapters:\n      - file: course_lib/README\n"
            "        sections:\n          - file: course_lib/runtime/README\n")


def stage(src: Path) -> list[str]:
    paths = notebooks()
    anchors = {p.name: headings(nbformat.read(p, as_version=4)) for p in paths}
    on_site = {f"notebooks/{p.name}" for p in paths} | set(PAGES)
    for path in paths:
        write(src / "notebooks" / path.name, student_page(path, anchors, on_site))
    for page in PAGES:
        write(src / page, fix_links((ROOT / page).read_text(encoding="utf-8"), page, on_site))
    for name in CONFIG:
        write(src / name, (HERE / name).read_text(encoding="utf-8"))
    write(src / "_toc.yml", toc([p.stem for p in paths]))
    keep = on_site | set(CONFIG) | {"_toc.yml"}
    for old in [p for p in src.rglob("*") if p.is_file()]:
        if old.relative_to(src).as_posix() not in keep:  # a page since removed from the course
            old.unlink()
    for folder in sorted((p for p in src.rglob("*") if p.is_dir()), reverse=True):
        if not any(folder.iterdir()):
            shutil.rmtree(folder)
    return [p.stem for p in paths]


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):  # --help is not a folder to fill
        sys.exit("usage: python site/stage.py SRC (the folder to lay the site's source out in)")
    try:
        names = stage(Path(sys.argv[1]))
    except MalformedNotebook as error:
        sys.exit(f"error: {error}")
    print(f"[site] {len(names)} notebooks (student copies) and {len(PAGES)} pages laid out in "
          f"{sys.argv[1]}")
