"""Exercise 8.3, gradient hooks that all-reduce buckets during backward: ``BucketHooks(model,
group, bucket_cap_mb)`` with ``.finish()`` in the learner's file, on 2, 3 and 4 processes.

Rank side: each case builds the same small MLP on every rank, gives each rank its own batch
and runs the learner's hooks, then, per step, ``loss.backward()`` and ``hooks.finish()``. Every
``.grad`` is compared with what torch DDP leaves there, the mean of the ranks' gradients (each
rank computes every rank's gradient alone, from the same seeds, outside the tracer). For each
call of ``dist.all_reduce`` the case keeps whether it was asynchronous, whether backward was
still running, which gradients were ready then, and which tensor (and how many values) it
reduced (``all_reduce_log``: its async handles hold the sum back until they are waited on,
so a bucket read before its wait is wrong every time, not only when the network is slow). On
3 and 4 processes a case runs on a group of ranks [1, 2] or [1, 3]. Of the course's code the
file may use only ``course_lib.core.buckets``' ``MB`` and ``plan_buckets`` (exercise 8.1's
plan, which the file's ``plan_by_hand`` calls until the learner pastes theirs):
the judge holds each step's all-reduces to that plan, one per bucket, each once its bucket is
full.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.check.answers import close
from course_lib.check.cases import members, passed, with_group_case
from course_lib.check.cases.all_reduce_log import AllReduceLog, recording
from course_lib.check.checker import ExerciseError, expect
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.tracer import Tracer
from course_lib.check.mp.verdict import Advice
from course_lib.check.own_work import names_in_file, shown
from course_lib.core.buckets import MB, plan_buckets  # MB: bytes, as bucket_cap_mb counts

SMALL_CAP = 1100  # bytes: 4 buckets for the model below (the last layer's leave first)
FEATURES, WIDTH, CLASSES, BATCH = 6, 16, 3, 5  # small for test speed


def case_specs(world_size: int, options: dict) -> list[dict]:
    specs = [{"name": "one step, 4 buckets", "cap_bytes": SMALL_CAP, "steps": 1},
             {"name": "two steps in a row, 4 buckets", "cap_bytes": SMALL_CAP, "steps": 2},
             {"name": "one bucket for everything (bucket_cap_mb=25)", "cap_bytes": 25 * MB,
              "steps": 1}]
    return with_group_case(specs, world_size, specs[0])


def make_model(seed: int) -> nn.Sequential:
    """The same weights on every rank (drawn from ``seed``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(FEATURES, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH),
                             nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(),
                             nn.Linear(WIDTH, CLASSES))


def batch(spec: dict, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s own batch of step ``step``: x (BATCH, FEATURES), y (BATCH,)."""
    g = torch.Generator().manual_seed(10_000 * spec["seed"] + 100 * step + rank)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randint(0, CLASSES, (BATCH,),
                                                                     generator=g)


def plan(model: nn.Module, cap_bytes: float) -> list[list[int]]:
    """Exercise 8.1's plan, as the file's plan_by_hand makes it: parameter indices per bucket,
    filled in backward's order (the last layer's first)."""
    sizes = [p.numel() * p.element_size() for p in model.parameters()][::-1]
    last = len(sizes) - 1
    return [[last - i for i in bucket] for bucket in plan_buckets(sizes, [None] * len(sizes),
                                                                   cap_bytes)]


def flat_grads(model: nn.Module) -> list[float]:
    return torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.full(
        (p.numel(),), float("nan")) for p in model.parameters()]).tolist()


def own_grads(model: nn.Module, x, y, scale: float = 1.0) -> list[float]:
    """One rank's gradient alone, before any averaging (of its loss times ``scale``)."""
    mine = copy.deepcopy(model)
    (F.cross_entropy(mine(x), y) * scale).backward()
    return flat_grads(mine)


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    model = make_model(spec["seed"])
    batches = [batch(spec, rank, step) for step in range(spec["steps"])]
    expected = [(torch.tensor([own_grads(model, *batch(spec, r, step)) for r in range(n)])
                 .sum(0) / n).tolist() for step in range(spec["steps"])]  # DDP's mean
    own = [own_grads(model, x, y) for x, y in batches]
    theirs = copy.deepcopy(model)
    log = AllReduceLog(tracer, len(list(theirs.parameters())))
    for i, param in enumerate(theirs.parameters()):  # before the learner's: they fire first
        param.register_post_accumulate_grad_hook(lambda p, i=i: log.arrived(i))
    got, per_step, orders = [], [], []
    try:
        with tracer.watching(spec["name"], members(spec)), recording(log):
            hooks = learner.BucketHooks(theirs, passed(spec, group),
                                        bucket_cap_mb=spec["cap_bytes"] / MB)
            for x, y in batches:
                theirs.zero_grad(set_to_none=True)
                loss = F.cross_entropy(theirs(x), y)
                log.in_backward, log.ready, log.order, first = True, 0, [], len(log.calls)
                loss.backward()  # the learner's hooks run in here
                log.in_backward = False
                hooks.finish()
                got.append(flat_grads(theirs))
                per_step.append(log.calls[first:])
                orders.append(log.order)
    finally:
        log.drain()
    return {"got": got, "expected": expected, "own": own, "steps": per_step, "orders": orders,
            "buckets": plan(model, spec["cap_bytes"]),
            "sizes": [p.numel() for p in model.parameters()],
            "numel": len(own[0]), **log.summary()}


