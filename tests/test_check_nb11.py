"""Exercise checkers of notebook 11: the trainer's ladder (11.1) and the budget's judge (11.2).

11.1 (its right answers and each bug alone, at the rung it breaks first:
test_check_file_exercises.py): the file notebook 11 hands out, every bug in it, fails at the
first of them, the missing loss scaling's rung. 11.2: a plan that breaks either limit is
rejected with its figures and parts, and the part that breaks it; the fastest plan (found by
trying every plan) and the notebook's answer pass, and so does a slower plan that fits.
"""

from pathlib import Path

import nbformat
import numpy as np
import pytest
from answer_edits import edited, reference, skeleton
from check_reports import report_of, shown_report
from file_exercises import BUGS, CAPSTONE

from course_lib.check import nb11
from course_lib.check.cases import capstone
from course_lib.check.reference import reference_answer
from course_lib.check.student_copy import make_student_copy
from course_lib.lessons import budget
from course_lib.lessons.budget import Budget, Plan
from course_lib.runtime.workspace import has_passed

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "11_capstone.ipynb"
TRAINER = "capstone_trainer.py"


@pytest.mark.slow
def test_the_handed_out_file_fails_at_the_first_bugs_rung(workspace):
    """Every bug at once (the file notebook 11 hands out): the report is the first rung's."""
    text = edited(reference("capstone_trainer.py"),
                  [edit for bug in BUGS for edit in CAPSTONE.wrong[bug].edits])
    assert text == reference("buggy_trainer.py")
    shown = " ".join(line.strip() for line in report_of(  # as section 2 runs it
        nb11.capstone_trainer, workspace.put(text, "buggy_trainer.py"),
        modules=(capstone, budget)))
    for words in CAPSTONE.wrong[BUGS[0]].said:  # rung 2: the loss not scaled
        assert words in shown, shown
    assert not has_passed("11.1", "workspace/buggy_trainer.py")


def test_the_student_copy_hands_out_the_buggy_trainer_and_it_is_not_done_yet(
        workspace, capsys, monkeypatch):
    """The student copy's file is section 2's trainer, bugs and all: the markers sit around
    the four places the fixes go (five bugs), each with the buggy lines as its student
    version. Left as given it is "not done yet" without a launch; changed, it is launched."""
    assert skeleton(TRAINER) == reference("buggy_trainer.py")
    blocks = [b for b in make_student_copy(nbformat.read(NOTEBOOK, as_version=4)).blocks
              if b.exercise_id == "11.1"]
    assert len(blocks) == 4 and all(b.given and b.given != b.lines for b in blocks)
    monkeypatch.setattr(capstone, "run_file", lambda *a, **k: pytest.fail("it launched"))
    nb11.capstone_trainer(workspace.put(skeleton(TRAINER), TRAINER))
    assert capsys.readouterr().out == (
        "Exercise 11.1: not done yet (this is the code as given: change it, and the checker "
        "runs on your version; the notebook's text says how to see the first report on the "
        "given code).\n")

    class Launched(Exception):
        pass

    def launched(*args, **kwargs):
        raise Launched

    monkeypatch.setattr(capstone, "run_file", launched)
    with pytest.raises(Exception) as error:  # one bug fixed: the ladder is climbed
        nb11.capstone_trainer(workspace.put(edited(skeleton(TRAINER), [(
            "        orders.append(list(sampler))",
            "        sampler.set_epoch(epoch)\n        orders.append(list(sampler))")]),
            TRAINER))
    assert isinstance(error.value.__cause__ or error.value, Launched)


# ---- 11.2: the budget --------------------------------------------------------------------

def fastest() -> Plan:
    return budget.fastest_plan(Budget())  # found by trying every plan (kept once found)


def rejection(plan: Plan) -> str:
    """The report of a plan the judge refuses, as one line (checked: no checker code)."""
    return shown_report(nb11.capstone_budget, lambda: plan, capstone, budget)


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


def test_numpy_integers_in_a_plan_count_as_whole_numbers(capsys):
    best = fastest()
    as_numpy = Plan(np.int64(best.micro_batch), np.int64(best.accum_steps),
                    np.int64(best.nproc), zero_stage=best.zero_stage,
                    bucket_kib=best.bucket_kib)
    assert "none is faster" in passed(as_numpy, capsys)


def test_the_checker_accepts_a_plan_of_every_split_that_fits(capsys):
    """At least two families of good answers: the fastest plan of each split that fits passes,
    whichever split the learner chose."""
    families = budget.splits_that_fit(Budget())
    assert len(families) >= 2
    for plans in families.values():
        passed(min(plans, key=lambda p: budget.run_seconds(p, Budget())), capsys)


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
    seconds, cap = budget.run_seconds(plan, Budget()), Budget().time_cap_s
    assert f"time: {seconds:.2f} s for 100 steps, {seconds - cap:.2f} s over the {cap:.2f} s " \
           "cap" in shown
    assert "the compute fits, the communication it does not hide takes it over" in shown
    assert "memory" not in shown and "bucket_kib" not in shown


def test_a_plan_over_both_caps_names_both():
    plan = Plan(16, 2, 1)  # one process, micro-batch 16
    shown = rejection(plan)
    memory, seconds = budget.memory_kib(plan)["total"], budget.run_seconds(plan, Budget())
    assert f"memory: {memory:.0f} KiB" in shown and f"time: {seconds:.2f} s" in shown
    assert "the compute alone is over the cap" in shown


@pytest.mark.parametrize("plan, words", [
    (Plan(8, 2, 4, 64, 1), "4 processes x 2 accumulation steps x 8 examples = 64, but"),
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


def test_a_slower_plan_passes_without_the_course_plan_and_the_fastest_shows_it(monkeypatch,
                                                                             capsys):
    """A plan that fits but is slower passes; the course's answer stays hidden until the
    learner finds one as fast (a student copy shows it beside theirs after a pass)."""
    from course_lib.check import checker
    shown = []
    monkeypatch.setattr(checker, "show_beside", lambda exercise_id, answer: shown.append(answer))
    assert "shown once yours is as fast" in passed(Plan(8, 1, 4, zero_stage=1), capsys)
    assert shown == []
    passed(fastest(), capsys)
    assert len(shown) == 1


@pytest.mark.parametrize("search", [budget.fastest_plan, budget.fitting_plans, budget.every_plan,
                                    budget.splits_that_fit])
def test_a_plan_taken_from_the_courses_search_is_refused(search):
    def my_plan():
        found = search(Budget())  # a plan, a list or tuple of plans, or {split: plans}
        found = next(iter(found.values())) if isinstance(found, dict) else found
        return found if isinstance(found, Plan) else found[0]
    hint = shown_report(nb11.capstone_budget, my_plan, capstone, budget)
    assert f"your my_plan calls budget.{search.__name__}, which tries every plan" in hint


def test_zero_on_one_process_is_refused():
    assert "zero_stage=2 on one process" in rejection(Plan(32, 1, 1, 64, 2))
