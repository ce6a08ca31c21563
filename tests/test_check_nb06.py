"""Notebook 06's checkers: the reference answers pass, realistic wrong answers (a wrong kind of
value, the course's own solution called, a wrong computation) get a short, pointed hint."""

import pytest
import torch
from check_reports import shown_report

from course_lib.check.nb06 import reduce_scatter_step, ring_bytes
from course_lib.core.collectives import chunk_bounds
from course_lib.lessons import network_sim, ring_viz


def report_of(checker, answer, hint: str) -> str:
    """What the learner sees for a wrong ``answer``: it names ``hint`` (and is short and free
    of checker code: ``check_reports``)."""
    shown = shown_report(checker, answer)
    assert hint in shown, shown
    return shown


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


def test_reduce_scatter_step_reference(capsys):
    reduce_scatter_step(reference_step)
    assert capsys.readouterr().out == "Exercise 6.1: correct.\n"


def test_the_library_step_would_give_the_right_chunks():
    """So only the check on the call stops it, not its result."""
    chunks = [[torch.tensor([float(10 * r + c)]) for c in range(3)] for r in range(3)]
    mine = reference_step([list(row) for row in chunks], 1)
    assert all(torch.equal(a, b) for ra, rb in zip(mine, library_step(chunks, 1), strict=True)
               for a, b in zip(ra, rb, strict=True))


@pytest.mark.parametrize("wrong, hint", [
    (shifted(offset=0), "a neighbouring chunk of the right one"),
    (shifted(offset=2), "a neighbouring chunk of the right one"),
    (shifted(adds=False), "replaced its copy with the incoming chunk"),
    (shifted(towards=-1), "went to the left-hand neighbour"),
    (lambda chunks, step: chunks, "nothing changed in step 0"),
    (no_return, "ends without `return` gives None"),
    (lambda chunks, step: torch.stack([torch.cat(row) for row in chunks]),
     "your code returned a tensor of shape (2, 6)"),
    (library_step, "ring_viz.apply_step"),
])
def test_reduce_scatter_step_wrong_answers(wrong, hint):
    shown = report_of(reduce_scatter_step, wrong, hint)
    assert "(r - s - 1)" not in shown and "(r - step - 1)" not in shown


def reference_bytes(numel, world_size, element_size):
    sizes = [b - a for a, b in chunk_bounds(numel, world_size)]
    if world_size == 1:
        return [0]
    return [(2 * numel - sizes[r] - sizes[(r + 1) % world_size]) * element_size
            for r in range(world_size)]


def test_ring_bytes_reference(capsys):
    ring_bytes(reference_bytes)
    assert capsys.readouterr().out == "Exercise 6.2: correct.\n"


def reduce_scatter_only(numel, n, size):
    sizes = [b - a for a, b in chunk_bounds(numel, n)]
    return [(numel - sizes[r]) * size for r in range(n)]


def every_rank_alike(numel, n, size):
    return [2 * (n - 1) * numel * size // n] * n


@pytest.mark.parametrize("wrong, hint", [
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
])
def test_ring_bytes_wrong_answers(wrong, hint):
    shown = report_of(ring_bytes, wrong, hint)
    assert "every chunk but" not in shown  # the rule is the second hint's, not the first's


def test_one_rank_sends_nothing():
    report_of(ring_bytes, lambda numel, n, size: [2 * numel * size] * n if n == 1 else
              reference_bytes(numel, n, size), "alone (world_size 1)")


def test_not_done(capsys):
    def hole(*args):
        raise NotImplementedError("Exercise 6.x")

    reduce_scatter_step(hole)
    ring_bytes(hole)
    out = capsys.readouterr().out
    assert "Exercise 6.1: not done yet" in out and "Exercise 6.2: not done yet" in out
