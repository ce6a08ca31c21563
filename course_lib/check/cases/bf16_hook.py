"""Exercise 10.5, a DDP communication hook that all-reduces in bf16: ``bf16_hook(process_group,
bucket)`` in the learner's file, registered on torch's DDP on 2, 3 and 4 processes.

Rank side: each case wraps the same small MLP (float32, ``hooks.make_model``) in torch's
``DistributedDataParallel`` on every rank and registers the learner's hook: DDP hands it each
bucket of gradients as backward completes it and copies the value of the future it returns
into the ``.grad`` of the bucket's parameters. Each rank runs a few backward passes on its own
batches; for each pass the case keeps the ``.grad`` DDP left and this rank's own gradient (the
same pass without DDP). Of every call of the hook it keeps what the call handed to a
collective (the tracer's dtype and size), whether it blocked, and the bucket's size. The case
stands between the hook and DDP: what DDP cannot take (not a future, a future of a list, of
another size, or one that failed) is noted and replaced by the bucket as it is, and the case
stops with a ``CaseFinding`` after backward; an exception in the hook is raised again after
backward, with the learner's line. DDP thus never ends in an error of its own.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from course_lib.check.cases import hooks, members, passed, with_group_case
from course_lib.check.checker import expect
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.learner import CaseFinding
from course_lib.check.mp.tracer import TracedWork, Tracer
from course_lib.check.mp.verdict import Advice, is_shape_error
from course_lib.core.buckets import MB

SMALL_CAP = 1100  # bytes: 3 buckets of the model's float32 gradients (from the 2nd pass)
LARGE_SCALE = 1e6  # the loss times this: gradients beyond float16's largest value, 65504
FUTURE_WAIT_S = 5.0  # a hook's future still open this long after the hook returned never ends
NEVER_COMPLETED = (f"the future your hook returned never completed ({FUTURE_WAIT_S:g} s after "
                   "the hook returned), and DDP waits for it before backward can end: a future "
                   "you make yourself completes when its set_result is called, an all-reduce's "
                   "when the all-reduce has finished")
UNIT_ROUNDOFF = 2.0 ** -8  # bf16 keeps 8 significant bits: each rounding is within 2^-8


def case_specs(world_size: int, options: dict) -> list[dict]:
    specs = [{"name": "3 backward passes: 1 bucket, then 3 (DDP rebuilds them after the first)",
              "passes": 3, "cap": SMALL_CAP, "scale": 1.0},
             {"name": "one bucket, gradients up to 1e5 (the loss times 1e6)", "passes": 1,
              "cap": 25 * MB, "scale": LARGE_SCALE}]
    return with_group_case(specs, world_size, {"name": "1 backward pass, 1 bucket",
                                               "passes": 1, "cap": SMALL_CAP, "scale": 1.0})


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
        before, blocked = len(self.log.handed), len(self.log.blocking)
        try:
            result = self.learner.bf16_hook(state, bucket)
        except Exception as error:  # raised again after backward, with the learner's line
            self.error = self.error or error
            return done(buffer)
        self.calls.append({"numel": buffer.numel(), "handed": self.log.handed[before:],
                           "blocking": self.log.blocking[blocked:]})
        if isinstance(result, dist.Work | TracedWork):  # the tracer's stand-in for a Work
            result.wait()
            self.note("your hook returned the all-reduce's handle (a Work), but DDP takes a "
                      "torch.futures.Future: the handle's get_future() is one")
            return done(buffer)
        if not isinstance(result, torch._C.Future):  # what get_future() and then() return
            self.note(f"your hook returned {type(result).__name__}, but DDP takes a "
                      "torch.futures.Future whose value is the bucket's mean")
            return done(buffer)
        return self.waited_for(result, buffer)

    def waited_for(self, result: torch.futures.Future, buffer) -> torch.futures.Future:
        """What DDP waits for: the learner's future's value once it completes, or, if it has
        not completed ``FUTURE_WAIT_S`` later, the bucket as it is (noted: it never would)."""
        mine, lock = torch.futures.Future(), threading.Lock()

        def finish(value, finding=None):
            with lock:
                if not mine.done():
                    if finding:
                        self.note(finding)
                    mine.set_result(value)

        timer = threading.Timer(FUTURE_WAIT_S, finish, (buffer, NEVER_COMPLETED))
        timer.daemon = True
        timer.start()
        result.add_done_callback(lambda future: (timer.cancel(),
                                                 finish(self.value(future, buffer))))
        return mine

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


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank = dist.get_rank(group)
    module = hooks.make_model(spec["seed"])
    model = DistributedDataParallel(module, process_group=passed(spec, group),
                                    bucket_cap_mb=spec["cap"] / MB)
    hook = HookLog(learner)
    model.register_comm_hook(passed(spec, group), hook.ddp_hook)  # the hook's process_group
    passes = []
    with tracer.watching(spec["name"], members(spec)) as log:
        hook.log = log
        for i in range(spec["passes"]):
            x, y = hooks.batch(spec, rank, i)
            local = hooks.own_grads(module, x, y, spec["scale"])  # without DDP
            model.zero_grad(set_to_none=True)
            (F.cross_entropy(model(x), y) * spec["scale"]).backward()  # the hook runs here
            hook.raise_if_failed()
            passes.append({"grad": hooks.flat_grads(module), "local": local})
    return {"passes": passes, "hooks": hook.calls, **log.summary()}


# ---- the judge (in the kernel) --------------------------------------------------------------

NO_OVERLAP = ("your hook waits for its all-reduce (a blocking dist.all_reduce, then a future "
              "already complete): right, but backward then waits for each bucket's sum before "
              "it computes the next gradients, so nothing overlaps; with async_op=True the "
              "hook can return the all-reduce's future at once")


def bf16_close(got: torch.Tensor, want: torch.Tensor, size: torch.Tensor, n: int) -> bool:
    """Within what bf16 allows: each message rounded once and each of the n-1 additions once,
    at most (n + 1) roundings of 2^-8 of the size ``size`` of the values summed (x 1.5)."""
    tol = 1.5 * (n + 1) * UNIT_ROUNDOFF * size + 1e-30
    return bool(((got - want).abs() <= tol).all())


def described(handed: list) -> str:
    """"a float32 tensor of 1 value and a bfloat16 tensor of 707 values"."""
    parts = [f"a {d} tensor of {k} value{'s' if k != 1 else ''}" for _, d, k in handed]
    return ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]


def judge_handed(hook_call: dict, rank: int, index: int) -> None:
    """What one call of the hook handed to a collective: a bf16 copy of the bucket, once."""
    numel, handed = hook_call["numel"], hook_call["handed"]
    expect(handed, f"rank {rank}'s hook handed nothing to an all-reduce for bucket {index}: "
                   "each rank's gradient stays its own")
    kinds = sorted({dtype for _, dtype, _ in handed})
    expect("float16" not in kinds,
           "your hook sends float16: 2 bytes too, but only 5 bits of exponent, so a gradient "
           "above 65504 becomes inf and one below 6e-8 becomes 0; bfloat16 keeps float32's "
           "8-bit exponent, its range")
    whole = kinds == ["bfloat16"] and sum(k for *_, k in handed) == numel
    expect(len(handed) == 1 or not whole,
           f"your hook makes {len(handed)} all-reduces for one bucket of {numel} values, one "
           "per parameter: DDP hands a hook the whole bucket so that one message carries it "
           "(one start-up cost, not one per tensor); all-reduce a bf16 copy of bucket.buffer()")
    expect(len(handed) == 1,
           f"for one bucket of {numel} values your hook hands {described(handed)} to "
           "collectives: one all-reduce of the bucket's bf16 copy is all it needs (the "
           "group's size is dist.get_world_size(group), no message)")
    nbytes = numel * torch.empty(0, dtype=getattr(torch, kinds[0])).element_size()
    expect(kinds == ["bfloat16"],
           f"your hook all-reduces {kinds[0]}: {nbytes} bytes for a bucket of {numel} "
           "float32 values" + (", what DDP sends without a hook" if kinds == ["float32"]
                               else "") + "; the message of this lesson is bfloat16, 2 bytes "
           f"a value, {2 * numel} bytes")
    expect(handed[0][2] == numel, f"your hook all-reduces {handed[0][2]} values for a bucket "
                                  f"of {numel}: the message is the whole bucket, in bf16")


def judge_pass(by_rank: dict, n: int, world: int, p: int) -> None:
    """The .grad of backward pass ``p`` on every rank: the mean of the ranks' own gradients."""
    local = torch.tensor([by_rank[r]["passes"][p]["local"] for r in range(n)])  # (n, numel)
    mean, size = local.mean(0), local.abs().sum(0) / n
    for rank in range(n):
        got = torch.tensor(by_rank[rank]["passes"][p]["grad"])
        if bf16_close(got, mean, size, n):
            continue
        expect(not bf16_close(got, n * mean, n * size, n),
               "the gradients are the SUM over the ranks: DDP copies what the future holds "
               "into .grad as it is, so the hook divides by the group's size itself")
        expect(n == world or not bf16_close(got, mean * n / world, size, n),
               f"the gradients were divided by {world}, the size of the whole world, but DDP "
               f"runs on a group of {n} ranks here: take the size from the process group the "
               "hook is given")
        expect(not bf16_close(got, mean / n, size / n, n),
               f"the gradients are the mean divided by {n} once more: the group's size "
               "divides the sum once, before the all-reduce or after it, not both")
        expect(not (bf16_close(got, local[rank] / n, size, n)
                    or bf16_close(got, local[rank], size, n)),
               f"rank {rank}'s .grad holds its own gradient, not the mean over the ranks: the "
               "all-reduce's result never reached the bucket, or reached it before the "
               "all-reduce had finished (bring it back in a then() of the all-reduce's future)")
        worst = float((got - mean).abs().max())
        expect(False, f"after backward pass {p + 1}, rank {rank}'s .grad differs from the mean "
                      f"of the ranks' gradients by up to {worst:.2e}, more than bf16's "
                      "rounding allows")


