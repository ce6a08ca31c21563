"""What each of the five collectives leaves on every rank, written in plain Python (notebook 05).

    before = [start_values(r, 3) for r in range(3)]  # [[0, 1, 2], [10, 11, 12], [20, 21, 22]]
    expected_after("reduce_scatter", before)         # [[30.0], [33.0], [36.0]]

The collectives tour (``course_lib.demos.collectives_tour``) checks every rank's result
against these definitions, and notebook 05 and its checkers read them too.
"""

from __future__ import annotations

COLLECTIVES = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
ROOT = 0  # the rank that broadcast sends from and reduce collects to


def start_values(rank: int, world_size: int) -> list[float]:
    """What rank ``rank`` holds before each collective: one number per chunk, 10 r + c, so
    that every sum can be read by eye."""
    return [float(10 * rank + c) for c in range(world_size)]


def expected_after(name: str, before: list[list[float]], root: int = ROOT) -> list:
    """What each rank must hold after collective ``name``, from what each held before.

    ``None`` for a rank whose buffer the collective leaves unspecified (reduce's non-roots).
    """
    n = len(before)
    sums = [sum(column) for column in zip(*before, strict=True)]  # element-wise sum over ranks
    if name == "broadcast":
        return [list(before[root]) for _ in range(n)]  # everyone gets the root's tensor
    if name == "reduce":
        return [sums if r == root else None for r in range(n)]  # only the root has the sum
    if name == "all_reduce":
        return [list(sums) for _ in range(n)]  # everyone gets the sum
    if name == "all_gather":
        joined = [value for mine in before for value in mine]  # rank 0's, then rank 1's, ...
        return [list(joined) for _ in range(n)]
    if name == "reduce_scatter":
        return [[sums[r]] for r in range(n)]  # rank r gets the sum of chunk r only
    raise ValueError(f"unknown collective {name!r}; pick one of {COLLECTIVES}")
