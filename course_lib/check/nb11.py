"""Checkers for the exercises of notebook 11 (capstone)."""

from __future__ import annotations

from typing import Callable

from course_lib.check.core import ExerciseError, exercise, expect
from course_lib.lessons import capstone
from course_lib.lessons.capstone import KIB, Challenge
from course_lib.runtime.launch import LaunchError


def linear_memory(fixed: int, per_example: int) -> Callable[[int], int]:
    """A made-up memory model: fixed bytes plus per_example bytes for each example."""
    return lambda b: fixed + per_example * b


def measured_memory(challenge: Challenge) -> Callable[[int], int]:
    """The real one: bytes per process of the trainer's model for a micro-batch (measured)."""
    return lambda b: capstone.memory_per_process(b, challenge)["total"]


def _largest_cases():
    real = Challenge()
    return [(linear_memory(400, 50), 1000, 32),  # 12 fit; 8 is the largest divisor of 32
            (linear_memory(400, 50), 800, 16),  # exactly 8 fit: 400 + 50 x 8 = 800
            (linear_memory(400, 50), 650, 12),  # 5 fit; divisors of 12: 4
            (linear_memory(400, 50), 420, 8),  # not even one
            (linear_memory(0, 1), 10**6, 24),  # everything fits
            (measured_memory(real), real.budget_bytes, 16)]


@exercise("11.1")
def largest_micro_batch(my_largest) -> None:
    """``my_largest(memory_of, budget_bytes, examples)``: the largest micro-batch that fits."""
    for memory_of, budget, examples in _largest_cases():
        want = capstone.largest_micro_batch(memory_of, budget, examples)
        got = my_largest(memory_of, budget, examples)
        case = f"budget {budget} bytes, {examples} examples per process"
        expect(isinstance(got, int) and not isinstance(got, bool),
               f"{case}: return a whole number (the micro-batch), not {got!r}")
        expect(want > 0 or got == 0, f"{case}: not even one example fits "
                                     f"(memory_of(1) = {memory_of(1)}); return 0")
        expect(got == 0 or examples % got == 0,
               f"{case}: {got} does not divide {examples}; every micro-step of every process "
               "must have the same size, so pick a divisor")
        expect(got == 0 or memory_of(got) <= budget,
               f"{case}: micro-batch {got} needs memory_of({got}) = {memory_of(got)} bytes, "
               "more than the budget")
        expect(not (got < want and memory_of(want) == budget),
               f"{case}: memory_of({want}) = {budget} is exactly the budget, and that fits "
               "(<=, not <)")
        expect(got == want, f"{case}: micro-batch {want} also fits and divides {examples}; "
                            f"return the largest, not {got}")


def _fewest_cases():
    real = Challenge()
    made_up = linear_memory(400, 50)  # 12 examples fit in 1000 bytes
    return [(measured_memory(real), real.budget_bytes, real.global_batch, n) for n in (1, 2, 4)] \
        + [(made_up, 1000, 36, 2), (made_up, 1000, 36, 3),
           (made_up, 1000, 24, 3),  # a tie at 1 micro-step: 2 x 1 x 12 and 3 x 1 x 8
           (made_up, 1000, 30, 4),  # 4 processes cannot share 30 examples evenly
           (made_up, 420, 8, 2)]  # nothing fits


def _judge_split(got, want, memory_of, budget, size, max_nproc) -> None:
    case = f"global batch {size}, budget {budget} bytes, at most {max_nproc} processes"
    if want is None:
        expect(got is None, f"{case}: nothing fits; return None, not {got!r}")
        return
    expect(got is not None, f"{case}: {want} fits; return it instead of None")
    try:
        got = capstone.as_split(got)
    except (TypeError, ValueError) as e:
        raise ExerciseError(f"{case}: {e}") from None
    expect(got.global_batch == size, f"{case}: {got} = {got.global_batch}; nproc x "
                                     f"accum_steps x micro_batch must equal {size}")
    expect(got.nproc <= max_nproc, f"{case}: {got.nproc} processes is over the maximum")
    expect(memory_of(got.micro_batch) <= budget,
           f"{case}: micro-batch {got.micro_batch} does not fit the budget")
    expect(got.accum_steps <= want.accum_steps,
           f"{case}: {want} needs {want.accum_steps} micro-steps, fewer than your "
           f"{got.accum_steps}; try every process count up to {max_nproc}")
    expect(got.nproc <= want.nproc, f"{case}: {want} and {got} both need {got.accum_steps} "
                                    "micro-step(s); on a tie take fewer processes (less "
                                    "communication)")


@exercise("11.2")
def fewest_micro_steps(my_fewest) -> None:
    """``my_fewest(memory_of, budget_bytes, global_batch, max_nproc)``: the quickest split."""
    for memory_of, budget, size, max_nproc in _fewest_cases():
        want = capstone.fewest_micro_steps(memory_of, budget, size, max_nproc)
        got = my_fewest(memory_of, budget, size, max_nproc)
        _judge_split(got, want, memory_of, budget, size, max_nproc)


def _first(problems: list[str]) -> None:
    expect(not problems, problems[0] if problems else "")


@exercise("11.3")
def capstone_run(my_split, challenge: Challenge | None = None,
                 runner: Callable = capstone.run_split) -> None:
    """``my_split()`` returns (nproc, accum_steps, micro_batch); the split is trained for real
    by ``runner`` (``capstone.run_split``: the training entry point) and judged."""
    challenge = challenge or Challenge()
    try:
        split = capstone.as_split(my_split())
    except (TypeError, ValueError) as e:
        raise ExerciseError(str(e)) from None
    _first(capstone.problems_before_training(split, challenge))
    print(f"training {split.nproc} process(es) x {split.accum_steps} micro-steps x "
          f"micro-batch {split.micro_batch} for {challenge.steps} steps ...")
    try:
        run = runner(split, challenge)
    except LaunchError as e:
        raise ExerciseError(f"the run failed: {str(e).splitlines()[0]}") from None
    _first(capstone.problems_after_training(run, challenge))
    used = capstone.memory_per_process(split.micro_batch, challenge)["total"]
    print(f"global batch {challenge.global_batch} = {split}; {used / KIB:.0f} KiB per process "
          f"(budget {challenge.budget_kib}); final loss {run['final_loss']:.3f} (target < "
          f"{challenge.target_loss})")
    best = capstone.fewest_micro_steps(measured_memory(challenge), challenge.budget_bytes,
                                       challenge.global_batch, challenge.max_nproc)
    print(f"{split.accum_steps} micro-step(s) per optimizer step on each process; the fewest "
          f"with up to {challenge.max_nproc} processes: {best.accum_steps} ({best})")

