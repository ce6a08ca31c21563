"""Reading a notebook's exercise cells: their Python, their functions, their checker calls.

Used by ``student_copies.py``; every problem is a ``MalformedNotebook`` that names the notebook,
the cell and what to change.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import NamedTuple

EXERCISE_IN_TEXT = re.compile(r"Exercise (\d+\.\d+)")
CHECK_MODULE = re.compile(r"^(?:course_lib\.)?check\.(nb\d\d[a-z]?)$|^(nb\d\d[a-z]?)$")  # 10b
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class MalformedNotebook(ValueError):
    """The solution markers of a notebook cannot be turned into a working exercise."""


class CheckerCall(NamedTuple):
    """One ``check.nbNN.name(...)`` call of a cell."""

    module: str  # "nb03"
    name: str  # the checker's name
    names: set[str]  # the names used in its arguments
    text: str  # the call as source code


def written_file(source: str) -> str | None:
    """``workspace/ring.py`` for a cell that starts with ``%%writefile workspace/ring.py``."""
    words = source.split("\n", 1)[0].split()
    return words[-1] if len(words) > 1 and words[0] == "%%writefile" else None


def as_python(source: str) -> str:
    """The cell as plain Python: IPython's %magic and !shell lines become ``pass``."""
    out = []
    for line in source.split("\n"):
        text = line.lstrip()
        out.append(line[: len(line) - len(text)] + "pass" if text[:1] in ("%", "!") else line)
    return "\n".join(out)


def parse(source: str, where: str) -> ast.Module:
    try:
        return ast.parse(as_python(source))
    except SyntaxError as e:
        raise MalformedNotebook(f"{where}, line {e.lineno}: not valid Python ({e.msg})") from None


def enclosing_function(tree: ast.Module, line_no: int) -> str | None:
    """Name of the innermost function whose body holds line ``line_no`` (1-based)."""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.body[0].lineno <= line_no <= node.end_lineno:
            if best is None or node.lineno > best.lineno:
                best = node
    return best.name if best else None


def top_level_owner(tree: ast.Module, line_no: int) -> ast.stmt | None:
    """The cell's top-level function or class that holds line ``line_no``."""
    for node in tree.body:
        if isinstance(node, DEFINITIONS) and node.lineno < line_no <= node.end_lineno:
            return node
    return None


def cells_in_scope(trees: dict, start: int, function: str) -> list[int]:
    """Cell ``start`` and the cells after it, up to one that defines ``function`` again."""
    cells = []
    for i in sorted(trees):
        if i < start:
            continue
        redefined = any(isinstance(n, DEFINITIONS) and n.name == function
                        for n in trees[i].body)
        if i > start and redefined:
            break
        cells.append(i)
    return cells


class TopLevelCalls(ast.NodeVisitor):
    """Names called when a cell runs: function and lambda bodies are not entered."""

    def __init__(self):
        self.called: set[str] = set()

    def visit_Call(self, node: ast.Call):
        if isinstance(node.func, ast.Name):
            self.called.add(node.func.id)
        self.generic_visit(node)

    def visit_FunctionDef(self, node):  # only its decorators and defaults run now
        for child in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if child is not None:
                self.visit(child)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        pass

    def visit_Try(self, node):  # a call guarded by `except NotImplementedError` is allowed
        guarded = any("NotImplementedError" in ast.unparse(h.type) for h in node.handlers
                      if h.type is not None)
        for child in [*([] if guarded else node.body), *node.handlers, *node.orelse,
                      *node.finalbody]:
            self.visit(child)


def checker_calls(tree: ast.Module) -> list[CheckerCall]:
    """Every ``check.nbNN.name(...)`` (or ``nbNN.name(...)``) call of a cell."""
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            match = CHECK_MODULE.match(ast.unparse(node.func.value))
            if match:
                args = [*node.args, *(k.value for k in node.keywords)]
                names = {n.id for a in args for n in ast.walk(a) if isinstance(n, ast.Name)}
                calls.append(CheckerCall(match.group(1) or match.group(2), node.func.attr,
                                         names, ast.unparse(node)))
    return calls


def checker_ids(module: str, check_dir: Path) -> dict[str, str]:
    """``{checker name: exercise id}`` from the ``@exercise("N.M")`` lines of check/nbNN.py."""
    path = check_dir / f"{module}.py"
    if not path.exists():
        return {}
    ids = {}
    for node in ast.parse(path.read_text()).body:
        for deco in getattr(node, "decorator_list", []):
            if isinstance(deco, ast.Call) and getattr(deco.func, "id", "") == "exercise" and \
                    deco.args and isinstance(deco.args[0], ast.Constant):
                ids[node.name] = str(deco.args[0].value)
    return ids


def markdown_exercise(cells: list, index: int) -> str | None:
    """The last "Exercise N.M" named in the markdown cells just above cell ``index``."""
    for cell in reversed(cells[:index]):
        if cell.cell_type == "code":
            break
        found = EXERCISE_IN_TEXT.findall(cell.source)
        if found:
            return found[-1]
    return None


def check_not_called(owner: ast.stmt, trees: dict, cells: list[int], name: str) -> None:
    """A function holding an open exercise must only be called by its checker."""
    if isinstance(owner, ast.ClassDef):
        return  # making an instance runs no method
    for i in cells:
        visitor = TopLevelCalls()
        visitor.visit(trees[i])
        if owner.name in visitor.called:
            raise MalformedNotebook(f"{name}, cell {i}: calls {owner.name}() outside its "
                                    "checker; in the student copy that raises at top level. "
                                    f"Pass {owner.name} to the checker, or guard the call with "
                                    "try: ... except NotImplementedError: ...")
