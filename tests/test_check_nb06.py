"""Notebook 06's checkers: the reference answers pass, realistic wrong answers (a wrong kind of
value, the course's own solution called, a wrong computation) get a short, pointed hint."""

import itertools
import math

import numpy as np
import pytest
import torch
from check_reports import hint_of, standard_tests

from course_lib.check.cases import ring
from course_lib.check.checker import ExerciseError
from course_lib.check.nb06 import reduce_scatter_step, ring_bytes
from course_lib.core.collectives import chunk_bounds
from course_lib.lessons import network_sim, ring_viz


def reference_step(chunks, step):
    n = len(chunks)
    for r in range(n):  # in place is safe: no rank sends the chunk it receives in this step
        c = (r - step - 1) % n
        chunks[(r + 1) % n][c] = chunks[(r + 1) % n][c] + chunks[r][c]
    return chunks


def shifted(offset=1, towards=1, adds=True):
    def step_fn(chunks, step):
        n = len(chunks)
        new = [list(row) for row in chunks]
        for r in range(n):
            c, to = (r - step - offset) % n, (r + towards) % n
            new[to][c] = chunks[to][c] + chunks[r][c] if adds else chunks[r][c].clone()
        return new
    return step_fn


def no_return(chunks, step):
    reference_step(chunks, step)  # right work, but the result is not returned


def library_step(chunks, step):
    n = len(chunks)
    sends = tuple(ring_viz.send_chunk(r, step, n, ring_viz.REDUCE_SCATTER) for r in range(n))
    return ring_viz.apply_step(chunks, ring_viz.RingStep(ring_viz.REDUCE_SCATTER, step, sends),
                               lambda mine, incoming: mine + incoming)


def test_the_library_step_would_give_the_right_chunks():
    """So only the check on the call stops it, not its result."""
    chunks = [[torch.tensor([float(10 * r + c)]) for c in range(3)] for r in range(3)]
    mine = reference_step([list(row) for row in chunks], 1)
    assert all(torch.equal(a, b) for ra, rb in zip(mine, library_step(chunks, 1), strict=True)
               for a, b in zip(ra, rb, strict=True))


REDUCE_SCATTER_STEP_MISTAKES = [
    (shifted(offset=0), "a neighbouring chunk of the right one"),
    (shifted(offset=2), "a neighbouring chunk of the right one"),
    (shifted(adds=False), "replaced its copy with the incoming chunk"),
    (shifted(towards=-1), "went to the left-hand neighbour"),
    (lambda chunks, step: chunks, "nothing changed in step 0"),
    (no_return, "ends without `return` gives None"),
    (lambda chunks, step: torch.stack([torch.cat(row) for row in chunks]),
     "your code returned a tensor of shape (2, 6)"),
    (library_step, "ring_viz.apply_step"),
]


def reference_bytes(numel, world_size, element_size):
    sizes = [b - a for a, b in chunk_bounds(numel, world_size)]
    if world_size == 1:
        return [0]
    return [(2 * numel - sizes[r] - sizes[(r + 1) % world_size]) * element_size
            for r in range(world_size)]


def numpy_bytes(numel, world_size, element_size):  # a list of numpy integers
    s = np.array([b - a for a, b in chunk_bounds(numel, world_size)])
    return list((2 * s.sum() - s - np.roll(s, -1)) * element_size) if world_size > 1 else [0]


def reduce_scatter_only(numel, n, size):
    sizes = [b - a for a, b in chunk_bounds(numel, n)]
    return [(numel - sizes[r]) * size for r in range(n)]


