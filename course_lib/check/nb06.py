"""Checkers for the exercises of notebook 06 (all-reduce from scratch)."""

from __future__ import annotations

import torch

from course_lib.check.answers import as_number, expect_type
from course_lib.check.cases import ring
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_exercise
from course_lib.check.own_work import call_own
from course_lib.core.collectives import REDUCE_SCATTER, chunk_bounds
from course_lib.lessons import network_sim, ring_viz


def random_chunks(world_size: int, numel: int, seed: int) -> list[list[torch.Tensor]]:
    """chunks[r][c]: rank r's copy of chunk c, chunk sizes as chunk_bounds cuts them."""
    g = torch.Generator().manual_seed(seed)
    flat = [torch.randn(numel, generator=g, dtype=torch.float64) for _ in range(world_size)]
    return [ring_viz.split_chunks(f, chunk_bounds(numel, world_size)) for f in flat]


def copy_chunks(chunks):
    return [[c.clone() for c in row] for row in chunks]


def same_chunks(a, b) -> bool:
    pairs = [(x, y) for row_a, row_b in zip(a, b, strict=True)
             for x, y in zip(row_a, row_b, strict=True)]
    return all(x.shape == y.shape and torch.allclose(x, y, rtol=1e-12, atol=1e-12)
               for x, y in pairs)


def check_shape(got, world_size: int) -> None:
    what = (f"return the chunks after the step: a list of {world_size} lists (one per rank) "
            f"of {world_size} chunk tensors each")
    expect_type(got, (list, tuple), what)
    expect(len(got) == world_size, f"{what}, not {len(got)} lists")
    for row in got:
        expect_type(row, (list, tuple), what)
        expect(len(row) == world_size, f"{what}; one row has {len(row)}")
        for chunk in row:
            expect_type(chunk, torch.Tensor, what)


def one_step(chunks, step: int, *, send: int = 1, towards: int = 1, adds: bool = True):
    """Reduce-scatter step ``step``: rank r sends chunk (r - step - send) mod N to rank
    (r + towards) mod N, which adds it (or, with ``adds=False``, takes it)."""
    ring_step = ring_viz.phase_steps(len(chunks), REDUCE_SCATTER, send, towards=towards,
                                     adds=adds)[step]
    return ring_viz.apply_step(chunks, ring_step, ring_viz.add)


def name_step_mistake(state, got, step: int) -> None:
    """Raise with a hint naming the mistake ``got`` made, if it is one we know."""
    expect(not same_chunks(got, state), f"nothing changed in step {step}: in every step every "
                                        "rank sends one chunk to its neighbour")
    expect(not same_chunks(got, one_step(state, step, adds=False)),
           "the receiver replaced its copy with the incoming chunk: in a reduce-scatter the "
           "incoming chunk is combined with the receiver's own copy")
    expect(not same_chunks(got, one_step(state, step, towards=-1)),
           "the chunks went to the left-hand neighbour: in this ring every rank sends to the "
           "rank on its right")
    for send in (0, 2):
        expect(not same_chunks(got, one_step(state, step, send=send)),
               f"in step {step} each rank sent a neighbouring chunk of the right one: check "
               "which chunk rank 0 sends in step 0, then how that moves from step to step")
    n = len(state)
    expect(False, f"step {step} with {n} ranks gave other chunks than expected: rank r sends "
                  "one chunk to rank r + 1, which adds it to its own copy of that chunk")


def check_one_step(step_fn, state, step: int):
    """Run the learner's step on a copy; return the right state, or raise with a hint."""
    library = [ring_viz.apply_step, ring_viz.run_steps, ring_viz.simulate_ring_all_reduce]
    got = call_own(step_fn, copy_chunks(state), step, library=library)
    check_shape(got, len(state))
    expected = one_step(state, step)
    if not same_chunks(got, expected):
        name_step_mistake(state, got, step)
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
                   f"after N-1 steps rank {r} should hold the full sum of chunk {r}")


def _phase_bytes(sizes: list[int], skip: int, element_size: int) -> int:
    return (sum(sizes) - sizes[skip]) * element_size


def name_bytes_mistake(got: list[int], numel: int, world_size: int, element_size: int) -> None:
    """Raise with a hint naming the mistake ``got`` made, if it is one we know."""
    n, size = world_size, element_size
    sizes = [b - a for a, b in chunk_bounds(numel, n)]
    expect(n > 1 or got == [0], f"alone (world_size 1) a rank has no one to send to; you "
                                f"counted {got[0]} bytes")
    expect(got != ring_viz.bytes_sent_per_rank(numel, n, 1),
           "those are elements, not bytes: each element is element_size bytes")
    expect(got != [2 * (n - 1) * numel * size] * n,
           "that is a whole tensor in every step; a ring step sends one chunk")
    expect(got != [_phase_bytes(sizes, r, size) for r in range(n)],
           "that counts the reduce-scatter only: the all-gather sends chunks too")
    expect(len(set(got)) > 1 or numel % n == 0,
           f"every rank got the same count, but {numel} elements do not split evenly over "
           f"{n} ranks: chunks differ in size, and so do the ranks' counts")
    expect(False, f"numel={numel}, world_size={n}, element_size={size}: expected "
                  f"{ring_viz.bytes_sent_per_rank(numel, n, size)}, got {got}. Count the "
                  "chunks rank r sends in each phase, and which ones it does not send")


@exercise("6.2")
def ring_bytes(count_fn) -> None:
    """``count_fn(numel, world_size, element_size)``: bytes each rank sends in the ring."""
    library = [ring_viz.bytes_sent_per_rank, network_sim.simulate]
    cases = ((4000, 4, 4), (4001, 4, 4), (10, 3, 8), (3, 4, 4), (7, 2, 2), (100, 1, 4))
    for numel, world_size, element_size in cases:
        got = call_own(count_fn, numel, world_size, element_size, library=library)
        what = f"return one number per rank: a list of {world_size} for {world_size} ranks"
        expect_type(got, (list, tuple), what)
        expect(len(got) == world_size, f"{what}, not {len(got)}")
        got = [int(as_number(v, f"{what}, each a whole number of bytes")) for v in got]
        if got != ring_viz.bytes_sent_per_rank(numel, world_size, element_size):
            name_bytes_mistake(got, numel, world_size, element_size)


# ---- the ring all-reduce: the learner's own file, launched on 2, 3 and 4 processes --------

@exercise("6.3")
def my_ring(path: str = ring.EXERCISE.file, world_sizes=WORLD_SIZES) -> None:
    """``ring_all_reduce(tensor, group=None)`` in the learner's file: in place, the SUM, from
    point-to-point messages, each rank sending about 2(N-1)/N of the tensor."""
    check_exercise(ring.EXERCISE, path, world_sizes)
