"""The learner's own files: ``workspace/NAME.py``, written by ``%%writefile`` cells.

A notebook cell that starts with ``%%writefile workspace/my_ring.py`` saves the learner's code
in the ``workspace/`` folder next to the notebook (the kernel's working directory). A checker
launches that file on several processes and, once it is right, records the pass in
``workspace/.passed.json`` together with a hash of the file that passed. Later files use the
learner's function only while that record holds, else the library's::

    from course_lib.core.collectives import ring_all_reduce as library_ring
    from course_lib.runtime.workspace import mine_or_library

    ring_all_reduce = mine_or_library("my_ring", "ring_all_reduce", "6.3", library_ring)

``COURSE_WORKSPACE`` names another folder (tests use it); launched processes inherit both the
working directory and the environment, so they find the same folder.

In a student copy (its folder holds ``.student_copies.json``), the library code an exercise
mirrors shows only its signature until the exercise is *unlocked*: passed, or revealed on
purpose (``check.reveal``). ``unlock`` notes that in ``workspace/.unlocked.json``, so it holds
after a restart of the kernel.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

WORKSPACE_ENV = "COURSE_WORKSPACE"
PASSED_FILE = ".passed.json"
UNLOCKED_FILE = ".unlocked.json"
STUDENT_MANIFEST = ".student_copies.json"  # written by scripts/make_student_notebooks.py
STUDENT_ENV = "COURSE_STUDENT_COPY"  # "1": act as a student copy wherever the kernel runs


def workspace_dir(create: bool = True) -> Path:
    """The workspace folder: ``$COURSE_WORKSPACE``, else ``workspace/`` in the working dir."""
    folder = Path(os.environ.get(WORKSPACE_ENV) or "workspace")
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def file_hash(path: str | os.PathLike) -> str:
    """SHA-256 of the file's bytes: a pass holds for exactly the text that passed."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            value = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _write_json(path: Path, value: dict) -> None:
    tmp = path.parent / f"{path.name}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _read_passes(folder: Path) -> dict:
    return _read_json(folder / PASSED_FILE)


def is_student_copy() -> bool:
    """True in a student copy's folder (the kernel's working directory), or with
    ``COURSE_STUDENT_COPY=1``."""
    return os.environ.get(STUDENT_ENV) == "1" or Path(STUDENT_MANIFEST).is_file()


def unlock(exercise_id: str, why: str = "passed") -> None:
    """Note, in a student copy, that exercise ``exercise_id`` was passed (or revealed): its
    code may show from now on. Elsewhere everything shows already: nothing is written."""
    if not is_student_copy():
        return
    folder = workspace_dir()
    unlocked = _read_json(folder / UNLOCKED_FILE)
    unlocked[exercise_id] = why
    _write_json(folder / UNLOCKED_FILE, unlocked)


def is_unlocked(exercise_id: str) -> bool:
    """Whether the library code that exercise ``exercise_id`` mirrors may show in full: always
    outside a student copy; in one, once the exercise is passed or revealed."""
    if not is_student_copy():
        return True
    folder = workspace_dir(create=False)
    return exercise_id in _read_json(folder / UNLOCKED_FILE) or \
        exercise_id in _read_passes(folder)


def record_pass(exercise_id: str, path: str | os.PathLike) -> None:
    """Note in ``.passed.json`` (next to ``path``) that this file passed ``exercise_id``."""
    path = Path(path)
    passes = _read_passes(path.parent)
    passes[exercise_id] = {"file": path.name, "sha256": file_hash(path)}
    _write_json(path.parent / PASSED_FILE, passes)


def has_passed(exercise_id: str, path: str | os.PathLike) -> bool:
    """True when ``path`` is, byte for byte, the file that passed ``exercise_id``."""
    path = Path(path)
    record = _read_passes(path.parent).get(exercise_id)
    return (isinstance(record, dict) and record.get("file") == path.name
            and path.is_file() and record.get("sha256") == file_hash(path))


def load_file(path: str | os.PathLike, module_name: str) -> ModuleType:
    """Import the Python file ``path`` as module ``module_name`` (kept in ``sys.modules``)."""
    path = Path(path).resolve()
    known = sys.modules.get(module_name)
    if known is not None and getattr(known, "__file__", None) == str(path):
        return known
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}: is it a .py file?")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def mine_or_library(module_name: str, attribute: str, exercise_id: str, fallback: Any) -> Any:
    """The learner's ``attribute`` from ``workspace/<module_name>.py`` once it passed, else
    ``fallback``; rank 0 says which in one line when it is the library's."""
    path = workspace_dir(create=False) / f"{module_name}.py"
    if has_passed(exercise_id, path):
        module = load_file(path, module_name)
        if hasattr(module, attribute):
            return getattr(module, attribute)
    if int(os.environ.get("RANK", "0")) == 0:
        recorded = exercise_id in _read_passes(path.parent)
        why = (f"{path} changed since it passed exercise {exercise_id} (run its checker again)"
               if recorded else f"exercise {exercise_id} is still open")
        print(f"using the library's {attribute}: {why}", flush=True)
    return fallback
