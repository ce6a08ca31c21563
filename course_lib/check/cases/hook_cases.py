"""Gradient hooks that all-reduce buckets during backward: the cases of exercise 8.3, run by
``course_lib.check.mp.program``.

Each case builds the same small MLP on every rank, gives each rank its own batch and runs
``hooks = BucketHooks(model, group, bucket_cap_mb)`` from the learner's file, then, per step,
``loss.backward()`` and ``hooks.finish()``. The checker compares every ``.grad`` with what
torch DDP leaves there, the mean of the ranks' gradients (each rank computes every rank's
gradient alone, from the same seeds, outside the tracer), and keeps, for each call of
``dist.all_reduce``: whether it was asynchronous, whether backward was still running, how many
gradients were ready then, and which tensor it reduced.

The learner's async handles hold the result back until they are waited on (the bucket keeps
this rank's values till ``wait()``, as a real all-reduce may), so a bucket read before its
wait gives a wrong gradient every time, not only when the network is slow.
"""

from __future__ import annotations

import copy
import inspect
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.check.mp.tracer import Tracer
from course_lib.core.buckets import MB  # bytes in a megabyte, as bucket_cap_mb counts them

SMALL_CAP = 1100  # bytes: 4 buckets for the model below (the last layer's leave first)
FEATURES, WIDTH, CLASSES, BATCH = 6, 16, 3, 5  # small for test speed


def case_specs(world_size: int, options: dict) -> list[dict]:
    n = world_size
    specs = [
        {"name": "one step, 4 buckets", "cap_bytes": SMALL_CAP, "steps": 1, "ranks": n},
        {"name": "two steps in a row, 4 buckets", "cap_bytes": SMALL_CAP, "steps": 2,
         "ranks": n},
        {"name": "one bucket for everything (bucket_cap_mb=25)", "cap_bytes": 25 * MB,
         "steps": 1, "ranks": n},
    ]
    if n >= 3:
        specs.append({"name": f"a group of ranks 0..{n - 2} (not the whole world)",
                      "cap_bytes": SMALL_CAP, "steps": 1, "ranks": n - 1})
    for i, spec in enumerate(specs):
        spec["seed"] = i
    return specs


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


def own_grads(model: nn.Module, x, y) -> list[float]:
    """One rank's gradient alone, before any averaging."""
    mine = copy.deepcopy(model)
    F.cross_entropy(mine(x), y).backward()
    return flat_grads(mine)


def mean_grads(model: nn.Module, spec: dict, step: int) -> list[float]:
    """What torch DDP leaves in ``.grad`` at ``step``: the mean of every rank's own gradient
    (each computed here, from that rank's batch)."""
    grads = [own_grads(model, *batch(spec, rank, step)) for rank in range(spec["ranks"])]
    return (torch.tensor(grads).sum(0) / spec["ranks"]).tolist()


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
            self.work.wait(*args, **kwargs)
            self._land()
        return True

    def is_completed(self):
        """Polling waits for nothing: a finished all-reduce lands, and is not a wait."""
        if not self.done and self.work.is_completed():
            self._land()
        return self.done

    def get_future(self):
        """A future that completes with the sum in the bucket; when the learner waits on it
        is theirs to follow, not ours."""
        self.done = True
        return self.work.get_future().then(lambda _: self._land(force=True))

    def _land(self, force: bool = False):
        """Only now does the bucket hold the sum."""
        if force or not self.done:
            self.bucket.copy_(self.private)
            self.done = True
        return [self.bucket]

    def __getattr__(self, name):
        return getattr(self.work, name)


class AllReduceLog:
    """Every ``dist.all_reduce`` of one case: when it came, and the handles given out."""

    def __init__(self, tracer: Tracer, total_params: int):
        self.tracer, self.total = tracer, total_params
        self.in_backward, self.ready = False, 0  # set by the case and by its counting hooks
        self.calls, self.handles = [], []
        self._signature = None

    def handler(self, original, *args, **kwargs):
        self._signature = self._signature or inspect.signature(original)
        bound = self._signature.bind(*args, **kwargs).arguments
        tensor, is_async = bound.get("tensor"), bool(bound.get("async_op", False))
        line = self.tracer.learner_line()
        self.calls.append({"async": is_async, "in_backward": self.in_backward,
                           "ready": self.ready, "total": self.total, "line": line,
                           "tensor": tensor.data_ptr()})  # which bucket, within one step
        if not is_async:
            return original(*args, **kwargs)
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
    if hasattr(stand_in, "handler"):  # the tracer's _Wrapped: swap what it calls
        saved = stand_in.handler
        stand_in.handler = log.handler
        try:
            yield
        finally:
            stand_in.handler = saved
    else:  # no tracer installed: wrap the function itself
        dist.all_reduce = lambda *a, **k: log.handler(stand_in, *a, **k)
        try:
            yield
        finally:
            dist.all_reduce = stand_in


def count_ready(model: nn.Module, log: AllReduceLog) -> None:
    """Hooks registered before the learner's: they fire first, counting final gradients."""
    def ready(param):
        log.ready += 1

    for param in model.parameters():
        param.register_post_accumulate_grad_hook(ready)


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank = dist.get_rank(group)
    model = make_model(spec["seed"])
    batches = [batch(spec, rank, step) for step in range(spec["steps"])]
    expected = [mean_grads(model, spec, step) for step in range(spec["steps"])]
    own = [own_grads(model, x, y) for x, y in batches]
    theirs = copy.deepcopy(model)
    log = AllReduceLog(tracer, len(list(theirs.parameters())))
    count_ready(theirs, log)
    passed = None if spec["ranks"] == dist.get_world_size() else group
    got, per_step = [], []
    try:
        with tracer.watching(spec["name"], range(spec["ranks"])), recording(log):
            hooks = learner.BucketHooks(theirs, passed, bucket_cap_mb=spec["cap_bytes"] / MB)
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
    return {"name": spec["name"], "ranks": spec["ranks"], "got": got, "expected": expected,
            "own": own, "steps": per_step, "world": dist.get_world_size(group),
            **log.summary()}
