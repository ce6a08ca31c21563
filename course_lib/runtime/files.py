"""Small files that several processes write and read while a run goes on.

- ``write_json_atomic``: write JSON so that a reader never sees half a file.
- ``read_json``: the JSON in a file, or a default while it is missing or half written.
- ``read_text``: a log's text so far, or "" while it does not exist.

The standard library only: the launcher's child processes import this module too.
"""

from __future__ import annotations

import json
import os
from typing import Any


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON so that a reader never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)  # a reader sees the old file or the new one, never a mix


def read_json(path: str | os.PathLike, default: Any = None) -> Any:
    """The JSON value in ``path``; ``default`` when the file is missing, unreadable or not
    (yet) valid JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return default


def read_text(path: str | os.PathLike) -> str:
    """The text in ``path`` (undecodable bytes replaced); "" when it is missing or unreadable."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
