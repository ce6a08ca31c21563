"""The ring all-reduce's cases (exercise 6.3), run by ``course_lib.check.mp.program``.

Each case gives every rank its own tensor and calls the learner's ``ring_all_reduce(tensor,
group)`` on it; the checker compares the caller's tensor afterwards with ``dist.all_reduce``
of the same inputs (run first, by the checker, outside the tracer). Inputs are whole numbers
from 1 to 99, so every sum is exact in any order and a wrong answer can be matched exactly
against what a known mistake would produce. The tracer counts the bytes each rank sends, for
the checker's rule: 2(N-1)/N of the tensor, give or take one chunk. On 2 processes a last case
passes a group of one process (rank 0 alone); the other cases pass ``group=None``, the default
group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.check.mp.tracer import Tracer


def case_specs(world_size: int, options: dict) -> list[dict]:
    n = world_size
    few = max(1, n - 1)
    specs = [  # (name, shape, dtype, transposed)
        ("12 float32 numbers", [12], "float32", False),
        ("11 float64 numbers (not a multiple of N)", [11], "float64", False),
        (f"{few} float32 number{'s' if few > 1 else ''}, fewer than the {n} ranks", [few],
         "float32", False),
        ("a 0-d float64 tensor", [], "float64", False),
        ("an int64 tensor of shape (2, 5)", [2, 5], "int64", False),
        ("a transposed (non-contiguous) float32 view of shape (3, 4)", [4, 3], "float32",
         True),
    ]
    specs = [{"name": name, "shape": shape, "dtype": dtype, "transposed": transposed,
              "seed": i, "ranks": n} for i, (name, shape, dtype, transposed) in enumerate(specs)]
    if n == 2:
        specs.append({"name": "5 float32 numbers, in a group of 1 process", "shape": [5],
                      "dtype": "float32", "transposed": False, "seed": 9, "ranks": 1})
    return specs


def make_input(spec: dict, rank: int) -> torch.Tensor:
    """Rank ``rank``'s tensor in case ``spec`` (a transposed view where the case says so)."""
    g = torch.Generator().manual_seed(1000 * spec["seed"] + rank)
    values = torch.randint(1, 100, spec["shape"], generator=g).to(getattr(torch, spec["dtype"]))
    return values.t() if spec["transposed"] else values


def flat_list(tensor: torch.Tensor) -> list:
    return tensor.detach().flatten().tolist()  # in the order of the logical shape


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    function = getattr(learner, options.get("function", "ring_all_reduce"))
    tensor = make_input(spec, dist.get_rank(group))
    before = tensor.clone()
    expected = before.clone()
    dist.all_reduce(expected, group=group)  # the answer, before the tracer watches
    passed = None if spec["ranks"] == dist.get_world_size() else group
    with tracer.watching(spec["name"], range(spec["ranks"])) as log:
        returned = function(tensor, passed)
        got = flat_list(tensor)  # what the caller's tensor holds when the function returns
    other = isinstance(returned, torch.Tensor) and returned is not tensor
    return {"name": spec["name"], "ranks": spec["ranks"], "input": flat_list(before),
            "expected": flat_list(expected), "got": got, "numel": tensor.numel(),
            "element_size": tensor.element_size(),
            "returned_other": flat_list(returned) if other else None, **log.summary()}
