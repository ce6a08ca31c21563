"""Exercise checkers of notebook 02 against the reference answers and realistic wrong ones."""

import math

import pytest

from course_lib.check.core import ExerciseError
from course_lib.check.nb02 import accumulation_plan, training_bytes

COPIES = {"sgd": 0, "momentum": 1, "adam": 2}


def right_bytes(model, name):
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return (2 + COPIES[name]) * params


def test_training_bytes(capsys):
    training_bytes(right_bytes)
    assert capsys.readouterr().out == "Exercise 2.1: correct.\n"
    with pytest.raises(ExerciseError, match="element_size"):  # elements, not bytes
        training_bytes(lambda m, n: (2 + COPIES[n]) * sum(p.numel() for p in m.parameters()))
    with pytest.raises(ExerciseError, match="copy of the parameters is missing"):  # no grads
        training_bytes(lambda m, n: right_bytes(m, n) // (2 + COPIES[n]) * (1 + COPIES[n]))
    with pytest.raises(ExerciseError, match="float64"):  # assumes float32 everywhere
        training_bytes(lambda m, n: 4 * (2 + COPIES[n]) * sum(p.numel() for p in m.parameters()))
    with pytest.raises(ExerciseError, match="adam keeps 2 copies"):  # Adam with one copy only
        training_bytes(lambda m, n: right_bytes(m, n) - (n == "adam") * right_bytes(m, n) // 4)
    with pytest.raises(ExerciseError, match="momentum.*expected"):  # two momentum buffers
        training_bytes(lambda m, n: right_bytes(m, n) + (n == "momentum") * right_bytes(m, n) // 3)


def right_steps(budget, fixed, per_example, global_batch):
    largest = math.floor((budget - fixed) / per_example)
    if largest < 1:
        raise ValueError("not even one example fits")
    return math.ceil(global_batch / largest)


def test_accumulation_plan(capsys):
    accumulation_plan(right_steps)
    assert capsys.readouterr().out == "Exercise 2.2: correct.\n"
    with pytest.raises(ExerciseError, match="round the number of micro-steps up"):
        accumulation_plan(lambda b, f, e, g: max(1, g // ((b - f) // e)))
    with pytest.raises(ExerciseError, match="fixed memory"):
        accumulation_plan(lambda b, f, e, g: math.ceil(g / (b // e)))
    with pytest.raises(ExerciseError, match="raise ValueError"):  # divides by zero instead
        accumulation_plan(lambda b, f, e, g: math.ceil(g / ((b - f) // e)) if b > f else 1)


def test_not_done_yet(capsys):
    def hole(*args):
        raise NotImplementedError

    training_bytes(hole)
    accumulation_plan(hole)
    out = capsys.readouterr().out
    assert "Exercise 2.1: not done yet" in out and "Exercise 2.2: not done yet" in out
