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
from course_lib.check.checker import KEEP_HIDDEN, exercise, expect
from course_lib.check.own_work import call_own
from course_lib.lessons import budget


@exercise("11.1")
def capstone_trainer(path: str = capstone.EXERCISE.file, world_sizes=(2,)) -> None:
    """The learner's trainer, launched on 2 processes, against the ladder."""
    capstone.check(capstone.EXERCISE, path, world_sizes)


SEARCHES = (budget.fastest_plan, budget.fitting_plans, budget.splits_that_fit, budget.every_plan)


@exercise("11.2")
def capstone_budget(my_plan, challenge: budget.Budget | None = None) -> bool | None:
    """``my_plan()`` returns a ``budget.Plan``; it must keep the recipe and fit both caps. A plan
    that fits but is slower than the fastest passes, without showing the course's plan."""
    challenge = challenge or budget.Budget()
    plan = call_own(my_plan, library=SEARCHES, hint=(
        "your my_plan calls budget.{name}, which tries every plan for you: the exercise is to "
        "choose the five values yourself, from what describe and verdict say of your tries"))
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
        return None
    print(f"the fastest plan that fits takes {fastest:.3f} s, yours {seconds:.3f} s (every "
          "plan was tried); the course's plan is shown once yours is as fast")
    return KEEP_HIDDEN
