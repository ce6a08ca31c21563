"""Show the code a notebook teaches, read from its source file, so that what the notebook shows
is exactly what runs (notebooks 03 to 10).

    from course_lib.lessons.show import show, show_diff, show_file
    show(ring_reduce_scatter)                      # highlighted, with its file and line
    show_diff(ring_reduce_scatter, fast_version)   # what one version changes in the other
    show_file("course_lib/demos/ddp_minimal.py")   # a whole file
"""

from __future__ import annotations

import difflib
import inspect
from pathlib import Path

from IPython.display import Markdown, display

ROOT = Path(__file__).resolve().parents[2]  # the repository: paths are shown from here


def where(obj) -> str:
    """``course_lib/core/collectives.py, line 12``: where ``obj`` is defined."""
    obj = inspect.unwrap(obj)  # a decorated function (@torch.no_grad()): its own file
    path = Path(inspect.getsourcefile(obj)).resolve()
    line = inspect.getsourcelines(obj)[1]
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return f"{shown}, line {line}"


def code_block(text: str, language: str = "python") -> Markdown:
    """``text`` as a highlighted block (JupyterLab highlights fenced code in Markdown)."""
    return Markdown(f"```{language}\n{text.rstrip()}\n```")


def show(*objects) -> None:
    """Display the source of each function, class or module, highlighted."""
    for obj in objects:
        display(code_block(f"# {where(obj)}\n{inspect.getsource(obj)}"))


def show_diff(old, new) -> None:
    """Display what changes from the source of ``old`` to that of ``new`` (a unified diff)."""
    lines = difflib.unified_diff(inspect.getsource(old).splitlines(),
                                 inspect.getsource(new).splitlines(),
                                 fromfile=where(old), tofile=where(new), lineterm="", n=2)
    display(code_block("\n".join(lines), "diff"))


def show_file(path: str) -> None:
    """Display a whole file of the repository (``path`` relative to its root)."""
    text = (ROOT / path).read_text()
    display(code_block(f"# {path}\n{text}"))
