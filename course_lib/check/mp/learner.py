"""The learner's file: checked before a launch, imported inside one, its errors described.

Kernel side: ``find_learner_file`` fails early, with what to change, on a missing file, a
syntax error or a missing function. Worker side: ``load_learner`` imports the file by path
(its ``if __name__ == "__main__":`` block does not run) and ``describe_error`` turns an
exception into a small dict that keeps only the learner's own line.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import traceback
from dataclasses import dataclass
from types import ModuleType

from course_lib.check.checker import ExerciseError
from course_lib.runtime.workspace import load_file

# Errors a rank gets because a PEER stopped: the culprit is elsewhere.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
             "Socket closed", "pair closure", "remote worker crash")
TIMED_OUT = ("Timed out waiting", "timed out")
# the line a student copy holds in place of a solution (course_lib/check/student_copy.py)
MARKED_LINE = re.compile(r'raise NotImplementedError\(\s*"Exercise \d+\.\d+: replace this line')


class CaseFinding(Exception):
    """Raised by a case when the learner's code left what the case cannot go on with (a
    gradient of the wrong shape, say); its message says what, and is the checker's verdict."""


@dataclass(frozen=True)
class LearnerFile:
    """A checked file: the path as the learner wrote it, and the functions it must define."""

    path: str
    functions: tuple[str, ...]


def top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def find_learner_file(path: str, functions: tuple[str, ...]) -> LearnerFile:
    """The file at ``path``, after making sure it exists, parses and defines ``functions``."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ExerciseError(f"there is no file {path} yet: run the cell that starts with "
                            f"%%writefile {path} first (it saves the cell as that file)")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as e:
        shown = (e.text or "").rstrip()
        raise ExerciseError(f"{path} line {e.lineno}: SyntaxError: {e.msg}"
                            + (f"\n    {shown.strip()}" if shown else "")) from None
    missing = [name for name in functions if name not in top_level_names(tree)]
    if missing:
        name = missing[0]
        kind, write = ("class", f"class {name}:") if name[0].isupper() else (
            "function", f"def {name}(...):")
        raise ExerciseError(f"{path} defines no {kind} {name}: write `{write}` at the top "
                            "level of the file (not inside another function or the __main__ "
                            "block)")
    if still_open(tree, text, functions):  # "not done yet" at once, without a launch
        raise NotImplementedError(f"{path} still holds its exercise's marked line")
    return LearnerFile(path, tuple(functions))


def still_open(tree: ast.Module, text: str, functions: tuple[str, ...]) -> bool:
    """Whether the marked line of a student copy is still in one of ``functions`` (in the
    whole file when none is named)."""
    if not functions:
        return bool(MARKED_LINE.search(text))
    return any(MARKED_LINE.search(ast.get_source_segment(text, node) or "")
               for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in functions)


def load_learner(path: str) -> ModuleType:
    """Import the learner's file by path, as a module named after the file."""
    name = "workspace_" + os.path.splitext(os.path.basename(path))[0]
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the file may import its neighbours in the workspace
    return load_file(path, name)


def _learner_frames(error: BaseException, learner_file: str) -> list[traceback.FrameSummary]:
    real = os.path.realpath(learner_file)
    return [f for f in traceback.extract_tb(error.__traceback__)
            if os.path.realpath(f.filename) == real]


def error_kind(error: BaseException, frames: list, raised_here: bool) -> str:
    """not_done, finding, timeout, peer_gone, learner or checker (the checker's own fault)."""
    text = str(error)
    if isinstance(error, CaseFinding):
        return "finding"
    if isinstance(error, NotImplementedError) and raised_here:
        return "not_done"
    if isinstance(error, TimeoutError) or any(s in text for s in TIMED_OUT):
        return "timeout"
    if any(s in text for s in PEER_GONE):
        return "peer_gone"
    if frames or isinstance(error, SyntaxError):
        return "learner"
    return "checker"


def describe_error(error: BaseException, learner_file: str) -> dict:
    """What the checker needs to know about an exception, with the learner's line only."""
    frames = _learner_frames(error, learner_file)
    tb = traceback.extract_tb(error.__traceback__)
    raised_here = bool(frames) and tb[-1] == frames[-1]  # raised by the learner's own line
    info = {"kind": error_kind(error, frames, raised_here), "type": type(error).__name__,
            "message": str(error).strip(), "line": None, "source": "", "function": ""}
    if frames:
        info.update(line=frames[-1].lineno, source=(frames[-1].line or "").strip(),
                    function=frames[-1].name)
    elif isinstance(error, SyntaxError) and error.lineno:
        info.update(line=error.lineno, source=(error.text or "").strip(), message=error.msg)
    if info["kind"] == "checker":
        info["traceback"] = "".join(traceback.format_exception(error))[-3000:]
    return info
