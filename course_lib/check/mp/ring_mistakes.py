"""What known mistakes in a ring all-reduce produce, so that a wrong answer can be named.

``simulate`` runs the ring on every rank's input at once, with the chunk indices as
parameters: in reduce-scatter step s rank r sends chunk (r - s - rs_send) and combines the
incoming chunk into chunk (r - s - rs_recv); in all-gather step s it sends chunk
(r - s - ag_send) and stores the incoming chunk in chunk (r - s - ag_recv) (all mod N, chunks
cut by ``chunk_bounds``). The course's ring uses (1, 2, 0, 1); any (a, a+1, a-1, a) is right.
``name_mistake`` compares the learner's results with known mistakes: the mean instead of the
sum, no all-gather, replacing instead of adding, and every wrong set of chunk indices.
"""

from __future__ import annotations

import itertools

import torch

from course_lib.core.collectives import chunk_bounds


def simulate(inputs: list[torch.Tensor], offsets: tuple[int, int, int, int],
             add: bool = True, gather: bool = True) -> list[torch.Tensor] | None:
    """Every rank's flat tensor after the ring; None when a message would not fit its chunk."""
    n = len(inputs)
    bounds = chunk_bounds(inputs[0].numel(), n)
    state = [x.clone() for x in inputs]

    def chunk(r: int, c: int) -> torch.Tensor:
        start, end = bounds[c % n]
        return state[r][start:end]

    phases = [(offsets[0], offsets[1], add)] + ([(offsets[2], offsets[3], False)] if gather
                                                 else [])
    for send, recv, combine in phases:
        for step in range(n - 1):
            outgoing = [chunk(r, r - step - send).clone() for r in range(n)]  # as sent
            for r in range(n):
                target, incoming = chunk(r, r - step - recv), outgoing[(r - 1) % n]
                if target.numel() != incoming.numel():
                    return None
                target.copy_(target + incoming if combine else incoming)
    return state


def _right(a: int) -> list[int]:
    return [a, a + 1, a - 1, a]


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
    """Every wrong set of the four offsets, those nearest the course's (1, 2, 0, 1) first."""
    course = _right(1)
    every = itertools.product(range(n), repeat=4)
    wrong = [o for o in every if not _is_right(o, n)]

    def distance(offsets) -> int:  # how many of the four indices differ from the course's
        return sum((a - b) % n != 0 for a, b in zip(offsets, course, strict=True))

    return sorted(wrong, key=distance)


def name_mistake(inputs: list[torch.Tensor], got: list[torch.Tensor]) -> tuple | None:
    """("mean",), ("scatter_only",), ("overwrite",) or (kind, offsets) with kind one of
    rs_pair, ag_pair, ag_start; None when no known mistake gives ``got``.

    ``inputs`` and ``got``: every rank's flat tensor, as float64.
    """
    n, total = len(inputs), sum(inputs)
    if all(torch.equal(g, total) for g in got):
        return None  # no mistake: every rank holds the sum
    if n > 1 and all(torch.allclose(g * n, total) for g in got):
        return ("mean",)
    for a in range(n):
        if _same(got, simulate(inputs, _right(a), gather=False)):
            return ("scatter_only",)
        if _same(got, simulate(inputs, _right(a), add=False)):
            return ("overwrite",)
    for offsets in _wrong_indices(n):
        if _same(got, simulate(inputs, offsets)):
            rs_send, rs_recv, ag_send, ag_recv = offsets
            if (rs_recv - rs_send) % n != 1:
                return ("rs_pair", offsets)
            return ("ag_pair" if (ag_recv - ag_send) % n != 1 else "ag_start", offsets)
    return None


def mistake_hint(mistake: tuple, n: int) -> str:
    """The hint for a mistake found by ``name_mistake``."""
    kind = mistake[0]
    if kind == "mean":
        return ("every rank holds the sum divided by N, the mean: ring_all_reduce must leave "
                "the SUM (a data-parallel step divides by N itself, later)")
    if kind == "scatter_only":
        return ("each rank holds the full sum in one chunk only: the reduce-scatter is done, "
                "but not the all-gather, which passes every finished chunk once round the ring "
                "so that each rank ends with all of them")
    if kind == "overwrite":  # an all-gather one chunk late gives the very same numbers
        return ("each chunk of the result is one rank's own numbers, not a sum. Either the "
                "reduce-scatter replaces its chunk with the incoming one (add it: +=), or the "
                "all-gather starts one chunk late, from a chunk the reduce-scatter never added "
                "to (all-gather step s sends chunk (r - s) % N, the one rank r finished)")
    send, recv, ag_send, ag_recv = mistake[1]
    if kind == "rs_pair":
        return (f"in the reduce-scatter, rank r sends chunk {formula(send, n)} but adds what "
                f"arrives into chunk {formula(recv, n)}: that is not the chunk its left "
                "neighbour sent. At step s rank r sends chunk (r - s - 1) % N and adds the "
                "incoming one into chunk (r - s - 2) % N, the left neighbour's r - s - 1")
    if kind == "ag_pair":
        return (f"in the all-gather, rank r sends chunk {formula(ag_send, n)} but stores what "
                f"arrives in chunk {formula(ag_recv, n)}: that is not the chunk its left "
                "neighbour sent. At step s rank r sends chunk (r - s) % N and stores the "
                "incoming one in chunk (r - s - 1) % N")
    return (f"the all-gather starts from a chunk the reduce-scatter did not finish: your "
            f"reduce-scatter leaves the full sum of chunk {formula(send - 1, n, step=False)} "
            f"on rank r, but all-gather step 0 sends chunk {formula(ag_send, n, step=False)}. "
            "Step s of the all-gather must send the chunk finished s steps earlier")
