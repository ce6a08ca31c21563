"""Exercise 10.6, ZeRO-2's bucket hook: ``reduce_scatter_bucket(grads, piece, group)`` in the
learner's file, as the ``bucket_hook`` of the course's ``Zero2`` on 2, 3 and 4 processes.

Rank side: each case builds the same small float64 MLP (8.3's) on every rank and wraps it with
``Zero2`` (``course_lib/core/zero2.py``): every complete bucket's gradients go through the
learner's hook. Each rank trains on its own batches (``accum`` micro-steps per step, each loss
divided by ``accum``). A hook that leaves ``piece.grad`` None or of the wrong shape stops the
case; of every other call the case keeps whether ``piece.grad`` shares memory with ``grads``
(then the whole bucket stays alive), which chunk of the bucket it took, and what the call sent
(the tracer's bytes, collectives and library calls). On 3 and 4 processes a case runs on a
group of ranks [1, 2] or [1, 3].

Kernel side: ``reference`` is plain data parallelism (the mean of every rank's gradient, a
whole torch optimizer), computed from the same seeds.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.check.answers import close
from course_lib.check.cases import (
    global_rank_sentence,
    hooks,
    members,
    passed,
    rank_name,
    subgroup,
)
from course_lib.check.checker import expect
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.learner import CaseFinding
from course_lib.check.mp.tracer import ALL_REDUCES, Tracer
from course_lib.check.mp.verdict import Advice, is_shape_error
from course_lib.core.buckets import MB
from course_lib.core.zero2 import Zero2

FEATURES, CLASSES, BATCH = hooks.FEATURES, hooks.CLASSES, 4
SMALL_CAP = 2200  # bytes: 4 buckets of the model's float64 parameters
OPTIMIZERS = {"SGD with momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
              "AdamW": (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.01})}


def case_specs(world_size: int, options: dict) -> list[dict]:
    specs = [{"name": "2 steps, 4 buckets, SGD with momentum", "steps": 2, "accum": 1,
              "cap": SMALL_CAP, "optimizer": "SGD with momentum"},
             {"name": "1 step of 2 micro-steps (accumulation), one bucket, AdamW", "steps": 1,
              "accum": 2, "cap": 25 * MB, "optimizer": "AdamW"}]
    if world_size >= 3:
        ranks = subgroup(world_size)
        specs.append({"name": f"a group of ranks {ranks} (not the whole world)", "steps": 1,
                      "accum": 1, "cap": SMALL_CAP, "optimizer": "AdamW", "members": ranks})
    return [{**spec, "seed": i} for i, spec in enumerate(specs)]


def batch(spec: dict, rank: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch: x (BATCH, FEATURES), y (BATCH,)."""
    g = torch.Generator().manual_seed(10_000 * spec["seed"] + 100 * step + 10 * micro + rank)
    return (torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64),
            torch.randint(0, CLASSES, (BATCH,), generator=g))