# ---- the judge (in the kernel) --------------------------------------------------------------

def _at(call: dict) -> str:
    return f"line {call['line']}" if call["line"] else "a line outside your file"


def judge_step_calls(calls: list[dict], spec: dict, numel: int) -> None:
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
    if after:
        raise ExerciseError(
            f"no overlap: no all-reduce started while backward ran; the first ({_at(after[0])}"
            f"{'' if after[0]['async'] else ', blocking'}) started after loss.backward() had "
            "returned, so the step waits for all of its communication after backward"
            if not during else f"the all-reduce at {_at(after[0])} started after "
            "loss.backward() had returned: that bucket left in finish(), not when it was full, "
            "so its communication does not overlap with backward")
    expect(not during or spec["cap_bytes"] > SMALL_CAP or during[0]["ready"] < during[0]["total"],
           "no overlap: the first all-reduce started only when every gradient was ready, at "
           "the end of backward: a bucket that is full could leave while backward still "
           "computes the others")
    sent = sum(c["numel"] for c in calls)
    expect(sent <= numel, f"one step all-reduced {sent} values for {numel} gradients: each "
                          "bucket once, every value in one bucket")


def judge_buckets(calls: list[dict], order: list[int], s: dict) -> None:
    """One step's all-reduces against the plan (``s["buckets"]``, parameter indices): one per
    bucket, each started once every gradient of its bucket was ready (``order``: the indices
    of the gradients in the order they were ready)."""
    buckets, sizes = s["buckets"], s["sizes"]
    if calls and len(calls) != len(buckets):
        expect(len(calls) != len(sizes), f"one step started {len(calls)} all-reduces, one per "
               f"parameter, for the {len(buckets)} buckets of the plan: a bucket's gradients "
               "travel together, copied into its flat tensor, in one all-reduce started when "
               "the last of them is in (fewer, larger messages are the point of buckets)")
        expect(False, f"one step started {len(calls)} all-reduces for the {len(buckets)} "
                      "buckets of the plan: each bucket's all-reduce starts once per step, when "
                      "its last gradient is copied in")
    for call in (c for c in calls if c["in_backward"]):
        ready = set(order[:call["ready"]])
        alike = [b for b in buckets if sum(sizes[i] for i in b) == call["numel"]]
        expect(alike, f"the all-reduce at {_at(call)} sent {call['numel']} values, and no bucket "
                      "of the plan holds that many (they hold "
                      f"{', '.join(str(sum(sizes[i] for i in b)) for b in buckets)}): all-reduce "
                      "each bucket's flat tensor, whole")
        held, whole = max((sum(i in ready for i in b), len(b)) for b in alike)
        expect(held == whole, f"the all-reduce at {_at(call)} started when its bucket held {held} "
                              f"of its {whole} gradients: a bucket may leave only once every "
                              "gradient of it is copied in, or the missing ones never reach the "
                              "sum")


def judge_calls(rank: int, s: dict, spec: dict) -> None:
    """How this rank communicated: async all-reduces, waited on, started during backward."""
    expect(any(s["steps"]), f"rank {rank} never called dist.all_reduce: its buckets were "
                            "never summed over the ranks")
    for calls, order in zip(s["steps"], s["orders"], strict=True):
        judge_step_calls(calls, spec, s["numel"])
        judge_buckets(calls, order, s)
    expect(not s["unwaited"], f"rank {rank} never waited on the all-reduce started at line "
                              f"{(s['unwaited'] or [''])[0]}: until its handle's wait() "
                              "returns, the bucket does not hold the sum yet")
    early = s["waited_in_backward"]
    expect(not early, f"the all-reduce started at line {(early or [''])[0]} is waited on during "
                      "backward, in the hook: backward then waits for the network, as with a "
                      "blocking all-reduce, and nothing overlaps")


