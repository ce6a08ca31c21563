"""A DDP communication hook that all-reduces in bf16: the cases of exercise 10.5, run by
``course_lib.check.mp.program``.

Each case wraps the same small MLP (float32) in torch's ``DistributedDataParallel`` on every
rank and registers the learner's ``bf16_hook(process_group, bucket)``: DDP hands it each
bucket of gradients as backward completes it and copies the value of the future it returns
into the ``.grad`` of the bucket's parameters. Each rank runs a few backward passes on its own
batches; for each pass the case keeps the ``.grad`` DDP left and this rank's own gradient
(the same pass without DDP), so that the checker can form the mean over the ranks itself.
Of every call of the hook it keeps what the call handed to a collective (the tracer's dtype
and size) and the bucket's size.

The case stands between the learner's hook and DDP: what DDP cannot take (not a future, a
future of a list, of another size, or one that failed) is noted and replaced by the bucket as
it is, and the case stops with a ``CaseFinding`` after backward. An exception in the hook
itself is raised again after backward, with the learner's line. DDP thus never ends in an
error of its own, which can abort the process when it exits.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course_lib.check.cases import hook_cases
from course_lib.check.mp.learner import CaseFinding
from course_lib.check.mp.tracer import Tracer
from course_lib.core.buckets import MB

SMALL_CAP = 1100  # bytes: 3 buckets of the model's float32 gradients (from the 2nd pass)
LARGE_SCALE = 1e6  # the loss times this: gradients beyond float16's largest value, 65504


def case_specs(world_size: int, options: dict) -> list[dict]:
    n = world_size
    specs = [
        {"name": "3 backward passes: 1 bucket, then 3 (DDP rebuilds them after the first)",
         "passes": 3, "cap": SMALL_CAP, "scale": 1.0, "ranks": n},
        {"name": "one bucket, gradients up to 1e5 (the loss times 1e6)", "passes": 1,
         "cap": 25 * MB, "scale": LARGE_SCALE, "ranks": n},
    ]
    if n >= 3:
        specs.append({"name": f"a group of ranks 0..{n - 2} (not the whole world)",
                      "passes": 1, "cap": SMALL_CAP, "scale": 1.0, "ranks": n - 1})
    for i, spec in enumerate(specs):
        spec["seed"] = i
    return specs


def done(value: torch.Tensor) -> torch.futures.Future:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(value)
    return future


class HookLog:
    """The learner's hook as DDP calls it, and what each call did."""

    def __init__(self, learner):
        self.learner, self.log, self.calls = learner, None, []
        self.error: BaseException | None = None  # raised by the learner's hook
        self.finding: str | None = None  # what DDP could not have taken

    def note(self, finding: str) -> None:
        self.finding = self.finding or finding

    def ddp_hook(self, state, bucket):  # no annotations: DDP checks them, strings fail
        buffer = bucket.buffer()  # (numel,) float32: this rank's gradients of the bucket
        before = len(self.log.handed)
        try:
            result = self.learner.bf16_hook(state, bucket)
        except Exception as error:  # raised again after backward, with the learner's line
            self.error = self.error or error
            return done(buffer)
        self.calls.append({"numel": buffer.numel(), "handed": self.log.handed[before:]})
        if isinstance(result, dist.Work):
            result.wait()
            self.note("your hook returned the all-reduce's handle (a Work), but DDP takes a "
                      "torch.futures.Future: the handle's get_future() is one")
            return done(buffer)
        if not isinstance(result, torch._C.Future):  # what get_future() and then() return
            self.note(f"your hook returned {type(result).__name__}, but DDP takes a "
                      "torch.futures.Future whose value is the bucket's mean")
            return done(buffer)
        return result.then(lambda future: self.value(future, buffer))

    def value(self, future: torch.futures.Future, buffer: torch.Tensor) -> torch.Tensor:
        """The future's value if DDP can take it, else the bucket as it is (noted)."""
        try:
            value = future.value()
        except Exception as error:
            self.note(f"the future your hook returned failed: {str(error).strip()}")
            return buffer
        if isinstance(value, (list, tuple)):
            self.note(f"the future your hook returned holds a {type(value).__name__} (what an "
                      "all-reduce's own future holds), but DDP takes one tensor: the bucket's "
                      "values, as a future's then() can give them")
            return buffer
        if not isinstance(value, torch.Tensor) or value.numel() != buffer.numel():
            got = (f"a tensor of {value.numel()} values" if isinstance(value, torch.Tensor)
                   else type(value).__name__)
            self.note(f"the future your hook returned holds {got}, but the bucket holds "
                      f"{buffer.numel()} values: DDP takes one tensor of them all")
            return buffer
        return value

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
        if self.finding is not None:
            raise CaseFinding(self.finding)


def own_grads(model: nn.Module, x, y, scale: float) -> list[float]:
    """This rank's gradient alone (the same pass, no DDP)."""
    mine = copy.deepcopy(model)
    (F.cross_entropy(mine(x), y) * scale).backward()
    return hook_cases.flat_grads(mine)


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank = dist.get_rank(group)
    module = hook_cases.make_model(spec["seed"])
    passed = None if spec["ranks"] == dist.get_world_size() else group  # None: the world
    model = DistributedDataParallel(module, process_group=passed,
                                    bucket_cap_mb=spec["cap"] / MB)
    hook = HookLog(learner)
    model.register_comm_hook(passed, hook.ddp_hook)  # the hook's first argument: DDP's group
    passes = []
    with tracer.watching(spec["name"], range(spec["ranks"])) as log:
        hook.log = log
        for i in range(spec["passes"]):
            x, y = hook_cases.batch(spec, rank, i)
            local = own_grads(module, x, y, spec["scale"])
            model.zero_grad(set_to_none=True)
            (F.cross_entropy(model(x), y) * spec["scale"]).backward()  # the hook runs here
            hook.raise_if_failed()
            passes.append({"grad": hook_cases.flat_grads(module), "local": local,
                           "grad_dtype": str(next(module.parameters()).grad.dtype)})
    return {"name": spec["name"], "ranks": spec["ranks"], "passes": passes,
            "hooks": hook.calls, **log.summary()}
