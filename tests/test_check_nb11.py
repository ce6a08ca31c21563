"""Exercise checkers of notebook 11: the trainer's ladder (11.1) and the budget's judge (11.2).

11.1: the fixed trainer (the notebook's answer cell) and another right one pass every rung;
each injected bug, alone in an otherwise fixed file, fails at the rung it breaks first; the
file notebook 11 hands out fails at the first of them (the missing loss scaling's rung, so that
bug needs no launch of its own). 11.2: a plan that breaks either limit is rejected with its
figures and parts, and the part that breaks it; the fastest plan (found by trying every plan)
and the notebook's answer pass, and so does a slower plan that fits.
"""

import re
import time
from pathlib import Path

import pytest
from answer_edits import edited, reference, skeleton
from capstone_bugs import ANOTHER_RIGHT, BUGS, HALF_FIXES, buggy_text, fixed
from check_reports import report_of, shown_report

from course_lib.check import nb11
from course_lib.check.cases import capstone_cases
from course_lib.check.reference import reference_answer
from course_lib.lessons import budget
from course_lib.lessons.budget import Budget, Plan
from course_lib.runtime.workspace import has_passed

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "11_capstone.ipynb"
TRAINER = "capstone_trainer.py"


def failing_rung(workspace, text: str) -> tuple[int, str]:
    """The rung the trainer ``text`` fails first and the report it gets (checked: a few lines,
    no checker code), after asserting that no pass was recorded."""
    path = workspace.put(text, TRAINER)
    shown = " ".join(line.strip() for line in report_of(nb11.capstone_trainer, path,
                                                        modules=(capstone_cases, budget)))
    assert not has_passed("11.1", path)
    found = re.search(r"rung (\d) of 7 fails", shown)
    assert found, shown
    return int(found.group(1)), shown


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["the notebook's", "another right one"])
def test_a_right_trainer_climbs_every_rung(workspace, capsys, answer):
    text = fixed() if answer == "the notebook's" else edited(fixed(), ANOTHER_RIGHT)
    path = workspace.put(text, TRAINER)
    nb11.capstone_trainer(path)
    out = capsys.readouterr().out
    assert [f"rung {n}:" in out for n in range(1, 8)] == [True] * 7
    assert out.endswith("Exercise 11.1: correct.\n")
    assert has_passed("11.1", path)


SAYS = {  # what each report must say (the hint names the symptom, not the fix)
    "no loss scaling": "about 4 times the big batch's",
    "no_sync around backward only": "all-reduced its gradients 2 times in one optimizer step",
    "a rank that skips the broadcast": "rank 0 never joined it",
    "mean of micro-batch means": "is the mean of the micro-batches' means",
    "no set_epoch": "same examples in the same order in epoch 0 and epoch 1",
    "each micro-batch's own mean, / K": "different numbers of scored tokens",
}
ALONE = ["no_sync around backward only", "mean of micro-batch means", "no set_epoch",
         "each micro-batch's own mean, / K"]  # the other two have tests of their own below


def only_its_own_words(bug: str, shown: str) -> None:
    assert SAYS[bug] in shown, shown
    assert not [words for words in SAYS.values() if words != SAYS[bug] and words in shown]


@pytest.mark.slow
@pytest.mark.parametrize("bug", ALONE)
def test_each_bug_alone_fails_at_its_rung(workspace, bug):
    rung, shown = failing_rung(workspace, buggy_text([bug]))
    assert rung == {**BUGS, **HALF_FIXES}[bug][0], shown
    only_its_own_words(bug, shown)


@pytest.mark.slow
def test_the_handed_out_file_fails_at_the_first_bugs_rung(workspace):
    rung, shown = failing_rung(workspace, buggy_text(list(BUGS)))
    assert rung == BUGS["no loss scaling"][0] == min(r for r, _ in BUGS.values()) == 2
    only_its_own_words("no loss scaling", shown)


@pytest.mark.slow
def test_the_skipped_broadcast_names_the_waiting_rank_and_line(workspace):
    bug = "a rank that skips the broadcast"
    text = buggy_text([bug])
    start = time.monotonic()
    rung, shown = failing_rung(workspace, text)
    # rank 0 leaves when it has finished, so rank 1 hears "peer gone" at once (a rank that
    # lingered until every rank was done would leave it waiting for its whole timeout)
    assert time.monotonic() - start < nb11.PG_TIMEOUT_S
    assert rung == BUGS[bug][0]
    only_its_own_words(bug, shown)
    line = next(i for i, row in enumerate(text.split("\n"), 1) if "dist.broadcast" in row)
    assert f"Rank 1 waited at line {line}" in shown


@pytest.mark.slow
def test_an_error_in_the_learners_step_names_the_rung_and_the_line(workspace):
    text = edited(fixed(), [("optimizer.step()", "optimiser.step()")])
    rung, shown = failing_rung(workspace, text)
    line = next(i for i, row in enumerate(text.split("\n"), 1) if "optimiser.step()" in row)
    assert rung == 1 and f"line {line} in train_step" in shown, shown
    assert "NameError: name 'optimiser' is not defined" in shown, shown


