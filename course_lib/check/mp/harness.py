"""One call that checks a learner's file on several world sizes (used by every such checker).

    learner = find_learner_file(path, ("ring_all_reduce",))
    check_file(learner, "course_lib.check.cases.ring_cases", {}, (2, 3, 4), ADVICE, judge_case)
    record_pass("6.3", learner.path)

One launch per world size, smallest first; every case runs inside it. After each launch the
cases that every rank finished are judged in order (``judge_case(summary, by_rank, run)``
raises ``ExerciseError``), then how the launch ended (``raise_if_stopped``), so a wrong
answer is usually judged after the first launch. ``NotImplementedError`` ("not done yet") is
raised before any further launch.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from course_lib.check.checker import ExerciseError
from course_lib.check.mp.learner import LearnerFile
from course_lib.check.mp.runner import Run, run_file
from course_lib.check.mp.verdict import Advice, raise_if_stopped, where

WORLD_SIZES = (2, 3, 4)
# "3" (or "2,4"): check on those world sizes only. The student-copy test sets it: the copy's
# answers are the notebook's own, which nbval checks on every world size.
WORLD_SIZES_ENV = "COURSE_CHECK_WORLD_SIZES"


def world_sizes_to_run(world_sizes: Sequence[int]) -> list[int]:
    """``world_sizes``, or those of them that ``$COURSE_CHECK_WORLD_SIZES`` names."""
    chosen = os.environ.get(WORLD_SIZES_ENV, "").strip()
    if not chosen:
        return list(world_sizes)
    wanted = {int(n) for n in chosen.split(",")}
    return [n for n in world_sizes if n in wanted] or list(world_sizes)


def check_file(learner: LearnerFile, cases_module: str, options: dict,
               world_sizes: Sequence[int], advice: Advice,
               judge_case: Callable[[dict, dict, Run], None],
               explain: Callable[[dict, str], str] | None = None,
               deadline_s: float | None = None) -> list[Run]:
    """Launch, judge, repeat for each world size; return the runs (for their timings).
    ``deadline_s``: how long a launch may take in all (``run_file``'s default if None)."""
    runs = []
    for world_size in world_sizes_to_run(world_sizes):
        run = run_file(cases_module, learner, world_size, options, deadline_s=deadline_s)
        runs.append(run)
        for summary, by_rank in run.finished_cases():
            try:
                judge_case(summary, by_rank, run)
            except ExerciseError as e:
                raise ExerciseError(f"{e} {where(run, summary['name'])}") from None
        raise_if_stopped(run, learner, advice, explain)
    return runs
