"""Notebook 08's checkers: the reference answers pass, realistic wrong answers get a hint."""

import numpy as np
import pytest
import torch
from answer_edits import reference
from check_reports import assert_passes, shown_report, standard_tests

from course_lib.check import nb08
from course_lib.check.cases import hooks
from course_lib.check.checker import ExerciseError
from course_lib.check.nb08 import buckets_by_hand, exposed_communication
from course_lib.core.buckets import plan_buckets
from course_lib.lessons.timeline import overlap_summary


def plan_reference(sizes, cap, order=reversed):  # backward order: last parameter first
    buckets, filled = [], 0
    for i in order(range(len(sizes))):
        if not buckets or filled + sizes[i] > cap:
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += sizes[i]
    return buckets


def plan_forward_order(sizes, cap):
    return plan_reference(sizes, cap, order=list)


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


def plan_big_alone_first(sizes, cap):  # a parameter over the cap jumps the open bucket
    buckets, open_bucket, filled = [], [], 0
    for i in reversed(range(len(sizes))):
        if sizes[i] > cap:
            buckets.append([i])
            continue
        if open_bucket and filled + sizes[i] > cap:
            buckets.append(open_bucket)
            open_bucket, filled = [], 0
        open_bucket.append(i)
        filled += sizes[i]
    return buckets + ([open_bucket] if open_bucket else [])


def plan_numpy_indices(sizes, cap):  # right, with numpy's integers
    return [[np.int64(i) for i in bucket] for bucket in plan_reference(sizes, cap)]


def exposed_to_the_last_end(events):  # counts the gaps between collectives too
    end = max(e["end_s"] for e in events if e["kind"] == "compute")
    return 1000 * max(0.0, max(e["end_s"] for e in events if e["kind"] == "comm") - end)


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


# ---- what a learner sees: the hint, at most 10 lines, none of the checker's code ----------


def plan_with_the_library(sizes, cap):
    order = list(range(len(sizes)))[::-1]
    plan = plan_buckets([sizes[i] for i in order], [None] * len(sizes), cap)
    return [[order[i] for i in bucket] for bucket in plan]


BUCKETS_BY_HAND_MISTAKES = [
    (plan_with_the_library, "calls the library's plan_buckets"),
    (lambda sizes, cap: tuple(plan_reference(sizes, cap)), "return a list of buckets"),
    (lambda sizes, cap: [[sizes[i] for i in b] for b in plan_reference(sizes, cap)],
     "exactly one bucket"),  # sizes instead of indices
    (lambda sizes, cap: [[float(i) for i in b] for b in plan_reference(sizes, cap)],
     "parameter INDICES"),
    (plan_forward_order, "REVERSE registration order"),
    (plan_closes_when_full, "would not fit"),
    (plan_overfills, "holds at most"),
    (plan_big_alone_first, "each bucket lists its indices last first, but the buckets are out "
                           "of order"),
    (lambda sizes, cap: [[i] for i in reversed(range(len(sizes)))], "would not fit"),
    (lambda sizes, cap: [list(range(len(sizes)))[::-1][1:]], "exactly one bucket"),
    (plan_reference([1024, 2048], 3000), "pass the function itself"),  # called, not passed
]


def test_an_error_inside_the_plan_shows_the_learners_line():
    def plan_by_hand(sizes, cap):
        return [[i] for i in range(len(sizes) + "1")]  # TypeError in the learner's code

    text = shown_report(buckets_by_hand, plan_by_hand)
    assert "TypeError" in text and "range(len(sizes) + \"1\")" in text


EXPOSED_COMMUNICATION_MISTAKES = [
    (lambda events: str(exposed_reference(events)), "return one number, the exposed "
                                                    "milliseconds; your code returned the str"),
    (lambda events: overlap_summary(events)["exposed_s"] * 1000,
     "calls the library's overlap_summary"),
    (exposed_all_comm, "all communication time"),
    (exposed_double_counts, "count once"),
    (exposed_to_the_last_end, "from backward's end to the last collective's end"),
    (lambda events: exposed_reference(events) / 1000, "in seconds: return milliseconds"),
    (lambda events: 1000 * exposed_reference(events), "expected"),  # seconds mixed with ms
    (None, "pass the function itself"),
]


def test_a_one_number_tensor_counts_as_a_number(capsys):
    assert_passes(capsys, exposed_communication,
                  lambda events: torch.tensor(exposed_reference(events)))


def test_the_hooks_checker_wants_a_path_and_says_so(tmp_path, monkeypatch):
    class BucketHooks:  # the class itself, passed instead of its file
        pass

    text = shown_report(nb08.my_hooks, BucketHooks)
    assert 'pass the path of your file, check.nb08.my_hooks("workspace/my_hooks.py")' in text
    monkeypatch.chdir(tmp_path)  # no workspace/ here: the %%writefile cell was not run
    assert "run the cell that starts with %%writefile workspace/my_hooks.py first" in \
        shown_report(nb08.my_hooks, "workspace/my_hooks.py")


IMPORTED = "from course_lib.core.buckets import MB, plan_buckets"


@pytest.mark.parametrize("imports, refused", [
    (IMPORTED, None),  # the plan of 8.1 and the megabyte: the one course import allowed
    (IMPORTED.replace("MB, ", ""), None),
    (IMPORTED + ", make_buckets", "the library's make_buckets"),
    ("import course_lib.core.buckets as course_buckets", "the library's buckets"),
    (IMPORTED + "\nfrom course_lib.core.overlap import OverlapDataParallel",
     "the library's OverlapDataParallel"),
    (IMPORTED + "\nimport course_lib", "course_lib (line")])
def test_my_hooks_may_import_the_plan_of_8_1_and_nothing_else_of_the_course(
        tmp_path, imports, refused):
    """Read before any launch: the reference's own import passes, any other is refused."""
    text = reference("my_hooks.py")
    assert text.count(IMPORTED) == 1
    path = tmp_path / "my_hooks.py"
    path.write_text(text.replace(IMPORTED, imports))
    if refused is None:
        hooks.before_launch(str(path))
        return
    with pytest.raises(ExerciseError) as caught:
        hooks.before_launch(str(path))
    assert refused in caught.value.hint and "may import only MB and plan_buckets" in \
        caught.value.hint, caught.value.hint


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((buckets_by_hand, [plan_reference, plan_numpy_indices],
                    BUCKETS_BY_HAND_MISTAKES),
                   (exposed_communication, [exposed_reference,
                                            lambda events: np.float32(exposed_reference(events))],
                    EXPOSED_COMMUNICATION_MISTAKES))
