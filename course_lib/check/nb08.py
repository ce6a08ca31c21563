"""Checkers for the exercises of notebook 08 (bucketing and overlap)."""

from __future__ import annotations

import ast
import math

import torch

from course_lib.check.answers import call, expect_function, expect_path, expect_type
from course_lib.check.cases import hook_cases
from course_lib.check.checker import ExerciseError, exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_file
from course_lib.check.mp.learner import find_learner_file
from course_lib.check.mp.verdict import Advice
from course_lib.check.own_work import names_used
from course_lib.core.buckets import plan_buckets
from course_lib.runtime.workspace import record_pass

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
    used = names_used(plan, ("plan_buckets", "make_buckets", "BucketedDataParallel"))
    expect(not used, f"your function calls the library's {(used or [''])[0]}: the point is to "
                     "plan the buckets yourself, with a loop over the parameters")
    for sizes, cap in BUCKET_CASES:
        got = call(plan, list(sizes), cap)
        want = reference_buckets(list(sizes), cap)
        expect_type(got, list, "return a list of buckets, each a list of parameter indices")
        expect(all(isinstance(b, (list, tuple)) for b in got),
               "return a list of buckets, each a list of parameter indices (you returned a "
               "list, but not of lists)")
        expect(all(isinstance(i, int) or (torch.is_tensor(i) and i.numel() == 1)
                   for b in got for i in b),
               "each bucket lists parameter INDICES (whole numbers 0, 1, ...), not sizes or "
               "parameters")
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
    expect_function(exposed_ms, "check.nb08.exposed_communication(exposed_ms)")
    used = names_used(exposed_ms, ("overlap_summary",))
    expect(not used, "your function calls the library's overlap_summary: the point is to "
                     "measure the exposed time yourself, from the events")
    for events in TIMELINES:
        got = call(exposed_ms, [dict(e) for e in events])
        if torch.is_tensor(got) and got.numel() == 1:
            got = got.item()  # a one-number tensor counts as its number
        expect_type(got, (int, float), "return one number, the exposed milliseconds")
        got = float(got)
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
        expect(not (math.isclose(1000 * got, want, abs_tol=1e-6) and want > 0),
               "that is the exposed time in seconds: return milliseconds")
        expect(math.isclose(got, want, abs_tol=1e-6),
               f"expected {want:.3f} ms exposed for this timeline, got {got:.3f}: the time "
               "after backward ends during which at least one collective is still running")


# ---- gradient hooks: the learner's own file, launched on 2, 3 and 4 processes -------------

MY_HOOKS_FILE = "workspace/my_hooks.py"
HOOKS_CASES = "course_lib.check.cases.hook_cases"
DEADLINE_S = 60.0  # a launch builds DDP models and trains: more than a ring needs
LIBRARY_NAMES = ("DistributedDataParallel", "OverlapDataParallel", "BucketedDataParallel",
                 "register_comm_hook")
HOOKS_ADVICE = Advice(  # the ranks' collectives did not pair up
    all_send="Every rank must start the same all-reduces, in the same order.",
    all_recv="Every rank must start the same all-reduces, in the same order.",
    mismatch="Every rank must start the same all-reduces, in the same order.",
    size="Every rank must all-reduce buckets of the same sizes, in the same order.")


def _outside_main(tree: ast.Module) -> list[ast.stmt]:
    """The file's top-level statements, without its ``if __name__ == "__main__":`` block."""
    return [node for node in tree.body
            if not (isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))]


def _tree(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read())


