"""Exercise checkers of notebook 11 against the reference answers and realistic wrong ones."""

import re

import pytest

from course_lib.check.core import ExerciseError
from course_lib.check.nb11 import capstone_run, fewest_micro_steps, largest_micro_batch
from course_lib.lessons import capstone
from course_lib.lessons.capstone import Challenge, Split
from course_lib.runtime.launch import LaunchError


def not_done(*args):
    raise NotImplementedError("Exercise 11.x")


def test_largest_micro_batch(capsys):
    largest_micro_batch(capstone.largest_micro_batch)
    assert capsys.readouterr().out == "Exercise 11.1: correct.\n"

    def any_size(memory_of, budget, examples):  # forgets that micro-batches must be equal
        return max(b for b in range(1, examples + 1) if memory_of(b) <= budget)

    def strictly_below(memory_of, budget, examples):
        return max([b for b in range(1, examples + 1)
                    if examples % b == 0 and memory_of(b) < budget], default=0)

    def at_least_one(memory_of, budget, examples):
        return capstone.largest_micro_batch(memory_of, budget, examples) or 1

    for wrong, hint in [(any_size, "does not divide 32"), (strictly_below, "<=, not <"),
                        (at_least_one, "return 0")]:
        with pytest.raises(ExerciseError, match=hint):
            largest_micro_batch(wrong)
    largest_micro_batch(not_done)
    assert "Exercise 11.1: not done yet" in capsys.readouterr().out


def test_fewest_micro_steps(capsys):
    fewest_micro_steps(capstone.fewest_micro_steps)
    assert capsys.readouterr().out == "Exercise 11.2: correct.\n"

    def one_process(memory_of, budget, size, max_nproc):
        return capstone.fewest_micro_steps(memory_of, budget, size, 1)

    def most_processes_on_a_tie(memory_of, budget, size, max_nproc):
        best = None
        for nproc in range(1, max_nproc + 1):  # `<=` below: the last of a tie wins
            micro = capstone.largest_micro_batch(memory_of, budget, size // nproc)
            if size % nproc == 0 and micro and (best is None or size // (nproc * micro) <=
                                                best.accum_steps):
                best = Split(nproc, size // (nproc * micro), micro)
        return best

    def uneven_share(memory_of, budget, size, max_nproc):  # 4 processes for 30 examples
        micro = capstone.largest_micro_batch(memory_of, budget, size // max_nproc)
        return (max_nproc, 1, micro) if micro else None

    for wrong, hint in [(one_process, "fewer than your"), (most_processes_on_a_tie,
                        "on a tie take fewer processes"), (uneven_share, "must equal")]:
        with pytest.raises(ExerciseError, match=hint):
            fewest_micro_steps(wrong)
    fewest_micro_steps(not_done)
    assert "Exercise 11.2: not done yet" in capsys.readouterr().out


def refuse_to_train(split, challenge):
    raise AssertionError("a split that breaks the rules must be refused before training")


def fake_run(losses, global_batch=32, equal=True):
    def runner(split, challenge):
        return {"split": [split.nproc, split.accum_steps, split.micro_batch],
                "global_batch": global_batch, "steps": len(losses), "losses": losses,
                "final_loss": capstone.final_loss(losses, challenge.window),
                "replicas_bitwise_equal": equal, "elapsed_s": 1.0}
    return runner


@pytest.mark.parametrize("choice, hint", [
    (Split(1, 2, 16), "over the budget"),  # the trainer's default micro-batch
    (Split(1, 1, 8), "accum_steps = 4"),  # fits, but the global batch shrank to 8
    (Split(8, 1, 4), "at most 4"),
    ((2, 2, 0), "micro_batch must be a whole number"),
    ("2x2x8", "expected Split"),
])
def test_capstone_refuses_bad_splits_before_training(choice, hint):
    with pytest.raises(ExerciseError, match=hint):
        capstone_run(lambda: choice, runner=refuse_to_train)


def test_capstone_judges_the_finished_run(capsys):
    good = [2.0] * 90 + [1.6] * 10
    capstone_run(lambda: (2, 2, 8), runner=fake_run(good))
    assert capsys.readouterr().out.endswith("Exercise 11.3: correct.\n")
    with pytest.raises(ExerciseError, match="not below the target 1.75"):
        capstone_run(lambda: (2, 2, 8), runner=fake_run([2.0] * 100))
    with pytest.raises(ExerciseError, match="drifted apart"):
        capstone_run(lambda: (2, 2, 8), runner=fake_run(good, equal=False))
    with pytest.raises(ExerciseError, match="not 100"):
        capstone_run(lambda: (2, 2, 8), runner=fake_run(good[:50]))

    def crashed(split, challenge):
        raise LaunchError("rank 1 failed (exit code 1) in course_lib.train; ...\nmore")
    with pytest.raises(ExerciseError, match="the run failed: rank 1 failed"):
        capstone_run(lambda: (2, 2, 8), runner=crashed)
    capstone_run(not_done, runner=refuse_to_train)
    assert capsys.readouterr().out.endswith("Exercise 11.3: not done yet (replace the line "
                                            "that raises NotImplementedError with your code, "
                                            "then run the cell again).\n")


@pytest.mark.slow
def test_capstone_reference_answer_trains_for_real(capsys):
    """The notebook's answer, through the real training entry point on 2 processes."""
    capstone_run(lambda: Split(2, 2, 8))
    out = capsys.readouterr().out
    assert "global batch 32 = 2 x 2 x 8" in out and out.endswith("Exercise 11.3: correct.\n")
    final = float(re.search(r"final loss (\d+\.\d+)", out).group(1))
    assert 1.0 < final < Challenge().target_loss  # trained, and below the target
