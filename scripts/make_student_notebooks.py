"""Write workshop copies of the notebooks with every exercise left open (see notebooks/README.md).

    python scripts/make_student_notebooks.py                # notebooks/NN_*.ipynb -> student/
    python scripts/make_student_notebooks.py --out student --reset   # fresh copies of all
    python scripts/make_student_notebooks.py --check        # only check the notebooks' markers

In an exercise cell the lines from ``# BEGIN SOLUTION`` to ``# END SOLUTION`` become a hole at
the same indentation::

        ...
        raise NotImplementedError("Exercise 3.1: scaled loss")

and the outputs of exercise cells (and of the cells that call their checkers) are cleared. The
checker call after the learner's function catches the NotImplementedError and prints
"Exercise 3.1: not done yet ...", so a student copy runs top to bottom without an error.

A learner's work is kept: ``OUT/.student_copies.json`` records the SHA-256 of each copy as it
was written. A copy whose bytes still match is replaced by a fresh one (so it picks up course
updates); a copy that differs was edited, or run and saved, in JupyterLab and is kept. With
``--reset`` every copy is written again, and edited ones are first moved to
``OUT/previous/NAME-YYYYmmdd-HHMMSS.ipynb``.

A notebook whose markers cannot make a working hole stops the script before anything is
written, with a message naming the notebook, the cell and what to change.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
MANIFEST = ".student_copies.json"
EXERCISE_IN_TEXT = re.compile(r"Exercise (\d+\.\d+)")
CHECK_MODULE = re.compile(r"^(?:course_lib\.)?check\.(nb\d\d)$|^(nb\d\d)$")
NOTE = ("> **Your copy.** The exercises at the end are open: replace each `...` with your code "
        "and run the cell; its checker prints `correct` or a hint. `scripts/start.sh --student` "
        "keeps this copy; `scripts/start.sh --student --reset` gives you a fresh one.")


DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class MalformedNotebook(ValueError):
    """The solution markers of a notebook cannot be turned into a working hole."""


@dataclass
class Block:
    """One solution block: lines ``begin`` to ``end`` (markers included) of code cell ``cell``."""

    cell: int
    begin: int
    end: int
    indent: str
    lines: list[str]  # the solution code between the markers
    function: str = ""  # the function the block sits in
    exercise_id: str = ""

    def hole(self) -> list[str]:
        title = self.function.removeprefix("my_").replace("_", " ").strip()
        return [f"{self.indent}...",
                f'{self.indent}raise NotImplementedError("Exercise {self.exercise_id}: {title}")']


@dataclass
class StudentCopy:
    notebook: nbformat.NotebookNode
    blocks: list[Block]
    checks: dict[str, int]  # exercise id -> number of checker calls for it


def find_blocks(lines: list[str], cell: int, where: str) -> list[Block]:
    """Pair the markers of one cell; every way they can be misplaced is an error."""
    blocks, open_at = [], None
    for i, line in enumerate(lines):
        text = line.strip()
        if "BEGIN SOLUTION" in text or "END SOLUTION" in text:
            if text not in (BEGIN, END):
                raise MalformedNotebook(f"{where}, line {i + 1}: write the marker exactly as "
                                        f"'{BEGIN}' or '{END}', not {text!r}")
        if text == BEGIN:
            if open_at is not None:
                raise MalformedNotebook(f"{where}, line {i + 1}: '{BEGIN}' again before "
                                        f"'{END}' (blocks cannot nest)")
            open_at = i
        elif text == END:
            if open_at is None:
                raise MalformedNotebook(f"{where}, line {i + 1}: '{END}' without '{BEGIN}'")
            blocks.append(make_block(lines, cell, open_at, i, where))
            open_at = None
    if open_at is not None:
        raise MalformedNotebook(f"{where}, line {open_at + 1}: '{BEGIN}' without '{END}'")
    return blocks


def make_block(lines: list[str], cell: int, begin: int, end: int, where: str) -> Block:
    indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
    if not lines[end].startswith(indent) or lines[end].strip() != END or \
            len(lines[end]) - len(lines[end].lstrip()) != len(indent):
        raise MalformedNotebook(f"{where}, line {end + 1}: '{END}' is not indented like its "
                                f"'{BEGIN}' on line {begin + 1}")
    body = lines[begin + 1: end]
    if not any(line.strip() for line in body):
        raise MalformedNotebook(f"{where}, line {begin + 1}: empty solution block")
    for j, line in enumerate(body, start=begin + 2):
        if line.strip() and not line.startswith(indent):
            raise MalformedNotebook(f"{where}, line {j}: solution code is indented less than "
                                    f"its '{BEGIN}' marker; indent the markers like the code")
    return Block(cell, begin, end, indent, body)


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


def first_code_line(block: Block) -> int:
    """1-based line number in the cell of the block's first line that is not blank or comment."""
    for j, line in enumerate(block.lines):
        if line.strip() and not line.strip().startswith("#"):
            return block.begin + 2 + j
    raise MalformedNotebook("the solution block holds only comments")


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


