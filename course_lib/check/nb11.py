"""Checkers for the exercises of notebook 11 (capstone).

11.1 launches the learner's trainer (``workspace/capstone_trainer.py``) on 2 processes and
climbs the course's equivalence ladder, rung by rung; the report names the first rung that
fails and what to look at. 11.2 judges a plan against the memory cap and the time cap, part by
part (``course_lib.lessons.budget``), and compares it with the fastest plan that fits, found by
trying every plan.
"""

from __future__ import annotations

from course_lib.check.cases import capstone
from course_lib.check.cases.capstone import RUNGS  # noqa: F401 - notebook 11 prints them
from course_lib.check.checker import exercise, expect
from course_lib.lessons import budget


@exercise("11.1")
def capstone_trainer(path: str = capstone.EXERCISE.file, world_sizes=(2,)) -> None:
    """The learner's trainer, launched on 2 processes, against the ladder."""
    capstone.check(capstone.EXERCISE, path, world_sizes)


@exercise("11.2")
def capstone_budget(my_plan, challenge: budget.Budget | None = None) -> None:
    """``my_plan()`` returns a ``budget.Plan``; it must keep the recipe and fit both caps."""
    challenge = challenge or budget.Budget()
    plan = my_plan()
    expect(isinstance(plan, budget.Plan), f"return a Plan(micro_batch, accum_steps, nproc, "
                                          f"bucket_kib, zero_stage), not {plan!r}")
    problems = budget.verdict(plan, challenge)
    expect(not problems, "\n".join(problems))  # each limit on lines of its own
    for line in budget.describe(plan, challenge):
        print(line)
    best = budget.fastest_plan(challenge)  # every plan tried: none is faster
    seconds, fastest = (budget.run_seconds(p, challenge) for p in (plan, best))
    if seconds <= fastest + 1e-9:
        print("of every plan that fits, none is faster (every plan was tried)")
    else:
        print(f"the fastest plan that fits takes {fastest:.3f} s, yours {seconds:.3f} s "
              "(every plan was tried)")
