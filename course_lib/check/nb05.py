"""Checkers for the exercises of notebook 05 (processes and collectives)."""

from __future__ import annotations

import math

from course_lib.check.answers import as_number, as_numbers, describe, expect_type
from course_lib.check.cases.token_ring import TOKEN_RING, TOKEN_RING_ASYNC
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_exercise
from course_lib.check.own_work import call_own
from course_lib.lessons.collective_definitions import expected_after, start_values
from course_lib.lessons.cost_model import fit_alpha_beta

CASES = (  # (what each rank holds before) for 2, 3 and 4 ranks, small whole numbers
    [start_values(r, 2) for r in range(2)],
    [start_values(r, 3) for r in range(3)],
    [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [0.0, 0.0, 0.0, 1.0], [2.0, 0.0, 2.0, 0.0]],
)


def _row_sums(before) -> list[list[float]]:
    return [[float(sum(row))] for row in before]


@exercise("5.1")
def reduce_scatter_by_hand(simulate) -> None:
    """``simulate(before)`` returns what every rank holds after a reduce-scatter."""
    library = [expected_after]
    for before in CASES:
        n = len(before)
        got = call_own(simulate, [list(row) for row in before], library=library)
        want = expected_after("reduce_scatter", before)
        expect_type(got, (list, tuple), f"return a list with one entry per rank ({n} entries "
                                        f"for {n} ranks)")
        expect(len(got) == n, f"return one entry per rank: {n} entries for {n} ranks, not "
                              f"{len(got)}")
        expect(isinstance(got[0], (list, tuple)), "each entry is the list of numbers that rank "
                                                  "holds afterwards (a list, even of one "
                                                  f"number); rank 0's is {describe(got[0])}")
        got = [[float(v) for v in row] for row in got]
        sums = [float(sum(col)) for col in zip(*before, strict=True)]
        expect(got != [sums] * n, "every rank holds every chunk's sum: that is all-reduce; "
                                  "after a reduce-scatter each rank keeps less than that")
        expect(all(len(row) == 1 for row in got),
               "each rank ends with one number (one chunk of the sum), not a whole tensor")
        expect(got != _row_sums(before), "each rank added up its own numbers: a reduction "
                                         "adds the same chunk across the ranks")
        expect(got != [[before[r][r]] for r in range(n)],
               "each rank kept its own number of its chunk: the other ranks' numbers of that "
               "chunk are missing")
        expect(sorted(got) != sorted([s] for s in sums) or got == want,
               "the right sums, on the wrong ranks: which chunk does each rank own?")
        expect(got == want, f"for {n} ranks starting from {before} expected {want}, got {got}")


@exercise("5.2")
def two_point_fit(fit) -> None:
    """``fit(n1, t1, n2, t2)`` returns ``(alpha, beta)`` of the line through both."""
    library = [fit_alpha_beta]
    for alpha, beta in ((50e-6, 1 / 2e9), (5e-6, 1 / 20e9), (1e-3, 1 / 1e8)):
        n1, n2 = 1024, 4 * 2**20
        t1, t2 = alpha + beta * n1, alpha + beta * n2
        got = call_own(fit, n1, t1, n2, t2, library=library)
        got = as_numbers(got, "return a pair (alpha, beta): two numbers")
        expect(len(got) == 2, f"return a pair (alpha, beta), two numbers, not {len(got)}")
        got_alpha, got_beta = (as_number(v, "alpha and beta are plain numbers (seconds and "
                                            "seconds per byte)", "one of yours is")
                               for v in got)
        expect(not math.isclose(got_alpha, beta, rel_tol=1e-6),
               "alpha and beta are swapped: return (alpha, beta), latency first")
        expect(not math.isclose(got_beta, t2 / n2, rel_tol=1e-9),
               "beta is the large message's time per byte, its latency included: only the "
               "difference between the two measurements comes from the extra bytes")
        expect(math.isclose(got_beta, beta, rel_tol=1e-6),
               f"beta should be {beta:.3e} s/byte: how much longer each extra byte makes a "
               "message; compare the two measurements")
        expect(not math.isclose(got_alpha, t1, rel_tol=1e-9),
               "alpha is the whole time of the small message, but part of that time is its "
               "bytes: take their cost away")
        expect(math.isclose(got_alpha, alpha, rel_tol=1e-6),
               f"alpha should be {alpha:.3e} s: the time the line gives a message of 0 bytes")


# ---- the token ring: the learner's own file, launched on 2, 3 and 4 processes -------------

@exercise("5.3")
def token_ring(path: str = TOKEN_RING.file, world_sizes=WORLD_SIZES) -> None:
    """``pass_token(token, group)`` in the learner's file, with blocking send/recv."""
    check_exercise(TOKEN_RING, path, world_sizes)


@exercise("5.4")
def token_ring_async(path: str = TOKEN_RING_ASYNC.file, world_sizes=WORLD_SIZES) -> None:
    """``pass_token_async(token, group)`` in the learner's file, with isend/irecv."""
    check_exercise(TOKEN_RING_ASYNC, path, world_sizes)