def checker_calls(tree: ast.Module) -> list[tuple[str, str, set[str]]]:
    """(nbNN, checker name, names used in its arguments) for each ``check.nbNN.name(...)``."""
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            match = CHECK_MODULE.match(ast.unparse(node.func.value))
            if match:
                args = [*node.args, *(k.value for k in node.keywords)]
                names = {n.id for a in args for n in ast.walk(a) if isinstance(n, ast.Name)}
                calls.append((match.group(1) or match.group(2), node.func.attr, names))
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


def locate(block: Block, tree: ast.Module, where: str) -> ast.stmt:
    """Set ``block.function``; return the top-level def or class that holds the block."""
    try:
        line = first_code_line(block)
    except MalformedNotebook as e:
        raise MalformedNotebook(f"{where}, line {block.begin + 1}: {e}") from None
    function, owner = enclosing_function(tree, line), top_level_owner(tree, line)
    if function is None or owner is None:
        raise MalformedNotebook(f"{where}, line {block.begin + 1}: the solution block is not "
                                "inside a function; its hole would stop the cell at top level. "
                                "Put the solution in a function the checker calls")
    block.function = function
    return owner


def check_not_called(owner: ast.stmt, trees: dict, cells: list[int], name: str) -> None:
    """A function holding a hole must only be called by its checker, never at top level."""
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


def resolve(block: Block, nb, trees: dict, check_dir: Path, name: str) -> list[int]:
    """Name the block's exercise and find the checker calls that report it (cell indices)."""
    where = f"{name}, cell {block.cell}"
    owner = locate(block, trees[block.cell], where)
    cells = cells_in_scope(trees, block.cell, owner.name)
    check_not_called(owner, trees, cells, name)
    calls = [(i, c) for i in cells for c in checker_calls(trees[i])
             if owner.name in c[2]]
    own = checker_calls(trees[block.cell])
    if not calls and len(own) == 1:
        calls = [(block.cell, own[0])]
    if not calls:
        raise MalformedNotebook(f"{where}: no checker call receives {owner.name}; add e.g. "
                                f"check.nbNN.name({owner.name}) after it")
    ids = {checker_ids(m, check_dir).get(c) or markdown_exercise(nb.cells, block.cell)
           for _, (m, c, _) in calls}
    if None in ids or len(ids) != 1:
        raise MalformedNotebook(f"{where}: cannot tell the exercise number of {owner.name}; "
                                'decorate its checker with @exercise("N.M")')
    block.exercise_id = ids.pop()
    return [i for i, _ in calls]


