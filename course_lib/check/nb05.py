"""Checkers for the exercises of notebook 05 (processes and collectives)."""

from __future__ import annotations

import math

from course_lib.check.core import exercise, expect
from course_lib.demos.collectives_tour import expected_after, start_values

CASES = (  # (what each rank holds before) for 2, 3 and 4 ranks, small whole numbers
    [start_values(r, 2) for r in range(2)],
    [start_values(r, 3) for r in range(3)],
    [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [0.0, 0.0, 0.0, 1.0], [2.0, 0.0, 2.0, 0.0]],
)


@exercise("5.1")
def reduce_scatter_by_hand(simulate) -> None:
    """``simulate(before)`` returns what every rank holds after a reduce-scatter."""
    for before in CASES:
        n = len(before)
        got = simulate([list(row) for row in before])
        want = expected_after("reduce_scatter", before)
        expect(isinstance(got, list) and len(got) == n,
               f"return one list per rank: {n} lists for {n} ranks")
        got = [[float(v) for v in row] for row in got]
        sums = [sum(col) for col in zip(*before, strict=True)]
        expect(got != [sums] * n, "every rank holds the whole sum: that is all-reduce; "
                                  "rank r keeps only chunk r of the sum")
        expect(all(len(row) == 1 for row in got),
               "each rank ends with one number (one chunk of the sum), not a whole tensor")
        expect(got != [[before[r][r]] for r in range(n)],
               "rank r holds only its own chunk r: add chunk r over every rank")
        expect(got == want, f"for {n} ranks starting from {before} expected {want}, got {got}: "
                            "rank r gets the sum over ranks of chunk r")


@exercise("5.2")
def two_point_fit(fit) -> None:
    """``fit(n1, t1, n2, t2)`` returns ``(alpha_s, beta_s_per_byte)`` of the line through both."""
    for alpha, beta in ((50e-6, 1 / 2e9), (5e-6, 1 / 20e9), (1e-3, 1 / 1e8)):
        n1, n2 = 1024, 4 * 2**20
        t1, t2 = alpha + beta * n1, alpha + beta * n2
        got = fit(n1, t1, n2, t2)
        expect(isinstance(got, tuple) and len(got) == 2, "return a pair (alpha, beta)")
        got_alpha, got_beta = (float(v) for v in got)
        expect(not math.isclose(got_alpha, beta, rel_tol=1e-6),
               "alpha and beta are swapped: return (alpha, beta), latency first")
        expect(math.isclose(got_beta, beta, rel_tol=1e-6),
               f"beta should be {beta:.3e} s/byte: the slope (t2 - t1) / (n2 - n1)")
        expect(not math.isclose(got_alpha, t1, rel_tol=1e-9),
               "alpha is not the time of the small message: take away its bytes' cost, "
               "alpha = t1 - beta x n1")
        expect(math.isclose(got_alpha, alpha, rel_tol=1e-6),
               f"alpha should be {alpha:.3e} s: where the line crosses 0 bytes")
