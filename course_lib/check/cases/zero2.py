"""Exercise 10.6, ZeRO-2's two hooks in the learner's file, on 2, 3 and 4 processes:
``gradient_ready(zero2, param)`` on every parameter (copy ``param.grad`` into its bucket, free
it, reduce-scatter every complete bucket in order) and ``reduce_scatter_bucket(grads, piece,
group)`` on every complete bucket.

Rank side: each case builds the same small float64 MLP (8.3's) on every rank, wrapped in the
course's ``Zero2`` with the learner's two hooks, and trains it on each rank's own batches
(``accum`` micro-steps per step; in one case a layer sits out the first micro-step, so two
buckets are incomplete when its backward ends). The case keeps, per call of ``gradient_ready``,
whether ``.grad`` was freed; per bucket that leaves, which one, in which backward, from the
learner's hook or from ``Zero2.end_of_backward``, how many of its gradients had not come, whether
every one that came is in its slot, and what the bucket hook kept and sent (the tracer's bytes,
collectives and library calls). A bucket hook that leaves ``piece.grad`` None or of the wrong
shape stops the case. On 3 and 4 processes a case runs on a group of ranks [1, 2] or [1, 3].

Kernel side: ``reference`` is plain data parallelism (the mean of every rank's gradient, a
whole torch optimizer), computed from the same seeds.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.check import cases
from course_lib.check.answers import close
from course_lib.check.cases import global_rank_sentence, hooks, members, passed, rank_name
from course_lib.check.checker import expect
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.learner import CaseFinding
from course_lib.check.mp.tracer import ALL_REDUCES, Tracer
from course_lib.check.mp.verdict import Advice, is_shape_error
from course_lib.core.buckets import MB
from course_lib.core.zero2 import Zero2

FEATURES, CLASSES, BATCH = hooks.FEATURES, hooks.CLASSES, 4
SMALL_CAP = 2200  # bytes: 4 buckets of the model's float64 parameters
SKIPPED = 2  # the layer a case leaves out of its first micro-step: in buckets 1 and 2


def case_specs(world_size: int, options: dict) -> list[dict]:
    specs = [{"name": "2 steps, 4 buckets, SGD with momentum", "steps": 2, "accum": 1,
              "cap": SMALL_CAP, "optimizer": "SGD with momentum"},
             {"name": "1 step of 2 micro-steps (accumulation), one bucket, AdamW", "steps": 1,
              "accum": 2, "cap": 25 * MB, "optimizer": "AdamW"},
             {"name": f"1 step of 2 micro-steps, 4 buckets, layer {SKIPPED} unused in the "
                      "first", "steps": 1, "accum": 2, "cap": SMALL_CAP,
              "optimizer": "SGD with momentum", "unused_in": [0]}]
    return cases.with_group_case(specs, world_size, {
        "name": "1 step, 4 buckets, AdamW", "steps": 1, "accum": 1, "cap": SMALL_CAP,
        "optimizer": "AdamW"})


def batch(spec: dict, rank: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch: x (BATCH, FEATURES), y (BATCH,)."""
    g = torch.Generator().manual_seed(10_000 * spec["seed"] + 100 * step + 10 * micro + rank)
    return (torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64),
            torch.randint(0, CLASSES, (BATCH,), generator=g))


def forward(model: nn.Sequential, x: torch.Tensor, skip: bool) -> torch.Tensor:
    """The MLP, or without layer SKIPPED and its tanh (its parameters then get no gradient)."""
    layers = [m for i, m in enumerate(model) if not (skip and i in (SKIPPED, SKIPPED + 1))]
    return nn.Sequential(*layers)(x)  # (BATCH, CLASSES)


def micro_loss(spec: dict, model: nn.Sequential, rank: int, step: int, micro: int):
    x, y = batch(spec, rank, step, micro)
    skip = step == 0 and micro in spec.get("unused_in", ())
    return F.cross_entropy(forward(model, x, skip), y) / spec["accum"]


def reference(spec: dict, ranks: int, grad_scale: float = 1.0,
              last_micro_only: bool = False) -> list:
    """Plain data parallelism on ``ranks`` ranks: the parameters after each step.
    ``grad_scale`` N: the sum over the ranks; ``last_micro_only``: each step keeps only its last
    micro-step's gradient."""
    model = hooks.make_model(spec["seed"]).double()
    optimizer_class, options = cases.OPTIMIZERS[spec["optimizer"]]
    optimizer = optimizer_class(model.parameters(), **options)
    after = []
    for step in range(spec["steps"]):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(spec["accum"]):
            if last_micro_only:
                optimizer.zero_grad(set_to_none=True)
            for rank in range(ranks):  # the mean over the ranks of each one's loss
                loss = micro_loss(spec, model, rank, step, micro) / ranks
                (loss * grad_scale).backward()
        optimizer.step()
        after.append(cases.flat_parameters(model))
    return after


