"""Write workshop copies of the notebooks with every exercise left open (see notebooks/README.md).

    python scripts/make_student_notebooks.py                # notebooks/NN*_*.ipynb -> student/
    python scripts/make_student_notebooks.py --out student --reset   # fresh copies of all
    python scripts/make_student_notebooks.py --check        # only check the notebooks' markers

In each exercise cell the solution, the lines from ``# BEGIN SOLUTION`` to ``# END SOLUTION``,
becomes one line at the same indentation, for the learner to replace with their code::

        raise NotImplementedError("Exercise 3.1: replace this line with your code")

and the outputs of exercise cells (and of the cells that call their checkers) are cleared. The
checker call after the learner's function catches the NotImplementedError and prints
"Exercise 3.1: not done yet ...", so a student copy runs top to bottom without an error. How a
copy is made, ``%%writefile`` cells included: ``course_lib/check/student_copy.py``.

A learner's work is kept: ``OUT/.student_copies.json`` records the SHA-256 of each copy as it
was written. A copy whose bytes still match is replaced by a fresh one (so it picks up course
updates); a copy that differs was edited, or run and saved, in JupyterLab and is kept. With
``--reset`` every copy is written again, and edited ones are first moved to
``OUT/previous/NAME-YYYYmmdd-HHMMSS.ipynb``.

The learner's files are theirs alone. Nothing of the instructor's ``notebooks/workspace/`` (the
reference files the reference notebooks write, their pass records) reaches ``OUT``, and
``OUT/workspace/`` is never written: every file the learner wrote there, and their
``.passed.json``, stays as it is. ``--reset`` moves the whole folder aside, to
``OUT/previous/workspace-YYYYmmdd-HHMMSS/``, so a fresh start begins with no file done.

A notebook whose markers cannot make a working exercise stops the script before anything is
written, with a message naming the notebook, the cell and what to change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import nbformat

from course_lib.check.student_copy import ROOT, MalformedNotebook, make_student_copy

MANIFEST = ".student_copies.json"
WORKSPACE = "workspace"  # the learner's own files (course_lib/runtime/workspace.py)
# Folders beside the notebooks that runs write (never course material): not copied.
NOT_COPIED = {WORKSPACE, "previous", "runs", "checkpoints"}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def write_copies(sources: list[Path], out: Path, reset: bool) -> list[str]:
    """Write every student copy (all are made first, so one bad notebook writes nothing)."""
    made = {src.name: make_student_copy(nbformat.read(src, as_version=4), str(src))
            for src in sources}
    out.mkdir(parents=True, exist_ok=True)
    messages = set_aside_workspace(out) if reset else keep_workspace(out)
    manifest_path = out / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
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
            backup = out / "previous" / f"{target.stem}-{stamp()}{target.suffix}"
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


def keep_workspace(out: Path) -> list[str]:
    """Say that the learner's files are kept (they are never written here)."""
    files = learner_files(out / WORKSPACE)
    return [f"kept your {len(files)} file(s) in {out / WORKSPACE}"] if files else []


def set_aside_workspace(out: Path) -> list[str]:
    """--reset: the learner's files, pass records included, go to previous/workspace-STAMP."""
    folder = out / WORKSPACE
    if not learner_files(folder):
        return []
    backup = out / "previous" / f"{WORKSPACE}-{stamp()}"
    backup.parent.mkdir(exist_ok=True)
    shutil.move(folder, backup)
    return [f"moved your files in {folder} to {backup}"]


def learner_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def copy_assets(folder: Path, out: Path) -> None:
    """Folders beside the notebooks (pictures, data) go along, so links keep working; what
    runs write there (the instructor's workspace above all) does not, and a file already in
    ``out`` is never replaced."""
    for sub in folder.iterdir():
        if (sub.is_dir() and not sub.name.startswith((".", "_")) and sub.name not in NOT_COPIED
                and sub.resolve() != out.resolve()):
            for path in sorted(p for p in sub.rglob("*") if p.is_file()):
                target = out / path.relative_to(folder)
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to copy, as paths or names in notebooks/ (06, "
                             "06_all_reduce_from_scratch.ipynb); default: every one")
    parser.add_argument("--out", type=Path, default=Path("student"), help="folder to write")
    parser.add_argument("--reset", action="store_true", help="replace edited copies too")
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    ns = parser.parse_args(argv)
    try:
        sources = [find_notebook(name) for name in ns.notebooks] or course_notebooks()
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if ns.check:
        return check_only(sources)
    try:
        print("\n".join(write_copies(sources, ns.out, ns.reset)))
    except MalformedNotebook as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def course_notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def find_notebook(name: Path) -> Path:
    """``name`` as given if it is a file, else the course's notebook it names: its file name
    with or without ``.ipynb``, or its number (``06``, ``10b``)."""
    if name.is_file():
        return name
    stem = name.name.removesuffix(".ipynb")
    found = [nb for nb in course_notebooks() if nb.stem == stem or nb.stem.split("_")[0] == stem]
    if len(found) != 1:
        names = ", ".join(nb.name for nb in course_notebooks())
        raise FileNotFoundError(f"no notebook {name}: give a path, or one of {names}")
    return found[0]


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
