"""Checkers for the exercises of notebook 10 (beyond data parallel)."""

from __future__ import annotations

import math

import torch

from course_lib.check.core import exercise, expect
from course_lib.core.collectives import chunk_bounds

RANGE_CASES = ((12, 4), (10, 4), (7, 3), (3, 4), (26574, 4), (5, 1))  # (numel, world size)


@exercise("10.1")
def owned_range(owned) -> None:
    """``owned(numel, world_size, rank)`` returns ``(start, end)`` of rank's chunk."""
    for numel, world_size in RANGE_CASES:
        got = [tuple(int(v) for v in owned(numel, world_size, r)) for r in range(world_size)]
        want = chunk_bounds(numel, world_size)
        if got == [tuple(b) for b in want]:
            continue
        covered = sum(end - start for start, end in got)
        expect(covered == numel, f"{numel} elements on {world_size} ranks: your chunks cover "
                                 f"{covered}; every element must be owned by exactly one rank")
        expect(got[0][0] == 0 and all(got[r][1] == got[r + 1][0] for r in range(world_size - 1)),
               f"the chunks must follow each other without gaps: got {got}")
        expect(False, f"{numel} elements on {world_size} ranks: expected {want}, got {got}; "
                      "as chunk_bounds, the first numel % world_size ranks get one more")


def reference_bytes(num_params: int, world_size: int, stage: int) -> float:
    """fp32 parameters (4 bytes), fp32 gradients (4), AdamW's two moments (8)."""
    params, grads, state = 4.0 * num_params, 4.0 * num_params, 8.0 * num_params
    shards = {0: (params, grads, state), 1: (params, grads, state / world_size),
              2: (params, grads / world_size, state / world_size),
              3: (params / world_size, grads / world_size, state / world_size)}
    return sum(shards[stage])


@exercise("10.2")
def bytes_per_rank(model) -> None:
    """``model(num_params, world_size, stage)``: bytes per rank for ZeRO stage 0..3."""
    for num_params, world_size in ((1_000_000, 4), (26574, 2), (7_000_000_000, 8)):
        for stage in range(4):
            got = float(model(num_params, world_size, stage))
            want = reference_bytes(num_params, world_size, stage)
            if math.isclose(got, want, rel_tol=1e-9):
                continue
            expect(stage != 0, f"stage 0 is plain data parallelism: 16 bytes per "
                               f"parameter on every rank = {want:.0f}, got {got:.0f}")
            names = {1: "the optimizer state", 2: "the optimizer state and the gradients",
                     3: "the optimizer state, the gradients and the parameters"}
            expect(False, f"stage {stage}, {num_params} parameters on {world_size} ranks: "
                          f"expected {want:.0f} bytes, got {got:.0f}; stage {stage} divides "
                          f"{names[stage]} by the world size, and keeps the rest whole")


@exercise("10.3")
def global_norm(norm_of_shards) -> None:
    """``norm_of_shards(shards)``: the norm of the whole gradient from its pieces."""
    g = torch.Generator().manual_seed(0)
    for sizes in ((5, 5), (3, 4, 5), (1, 10, 2, 7)):
        shards = [torch.randn(n, generator=g, dtype=torch.float64) for n in sizes]
        got = float(norm_of_shards([s.clone() for s in shards]))
        want = float(torch.cat(shards).norm())
        summed = sum(float(s.norm()) for s in shards)
        expect(not math.isclose(got, summed, rel_tol=1e-9),
               "norms do not add up: the squares do. Add the squared norms, then take the "
               "square root")
        expect(math.isclose(got, want, rel_tol=1e-9),
               f"expected {want:.6f} (the norm of all shards put together), got {got:.6f}")