def flat(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def reference(spec: dict, ranks: int, grad_scale: float = 1.0,
              last_micro_only: bool = False) -> list:
    """Plain data parallelism on ``ranks`` ranks: the parameters after each step.
    ``grad_scale`` N: the sum over the ranks; ``last_micro_only``: each step keeps only its last
    micro-step's gradient."""
    model = hooks.make_model(spec["seed"]).double()
    optimizer_class, options = OPTIMIZERS[spec["optimizer"]]
    optimizer = optimizer_class(model.parameters(), **options)
    after = []
    for step in range(spec["steps"]):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(spec["accum"]):
            if last_micro_only:
                optimizer.zero_grad(set_to_none=True)
            for rank in range(ranks):  # the mean over the ranks of each one's loss
                x, y = batch(spec, rank, step, micro)
                loss = F.cross_entropy(model(x), y) / spec["accum"] / ranks
                (loss * grad_scale).backward()
        optimizer.step()
        after.append(flat(model))
    return after


def chunk_taken(added: torch.Tensor, grads: torch.Tensor, n: int) -> int | None:
    """Which chunk of ``grads``, divided by ``n``, the hook added to piece.grad, if any."""
    s = added.numel()
    return next((k for k in range(n) if torch.allclose(added, grads[k * s:(k + 1) * s] / n,
                                                       rtol=1e-12, atol=0)), None)


class HookLog:
    """The learner's hook, called by Zero2 for each complete bucket, and what each call did."""

    def __init__(self, learner, log):
        self.learner, self.log, self.calls = learner, log, []

    def __call__(self, grads: torch.Tensor, piece: nn.Parameter, group) -> None:
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
            "bucket_bytes": grads.numel() * grads.element_size(), "s": piece.numel(),
            "shares_bucket": (got.untyped_storage().data_ptr() ==
                              grads.untyped_storage().data_ptr()),
            "sent": self.log.bytes_sent - sent,
            "called": self.log.collectives[before[0]:] + self.log.library[before[1]:],
            "took_chunk": chunk_taken(got.detach() - (0 if earlier is None else earlier),
                                      grads, dist.get_world_size(group))})


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank = dist.get_rank(group)
    model = hooks.make_model(spec["seed"]).double()  # the same weights on every rank
    optimizer_class, optimizer_options = OPTIMIZERS[spec["optimizer"]]
    after = []
    with tracer.watching(spec["name"], members(spec)) as log:
        hook = HookLog(learner, log)
        optimizer = Zero2(model.parameters(), optimizer_class, process_group=passed(spec, group),
                          bucket_cap_mb=spec["cap"] / MB, bucket_hook=hook, **optimizer_options)
        for step in range(spec["steps"]):
            for micro in range(spec["accum"]):
                x, y = batch(spec, rank, step, micro)
                (F.cross_entropy(model(x), y) / spec["accum"]).backward()  # hooks run here
            optimizer.step()
            optimizer.zero_grad()
            after.append(flat(model))
    return {"after": after, "hooks": hook.calls, **log.summary()}


# ---- the judge (in the kernel) --------------------------------------------------------------

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
           "the step used the SUM of the ranks' gradients: the reduce-scatter adds them up, "
           "and plain data parallelism steps with their mean")
    expect(n == world or not close(got, reference(spec, n, grad_scale=n / world)[step]),
           f"the gradients were divided by {world}, the size of the whole world, but this "
           f"group has {n} ranks: take the size from the group your hook is given")
    expect(spec["accum"] == 1 or not close(got, reference(spec, n, last_micro_only=True)[step]),
           f"with {spec['accum']} backward passes before the step, only the last one's "
           "gradient counted: each backward calls the hook once per bucket, and what an "
           "earlier one left in piece.grad must stay in the sum")
    gap = float((torch.tensor(got) - torch.tensor(reference(spec, n)[step])).abs().max())
    expect(False, f"after step {step + 1}, {who}'s parameters differ from plain data "
                  f"parallelism by up to {gap:.2e}")


def judge(spec: dict, by_rank: dict, run) -> None:
    n, want = len(by_rank), reference(spec, len(by_rank))
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
    if not is_shape_error(error["message"]):
        return ""
    return global_rank_sentence(error, text) or (
        "piece holds s values, this rank's chunk of the bucket: its gradient has that shape, "
        "and a gradient of the whole bucket, N*s values, does not fit it.")


EXERCISE = FileExercise(
    "10.6", "workspace/my_zero2.py", ("reduce_scatter_bucket",), __name__,
    Advice.unpaired("every rank must reduce-scatter each bucket once, in the group it is "
                    "given", calls="collectives"), judge,
    library={"course_lib.core.zero2": "that is the course's own hook: write it yourself, "
                                      "from the ring's reduce-scatter"},
    explain=explain, deadline_s=60.0, entry="check.nb10b.my_zero2")
