"""Notebook 02's checkers: the reference answers pass; realistic wrong answers (of the wrong
kind, calling the notebook's memory functions, counting elements or too few copies) get the
hint that names their mistake, in a short report without checker code."""

import math

import numpy as np
import torch
from check_reports import standard_tests

from course_lib.check.nb02 import accumulation_plan, training_bytes
from course_lib.lessons import memory

COPIES = {"sgd": 0, "momentum": 1, "adam": 2}


def right_bytes(model, name):
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return (2 + COPIES[name]) * params


def elements(model):
    return sum(p.numel() for p in model.parameters())


def measured(model, name):  # the notebook's measurement instead of a count
    optimizer = torch.optim.Adam(model.parameters()) if name == "adam" else \
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9 if name == "momentum" else 0)
    x, y = torch.randn(4, 2, dtype=next(model.parameters()).dtype), torch.tensor([0, 1, 0, 1])
    parts = memory.memory_breakdown(model, optimizer, x, y)
    return parts["parameters"] + parts["gradients"] + parts["optimizer state"]


def state_dict_bytes(model, name):  # counts the buffers (BatchNorm's statistics) too
    tensors = model.state_dict().values()
    return (2 + COPIES[name]) * sum(t.numel() * t.element_size() for t in tensors)


def adam_steps_counted(model, name):  # adds Adam's step counters, which the text leaves out
    return right_bytes(model, name) + 8 * len(list(model.parameters())) * (name == "adam")


BYTES_MISTAKES = [
    (lambda m, n: (2 + COPIES[n]) * elements(m), "you count numbers, not bytes"),
    (lambda m, n: right_bytes(m, n) // (2 + COPIES[n]) * (1 + COPIES[n]),
     "one copy of the parameters' size is missing for every optimizer"),
    (lambda m, n: 4 * (2 + COPIES[n]) * elements(m), "this model is float64"),
    (lambda m, n: right_bytes(m, n) - (n == "adam") * right_bytes(m, n) // 4,
     "adam: you count 1 copy of optimizer state"),
    (lambda m, n: right_bytes(m, n) + (n == "momentum") * right_bytes(m, n) // 3,
     "momentum: you count 2 copies of optimizer state"),
    (lambda m, n: float(right_bytes(m, n)), "return a whole number of bytes (an int); your "
                                            "code returned the float"),
    (measured, "calls the notebook's memory functions"),
    (state_dict_bytes, "bytes of buffers (BatchNorm's running statistics), and you count them"),
    (adam_steps_counted, "those are Adam's step counts (one per parameter), which this exercise "
                         "leaves out"),
    (lambda m, n: memory.parameter_bytes(m) * (2 + COPIES[n]),
     "calls the notebook's memory functions"),
]


def right_steps(budget, fixed, per_example, global_batch):
    largest = math.floor((budget - fixed) / per_example)
    if largest < 1:
        raise ValueError("not even one example fits")
    return math.ceil(global_batch / largest)


def asserts_room(budget, fixed, per_example, global_batch):  # an AssertionError
    largest = (budget - fixed) // per_example
    assert largest >= 1, "no room"
    return math.ceil(global_batch / largest)


def checks_fixed_only(budget, fixed, per_example, global_batch):  # 5 bytes left: 0 fit
    if fixed >= budget:
        raise ValueError("no room")
    return math.ceil(global_batch / ((budget - fixed) // per_example))


def room_not_floored(budget, fixed, per_example, global_batch):  # 26.7 examples "fit"
    if budget - fixed < per_example:
        raise ValueError("no room")
    return math.ceil(global_batch / ((budget - fixed) / per_example))


def with_the_library(budget, fixed, per_example, global_batch):
    largest = memory.largest_batch_that_fits(budget, fixed, per_example)
    return memory.accumulation_steps_needed(global_batch, largest)


PLAN_MISTAKES = [
    (lambda b, f, e, g: max(1, g // ((b - f) // e)), "you round the number of micro-steps "
                                                     "down"),
    (lambda b, f, e, g: math.ceil(g / (b // e)), "leaves the fixed memory (parameters, "
                                                 "gradients, optimizer state) out"),
    (lambda b, f, e, g: math.ceil(g / ((b - f) // e)) if b > f else 1,
     "not even one example fits, yet your code returned the int 1, not a ValueError"),
    (lambda b, f, e, g: math.ceil(g / ((b - f) // e)), "your code returned the int 0"),
    (lambda b, f, e, g: math.ceil(g / max(0, (b - f) // e)),
     "budget 1000, fixed 2000, 10 per example: not even one example fits: the exercise asks "
     "for a ValueError here, not the ZeroDivisionError your code raised"),
    (asserts_room, "the exercise asks for a ValueError here, not the AssertionError"),
    (checks_fixed_only, "budget 5000, fixed 4995, 10 per example: not even one example fits: "
                        "the exercise asks for a ValueError here, not the ZeroDivisionError"),
    (room_not_floored, "the memory left holds 16.7 examples' worth of bytes, but a "
                       "micro-batch holds whole examples: with 3 micro-steps one holds 17, "
                       "10100 bytes in all, over the budget"),
    (lambda b, f, e, g: g / ((b - f) / e), "a whole number of micro-steps (an int, rounded); "
                                           "your code returned the float"),
    (with_the_library, "calls memory.largest_batch_that_fits, the course's own version"),
    (lambda b, f, e, g: math.ceil(g / math.floor((b - f) / e)) + 1, "is more than needed"),
    (lambda b, f, e, g: 1, "with 1 micro-step(s) a micro-batch holds more examples than fit"),
]


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((training_bytes, [right_bytes, lambda m, n: np.int64(right_bytes(m, n))],
                    BYTES_MISTAKES),
                   (accumulation_plan,
                    [right_steps, lambda *case: torch.tensor(right_steps(*case))], PLAN_MISTAKES))
