"""Checkers for the exercises of notebook 06 (all-reduce from scratch)."""

from __future__ import annotations

import torch

from course_lib.check.core import exercise, expect
from course_lib.core.collectives import chunk_bounds
from course_lib.lessons import ring_viz

RS_HINT = ("in reduce-scatter step s, rank r sends chunk (r - s - 1) mod N to rank (r + 1) mod N, "
           "which adds it to its own copy of that chunk")


def random_chunks(world_size: int, numel: int, seed: int) -> list[list[torch.Tensor]]:
    """chunks[r][c]: rank r's copy of chunk c, chunk sizes as chunk_bounds cuts them."""
    g = torch.Generator().manual_seed(seed)
    flat = [torch.randn(numel, generator=g, dtype=torch.float64) for _ in range(world_size)]
    return [[f[a:b].clone() for a, b in chunk_bounds(numel, world_size)] for f in flat]


def copy_chunks(chunks):
    return [[c.clone() for c in row] for row in chunks]


def same_chunks(a, b) -> bool:
    pairs = [(x, y) for row_a, row_b in zip(a, b, strict=True)
             for x, y in zip(row_a, row_b, strict=True)]
    return all(x.shape == y.shape and torch.allclose(x, y, rtol=1e-12, atol=1e-12)
               for x, y in pairs)


def well_formed(got, world_size: int) -> bool:
    return (isinstance(got, (list, tuple)) and len(got) == world_size
            and all(isinstance(row, (list, tuple)) and len(row) == world_size
                    and all(isinstance(c, torch.Tensor) for c in row) for row in got))


def ring_step(chunks, step: int, combine):
    rs = ring_viz.RingStep(ring_viz.REDUCE_SCATTER, step,
                           tuple(ring_viz.send_chunk(r, step, len(chunks), ring_viz.REDUCE_SCATTER)
                                 for r in range(len(chunks))))
    return ring_viz.apply_step(chunks, rs, combine)


def check_one_step(step_fn, state, step: int):
    """Run the learner's step on a copy; return its result, or raise with a pointed hint."""
    n = len(state)
    got = step_fn(copy_chunks(state), step)
    expect(well_formed(got, n), f"return the chunks after the step: a list of {n} lists "
                                f"(one per rank) of {n} chunk tensors each")
    expected = ring_step(state, step, lambda mine, incoming: mine + incoming)
    if not same_chunks(got, expected):
        replaced = ring_step(state, step, lambda mine, incoming: incoming.clone())
        expect(not same_chunks(got, replaced),
               "the receiver replaced its copy with the incoming chunk: in reduce-scatter it "
               "must add the incoming chunk to its own copy")
        expect(False, f"step {step} with {n} ranks gave other chunks than expected: {RS_HINT}")
    return expected


@exercise("6.1")
def reduce_scatter_step(step_fn) -> None:
    """``step_fn(chunks, step)`` returns the state after reduce-scatter step ``step``."""
    for world_size, numel in ((2, 6), (3, 7), (4, 9), (5, 5)):
        state = random_chunks(world_size, numel, seed=world_size)
        total = [sum(state[r][c] for r in range(world_size)) for c in range(world_size)]
        for step in range(world_size - 1):
            state = check_one_step(step_fn, state, step)
        for r in range(world_size):
            expect(torch.allclose(state[r][r], total[r]),
                   f"after N-1 steps rank {r} should hold the full sum of chunk {r}: {RS_HINT}")


@exercise("6.2")
def ring_bytes(count_fn) -> None:
    """``count_fn(numel, world_size, element_size)``: bytes each rank sends in the ring."""
    cases = ((4000, 4, 4), (4001, 4, 4), (10, 3, 8), (3, 4, 4), (7, 2, 2), (100, 1, 4))
    for numel, world_size, element_size in cases:
        got = count_fn(numel, world_size, element_size)
        want = ring_viz.bytes_sent_per_rank(numel, world_size, element_size)
        expect(isinstance(got, (list, tuple)) and len(got) == world_size,
               f"return one number per rank: {world_size} numbers for {world_size} ranks")
        got = [int(v) for v in got]
        elements = ring_viz.bytes_sent_per_rank(numel, world_size, 1)
        expect(got != elements or got == want,
               "those are elements, not bytes: multiply by element_size")
        expect(got == want, f"numel={numel}, world_size={world_size}, element_size="
                            f"{element_size}: expected {want}, got {got}. Rank r sends every "
                            "chunk but chunk r in reduce-scatter and every chunk but chunk "
                            "r + 1 in all-gather; use chunk_bounds for the real chunk sizes "
                            "(they differ when N does not divide numel)")
