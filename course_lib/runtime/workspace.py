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


def workspace_dir(create: bool = True) -> Path:
    """The workspace folder: ``$COURSE_WORKSPACE``, else ``workspace/`` in the working dir."""
    folder = Path(os.environ.get(WORKSPACE_ENV) or "workspace")
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def file_hash(path: str | os.PathLike) -> str:
    """SHA-256 of the file's bytes: a pass holds for exactly the text that passed."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _read_passes(folder: Path) -> dict:
    try:
        with open(folder / PASSED_FILE) as f:
            passes = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return passes if isinstance(passes, dict) else {}


def record_pass(exercise_id: str, path: str | os.PathLike) -> None:
    """Note in ``.passed.json`` (next to ``path``) that this file passed ``exercise_id``."""
    path = Path(path)
    passes = _read_passes(path.parent)
    passes[exercise_id] = {"file": path.name, "sha256": file_hash(path)}
    tmp = path.parent / f"{PASSED_FILE}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(passes, indent=1, sort_keys=True))
    os.replace(tmp, path.parent / PASSED_FILE)


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
