"""Answers that share one launch (for tests/test_check_file_exercises.py).

A file exercise's checker launches the learner's file on N processes: about half a second of
CPU before any case runs, for each of dozens of answers a test module holds. Answers that run
every case to the end (their mistake is in the values, which the checker judges afterwards)
can share one launch: ``share_launch`` runs them together, each as if alone, and the checker's
own call on the same text later reads its run instead of launching (``prelaunch`` in
``course_lib/check/mp/runner.py``). The test still calls the checker and reads its hint; only
where the processes ran changes. An answer that stops early (it raised, or hung) is not kept,
nor are the ones after it: those run alone, so ``share_launch`` returns how many were kept and
the fixture that calls it asserts it kept them all.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from course_lib.check.mp import runner


def share_launch(cases_module: str, texts: list[str], name: str, world_size: int,
                 options: dict | None = None) -> int:
    """Run ``cases_module``'s cases on each text (a ``workspace/NAME`` file) in one launch on
    ``world_size`` processes; returns how many runs were kept for the checker."""
    root = Path(tempfile.mkdtemp(prefix="shared-launch-"))
    paths = []
    for k, text in enumerate(texts):
        folder = root / str(k) / "workspace"  # a workspace of its own, as each test has
        folder.mkdir(parents=True)
        (folder / name).write_text(text)
        paths.append(str(folder / name))
    try:
        return runner.prelaunch(cases_module, paths, world_size, options)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def share_launches(cases_module: str, name: str, answers: list[tuple[str, int]],
                   options: dict | None = None) -> None:
    """``answers``: (text of workspace/NAME, world size) pairs that each run every case to the
    end: one launch per world size, and every run kept (asserted, so that the list stays
    true when a checker changes)."""
    by_size: dict[int, list[str]] = {}
    for text, world_size in answers:
        by_size.setdefault(world_size, []).append(text)
    for world_size, texts in sorted(by_size.items()):
        kept = share_launch(cases_module, texts, name, world_size, options)
        assert kept == len(texts), (f"{len(texts) - kept} of {len(texts)} answers on "
                                    f"{world_size} processes stopped early: run them alone")
