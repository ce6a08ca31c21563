"""The package's layers (course_lib/README.md): a module imports only from its own layer or
lower ones, and no module outside demos/ imports a demo. Every import counts, also one inside a
function or under ``if TYPE_CHECKING:``."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "course_lib"
LAYER = {"runtime": 0, "tasks": 0, "core": 1, "train": 2, "lessons": 3, "demos": 3, "check": 4}
PROGRAMS = "demos"  # launched, never imported


def imported_modules(tree: ast.Module, module: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in the tree; relative imports made absolute and
    ``from course_lib import lessons`` read as ``course_lib.lessons``."""
    package = module.split(".")[:-1]  # where a relative import starts (an __init__: its own)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            if base == "course_lib" or not node.module:
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, base))
    return found


def folder_of(dotted: str) -> str | None:
    """``course_lib.core.zero`` -> ``core``; None outside the package's folders."""
    parts = dotted.split(".")
    return parts[1] if parts[0] == "course_lib" and len(parts) > 1 else None


def wrong_way(path: Path) -> list[str]:
    """Every import of ``path`` that goes against the layers, as "file:line imports name"."""
    relative = path.relative_to(PACKAGE.parent)
    module = ".".join(relative.with_suffix("").parts)
    mine = folder_of(module) if len(relative.parts) > 2 else None  # course_lib/x.py: no folder
    found = []
    for line, name in imported_modules(ast.parse(path.read_text()), module):
        theirs = folder_of(name)
        if theirs is None or theirs == mine:
            continue
        if mine is None:
            why = "the package's top level imports no folder"
        elif theirs not in LAYER:
            why = f"course_lib/{theirs}/ has no layer (add it to LAYER and the README)"
        elif theirs == PROGRAMS:
            why = "a demo is a program the notebooks launch, not a library"
        elif LAYER[theirs] > LAYER[mine]:
            why = f"{theirs}/ is above {mine}/"
        else:
            continue
        found.append(f"{relative}:{line} imports {name}: {why}")
    return found


def test_every_folder_has_a_layer():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(LAYER), "give each folder of course_lib/ a layer here and in its README"


def test_no_import_goes_up_the_layers():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50  # the walk found the package
    wrong = [line for path in modules for line in wrong_way(path)]
    assert not wrong, "imports against course_lib/README.md's layers:\n" + "\n".join(wrong)


def test_imports_inside_functions_and_of_folders_are_read():
    tree = ast.parse("def f():\n    from ..lessons.timeline import CommRecorder\n")
    names = imported_modules(tree, "course_lib.train.syncs")
    assert names == [(2, "course_lib.lessons.timeline")]
    tree = ast.parse("from course_lib import lessons, check\n")
    assert [n for _, n in imported_modules(tree, "course_lib.core.zero")] == [
        "course_lib.lessons", "course_lib.check"]


def printed_by(code: str) -> str:
    """What ``python -c CODE`` prints, run from the repository (a fresh interpreter)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=PACKAGE.parent, timeout=120).stdout


def test_a_launched_checker_imports_neither_nbformat_nor_ipython():
    # Every rank of every exercise check imports the checker's program; nbformat (through
    # jsonschema) takes seconds of CPU to import and IPython half a second, in each rank.
    code = ("import sys, course_lib.check.mp.program\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'nbformat', 'IPython', "
            "'jsonschema'}))")
    out = printed_by(code)
    assert out.strip() == "[]", f"the launched checker imports {out.strip()}: import them lazily"


def test_showing_the_course_answer_beside_a_pass_imports_no_nbformat():
    # a kernel shows the course's answer at every passed exercise: reading the notebook as
    # JSON spares it nbformat's 2 s import; the answer is what nbformat's reading gives
    code = ("import sys\nfrom course_lib.check.reference import reference_answer\n"
            "answers = [reference_answer(i) for i in ('3.1', '6.3', '10.4')]\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'nbformat', 'jsonschema'}))"
            "\nprint(repr(answers))")
    out = printed_by(code).split("\n")
    assert out[0] == "[]", f"reference_answer imports {out[0]}"
    import nbformat

    from course_lib.check import reference
    from course_lib.check.student_copy import make_student_copy
    for exercise_id, answer in zip(("3.1", "6.3", "10.4"), ast.literal_eval(out[1]),
                                   strict=True):
        assert answer and "def " in answer, exercise_id
        path = next(reference.NOTEBOOKS.glob(f"{int(exercise_id.split('.')[0]):02d}_*.ipynb"))
        nb = nbformat.read(path, as_version=4)
        plain = reference.read_notebook(path)
        assert [c.source for c in plain.cells] == [c.source for c in nb.cells]
        assert make_student_copy(plain, path.name).blocks == make_student_copy(nb, path.name).blocks


def test_making_a_student_copy_imports_no_torch():
    # make_student_notebooks.py and the website's stage.py only read and write notebooks:
    # torch's import (2-4 s of CPU) waits until a checker needs the answer helpers
    code = ("import sys\nimport course_lib.check.student_copy\nprint('torch' in sys.modules)\n"
            "from course_lib.check import call, expect_type\n"
            "print('torch' in sys.modules, call.__module__, expect_type.__module__)")
    out = printed_by(code)
    assert out.split("\n")[:2] == ["False", "True course_lib.check.answers "
                                            "course_lib.check.answers"], out
