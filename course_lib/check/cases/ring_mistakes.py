"""What known mistakes in a ring all-reduce produce, so that exercise 6.3 can name them.

``simulate`` runs a ring, right or wrong, on every rank's input at once, with
``ring_viz.run_steps`` (the course's one simulation of the ring). Its chunk indices are
parameters: in reduce-scatter step s rank r sends chunk (r - s - rs_send) and adds what
arrives into chunk (r - s - rs_keep); in all-gather step s it sends chunk (r - s - ag_send)
and stores what arrives in chunk (r - s - ag_keep), all mod N. The course's ring uses
(1, 2, 0, 1); any (a, a + 1, a - 1, a) is right. ``name_mistake`` compares a learner's
results with the mean, a ring without its all-gather, one whose receivers replace where they
should add (or add where they should replace), and every wrong set of indices, with the
chunks cut the larger first (``torch.tensor_split``, ``chunk_bounds``) or the larger last;
then chunks that leave numbers out (each rank holds its own there, never summed).
``REFUSED`` names what a ring is built without: 6.3's checker reads, before any launch,
whether ``ring_all_reduce`` calls one of them (the tracer still catches a call made by way of
a helper).
"""

from __future__ import annotations

import itertools

import torch

from course_lib.check.mp.tracer import COLLECTIVES, LIBRARY, LIBRARY_MODULE
from course_lib.core.collectives import ALL_GATHER, REDUCE_SCATTER, chunk_bounds
from course_lib.lessons import ring_viz

COURSE = (1, 2, 0, 1)  # (rs_send, rs_keep, ag_send, ag_keep) of the course's ring


class _DoesNotFit(Exception):
    """A message bigger or smaller than the chunk it is received into."""