def make_student_copy(nb, name: str = "notebook", check_dir: Path | None = None) -> StudentCopy:
    """The student copy of ``nb`` (not changed), its solution blocks and checker calls."""
    check_dir = check_dir or ROOT / "course_lib" / "check"
    nb = copy.deepcopy(nb)
    trees = {i: parse(c.source, f"{name}, cell {i}")
             for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    blocks, clear, checks = [], set(), {}
    for i in sorted(trees):
        for block in find_blocks(nb.cells[i].source.split("\n"), i, f"{name}, cell {i}"):
            call_cells = resolve(block, nb, trees, check_dir, name)
            blocks.append(block)
            clear.update([i, *call_cells])
            checks.setdefault(block.exercise_id, set()).update(call_cells)
    for i in sorted({b.cell for b in blocks}):
        lines = nb.cells[i].source.split("\n")
        for block in sorted((b for b in blocks if b.cell == i), key=lambda b: -b.begin):
            lines[block.begin: block.end + 1] = block.hole()
        nb.cells[i].source = "\n".join(lines)
        parse(nb.cells[i].source, f"{name}, cell {i} (with its hole)")
    for i in clear:
        nb.cells[i].outputs, nb.cells[i].execution_count = [], None
        nb.cells[i].metadata.pop("execution", None)
    if blocks:
        note = nbformat.v4.new_markdown_cell(NOTE, id="student-copy-note")
        if nb.nbformat_minor < 5:  # cell ids came with format 4.5
            del note["id"]
        nb.cells.insert(1, note)
    return StudentCopy(nb, blocks, {k: len(v) for k, v in checks.items()})


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_copies(sources: list[Path], out: Path, reset: bool) -> list[str]:
    """Write every student copy (all are made first, so one bad notebook writes nothing)."""
    made = {src.name: make_student_copy(nbformat.read(src, as_version=4), str(src))
            for src in sources}
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    messages = []
    for src in sources:
        data = (nbformat.writes(made[src.name].notebook) + "\n").encode()
        target, record = out / src.name, manifest.get(src.name, {})
        edited = target.exists() and sha256(target.read_bytes()) != record.get("sha256")
        if edited and not reset:
            fresh = record.get("source_sha256") == sha256(src.read_bytes())
            messages.append(f"kept {target} (you changed it)" + (
                "" if fresh else "; the course has a newer version: --reset to take it"))
            continue
        if edited:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            backup = out / "previous" / f"{target.stem}-{stamp}{target.suffix}"
            backup.parent.mkdir(exist_ok=True)
            shutil.move(target, backup)
            messages.append(f"moved your {target.name} to {backup}")
        same = target.exists() and target.read_bytes() == data
        target.write_bytes(data)
        manifest[src.name] = {"sha256": sha256(data), "source_sha256": sha256(src.read_bytes())}
        count = len(made[src.name].blocks)
        messages.append(f"{'unchanged' if same else 'wrote'} {target} ({count} exercise blocks)")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    for folder in {src.parent for src in sources}:
        copy_assets(folder, out)
    return messages


def copy_assets(folder: Path, out: Path) -> None:
    """Folders beside the notebooks (pictures, data) go along, so links keep working."""
    for sub in folder.iterdir():
        if sub.is_dir() and not sub.name.startswith((".", "_")) and sub.resolve() != out.resolve():
            shutil.copytree(sub, out / sub.name, dirs_exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to copy (default: notebooks/NN_*.ipynb)")
    parser.add_argument("--out", type=Path, default=Path("student"), help="folder to write")
    parser.add_argument("--reset", action="store_true", help="replace edited copies too")
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    ns = parser.parse_args(argv)
    sources = ns.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if ns.check:
        return check_only(sources)
    try:
        print("\n".join(write_copies(sources, ns.out, ns.reset)))
    except MalformedNotebook as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def check_only(sources: list[Path]) -> int:
    """Check every notebook, report each one, write nothing; 1 if any is malformed."""
    status = 0
    for src in sources:
        try:
            made = make_student_copy(nbformat.read(src, as_version=4), str(src))
            print(f"ok {src} ({len(made.blocks)} exercise blocks)")
        except MalformedNotebook as e:
            print(f"error: {e}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