def library_used(path: str, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` (or a course_lib import) the file uses outside its __main__."""
    for node in (n for top in _outside_main(_tree(path)) for n in ast.walk(top)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_lib"):
            return f"course_lib ({node.module})"
        if isinstance(node, ast.Import) and any(a.name.startswith("course_lib")
                                                for a in node.names):
            return "course_lib"
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if isinstance(node, ast.alias):  # from torch.nn.parallel import ... as DDP
            name = node.name.split(".")[-1]
        if name in names:
            return name
    return None


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=1e-5, atol=1e-6))


def _at(call: dict) -> str:
    return f"line {call['line']}" if call["line"] else "a line outside your file"


def judge_step_calls(calls: list[dict], spec: dict) -> None:
    """One step's all-reduces: started from the hooks, without blocking, each bucket once."""
    during = [c for c in calls if c["in_backward"]]
    after = [c for c in calls if not c["in_backward"]]
    blocking = [c for c in during if not c["async"]]
    if blocking:
        raise ExerciseError(
            f"the all-reduce at {_at(blocking[0])} blocks (it has no async_op=True): the hook "
            "returns only once the sum has arrived, so backward waits for the network before "
            "it computes the next gradients, and nothing overlaps")
    started = {c["tensor"]: c for c in during}
    again = [c for c in after if c["tensor"] in started]
    if again:
        raise ExerciseError(
            f"{_at(again[0])} all-reduces, after loss.backward() has returned, a bucket whose "
            f"all-reduce the hook already started ({_at(started[again[0]['tensor']])}): that "
            "bucket is summed a second time, on top of a first all-reduce still in flight")
    if after and not during:
        raise ExerciseError(
            f"no overlap: no all-reduce started while backward ran; the first ({_at(after[0])}"
            f"{'' if after[0]['async'] else ', blocking'}) started after loss.backward() had "
            "returned, so the step waits for all of its communication after backward")
    if after:
        raise ExerciseError(
            f"the all-reduce at {_at(after[0])} started after loss.backward() had returned: "
            "that bucket left in finish(), not when it was full, so its communication does "
            "not overlap with backward")
    expect(not during or spec["cap_bytes"] > hook_cases.SMALL_CAP
           or during[0]["ready"] < during[0]["total"],
           "no overlap: the first all-reduce started only when every gradient was ready, at "
           "the end of backward: a bucket that is full could leave while backward still "
           "computes the others")


def judge_hook_calls(rank: int, s: dict, spec: dict) -> None:
    """How this rank communicated: async all-reduces, waited on, started during backward."""
    expect(any(s["steps"]), f"rank {rank} never called dist.all_reduce: its buckets were "
                            "never summed over the ranks")
    for calls in s["steps"]:
        judge_step_calls(calls, spec)
    expect(not s["unwaited"], f"rank {rank} never waited on the all-reduce started at line "
                              f"{(s['unwaited'] or [''])[0]}: until its handle's wait() "
                              "returns, the bucket does not hold the sum yet")
    early = s["waited_in_backward"]
    expect(not early, f"the all-reduce started at line {(early or [''])[0]} is waited on during "
                      "backward, in the hook: backward then waits for the network, as with a "
                      "blocking all-reduce, and nothing overlaps")


def judge_hook_values(rank: int, s: dict, world: int) -> None:
    n = s["world"]  # the size of the group the case passed
    for step, (got, want, own) in enumerate(zip(s["got"], s["expected"], s["own"],
                                                strict=True)):
        got, want, own = (torch.tensor(v) for v in (got, want, own))
        if _close(got, want):
            continue
        expect(not torch.isnan(got).any(), f"rank {rank}: some .grad is None after finish()")
        expect(step == 0 or s["steps"][step], "the first step was right, the second is not: "
               "in the second step the hooks started no all-reduce, so something left over "
               "from the first step (a count, a handle) stops them")
        expect(step == 0, "the first step was right, the second is not: something left over "
                          "from the first step (a count, a handle) changes the second")
        expect(not _close(got, own / n),
               "a bucket was read before its all-reduce had finished: it still held this "
               "rank's own gradient when it went into .grad (the sum lands in the bucket only "
               "once the handle's wait() returns)")
        expect(not _close(got, own), f"rank {rank}'s .grad still holds its own gradient: the "
                                     "averaged buckets never reached .grad")
        expect(not _close(got, want * n), "the gradients are the SUM over the ranks, N times "
                                          "DDP's: nothing divides them by the world size")
        expect(n == world or not _close(got, want * n / world),
               "you divided by the size of the whole world, not of the group you were given")
        expect(False, f"rank {rank}'s gradients differ from DDP's (rtol 1e-5): each .grad must "
                      "end as its parameter's gradient summed over the ranks, divided by the "
                      "world size")


def judge_hooks_case(summary: dict, by_rank: dict, run) -> None:
    spec = {s["name"]: s for s in hook_cases.case_specs(run.world_size, {})}[summary["name"]]
    for rank in range(summary["ranks"]):
        judge_hook_calls(rank, by_rank[rank], spec)
        judge_hook_values(rank, by_rank[rank], run.world_size)


def explain_hooks_error(error: dict, text: str) -> str:
    """A sentence for the exceptions this exercise knows."""
    if "NoneType" in error["message"] and "wait" in error["message"]:
        return ("dist.all_reduce returns a handle only with async_op=True; without it, it "
                "returns None, after waiting for the sum itself.")
    return ""


@exercise("8.3")
def my_hooks(path: str = MY_HOOKS_FILE, world_sizes=WORLD_SIZES) -> None:
    """``BucketHooks(model, group, bucket_cap_mb)`` with ``.finish()`` in the learner's file."""
    expect_path(path, f'check.nb08.my_hooks("{MY_HOOKS_FILE}")')
    learner = find_learner_file(path, ())
    expect("BucketHooks" in {n.name for n in _outside_main(_tree(path))
                             if isinstance(n, ast.ClassDef)},
           f"{path} defines no class BucketHooks: keep `class BucketHooks:` at the top level of "
           "the file, with its __init__, gradient_ready and finish")
    used = library_used(path, LIBRARY_NAMES)
    expect(used is None, f"{path} uses {used}: the point is to write the hooks yourself, with "
                         "register_post_accumulate_grad_hook and dist.all_reduce")
    check_file(learner, HOOKS_CASES, {}, world_sizes, HOOKS_ADVICE, judge_hooks_case,
               explain_hooks_error, deadline_s=DEADLINE_S)
    record_pass("8.3", path)