def _add_fitting(mine: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor:
    if mine.shape != incoming.shape:  # a real run fails here, it does not broadcast
        raise _DoesNotFit
    return mine + incoming


def cuts(numel: int, n: int) -> list[list[tuple[int, int]]]:
    """The chunk cuts a learner's ring may use: the larger chunks first, or last."""
    first = chunk_bounds(numel, n)
    sizes = [end - start for start, end in reversed(first)]
    ends = list(itertools.accumulate(sizes))
    return [first, [(end - size, end) for size, end in zip(sizes, ends, strict=True)]]


def simulate(inputs: list[torch.Tensor], offsets=COURSE, *, rs_adds: bool = True,
             ag_adds: bool = False, gather: bool = True,
             bounds: list[tuple[int, int]] | None = None) -> list[torch.Tensor] | None:
    """Every rank's flat tensor after the ring; None when a message would not fit its chunk.
    ``inputs``: every rank's flat tensor; ``bounds``: the chunks (``chunk_bounds`` if None)."""
    n = len(inputs)
    bounds = chunk_bounds(inputs[0].numel(), n) if bounds is None else bounds
    rs_send, rs_keep, ag_send, ag_keep = offsets
    steps = ring_viz.phase_steps(n, REDUCE_SCATTER, rs_send, rs_keep, adds=rs_adds)
    if gather:
        steps += ring_viz.phase_steps(n, ALL_GATHER, ag_send, ag_keep, adds=ag_adds)
    try:
        states = ring_viz.run_steps([ring_viz.split_chunks(x, bounds) for x in inputs], steps,
                                    _add_fitting)
    except _DoesNotFit:
        return None
    sizes = [end - start for start, end in bounds]
    if any(chunk.numel() != sizes[c] for row in states[-1] for c, chunk in enumerate(row)):
        return None  # a message replaced a chunk of another size
    return [torch.cat(row) for row in states[-1]]


def _right(a: int) -> tuple[int, int, int, int]:
    return (a, a + 1, a - 1, a)


def _is_right(offsets, n: int) -> bool:
    return any([o % n for o in offsets] == [o % n for o in _right(a)] for a in range(n))


def _same(got: list[torch.Tensor], want: list[torch.Tensor] | None) -> bool:
    return want is not None and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def formula(offset: int, n: int, step: bool = True) -> str:
    """Chunk index ``r - s - offset`` as the course writes it: (r - s - 1) % N, (r - 1) % N."""
    k, base = offset % n, "r - s" if step else "r"
    if k == 0:
        return f"({base}) % N" if step else "r"
    return f"({base} - {k}) % N"


def _wrong_indices(n: int) -> list[tuple[int, ...]]:
    """Every wrong set of the four offsets, those nearest the course's first."""
    every = itertools.product(range(n), repeat=4)
    wrong = [o for o in every if not _is_right(o, n)]

    def distance(offsets) -> int:  # how many of the four indices differ from the course's
        return sum((a - b) % n != 0 for a, b in zip(offsets, COURSE, strict=True))

    return sorted(wrong, key=distance)


def _named_by_phase(inputs, got, bounds) -> tuple | None:
    """A right ring but for one phase: no all-gather, or a receiver that adds or replaces
    where it should not."""
    for a in range(len(inputs)):
        for kind, how in (("scatter_only", {"gather": False}), ("overwrite", {"rs_adds": False}),
                          ("gather_adds", {"ag_adds": True})):
            if _same(got, simulate(inputs, _right(a), bounds=bounds, **how)):
                return (kind,)
    return None


def _named_by_indices(inputs, got, bounds) -> tuple | None:
    n = len(inputs)
    for offsets in _wrong_indices(n):
        if _same(got, simulate(inputs, offsets, bounds=bounds)):
            rs_send, rs_keep, ag_send, ag_keep = offsets
            if (rs_keep - rs_send) % n != 1:
                return ("rs_pair", offsets)
            return ("ag_pair" if (ag_keep - ag_send) % n != 1 else "ag_start", offsets)
    return None


def name_mistake(inputs: list[torch.Tensor], got: list[torch.Tensor]) -> tuple | None:
    """("mean",), ("scatter_only",), ("overwrite",), ("gather_adds",), (kind, offsets) with
    kind one of rs_pair, ag_pair, ag_start, or ("uncovered", positions, numel) for chunks that
    leave numbers out; None when no known mistake gives ``got``.

    ``inputs`` and ``got``: every rank's flat tensor, as float64.
    """
    n, total = len(inputs), sum(inputs)
    if all(torch.equal(g, total) for g in got):
        return None  # no mistake: every rank holds the sum
    if n > 1 and all(torch.allclose(g * n, total) for g in got):
        return ("mean",)
    for finder in (_named_by_phase, _named_by_indices):
        for bounds in cuts(inputs[0].numel(), n):
            found = finder(inputs, got, bounds)
            if found:
                return found
    return _never_summed(inputs, got, total)


def _never_summed(inputs, got, total) -> tuple | None:
    """("uncovered", positions, numel): every rank holds the sum but at ``positions``, where
    it holds its own input (the chunks left those numbers out); None otherwise. Inputs are
    positive, so a number left out never equals its sum."""
    left_out = [g != total for g in got]
    positions = torch.nonzero(left_out[0]).flatten().tolist()
    if not positions or any(not torch.equal(m, left_out[0]) for m in left_out):
        return None
    if any(not torch.equal(g[m], x[m]) for g, x, m in zip(got, inputs, left_out, strict=True)):
        return None
    return ("uncovered", positions, total.numel())


PHASE_HINTS = {
    "mean": "every rank holds the sum divided by N, the mean: ring_all_reduce must leave the "
            "SUM, as dist.all_reduce does (a data-parallel step divides by N itself, later)",
    "scatter_only": "each rank holds the full sum in one chunk only: the reduce-scatter is "
                    "done, but not the all-gather, which passes every finished chunk once round "
                    "the ring so that each rank ends with all of them",
    # an all-gather one chunk late gives the very same numbers: name both
    "overwrite": "each chunk of the result is one rank's own numbers, not a sum. Either the "
                 "reduce-scatter replaces its chunk with the incoming one instead of adding to "
                 "it, or the all-gather starts one chunk late, from a chunk the reduce-scatter "
                 "never added to",
    "gather_adds": "every chunk holds more than the sum: the all-gather adds what arrives to the "
                   "receiver's copy, but what arrives is already the full sum of that chunk, "
                   "so the receiver's partial sum is counted twice",
}


def mistake_hint(mistake: tuple, n: int) -> str:
    """The hint for a mistake found by ``name_mistake``: what the ring did, not the fix."""
    kind = mistake[0]
    if kind in PHASE_HINTS:
        return PHASE_HINTS[kind]
    if kind == "uncovered":
        return _uncovered_hint(mistake[1], mistake[2], n)
    send, keep, ag_send, ag_keep = mistake[1]
    if kind == "rs_pair" and (keep - send) % n == 0:  # the chunk it sends gets the message
        return (f"in the reduce-scatter, rank r adds its own chunk {formula(send, n)}, the one "
                f"it sends, to the chunk its left neighbour sent, (r - s - {send % n + 1}) % N: "
                "partial sums of different chunks are added together")
    if kind == "rs_pair":
        return (f"in the reduce-scatter, rank r sends chunk {formula(send, n)} but adds what "
                f"arrives into chunk {formula(keep, n)}: that is not the chunk its left "
                "neighbour sent in the same step, so partial sums of different chunks are "
                "added together")
    if kind == "ag_pair":
        return (f"in the all-gather, rank r sends chunk {formula(ag_send, n)} but stores what "
                f"arrives in chunk {formula(ag_keep, n)}: that is not the chunk its left "
                "neighbour sent in the same step")
    return (f"the all-gather starts from a chunk the reduce-scatter did not finish: your "
            f"reduce-scatter leaves the full sum of chunk {formula(send - 1, n, step=False)} "
            f"on rank r, but all-gather step 0 sends chunk {formula(ag_send, n, step=False)}, "
            "which holds only a partial sum")


def _uncovered_hint(positions: list[int], numel: int, n: int) -> str:
    """Numbers the chunks left out: each rank kept its own there, never summed."""
    tail = numel % n
    if positions == list(range(numel - tail, numel)):
        return (f"the last {tail} of the {numel} numbers (numel mod N = {numel} mod {n}) were "
                "never summed: each rank holds its own there. The chunks do not cover the "
                "tensor: N chunks of numel // N numbers leave the rest out")
    shown = ", ".join(map(str, positions[:4])) + (", ..." if len(positions) > 4 else "")
    return (f"{len(positions)} of the {numel} numbers (at {shown}) were never summed: each "
            "rank holds its own there. The chunks do not cover the tensor: together they "
            "must hold every number once")


REFUSED = (*(f"torch.distributed.{name}" for name in COLLECTIVES),
           *(f"{LIBRARY_MODULE}.{name}" for name in LIBRARY))  # what a ring is built without
