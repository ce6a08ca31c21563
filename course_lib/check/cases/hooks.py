"""Exercise 8.3, gradient hooks that all-reduce buckets during backward: ``BucketHooks(model,
group, bucket_cap_mb)`` with ``.finish()`` in the learner's file, on 2, 3 and 4 processes.

Rank side: each case builds the same small MLP on every rank, gives each rank its own batch
and runs the learner's hooks, then, per step, ``loss.backward()`` and ``hooks.finish()``. Every
``.grad`` is compared with what torch DDP leaves there, the mean of the ranks' gradients (each
rank computes every rank's gradient alone, from the same seeds, outside the tracer). For each
call of ``dist.all_reduce`` the case keeps whether it was asynchronous, whether backward was
still running, how many gradients were ready then, and which tensor (and how many values) it
reduced. The learner's async handles hold the result back until they are waited on
(``HeldBack``: the bucket keeps this rank's values till ``wait()``, as a real all-reduce may),
so a bucket read before its wait gives a wrong gradient every time, not only when the network
is slow. On 3 and 4 processes a case runs on a group of ranks [1, 2] or [1, 3]. Of the
course's code the file may use only ``course_lib.core.buckets``' ``MB`` and ``plan_buckets``
(exercise 8.1's plan, which the file's ``plan_by_hand`` calls until the learner pastes theirs).
"""

from __future__ import annotations

import copy
import inspect
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.check.answers import close
from course_lib.check.cases import members, passed, with_group_case
from course_lib.check.checker import ExerciseError, expect
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.tracer import Tracer
from course_lib.check.mp.verdict import Advice
from course_lib.check.own_work import names_in_file, shown
from course_lib.core.buckets import MB  # bytes in a megabyte, as bucket_cap_mb counts them

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


def flat_grads(model: nn.Module) -> list[float]:
    return torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.full(
        (p.numel(),), float("nan")) for p in model.parameters()]).tolist()


def own_grads(model: nn.Module, x, y, scale: float = 1.0) -> list[float]:
    """One rank's gradient alone, before any averaging (of its loss times ``scale``)."""
    mine = copy.deepcopy(model)
    (F.cross_entropy(mine(x), y) * scale).backward()
    return flat_grads(mine)


class HeldBack:
    """The learner's async handle: the sum lands in the bucket when the learner waits on it
    (or sees it completed), not before."""

    def __init__(self, work, private: torch.Tensor, bucket: torch.Tensor, line, log):
        self.work, self.private, self.bucket, self.line, self.log = work, private, bucket, \
            line, log
        self.done = self.waited_in_backward = False

    def wait(self, *args, **kwargs):
        if not self.done:
            self.waited_in_backward = self.log.in_backward
            self.log.tracer.status(op="all_reduce", line=self.log.tracer.learner_line(),
                                   waiting=True)  # it may block: say so
            self.work.wait(*args, **kwargs)
            self.log.tracer.status(op=None)
            self._land()
        return True

    def is_completed(self):
        """Polling waits for nothing: a finished all-reduce lands, and is not a wait."""
        if not self.done and self.work.is_completed():
            self._land()
        return self.done

    def get_future(self):
        """A future that completes with the sum in the bucket."""
        self.done = True
        return self.work.get_future().then(lambda _: self._land(force=True))

    def _land(self, force: bool = False):
        if force or not self.done:
            self.bucket.copy_(self.private)  # only now does the bucket hold the sum
            self.done = True
        return [self.bucket]

    def __getattr__(self, name):
        return getattr(self.work, name)


