"""Checkers for the exercises of notebook 08 (bucketing and overlap)."""

from __future__ import annotations

import math
import numbers

import torch

from course_lib.check.answers import as_number, expect_function, expect_type
from course_lib.check.cases import hooks
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_exercise
from course_lib.check.own_work import call_own
from course_lib.core.buckets import BucketedDataParallel, make_buckets, plan_buckets
from course_lib.lessons.timeline import overlap_summary

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
    expect_function(plan, "check.nb08.buckets_by_hand(plan_by_hand)")
    for sizes, cap in BUCKET_CASES:
        got = call_own(plan, list(sizes), cap, library=[plan_buckets, make_buckets,
                                                         BucketedDataParallel.__init__],
                       hint="your function calls the library's {name}: the point is to plan "
                            "the buckets yourself, with a loop over the parameters")
        want = reference_buckets(list(sizes), cap)
        expect_type(got, list, "return a list of buckets, each a list of parameter indices")
        expect(all(isinstance(b, (list, tuple)) for b in got),
               "return a list of buckets, each a list of parameter indices (you returned a "
               "list, but not of lists)")
        expect(all(isinstance(i, numbers.Integral) and not isinstance(i, bool)
                   or (torch.is_tensor(i) and i.numel() == 1) for b in got for i in b),
               "each bucket lists parameter INDICES (whole numbers 0, 1, ...), not sizes or "
               "parameters")
        got = [[int(i) for i in bucket] for bucket in got]
        flat = [i for bucket in got for i in bucket]
        expect(sorted(flat) == list(range(len(sizes))),
               f"every parameter 0..{len(sizes) - 1} must be in exactly one bucket; got {got}")
        backward_order = flat == list(range(len(sizes)))[::-1] or len(sizes) == 1
        expect(backward_order or not all(b == sorted(b, reverse=True) for b in got),
               f"each bucket lists its indices last first, but the buckets are out of order "
               f"({got}): a bucket leaves as soon as it closes, so when a parameter starts a "
               "new bucket (one bigger than the cap goes alone), the open one is closed first")
        expect(backward_order,
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
    [{"name": "backward", "kind": "compute", "start_s": 0.0, "end_s": 0.010},  # a gap: 10-12
     {"name": "bucket 0", "kind": "comm", "start_s": 0.002, "end_s": 0.006},
     {"name": "bucket 1", "kind": "comm", "start_s": 0.012, "end_s": 0.013}],
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
    expect_function(exposed_ms, "check.nb08.exposed_communication(exposed_ms)")
    for events in TIMELINES:
        got = call_own(exposed_ms, [dict(e) for e in events], library=[overlap_summary],
                       hint="your function calls the library's overlap_summary: the point is "
                            "to measure the exposed time yourself, from the events")
        got = as_number(got, "return one number, the exposed milliseconds")
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
        last = 1000 * (max(e["end_s"] for e in comm) - end)  # to the last one's end
        expect(not (math.isclose(got, last, abs_tol=1e-6) and last != want),
               "you measured from backward's end to the last collective's end, but no "
               "collective runs in part of that time (between two of them): count only the "
               "time during which at least one is running")
        expect(not (math.isclose(1000 * got, want, abs_tol=1e-6) and want > 0),
               "that is the exposed time in seconds: return milliseconds")
        expect(math.isclose(got, want, abs_tol=1e-6),
               f"expected {want:.3f} ms exposed for this timeline, got {got:.3f}: the time "
               "after backward ends during which at least one collective is still running")


# ---- gradient hooks: the learner's own file, launched on 2, 3 and 4 processes -------------

@exercise("8.3")
def my_hooks(path: str = hooks.EXERCISE.file, world_sizes=WORLD_SIZES) -> None:
    """``BucketHooks(model, group, bucket_cap_mb)`` with ``.finish()`` in the learner's file."""
    check_exercise(hooks.EXERCISE, path, world_sizes)