def chunk_taken(added: torch.Tensor, grads: torch.Tensor, n: int) -> int | None:
    """Which chunk of ``grads``, divided by ``n``, the hook added to piece.grad, if any."""
    s = added.numel()
    return next((k for k in range(n) if torch.allclose(added, grads[k * s:(k + 1) * s] / n,
                                                       rtol=1e-12, atol=0)), None)


@contextmanager
def uninitialized_as_nan():
    """Memory that torch.empty (empty_like, new_empty, ...) hands out holds NaN meanwhile, not
    whatever was there before: a slot the learner's code never fills shows, every run."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)  # fills uninitialized memory
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


class CaseZero2(Zero2):
    """``Zero2`` whose hook on every parameter is the learner's ``gradient_ready``; it keeps
    each gradient as the hook got it, whether the hook freed ``.grad``, and whether it moved
    ``zero2.reduced`` on past the buckets it sent."""

    learner = None  # the learner's module (set before building)

    def __init__(self, model: nn.Module, *args, **kwargs):
        self.came = {}  # parameter -> its gradient (numel,) since its bucket last left
        self.kept_grad, self.at_end = None, False  # a .grad the hook did not free; in the end?
        self.moved_on = None  # (moved on by, buckets sent) in the first call that skipped
        super().__init__(model.parameters(), *args, **kwargs)
        self.label = {p: f"parameter {name}" for name, p in model.named_parameters()}

    def gradient_ready(self, param: nn.Parameter) -> None:
        self.came[param] = param.grad.detach().reshape(-1).clone()
        reduced, calls = self.reduced, len(self.bucket_hook.calls)
        with uninitialized_as_nan():
            self.learner.gradient_ready(self, param)
        if param.grad is not None and self.kept_grad is None:
            self.kept_grad = self.label[param]
        sent = len(self.bucket_hook.calls) - calls  # buckets this call sent
        if self.reduced - reduced > sent and self.moved_on is None:  # moved past, never sent
            self.moved_on = (self.reduced - reduced, sent)

    def end_of_backward(self) -> None:
        self.at_end = True  # the buckets this backward left, reduced by the library
        try:
            super().end_of_backward()
        finally:
            self.at_end = False


class HookLog:
    """The learner's bucket hook, called for each bucket that leaves, and what each call did."""

    def __init__(self, learner, log):
        self.learner, self.log, self.calls = learner, log, []
        self.zero2, self.backward = None, 0  # set once Zero2 is built; the backward running

    def which(self, grads: torch.Tensor, piece: nn.Parameter) -> dict:
        """The bucket leaving now, how many of its gradients have not come yet, and which of
        those that came is not in its slot of ``grads``."""
        z = self.zero2
        index = next(i for i, b in enumerate(z.buckets) if b.piece is piece)
        bucket = z.buckets[index]
        lost = [z.label[p] for p, start in zip(bucket.params, bucket.offsets, strict=True)
                if p in z.came and not torch.equal(grads[start:start + p.numel()], z.came[p])]
        missing = sum(p not in z.came for p in bucket.params)
        unfilled = torch.ones(grads.numel(), dtype=torch.bool)  # where no gradient was put
        for p, start in zip(bucket.params, bucket.offsets, strict=True):
            if p in z.came:
                unfilled[start:start + p.numel()] = False
        stray = grads.detach()[unfilled & (grads.detach() != 0)]  # NaN != 0 too
        for p in bucket.params:
            z.came.pop(p, None)
        return {"backward": self.backward, "bucket": index, "missing": missing,
                "of": len(bucket.params), "at_end": z.at_end, "lost": lost[:1],
                "stray": float(stray[0]) if stray.numel() else None}

    def __call__(self, grads: torch.Tensor, piece: nn.Parameter, group) -> None:
        left = self.which(grads, piece)
        sent, before = self.log.bytes_sent, (len(self.log.collectives), len(self.log.library))
        earlier = None if piece.grad is None else piece.grad.detach().clone()
        self.learner.reduce_scatter_bucket(grads, piece, group)
        got, rank = piece.grad, dist.get_rank(group)
        if got is None:
            raise CaseFinding(f"after your hook, rank {rank}'s piece.grad is None: the mean of "
                              "its chunk goes there, for the optimizer to step")
        if got.shape != piece.shape:
            raise CaseFinding(f"rank {rank}'s piece holds {piece.numel()} values (its chunk of "
                              "the bucket), but your hook left a piece.grad of shape "
                              f"{tuple(got.shape)}")
        self.calls.append({
            **left, "bucket_bytes": grads.numel() * grads.element_size(), "s": piece.numel(),
            "shares_bucket": (got.untyped_storage().data_ptr() ==
                              grads.untyped_storage().data_ptr()),
            "sent": self.log.bytes_sent - sent,
            "called": self.log.collectives[before[0]:] + self.log.library[before[1]:],
            "took_chunk": chunk_taken(got.detach() - (0 if earlier is None else earlier),
                                      grads, dist.get_world_size(group))})


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank = dist.get_rank(group)
    model = hooks.make_model(spec["seed"]).double()  # the same weights on every rank
    optimizer_class, optimizer_options = cases.OPTIMIZERS[spec["optimizer"]]
    after = []
    with tracer.watching(spec["name"], members(spec)) as log:
        hook, CaseZero2.learner = HookLog(learner, log), learner
        optimizer = CaseZero2(model, optimizer_class,
                              process_group=passed(spec, group), bucket_cap_mb=spec["cap"] / MB,
                              bucket_hook=hook, **optimizer_options)
        hook.zero2 = optimizer
        for step in range(spec["steps"]):
            for micro in range(spec["accum"]):
                micro_loss(spec, model, rank, step, micro).backward()  # the hooks run here
                hook.backward += 1
            optimizer.step()
            optimizer.zero_grad()
            after.append(cases.flat_parameters(model))
    return {"after": after, "hooks": hook.calls, "backwards": hook.backward,
            "buckets": [len(b.params) for b in optimizer.buckets],
            "kept_grad": optimizer.kept_grad, "moved_on": optimizer.moved_on, **log.summary()}


