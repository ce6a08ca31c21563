"""The checker's side: launch the learner's file on N processes, quietly, and read what
each rank wrote (``result{R}.json``, ``status{R}.json``, ``where{R}.json``).

``run_file`` never raises for the learner's mistakes: a failed or stopped launch is kept in
``Run.launch_error`` and judged with the files (``course_lib.check.mp.verdict``).

``prelaunch`` is for the tests, which check dozens of wrong answers: several files share one
launch, and each run that every rank finished without an error (and every one before it in
that launch too) is kept for the ``run_file`` call that asks for the same cases on the same
text; the others run alone then, as they always would.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from course_lib.check.mp.learner import LearnerFile
from course_lib.runtime.launch import LaunchError, launch

PROGRAM = "course_lib.check.mp.program"
PG_TIMEOUT_S = 10.0  # a rank blocked this long raises: a deadlock is seen after this
STARTUP_S = 18.0  # on top of that, time to start N processes on a busy laptop (< 30 s in all)


@dataclass
class RankResult:
    """What one rank left in the run folder."""

    rank: int
    reported: bool  # it wrote its final result (it was not killed)
    cases: list  # one summary per case it finished
    error: dict | None  # how it stopped early, or None
    status: dict  # the last thing it said it was doing (op None: its own code)
    where: dict  # the learner's line it was on at the last look (every 0.5 s)


@dataclass
class Run:
    """One launch of the learner's file."""

    world_size: int
    ranks: list[RankResult]
    launch_error: str | None  # the launcher's message when a rank died or time ran out
    seconds: float
    path: str = ""  # the learner's file

    def case_results(self) -> list[tuple[dict, dict[int, dict]]]:
        """[(first summary, {rank in the case's group: summary})] for every case, in the
        order they ran (a summary's "global_rank" is the rank's number in the world)."""
        order, found = [], {}
        for rank in self.ranks:
            for summary in rank.cases:
                if summary["name"] not in found:
                    order.append(summary)
                    found[summary["name"]] = {}
                found[summary["name"]][summary["group_rank"]] = {**summary,
                                                                 "global_rank": rank.rank}
        return [(s, found[s["name"]]) for s in order]

    def finished_cases(self) -> list[tuple[dict, dict[int, dict]]]:
        """The cases every rank that took part finished, in order."""
        return [(s, by_rank) for s, by_rank in self.case_results()
                if len(by_rank) == len(s["members"])]


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def read_rank(folder: str, rank: int) -> RankResult:
    result = _read(os.path.join(folder, f"result{rank}.json"))
    return RankResult(rank, bool(result.get("finished")), result.get("cases", []),
                      result.get("error"),
                      _read(os.path.join(folder, f"status{rank}.json")),
                      _read(os.path.join(folder, f"where{rank}.json")))


PRELAUNCHED: dict[tuple, Run] = {}  # (cases, options, world size, file's text) -> its run


def run_key(cases_module: str, path: str, world_size: int, options: dict | None) -> tuple:
    with open(path, "rb") as f:
        text = hashlib.sha256(f.read()).hexdigest()
    return cases_module, json.dumps(options or {}, sort_keys=True), world_size, text


def launch_program(cases_module: str, learner_arg: str, world_size: int, options: dict | None,
                   pg_timeout_s: float, deadline_s: float, folder: str) -> str | None:
    """One launch of the program; the launcher's message if it failed or stopped, else None."""
    args = [folder, cases_module, learner_arg, json.dumps(options or {})]
    env = {"COURSE_PG_TIMEOUT_S": pg_timeout_s, "COURSE_BACKEND": "gloo",
           "COURSE_PRELOAD": f"{PROGRAM},{cases_module}"}  # imported once, not in every rank
    try:
        launch(PROGRAM, world_size, args, timeout_s=deadline_s, env=env, quiet=True,
               progress=False)
    except LaunchError as e:
        if str(e).startswith("interrupted"):  # the learner stopped the cell
            raise KeyboardInterrupt from None
        return str(e)
    return None


def run_file(cases_module: str, learner: LearnerFile, world_size: int,
             options: dict | None = None, pg_timeout_s: float = PG_TIMEOUT_S,
             deadline_s: float | None = None) -> Run:
    """Run ``cases_module``'s cases on ``learner``'s file on ``world_size`` processes."""
    kept = PRELAUNCHED.pop(run_key(cases_module, learner.path, world_size, options), None)
    if kept is not None:
        kept.path = learner.path
        return kept
    folder = tempfile.mkdtemp(prefix="course-check-")
    deadline_s = pg_timeout_s + STARTUP_S if deadline_s is None else deadline_s
    start = time.monotonic()
    try:
        launch_error = launch_program(cases_module, os.path.abspath(learner.path), world_size,
                                      options, pg_timeout_s, deadline_s, folder)
        ranks = [read_rank(folder, r) for r in range(world_size)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Run(world_size, ranks, launch_error, time.monotonic() - start, learner.path)


def prelaunch(cases_module: str, paths: list[str], world_size: int,
              options: dict | None = None, deadline_s: float = 120.0) -> int:
    """Run the cases on every file of ``paths`` in one launch (see the module's docstring);
    returns how many runs were kept for ``run_file``."""
    folder = tempfile.mkdtemp(prefix="course-check-")
    start = time.monotonic()
    try:
        launch_program(cases_module, json.dumps([os.path.abspath(p) for p in paths]),
                       world_size, options, PG_TIMEOUT_S, deadline_s, folder)
        kept = 0
        for k, path in enumerate(paths):
            ranks = [read_rank(os.path.join(folder, str(k)), r) for r in range(world_size)]
            if not all(r.reported and r.error is None for r in ranks):
                break  # this one stopped early: it and the ones after it run alone
            seconds = time.monotonic() - start
            PRELAUNCHED[run_key(cases_module, path, world_size, options)] = Run(
                world_size, ranks, None, seconds, path)
            kept += 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return kept
