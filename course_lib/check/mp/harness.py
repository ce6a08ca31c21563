"""One call that checks a learner's file on several world sizes (used by every such checker).

An exercise's cases module (``course_lib/check/cases/``) declares it::

    EXERCISE = FileExercise("6.3", "workspace/my_ring.py", ("ring_all_reduce",), __name__,
                            ADVICE, judge_case, library=LIBRARY, explain=explain)

and its entry point in ``check/nbNN.py`` calls ``check_exercise(EXERCISE, path, world_sizes)``:
the file exists, parses, defines the functions and uses none of the ``library`` names
(``own_work.expect_own_file``), ``before_launch`` reads what else it can without running it;
then one launch per world size, smallest first, every case inside it. After each launch the
cases that every rank finished are judged in order (``judge(summary, by_rank, run)`` raises
``ExerciseError``; ``by_rank`` is keyed by the rank's number in the case's group), then how
the launch ended (``raise_if_stopped``), so a wrong answer is usually judged after the first
launch. ``NotImplementedError`` ("not done yet") is raised before any launch. A judge may
return notes (a right answer that could be better), printed before the pass is recorded.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

from course_lib.check.answers import expect_path
from course_lib.check.checker import ExerciseError
from course_lib.check.mp.learner import LearnerFile, find_learner_file
from course_lib.check.mp.runner import run_file
from course_lib.check.mp.verdict import Advice, raise_if_stopped, where
from course_lib.check.own_work import expect_own_file
from course_lib.runtime.workspace import record_pass

WORLD_SIZES = (2, 3, 4)
# "3" (or "2,4"): check on those world sizes only. The student-copy test sets it: the copy's
# answers are the notebook's own, which nbval checks on every world size.
WORLD_SIZES_ENV = "COURSE_CHECK_WORLD_SIZES"


DECLARED: dict = {}  # exercise id -> its FileExercise, as its cases module declares it


@dataclass(frozen=True)
class FileExercise:
    """A file exercise: what the learner's file must define, what its cases module runs in
    every rank, and how its checker judges what they found."""

    id: str  # "6.3"
    file: str  # "workspace/my_ring.py", the notebook's %%writefile cell
    functions: tuple[str, ...]  # what the file defines at its top level
    cases: str  # the module whose case_specs and run_case each rank runs
    advice: Advice  # what to do when the ranks' messages do not pair up
    judge: Callable  # judge(summary, by_rank, run) -> notes or None; raises ExerciseError
    library: dict = field(default_factory=dict)  # {name: why}: refused in the file
    explain: Callable | None = None  # explain(error, file text) -> a sentence, or ""
    before_launch: Callable | None = None  # before_launch(path): what reading can find
    options: dict = field(default_factory=dict)  # handed to every case
    deadline_s: float | None = None  # a launch's time in all (run_file's default if None)
    entry: str = ""  # "check.nb06.my_ring", the checker a notebook calls

    def __post_init__(self) -> None:
        DECLARED[self.id] = self

    def expect_path(self, path) -> None:
        """``path`` must name the learner's file (not, say, the class the file defines)."""
        expect_path(path, f'{self.entry or "the checker"}("{self.file}")')


def world_sizes_to_run(world_sizes: Sequence[int]) -> list[int]:
    """``world_sizes``, or those of them that ``$COURSE_CHECK_WORLD_SIZES`` names."""
    chosen = os.environ.get(WORLD_SIZES_ENV, "").strip()
    if not chosen:
        return list(world_sizes)
    wanted = {int(n) for n in chosen.split(",")}
    return [n for n in world_sizes if n in wanted] or list(world_sizes)


def check_file(learner: LearnerFile, exercise: FileExercise,
               world_sizes: Sequence[int]) -> list[str]:
    """Launch, judge, repeat for each world size; return the judge's notes."""
    notes: list[str] = []
    cases = importlib.import_module(exercise.cases)
    for world_size in world_sizes_to_run(world_sizes):
        run = run_file(exercise.cases, learner, world_size, exercise.options,
                       deadline_s=exercise.deadline_s)
        specs = {s["name"]: s for s in cases.case_specs(world_size, exercise.options)}
        for summary, by_rank in run.finished_cases():
            try:
                notes += exercise.judge(specs[summary["name"]], by_rank, run) or []
            except ExerciseError as e:
                raise ExerciseError(f"{e} {where(run, summary['name'])}") from None
        raise_if_stopped(run, learner, exercise.advice, exercise.explain)
    return notes


def check_exercise(exercise: FileExercise, path: str, world_sizes: Sequence[int]) -> None:
    """The whole check of the learner's file at ``path``; a pass is recorded."""
    exercise.expect_path(path)
    learner = find_learner_file(path, exercise.functions)
    expect_own_file(path, exercise.library, path)  # the file outside its __main__ block
    if exercise.before_launch is not None:
        exercise.before_launch(path)
    for note in dict.fromkeys(check_file(learner, exercise, world_sizes)):  # each note once
        print(note)
    record_pass(exercise.id, path)