def every_rank_alike(numel, n, size):
    return [2 * (n - 1) * numel * size // n] * n


RING_BYTES_MISTAKES = [
    (every_rank_alike, "do not split evenly"),
    (lambda numel, n, size: [v // size for v in reference_bytes(numel, n, size)],
     "those are elements, not bytes"),
    (lambda numel, n, size: [2 * (n - 1) * numel * size] * n, "a whole tensor in every step"),
    (reduce_scatter_only, "counts the reduce-scatter only"),
    (lambda numel, n, size: [(2 * numel - 2 * numel // n) * size] * n if n > 1 else [0],
     "do not split evenly"),
    (lambda numel, n, size: 2 * (n - 1) * numel * size / n, "your code returned the float"),
    (lambda numel, n, size: [str(b) for b in reference_bytes(numel, n, size)],
     "your code returned the str"),
    (lambda numel, n, size: ring_viz.bytes_sent_per_rank(numel, n, size),
     "ring_viz.bytes_sent_per_rank"),
    (lambda numel, n, size: list(network_sim.simulate(
        "ring", n, numel * size, "PCIe 4.0 x16", element_size=size).bytes_sent),
     "network_sim.simulate"),
]


def test_one_rank_sends_nothing():
    def counts_alone_too(numel, n, size):
        return [2 * numel * size] if n == 1 else reference_bytes(numel, n, size)

    assert "alone (world_size 1)" in hint_of(ring_bytes, counts_alone_too)


# ---- exercise 6.3's judgement of what one launch measured (no processes started) ----------

def bytes_by_rank(numel: int, n: int, element_size: int, sizes: list[int], a: int) -> dict:
    """What each rank of a right ring sends with chunks of ``sizes``, ranks finishing chunk
    r - a + 1 (the course's ring: a = 1), as the tracer counts it."""
    steps = (ring_viz.phase_steps(n, ring_viz.REDUCE_SCATTER, send=a)
             + ring_viz.phase_steps(n, ring_viz.ALL_GATHER, send=a - 1))
    return {r: {"numel": numel, "element_size": element_size,
                "bytes_sent": sum(sizes[step.sends[r]] for step in steps) * element_size}
            for r in range(n)}


def chunk_sizes(numel: int, n: int) -> list[tuple[int, ...]]:
    """Every cut of ``numel`` into N chunks of at most numel / N, rounded up, each (the
    notebook's rule): the larger first or last, torch.chunk's when it gives N chunks..."""
    largest = -(-numel // n)
    return [sizes for sizes in itertools.product(range(largest + 1), repeat=n)
            if sum(sizes) == numel]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_any_right_ring_sends_its_share_in_every_case_however_it_cuts(n):
    for spec in ring.case_specs(n, {}):
        numel, size = math.prod(spec["shape"]), 4
        for sizes in chunk_sizes(numel, n):
            for a in range(n):
                ring.judge_bytes(bytes_by_rank(numel, n, size, sizes, a), n)


def bytes_hint(sent: list[int], numel: int = 12, size: int = 4) -> str:
    by_rank = {r: {"numel": numel, "element_size": size, "bytes_sent": b}
               for r, b in enumerate(sent)}
    with pytest.raises(ExerciseError) as caught:
        ring.judge_bytes(by_rank, len(sent))
    return str(caught.value)


def test_too_many_bytes_are_named_by_what_they_are():
    assert bytes_hint([96, 96]).startswith("each rank sent 96 bytes for a 48-byte tensor: the "
                                           "whole tensor in every step")
    naive = bytes_hint([96, 48, 48])  # rank 0 sums and sends the sum to both others
    assert naive.startswith("rank 0 sent 96 bytes for a 48-byte tensor on 3 ranks, more than "
                            "a ring sends: 2(N-1)/N of the tensor, 64 bytes here, give or take "
                            "one chunk (16 bytes)"), naive


@pytest.mark.parametrize("found, words", [
    ({"library": ["ring_all_reduce"]}, "calls the library's ring_all_reduce"),
    ({"collectives": ["all_gather"]}, "calls dist.all_gather"),
    ({"unwaited": [{"kind": "irecv", "peer": 1, "line": 16}]},
     "rank 0 returned without waiting for its irecv from rank 1 (line 16)"),
    ({"calls": ["isend", "recv"]}, "ring_all_reduce calls dist.recv, which blocks"),
    ({"touched": [{"kind": "isend", "peer": 1, "line": 14}]},
     "rank 0 changed the tensor of its isend to rank 1 (line 14) before that isend's wait()"),
    ({"forwarded": [{"line": 20, "peer": 2, "recv_line": 21}]},
     "rank 0 sent, at line 20, values that its irecv from rank 2 (line 21) had not finished"),
])
def test_a_collective_a_library_call_or_an_open_handle_is_named(found, words):
    with pytest.raises(ExerciseError) as caught:
        ring.judge_calls(0, {"library": [], "collectives": [], "calls": ["irecv", "isend"],
                             "unwaited": [], "touched": [], "forwarded": [], **found})
    assert words in str(caught.value)


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((reduce_scatter_step, [reference_step], REDUCE_SCATTER_STEP_MISTAKES,
                    ("(r - s - 1)", "(r - step - 1)")),
                   (ring_bytes, [reference_bytes, numpy_bytes], RING_BYTES_MISTAKES,
                    ("every chunk but",)))