def judge_in_flight(rank: int, s: dict) -> None:
    """No bucket written between its all-reduce's start and its wait (the sum then lands over
    it here, but on a network what was written is lost or summed in)."""
    written = s["written_in_flight"]
    expect(not written, f"rank {rank} changed a bucket while its all-reduce (started at line "
                        f"{(written or [''])[0]}) was still running, before that handle's "
                        "wait() returned: the all-reduce reads and writes the bucket until "
                        "then, so what was written is lost or summed in, as timing falls. "
                        "Divide or refill a bucket only after this step's own handle for it "
                        "has been waited on")


def judge_values(rank: int, s: dict, n: int, world: int) -> None:
    for step, (got, want, own) in enumerate(zip(s["got"], s["expected"], s["own"],
                                                strict=True)):
        got, want, own = (torch.tensor(v) for v in (got, want, own))
        if close(got, want, 1e-5, 1e-6):
            continue
        expect(not torch.isnan(got).any(), f"rank {rank}: some .grad is None after finish()")
        expect(step == 0 or s["steps"][step], "the first step was right, the second is not: "
               "in the second step the hooks started no all-reduce, so something left over "
               "from the first step (a count, a handle) stops them")
        expect(step == 0, "the first step was right, the second is not: something left over "
                          "from the first step (a count, a handle) changes the second")
        expect(not close(got, own / n, 1e-5, 1e-6),
               "a bucket was read before its all-reduce had finished: it still held this "
               "rank's own gradient when it went into .grad (the sum lands in the bucket only "
               "once the handle's wait() returns)")
        judge_in_flight(rank, s)
        expect(not close(got, own, 1e-5, 1e-6), f"rank {rank}'s .grad still holds its own "
                                                "gradient: the averaged buckets never reached "
                                                ".grad")
        expect(not close(got, want * n, 1e-5, 1e-6),
               "the gradients are the SUM over the ranks, N times DDP's: nothing divides them "
               "by the world size")
        expect(n == world or not close(got, want * n / world, 1e-5, 1e-6),
               "you divided by the size of the whole world, not of the group you were given")
        expect(not divided_again(got, want, n),
               f"some gradients were divided by the world size more than once (by {n}^2, "
               f"{n}^3, ...): divide each bucket's sum once, not once for each of its "
               "parameters")
        expect(False, f"rank {rank}'s gradients differ from DDP's (rtol 1e-5): each .grad must "
                      "end as its parameter's gradient summed over the ranks, divided by the "
                      "world size")


def divided_again(got: torch.Tensor, want: torch.Tensor, n: int) -> bool:
    """Whether every gradient is DDP's divided by n**j, some with j >= 1: a division repeated
    (once per parameter of a bucket, say)."""
    big = want.abs() > 1e-4  # where the ratio says something
    times = torch.log(want[big] / got[big]) / math.log(n) if n > 1 else torch.zeros(0)
    whole = times.round()
    return bool(times.numel() and (times - whole).abs().max() < 1e-3 and whole.min() >= 0
                and whole.max() >= 1)


def judge(spec: dict, by_rank: dict, run) -> None:
    for rank in range(len(by_rank)):
        judge_calls(rank, by_rank[rank], spec)
        judge_values(rank, by_rank[rank], len(by_rank), run.world_size)
        judge_in_flight(rank, by_rank[rank])


def explain(error: dict, text: str) -> str:
    if "NoneType" in error["message"] and "wait" in error["message"]:
        return ("dist.all_reduce returns a handle only with async_op=True; without it, it "
                "returns None, after waiting for the sum itself.")
    return ""


YOURSELF = ("the point is to write the hooks yourself, with register_post_accumulate_grad_hook "
            "and dist.all_reduce")
PLAN = ("course_lib.core.buckets.MB", "course_lib.core.buckets.plan_buckets")  # 8.1's plan


def before_launch(path: str) -> None:
    """Refuse every use of the course's code in the file (outside its ``__main__`` block) but
    ``from course_lib.core.buckets import MB, plan_buckets``: the plan is exercise 8.1's."""
    for full, written, line in names_in_file(path):
        if (full == "course_lib" or full.startswith("course_lib.")) and full not in PLAN:
            raise ExerciseError(f"{path} uses {shown(full, written)} (line {line}): {YOURSELF} "
                                "(from the course, the file may import only MB and "
                                "plan_buckets, from course_lib.core.buckets)")

SAME = "Every rank must start the same all-reduces, in the same order."
EXERCISE = FileExercise(
    "8.3", "workspace/my_hooks.py", ("BucketHooks",), __name__,
    Advice(all_send=SAME, all_recv=SAME, mismatch=SAME, size="Every rank must all-reduce "
           "buckets of the same sizes, in the same order."), judge,
    library=dict.fromkeys(("DistributedDataParallel", "register_comm_hook"), YOURSELF),
    explain=explain, before_launch=before_launch, deadline_s=60.0,
    entry="check.nb08.my_hooks")