def test_the_notebook_hands_out_the_buggy_file_and_the_exercise_opens_empty():
    assert reference("buggy_trainer.py") == buggy_text(list(BUGS))
    assert skeleton(TRAINER).startswith('raise NotImplementedError("Exercise 11.1')


def test_an_open_trainer_is_not_done_yet(workspace, capsys):
    nb11.capstone_trainer(workspace.put(skeleton(TRAINER), TRAINER))
    assert "Exercise 11.1: not done yet" in capsys.readouterr().out


# ---- 11.2: the budget --------------------------------------------------------------------

def fastest() -> Plan:
    return budget.fastest_plan(Budget())  # found by trying every plan (kept once found)


def rejection(plan: Plan) -> str:
    """The report of a plan the judge refuses, as one line (checked: no checker code)."""
    return shown_report(nb11.capstone_budget, lambda: plan, capstone_cases, budget)


def passed(plan: Plan, capsys) -> str:
    nb11.capstone_budget(lambda: plan)
    out = capsys.readouterr().out
    assert out.endswith("Exercise 11.2: correct.\n")
    return out


def test_the_fastest_plan_passes_with_its_parts_and_is_not_printed_before(capsys):
    best = fastest()
    out = passed(best, capsys)
    for words in budget.describe(best, Budget()):
        assert words in out
    assert "of every plan that fits, none is faster" in out
    assert budget.run_seconds(best, Budget()) <= Budget().time_cap_s
    before = NOTEBOOK.read_text().split("**Exercise 11.2")[0]
    assert f"zero_stage={best.zero_stage})" not in before
    assert "Plan(8, 1, 4" not in before and "micro_batch=8, accum_steps=1, nproc=4" not in before


def test_the_notebooks_answer_is_the_fastest_and_a_slower_right_plan_passes_too(capsys):
    answer = reference_answer("11.2")
    namespace = {"Plan": Plan}
    exec(answer + "\nresult = my_plan()", namespace)
    assert "none is faster" in passed(namespace["result"], capsys)
    slower = Plan(8, 1, 4, zero_stage=1)  # fits, with ZeRO-1's collectives after backward
    out = passed(slower, capsys)
    seconds = budget.run_seconds(slower, Budget())
    assert f"the fastest plan that fits takes {budget.run_seconds(fastest(), Budget()):.3f} s, " \
           f"yours {seconds:.3f} s" in out


def test_a_plan_over_the_memory_cap_names_each_part_not_the_plan_to_pick():
    plan = Plan(8, 1, 4, bucket_kib=64, zero_stage=0)  # fast enough, whole AdamW state
    shown = rejection(plan)
    memory = budget.memory_kib(plan)["total"]
    assert f"memory: {memory:.0f} KiB per process, {memory - 900:.0f} KiB over the 900 KiB " \
           "cap" in shown
    for words in ("optimizer state 208 KiB (whole on each process)",
                  "activations 437 KiB (8 examples at a time)", "buckets 104 KiB"):
        assert words in shown
    assert "time:" not in shown and "zero_stage" not in shown and "ZeRO" not in shown


def test_a_plan_over_the_time_cap_names_the_part_that_takes_it_over():
    plan = Plan(8, 1, 4, bucket_kib=0.05, zero_stage=2)  # a bucket per tensor, 28 on the link
    shown = rejection(plan)
    seconds = budget.run_seconds(plan, Budget())
    assert f"time: {seconds:.2f} s for 100 steps, {seconds - 0.6:.2f} s over the 0.60 s cap" \
        in shown
    assert "the compute fits, the communication it does not hide takes it over" in shown
    assert "memory" not in shown and "bucket_kib" not in shown


def test_a_plan_over_both_caps_names_both():
    shown = rejection(Plan(8, 2, 2, bucket_kib=1024, zero_stage=0))
    assert "memory: 956 KiB" in shown and "time: 0.81 s" in shown
    assert "the compute alone is over the cap" in shown


@pytest.mark.parametrize("plan, words", [
    (Plan(8, 2, 4, 64, 1), "= 64, but the recipe"),
    (Plan(4, 1, 8, 64, 1), "the machine runs at most 4"),
    (Plan(0, 1, 4, 64, 1), "micro_batch must be a whole number"),
    (Plan(8, 1, 4, "64", 1), "bucket_kib must be a number"),
    (Plan(8, 1, 4, 64, True), "zero_stage must be 0, 1, 2 or 3"),
    (Plan(8, 1, 4, 64, 4), "zero_stage must be 0, 1, 2 or 3"),
    (Plan(8, 1, 4, 0, 1), "bucket_kib must be more than 0"),
])
def test_plans_that_change_the_run_are_refused(plan, words):
    assert words in rejection(plan)


def test_something_else_than_a_plan_is_refused():
    assert "return a Plan(micro_batch, accum_steps, nproc, bucket_kib, zero_stage)" in \
        rejection((8, 1, 4))
