"""Checkers for the exercises of notebook 08 (bucketing and overlap)."""

from __future__ import annotations

import math

from course_lib.check.core import exercise, expect
from course_lib.core.buckets import plan_buckets

KB = 1024
BUCKET_CASES = (  # (parameter sizes in bytes, in registration order; bucket cap in bytes)
    ([4 * KB, 1 * KB, 4 * KB, 1 * KB], 5 * KB),
    ([3 * KB, 3 * KB, 3 * KB], 6 * KB),
    ([1 * KB, 10 * KB, 2 * KB, 2 * KB, 2 * KB], 4 * KB),
    ([100, 200, 300, 400, 500, 600], 700),
    ([2 * KB], 1 * KB),
)


def reference_buckets(sizes: list[int], cap: int) -> list[list[int]]:
    """The rule of course_lib.core.buckets, as registration indices, last parameter first."""
    order = list(range(len(sizes)))[::-1]  # backward produces the last layer's grads first
    plan = plan_buckets([sizes[i] for i in order], [None] * len(sizes), cap)
    return [[order[position] for position in bucket] for bucket in plan]


@exercise("8.1")
def buckets_by_hand(plan) -> None:
    """``plan(sizes, cap)`` returns buckets of parameter indices, in launch order."""
    for sizes, cap in BUCKET_CASES:
        got = plan(list(sizes), cap)
        want = reference_buckets(list(sizes), cap)
        expect(isinstance(got, list) and all(isinstance(b, list) for b in got),
               "return a list of buckets, each a list of parameter indices")
        got = [[int(i) for i in bucket] for bucket in got]
        flat = [i for bucket in got for i in bucket]
        expect(sorted(flat) == list(range(len(sizes))),
               f"every parameter 0..{len(sizes) - 1} must be in exactly one bucket; got {got}")
        expect(flat == list(range(len(sizes)))[::-1] or len(sizes) == 1,
               "fill buckets in REVERSE registration order: backward makes the last "
               "parameter's gradient first, so bucket 0 must start with the last index")
        expect(all(sum(sizes[i] for i in b) <= cap or len(b) == 1 for b in got),
               f"a bucket of {cap} bytes holds at most {cap} bytes (a bigger parameter goes "
               f"alone); for sizes {sizes} you returned {got}")
        expect(got == want, f"for sizes {sizes} and cap {cap} expected {want}, got {got}: "
                            "close a bucket only when the next parameter would not fit")


TIMELINES = (  # synthetic steps, times in seconds from the start of backward
    [{"name": "backward", "kind": "compute", "start_s": 0.0, "end_s": 0.010},
     {"name": "bucket 0", "kind": "comm", "start_s": 0.004, "end_s": 0.008},
     {"name": "bucket 1", "kind": "comm", "start_s": 0.008, "end_s": 0.013}],
    [{"name": "backward", "kind": "compute", "start_s": 0.0, "end_s": 0.010},
     {"name": "bucket 0", "kind": "comm", "start_s": 0.008, "end_s": 0.015},
     {"name": "bucket 1", "kind": "comm", "start_s": 0.012, "end_s": 0.020}],
    [{"name": "backward", "kind": "compute", "start_s": 0.0, "end_s": 0.020},
     {"name": "bucket 0", "kind": "comm", "start_s": 0.002, "end_s": 0.006},
     {"name": "bucket 1", "kind": "comm", "start_s": 0.005, "end_s": 0.009}],
)


def reference_exposed_ms(events: list[dict]) -> float:
    """Merge the collectives' intervals, keep the part after backward's end."""
    end = max(e["end_s"] for e in events if e["kind"] == "compute")
    merged: list[list[float]] = []
    for start, stop in sorted((e["start_s"], e["end_s"]) for e in events if e["kind"] == "comm"):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return 1000 * sum(max(0.0, stop - max(start, end)) for start, stop in merged)


@exercise("8.2")
def exposed_communication(exposed_ms) -> None:
    """``exposed_ms(events)``: milliseconds of communication NOT hidden under backward."""
    for events in TIMELINES:
        got = float(exposed_ms([dict(e) for e in events]))
        want = reference_exposed_ms(events)
        comm = [e for e in events if e["kind"] == "comm"]
        summed = 1000 * sum(e["end_s"] - e["start_s"] for e in comm)
        expect(not (math.isclose(got, summed, abs_tol=1e-6) and summed != want),
               "you returned all communication time; count only what happens after "
               "backward has ended (the part the step has to wait for)")
        end = max(e["end_s"] for e in events if e["kind"] == "compute")  # backward's end
        after = 1000 * sum(max(0.0, e["end_s"] - max(e["start_s"], end)) for e in comm)
        expect(not (math.isclose(got, after, abs_tol=1e-6) and after != want),
               "two collectives in flight at the same time count once: merge their "
               "intervals before measuring")
        expect(math.isclose(got, want, abs_tol=1e-6),
               f"expected {want:.3f} ms exposed for this timeline, got {got:.3f}: the time "
               "after backward ends during which at least one collective is still running")
