"""Checkers for the exercises of notebook 02 (batches and memory)."""

from __future__ import annotations

import math

import torch

from course_lib.check.core import exercise, expect
from course_lib.lessons import memory
from course_lib.tasks import toy

_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}  # optimizer state: copies of the params


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


@exercise("2.1")
def training_bytes(my_training_bytes) -> None:
    """``my_training_bytes(model, optimizer_name)``: parameters + gradients + optimizer state."""
    models = [toy.make_mlp(hidden=16, seed=0),
              toy.make_mlp(hidden=24, depth=3, seed=1, dtype=torch.float64)]
    for model in models:
        params = memory.parameter_bytes(model)
        element = next(model.parameters()).element_size()
        for name, copies in _STATE_COPIES.items():
            got = my_training_bytes(model, name)
            want = _measured_training_bytes(model, name)
            expect(isinstance(got, int), f"return a whole number of bytes, not {got!r}")
            expect(got * element != want,
                   "you count elements, not bytes: multiply by p.element_size() (4 for "
                   "float32, 8 for float64)")
            expect(element == 4 or got * element != want * 4,
                   "this model is float64: 8 bytes a number. Do not assume 4; ask each tensor "
                   "with p.element_size()")
            expect(got != want - params,
                   f"{name}: one copy of the parameters is missing. The gradients take as "
                   f"much room as the parameters, and {name} keeps {copies} copies of its own")
            expect(got == want,
                   f"{name}, {params} bytes of parameters: expected {want} bytes, got {got}. "
                   "Count parameters + gradients + optimizer state (SGD keeps none, momentum "
                   "one copy, Adam two: the running mean and the running mean of squares)")


@exercise("2.2")
def accumulation_plan(my_accum_steps) -> None:
    """``my_accum_steps(budget, fixed, per_example, global_batch)``: fewest micro-steps that fit."""
    cases = [(10_000, 2_000, 100, 64),  # room for 80 examples: 1 step
             (10_000, 5_000, 100, 230),  # 50 fit: 5 micro-steps (50, 50, 50, 50, 30)
             (10_000, 2_000, 100, 160),  # exactly 2 full micro-steps
             (5_050, 5_000, 10, 12)]  # 5 fit: 3 micro-steps
    for budget, fixed, per_example, global_batch in cases:
        largest = math.floor((budget - fixed) / per_example)
        want = math.ceil(global_batch / largest)
        got = my_accum_steps(budget, fixed, per_example, global_batch)
        expect(got != math.ceil(global_batch / math.floor(budget / per_example)) or got == want,
               "the fixed memory (parameters, gradients, optimizer state) comes first: only "
               "budget - fixed is left for activations")
        expect(got != math.floor(global_batch / largest) or got == want,
               f"budget {budget}, fixed {fixed}, {per_example} per example, global batch "
               f"{global_batch}: round the number of micro-steps up, or the last examples "
               "are left out")
        expect(got == want, f"budget {budget}, fixed {fixed}, {per_example} per example, "
                            f"global batch {global_batch}: expected {want} micro-steps, got {got}")
    try:
        my_accum_steps(1_000, 2_000, 10, 64)
    except ValueError:
        return
    except ZeroDivisionError:
        pass
    expect(False, "when not even one example fits (fixed memory above the budget), raise "
                  "ValueError with a message that says so")
