"""Notebook 08's checkers: the reference answers pass, realistic wrong answers get a hint."""

import pytest

from course_lib.check.core import ExerciseError
from course_lib.check.nb08 import buckets_by_hand, exposed_communication


def plan_reference(sizes, cap):
    buckets, filled = [], 0
    for i in reversed(range(len(sizes))):  # backward order: last parameter first
        if not buckets or filled + sizes[i] > cap:
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += sizes[i]
    return buckets


def plan_forward_order(sizes, cap):
    buckets, filled = [], 0
    for i in range(len(sizes)):
        if not buckets or filled + sizes[i] > cap:
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += sizes[i]
    return buckets


def plan_closes_when_full(sizes, cap):
    buckets, filled = [], 0
    for i in reversed(range(len(sizes))):
        if not buckets or filled + sizes[i] >= cap:  # one byte too eager
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += sizes[i]
    return buckets


def plan_overfills(sizes, cap):
    buckets, filled = [], 0
    for i in reversed(range(len(sizes))):
        if not buckets or filled > cap:  # closes only after passing the cap
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += sizes[i]
    return buckets


def test_buckets_reference(capsys):
    buckets_by_hand(plan_reference)
    assert capsys.readouterr().out == "Exercise 8.1: correct.\n"


@pytest.mark.parametrize("wrong, hint", [
    (plan_forward_order, "REVERSE registration order"),
    (plan_closes_when_full, "would not fit"),
    (plan_overfills, "holds at most"),
    (lambda sizes, cap: [[i] for i in reversed(range(len(sizes)))], "would not fit"),
    (lambda sizes, cap: [list(range(len(sizes)))[::-1][1:]], "exactly one bucket"),
])
def test_buckets_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        buckets_by_hand(wrong)


def test_buckets_not_done(capsys):
    def hole(sizes, cap):
        raise NotImplementedError("Exercise 8.1")

    buckets_by_hand(hole)
    assert "Exercise 8.1: not done yet" in capsys.readouterr().out


def exposed_reference(events):
    end = max(e["end_s"] for e in events if e["kind"] == "compute")
    total, reach = 0.0, end
    for start, stop in sorted((e["start_s"], e["end_s"]) for e in events if e["kind"] == "comm"):
        start = max(start, reach)  # what came before is hidden or already counted
        if stop > start:
            total += stop - start
            reach = stop
    return 1000 * total


def exposed_all_comm(events):
    return 1000 * sum(e["end_s"] - e["start_s"] for e in events if e["kind"] == "comm")


def exposed_double_counts(events):
    end = max(e["end_s"] for e in events if e["kind"] == "compute")
    return 1000 * sum(max(0.0, e["end_s"] - max(e["start_s"], end))
                      for e in events if e["kind"] == "comm")


def test_exposed_reference(capsys):
    exposed_communication(exposed_reference)
    assert capsys.readouterr().out == "Exercise 8.2: correct.\n"


@pytest.mark.parametrize("wrong, hint", [
    (exposed_all_comm, "all communication time"),
    (exposed_double_counts, "count once"),
    (lambda events: 1000 * exposed_reference(events), "expected"),  # seconds mixed with ms
])
def test_exposed_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        exposed_communication(wrong)