def judge(spec: dict, by_rank: dict, run) -> list[str]:
    n = len(by_rank)
    for rank in range(n):
        for index, hook_call in enumerate(by_rank[rank]["hooks"]):
            judge_handed(hook_call, rank, index)
    for p in range(len(by_rank[0]["passes"])):
        judge_pass(by_rank, n, run.world_size, p)
    return [NO_OVERLAP] if any(c["blocking"] for c in by_rank[0]["hooks"]) else []


def explain(error: dict, text: str) -> str | None:
    """A sentence for the errors a DDP hook meets first, or None."""
    message, source = error["message"], error["source"]
    if "'NoneType' object has no attribute 'get_future'" in message or (
            "'NoneType' object has no attribute 'wait'" in message):
        return ("dist.all_reduce returns None unless it is called with async_op=True; then it "
                "returns a handle, and the handle's get_future() a future")
    if "'NoneType' object has no attribute" in message and "group" in source:
        return ("DDP hands the hook process_group=None when it runs on the whole world: "
                "use dist.group.WORLD then (collectives take group=None as the world too)")
    if "'GradBucket' object has no attribute" in message:
        return ("the bucket's flat float32 gradients are bucket.buffer() (older torch called "
                "it get_tensor()); bucket.gradients() lists them per parameter")
    if "completed() INTERNAL ASSERT" in message:
        return ("a future's value() was read before the all-reduce had finished: read it in "
                "a function given to then(), which runs once it has, or after wait()")
    if is_shape_error(message):
        return ("bucket.buffer() is one flat tensor of every gradient of the bucket; the "
                "future's value is one tensor of that shape, the mean over the ranks")
    return None


EXERCISE = FileExercise(
    "10.5", "workspace/my_bf16_hook.py", ("bf16_hook",), __name__,
    Advice.unpaired("every rank must all-reduce each bucket once, in the process group DDP "
                    "hands the hook", calls="collectives"), judge,
    library={"course_lib.core.compress": "the course's bf16_comm_hook does what this exercise "
                                         "builds; write it with dist.all_reduce",
             "torch.distributed.algorithms.ddp_comm_hooks": "torch's bf16_compress_hook does "
             "what this exercise builds; write it with dist.all_reduce"},
    explain=explain, deadline_s=60.0, entry="check.nb10b.my_bf16_hook")