class AllReduceLog:
    """Every ``dist.all_reduce`` of one case: when it came, and the handles given out."""

    def __init__(self, tracer: Tracer, total_params: int):
        self.tracer, self.total = tracer, total_params
        self.in_backward, self.ready = False, 0  # set by the case and by its counting hooks
        self.calls, self.handles, self._signature = [], [], None

    def handler(self, original, *args, **kwargs):
        self._signature = self._signature or inspect.signature(original)
        bound = self._signature.bind(*args, **kwargs).arguments
        tensor, is_async = bound.get("tensor"), bool(bound.get("async_op", False))
        line = self.tracer.learner_line()
        self.tracer.log.collectives.append("all_reduce")  # counted, as the tracer counts
        self.calls.append({"async": is_async, "in_backward": self.in_backward,
                           "ready": self.ready, "total": self.total, "line": line,
                           "numel": tensor.numel(), "tensor": tensor.data_ptr()})
        if not is_async:
            self.tracer.status(op="all_reduce", line=line)  # it blocks: say so
            result = original(*args, **kwargs)
            self.tracer.status(op=None)
            return result
        private = tensor.detach().clone()  # reduced in the background, copied in at wait()
        bound["tensor"] = private
        handle = HeldBack(original(**bound), private, tensor, line, self)
        self.handles.append(handle)
        return handle

    def drain(self) -> None:
        """Finish every all-reduce the learner left open, so none mixes into the next case."""
        for handle in self.handles:
            handle.work.wait()

    def summary(self) -> dict:
        return {"calls": self.calls,
                "unwaited": [h.line for h in self.handles if not h.done],
                "waited_in_backward": [h.line for h in self.handles if h.waited_in_backward]}


@contextmanager
def recording(log: AllReduceLog):
    """Route ``dist.all_reduce`` (the tracer's stand-in, however the learner imported it)
    through ``log`` while the case runs."""
    stand_in = dist.all_reduce
    saved = stand_in.handler
    stand_in.handler = log.handler
    try:
        yield
    finally:
        stand_in.handler = saved


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    model = make_model(spec["seed"])
    batches = [batch(spec, rank, step) for step in range(spec["steps"])]
    expected = [(torch.tensor([own_grads(model, *batch(spec, r, step)) for r in range(n)])
                 .sum(0) / n).tolist() for step in range(spec["steps"])]  # DDP's mean
    own = [own_grads(model, x, y) for x, y in batches]
    theirs = copy.deepcopy(model)
    log = AllReduceLog(tracer, len(list(theirs.parameters())))
    for param in theirs.parameters():  # registered before the learner's: they fire first
        param.register_post_accumulate_grad_hook(lambda p: setattr(log, "ready", log.ready + 1))
    got, per_step = [], []
    try:
        with tracer.watching(spec["name"], members(spec)), recording(log):
            hooks = learner.BucketHooks(theirs, passed(spec, group),
                                        bucket_cap_mb=spec["cap_bytes"] / MB)
            for x, y in batches:
                theirs.zero_grad(set_to_none=True)
                loss = F.cross_entropy(theirs(x), y)
                log.in_backward, log.ready, first = True, 0, len(log.calls)
                loss.backward()  # the learner's hooks run in here
                log.in_backward = False
                hooks.finish()
                got.append(flat_grads(theirs))
                per_step.append(log.calls[first:])
    finally:
        log.drain()
    return {"got": got, "expected": expected, "own": own, "steps": per_step,
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


def judge_calls(rank: int, s: dict, spec: dict) -> None:
    """How this rank communicated: async all-reduces, waited on, started during backward."""
    expect(any(s["steps"]), f"rank {rank} never called dist.all_reduce: its buckets were "
                            "never summed over the ranks")
    for calls in s["steps"]:
        judge_step_calls(calls, spec, s["numel"])
    expect(not s["unwaited"], f"rank {rank} never waited on the all-reduce started at line "
                              f"{(s['unwaited'] or [''])[0]}: until its handle's wait() "
                              "returns, the bucket does not hold the sum yet")
    early = s["waited_in_backward"]
    expect(not early, f"the all-reduce started at line {(early or [''])[0]} is waited on during "
                      "backward, in the hook: backward then waits for the network, as with a "
                      "blocking all-reduce, and nothing overlaps")


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
        expect(not close(got, own, 1e-5, 1e-6), f"rank {rank}'s .grad still holds its own "
                                                "gradient: the averaged buckets never reached "
                                                ".grad")
        expect(not close(got, want * n, 1e-5, 1e-6),
               "the gradients are the SUM over the ranks, N times DDP's: nothing divides them "
               "by the world size")
        expect(n == world or not close(got, want * n / world, 1e-5, 1e-6),
               "you divided by the size of the whole world, not of the group you were given")
        expect(False, f"rank {rank}'s gradients differ from DDP's (rtol 1e-5): each .grad must "
                      "end as its parameter's gradient summed over the ranks, divided by the "
                      "world size")


def judge(spec: dict, by_rank: dict, run) -> None:
    for rank in range(len(by_rank)):
        judge_calls(rank, by_rank[rank], spec)
        judge_values(rank, by_rank[rank], len(by_rank), run.world_size)


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