# ---- the judge (in the kernel) --------------------------------------------------------------

def ordinal(k: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(k, f"{k}th")


def judge_gradient_hook(s: dict, who: str) -> None:
    """What the learner's gradient_ready did with each gradient: freed, kept in its slot."""
    expect(s["kept_grad"] is None,
           f"after your gradient_ready, {who}'s {s['kept_grad']} still held its .grad: the "
           "full-size gradient lives on beside its copy in the bucket, the memory ZeRO-2 is "
           "there to free, and the next backward adds its gradient to it")
    for call in s["hooks"]:
        expect(not call["lost"], f"bucket {call['bucket']} went to the reduce-scatter without "
                                 f"the gradient of {''.join(call['lost'])} in its slot: every "
                                 "gradient of a bucket must stay in the bucket's buffer, at "
                                 "its offset, until the bucket leaves")
        stray = call["stray"]
        expect(stray is None,
               f"bucket {call['bucket']} went to the reduce-scatter with values that no "
               "gradient put there, in the padding or in the slot of a parameter whose "
               "gradient had not come (" + ("NaN: the checker fills the memory torch.empty and "
                                            "empty_like hand out with NaN, so that it shows"
                                            if stray != stray else f"{stray}") +
               "). A slot no gradient filled must hold zeros, which add nothing to the sum: "
               "the bucket's buffer starts as zeros")


def judge_launches(s: dict, who: str) -> None:
    """Each backward: every bucket reduce-scattered once, in order, each from the learner's
    hook as soon as it and every bucket before it are complete."""
    if s["moved_on"]:
        moved, sent = s["moved_on"]
        expect(False, f"one call of your gradient_ready moved zero2.reduced on by {moved} "
                      f"but sent {sent} bucket{'s' if sent != 1 else ''}: "
                      "zero2.reduce_scatter(bucket) moves zero2.reduced on by itself, so "
                      "moving it on again skips the next bucket")
    for k in range(s["backwards"]):
        calls = [c for c in s["hooks"] if c["backward"] == k]
        when = f"in the {ordinal(k + 1)} backward"
        for c in calls:
            expect(not c["missing"] or c["at_end"],
                   f"{when}, your gradient_ready reduce-scattered bucket {c['bucket']} while "
                   f"{c['missing']} of its {c['of']} gradients had not come yet: a bucket "
                   "leaves only once every one of its gradients is in it")
        order = [c["bucket"] for c in calls]
        for i, b in enumerate(order):
            expect(b not in order[:i], f"{when}, bucket {b} was reduce-scattered twice")
            expect(b == i, f"{when}, {who} reduce-scattered bucket {b} before bucket {i}: "
                           "every rank must launch the buckets in one order, the plan's, "
                           "whatever order the gradients come in; a rank whose gradients come "
                           "in another order would pair its reduce-scatters with other buckets")
        expect(len(order) == len(s["buckets"]),
               f"{when}, bucket {len(order)} was never reduce-scattered: the buckets a "
               "backward leaves incomplete are reduced when it ends (end_of_backward, which "
               "the first lines of gradient_ready queue), and that also readies the "
               "buckets for the next backward")
        late = [c for c in calls if c["at_end"]]
        expect(not late or late[0]["missing"] > 0,
               f"{when}, bucket {late[0]['bucket'] if late else ''} held every gradient "
               "before backward ended, and so did every bucket before it, but your "
               "gradient_ready did not reduce-scatter it: it waited for the end of backward, "
               "where nothing overlaps")


def judge_hook_call(call: dict, who: str, n: int) -> None:
    """What one call of the hook kept (the case checked piece.grad's shape), and sent."""
    expect(not call["shares_bucket"],
           f"{who}'s piece.grad shares its memory with grads: the whole bucket "
           f"({call['bucket_bytes']} bytes) stays alive as long as the gradient does, and "
           "freeing it is what ZeRO-2 is for")
    reduced = sorted(ALL_REDUCES & set(call["called"]))
    expect(not reduced, f"your hook all-reduces the bucket ({reduced[0] if reduced else ''}): "
                        "every rank receives the sum of every chunk and keeps one; a "
                        "reduce-scatter hands each rank only its own chunk's sum")
    torch_rs = sorted({"reduce_scatter", "reduce_scatter_tensor"} & set(call["called"]))
    expect(not torch_rs, f"your hook calls dist.{torch_rs[0] if torch_rs else ''}: Gloo runs it "
                         "as an all-reduce of the whole bucket and keeps a slice, twice a "
                         "reduce-scatter's bytes; this exercise builds it from the ring's "
                         "first half")
    limit = call["bucket_bytes"] * (n - 1) // n
    expect(call["sent"] <= limit, f"{who} sent {call['sent']} bytes for a bucket of "
                                  f"{call['bucket_bytes']}: a reduce-scatter sends (N-1)/N of "
                                  f"the bucket, {limit} bytes on {n} ranks")


def judge_step(spec: dict, got: list, who: str, step: int, n: int, world: int) -> None:
    """Why ``got``, the parameters after ``step``, are not plain data parallelism's."""
    expect(not close(got, reference(spec, n, grad_scale=n)[step]),
           f"the step used {cases.SUMMED}")
    expect(n == world or not close(got, reference(spec, n, grad_scale=n / world)[step]),
           f"the gradients were divided by {world}, the size of the whole world, but this "
           f"group has {n} ranks: take the size from the group your hook is given")
    expect(spec["accum"] == 1 or not close(got, reference(spec, n, last_micro_only=True)[step]),
           f"with {spec['accum']} backward passes before the step, only the last one's "
           "gradient counted: each backward calls the hook once per bucket, and what an "
           "earlier one left in piece.grad must stay in the sum")
    cases.fail_with_gap(got, reference(spec, n)[step], who, step)


def judge(spec: dict, by_rank: dict, run) -> None:
    n, want = len(by_rank), reference(spec, len(by_rank))
    for rank in range(n):  # first what the gradient hook did with each gradient and bucket
        judge_gradient_hook(by_rank[rank], rank_name(by_rank, rank))
        judge_launches(by_rank[rank], rank_name(by_rank, rank))
    if any(not close(by_rank[r]["after"][-1], want[-1]) for r in range(n)):
        for rank in range(n):  # wrong values: first, whose chunk did each rank keep?
            for call in by_rank[rank]["hooks"]:
                k, s = call["took_chunk"], call["s"]
                if k is not None and k != rank:
                    expect(False, f"{rank_name(by_rank, rank)}'s piece.grad got the mean of "
                                  f"chunk {k} of the bucket (values {k * s}..{(k + 1) * s - 1}), "
                                  f"but its piece is chunk {rank}, values "
                                  f"{rank * s}..{(rank + 1) * s - 1}")
    for step in range(spec["steps"]):
        for rank in range(n):
            if not close(by_rank[rank]["after"][step], want[step]):
                judge_step(spec, by_rank[rank]["after"][step], rank_name(by_rank, rank), step,
                           n, run.world_size)
    for rank in range(n):  # right values: then what the hook kept and sent
        for call in by_rank[rank]["hooks"]:
            judge_hook_call(call, rank_name(by_rank, rank), n)


def explain(error: dict, text: str) -> str:
    if not is_shape_error(error["message"]) and "number of sizes provided" not in error["message"]:
        return ""
    if error.get("function") == "gradient_ready":
        return ("A parameter's slot in the bucket is flat, param.numel() values in a row, "
                "while param.grad has the parameter's shape.")
    return global_rank_sentence(error, text) or (
        "piece holds s values, this rank's chunk of the bucket: its gradient has that shape, "
        "and a gradient of the whole bucket, N*s values, does not fit it.")


EXERCISE = FileExercise(
    "10.6", "workspace/my_zero2.py", ("gradient_ready", "reduce_scatter_bucket"), __name__,
    Advice.unpaired("every rank must reduce-scatter each bucket once, in the group it is "
                    "given", calls="collectives"), judge,
    library={"course_lib.core.zero2": "that is the course's own ZeRO-2: write its two hooks "
                                      "yourself, the second from the ring's reduce-scatter"},
    explain=explain, deadline_s=60.0, entry="check.nb10b.my_zero2")
