"""Checkers for the exercises of notebook 02 (batches and memory)."""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import torch

from course_lib.check.answers import as_whole_number, expect_raises
from course_lib.check.checker import exercise, expect
from course_lib.check.own_work import call_own
from course_lib.lessons import memory
from course_lib.tasks import toy

_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}  # optimizer state: copies of the params
_COUNTING = [memory.memory_breakdown, memory.parameter_bytes, memory.gradient_bytes,
             memory.optimizer_state_bytes, memory.tensor_bytes]  # the notebook's measurements


def _measured_training_bytes(model, name: str) -> int:
    """Parameters + gradients + optimizer state after one real step, step counters left out."""
    kinds = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1),
             "momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
             "adam": lambda p: torch.optim.Adam(p, lr=0.1)}
    optimizer = kinds[name](model.parameters())
    x, y = toy.two_moons(8, seed=0, dtype=next(model.parameters()).dtype)
    measured = memory.memory_breakdown(model, optimizer, x, y)
    counters = sum(s["step"].numel() * s["step"].element_size()
                   for s in optimizer.state.values() if torch.is_tensor(s.get("step")))
    return measured["parameters"] + measured["gradients"] + measured["optimizer state"] - counters


def _training_bytes_hint(got: dict, want: dict, model) -> str:
    """What a wrong count of training memory (``got``: optimizer name -> bytes) most likely
    left out or added, judged on all three optimizers together."""
    names = list(got)
    params = memory.parameter_bytes(model)
    element = next(model.parameters()).element_size()
    buffers = sum(memory.tensor_bytes(b) for b in model.buffers())
    if buffers and all(got[n] > want[n] and (got[n] - want[n]) % buffers == 0 for n in names):
        return (f"this model has {buffers} bytes of buffers (BatchNorm's running statistics), "
                "and you count them: buffers are not parameters, so they get no gradient and "
                "no optimizer state")
    if got["sgd"] == want["sgd"] and got["momentum"] == want["momentum"] \
            and 0 < got["adam"] - want["adam"] < params:
        return (f"adam: {got['adam'] - want['adam']} bytes more than parameters, gradients "
                "and two copies of state: those are Adam's step counts (one per parameter), "
                "which this exercise leaves out")
    if all(got[n] * element == want[n] for n in names):
        return ("you count numbers, not bytes: each number takes several bytes, and a tensor "
                "can tell you how many")
    if element == 8 and all(got[n] * 2 == want[n] for n in names):
        return ("this model is float64, 8 bytes a number, and you count 4 bytes for every "
                "number")
    if all(got[n] == want[n] - params for n in names):
        return ("one copy of the parameters' size is missing for every optimizer. Besides the "
                "parameters and the optimizer's state, what does backward leave beside each "
                "parameter?")
    name = next(n for n in names if got[n] != want[n])
    copies, left = divmod(got[name] - 2 * params, params)
    if got["sgd"] == want["sgd"] and left == 0 and copies >= 0:
        return (f"{name}: you count {copies} cop{'y' if copies == 1 else 'ies'} of optimizer "
                f"state beside the parameters and the gradients; how many numbers does "
                f"{name} keep for each parameter?")
    return (f"{name}, {params} bytes of parameters: {got[name]} bytes is not parameters + "
            "gradients + optimizer state; count each of the three in bytes")


@exercise("2.1")
def training_bytes(my_training_bytes) -> None:
    """``my_training_bytes(model, optimizer_name)``: parameters + gradients + optimizer state."""
    models = [toy.make_mlp(hidden=16, seed=0),
              toy.make_mlp(hidden=24, depth=3, seed=1, dtype=torch.float64),
              toy.make_mlp(hidden=8, norm="batch", seed=2)]  # BatchNorm: buffers too
    for model in models:
        got, want = {}, {}
        for name in _STATE_COPIES:
            got[name] = as_whole_number(
                call_own(my_training_bytes, model, name, library=_COUNTING,
                         hint="your code calls the notebook's memory functions: the exercise "
                              "is to count the bytes yourself, from the parameters' sizes"),
                "return a whole number of bytes (an int)")
            want[name] = _measured_training_bytes(model, name)
        if got != want:
            expect(False, _training_bytes_hint(got, want, model))


@exercise("2.2")
def accumulation_plan(my_accum_steps) -> None:
    """``my_accum_steps(budget, fixed, per_example, global_batch)``: fewest micro-steps that fit."""
    cases = [(10_000, 2_000, 100, 64),  # room for 80 examples: 1 step
             (10_000, 5_000, 100, 230),  # 50 fit: 5 micro-steps (50, 50, 50, 50, 30)
             (10_000, 2_000, 100, 160),  # exactly 2 full micro-steps
             (5_050, 5_000, 10, 12),  # 5 fit: 3 micro-steps
             (10_000, 5_000, 300, 50),  # room for 16.7 examples: 16 fit, 4 micro-steps
             (10_000, 2_000, 300, 80)]  # 26.7: 26 fit, 4 micro-steps (3 of 27 are too big)
    library = [memory.largest_batch_that_fits, memory.accumulation_steps_needed]
    for budget, fixed, per_example, global_batch in cases:
        largest = math.floor((budget - fixed) / per_example)
        want = math.ceil(global_batch / largest)
        got = as_whole_number(call_own(my_accum_steps, budget, fixed, per_example,
                                       global_batch, library=library),
                              "return a whole number of micro-steps (an int, rounded)")
        case = (f"budget {budget}, fixed {fixed}, {per_example} per example, global batch "
                f"{global_batch}")
        room = Fraction(budget - fixed, per_example)  # examples' worth of bytes left, exactly
        micro = math.ceil(global_batch / max(got, 1))  # the largest micro-batch of the plan
        expect(got != math.ceil(global_batch / room) or got == want,
               f"{case}: the memory left holds {float(room):.3g} examples' worth of bytes, "
               f"but a micro-batch holds whole examples: with {got} micro-steps one holds "
               f"{micro}, {fixed + micro * per_example} bytes in all, over the budget")
        expect(got != math.ceil(global_batch / math.floor(budget / per_example)) or got == want,
               f"{case}: your plan leaves the fixed memory (parameters, gradients, optimizer "
               "state) out; it is in use during every micro-step")
        expect(got != math.floor(global_batch / largest) or got == want,
               f"{case}: you round the number of micro-steps down, so the last examples "
               "are left out")
        expect(got >= want, f"{case}: with {got} micro-step(s) a micro-batch holds more "
                            "examples than fit in the memory left after the fixed part")
        expect(got == want, f"{case}: {got} micro-steps is more than needed: fewer, larger "
                            "micro-batches still fit")
    for budget, fixed, per_example in ((1_000, 2_000, 10), (5_000, 4_995, 10)):
        when = (f"budget {budget}, fixed {fixed}, {per_example} per example: not even one "
                "example fits")
        run = functools.partial(call_own, my_accum_steps, budget, fixed, per_example, 64,
                                library=library)
        expect_raises(run, ValueError, when, f"{when}, yet your code returned {{got}}, not a "
                                             "ValueError")
