"""Show the code a notebook teaches, read from its source file, so that what the notebook shows
is exactly what runs (notebooks 03 to 10).

    from course_lib.lessons.show import show, show_diff, show_file
    show(ring_reduce_scatter)                      # highlighted, with its file and line
    show_diff(ring_reduce_scatter, fast_version)   # what one version changes in the other
    show_file("course_lib/demos/ddp_minimal.py")   # a whole file
    show(ring_all_reduce, exercise="6.3")          # the code an exercise asks a learner for

With ``exercise="N.M"`` the code is the answer of that exercise: in a student copy it shows as
its signature and docstring only, until the learner passes the exercise or asks for it with
``check.reveal("N.M")`` (``runtime/workspace.py``, ``is_unlocked``). Elsewhere it shows in full.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from IPython.display import Markdown

from course_lib.runtime.workspace import is_unlocked

ROOT = Path(__file__).resolve().parents[2]  # the repository: paths are shown from here


def where(obj) -> str:
    """``course_lib/core/collectives.py, line 12``: where ``obj`` is defined."""
    obj = inspect.unwrap(obj)  # a decorated function (@torch.no_grad()): its own file
    path = Path(inspect.getsourcefile(obj)).resolve()
    line = inspect.getsourcelines(obj)[1]
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return f"{shown}, line {line}"


def display(obj) -> None:
    """IPython's ``display``, imported when first used (launched ranks import this module and
    never show anything)."""
    from IPython.display import display as ipython_display

    ipython_display(obj)


def code_block(text: str, language: str = "python") -> Markdown:
    """``text`` as a highlighted block (JupyterLab highlights fenced code in Markdown)."""
    from IPython.display import Markdown  # here: see display()

    return Markdown(f"```{language}\n{text.rstrip()}\n```")


def show(*objects, exercise: str | None = None) -> None:
    """Display the source of each function, class or module, highlighted; the outline only
    while exercise ``exercise`` is locked (see the module docstring)."""
    hidden = exercise is not None and not is_unlocked(exercise)
    for obj in objects:
        source = outline(inspect.getsource(obj), exercise) if hidden else inspect.getsource(obj)
        display(code_block(f"# {where(obj)}\n{source}"))


def outline(source: str, exercise: str) -> str:
    """``source`` with every function body cut to its docstring and one line that says why:
    what a learner may see before writing the exercise themselves."""
    text = textwrap.dedent(source)
    lines = text.split("\n")
    cuts = []  # (first line of a body, last line, indentation), 0-based
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            has_doc = isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(
                body[0].value.value, str)
            start = body[1].lineno - 1 if has_doc and len(body) > 1 else body[0].lineno - 1
            if has_doc and len(body) == 1:
                continue
            indent = lines[body[0].lineno - 1][: len(lines[body[0].lineno - 1]) -
                                               len(lines[body[0].lineno - 1].lstrip())]
            cuts.append((start, node.end_lineno - 1, indent))
    for start, end, indent in sorted(cuts, reverse=True):
        if any(s < start and end <= e for s, e, _ in cuts if (s, e) != (start, end)):
            continue  # inside a body that is cut already
        lines[start: end + 1] = [f"{indent}...  # the body is exercise {exercise}: it shows "
                                 f'here once you pass, or after check.reveal("{exercise}")']
    return "\n".join(lines)


def show_diff(old, new) -> None:
    """Display what changes from the source of ``old`` to that of ``new`` (a unified diff)."""
    lines = difflib.unified_diff(inspect.getsource(old).splitlines(),
                                 inspect.getsource(new).splitlines(),
                                 fromfile=where(old), tofile=where(new), lineterm="", n=2)
    display(code_block("\n".join(lines), "diff"))


def show_file(path: str, exercise: str | None = None) -> None:
    """Display a whole file of the repository (``path`` relative to its root); with
    ``exercise``, its outline while that exercise is locked."""
    text = (ROOT / path).read_text()
    if exercise is not None and not is_unlocked(exercise):
        text = outline(text, exercise)
    display(code_block(f"# {path}\n{text}"))
