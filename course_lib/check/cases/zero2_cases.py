"""ZeRO-2's bucket hook: the cases of exercise 10.6, run by ``course_lib.check.mp.program``.

Each case builds the same small float64 MLP on every rank and wraps it with the course's
``Zero2`` (``course_lib/core/zero2.py``), the learner's ``reduce_scatter_bucket(grads, piece,
group)`` as its ``bucket_hook``: every complete bucket's gradients go through it. Each rank
trains on its own batches (``accum`` micro-steps per step, each loss divided by ``accum``);
``reference`` is plain data parallelism (the mean of every rank's gradient, a whole torch
optimizer), computed here from the same seeds. A hook that leaves ``piece.grad`` None or of
the wrong shape stops the case; of every other call the case keeps whether ``piece.grad``
shares memory with ``grads`` (then the whole bucket stays alive) and what the call sent (the
tracer's bytes, collectives and library calls).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.check.cases import hook_cases
from course_lib.check.mp.learner import CaseFinding
from course_lib.check.mp.tracer import Tracer
from course_lib.core.buckets import MB
from course_lib.core.zero2 import Zero2

FEATURES, CLASSES, BATCH = hook_cases.FEATURES, hook_cases.CLASSES, 4
SMALL_CAP = 2200  # bytes: 4 buckets of the model's float64 parameters
OPTIMIZERS = {"SGD with momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
              "AdamW": (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.01})}


def case_specs(world_size: int, options: dict) -> list[dict]:
    n = world_size
    specs = [
        {"name": "2 steps, 4 buckets, SGD with momentum", "steps": 2, "accum": 1,
         "cap": SMALL_CAP, "optimizer": "SGD with momentum", "ranks": n},
        {"name": "1 step of 2 micro-steps (accumulation), one bucket, AdamW", "steps": 1,
         "accum": 2, "cap": 25 * MB, "optimizer": "AdamW", "ranks": n},
    ]
    if n >= 3:
        specs.append({"name": f"a group of ranks 0..{n - 2} (not the whole world)", "steps": 1,
                      "accum": 1, "cap": SMALL_CAP, "optimizer": "AdamW", "ranks": n - 1})
    for i, spec in enumerate(specs):
        spec["seed"] = i
    return specs


def make_model(seed: int) -> nn.Sequential:
    """8.3's MLP, the same float64 weights on every rank (drawn from ``seed``)."""
    return hook_cases.make_model(seed).double()


def batch(spec: dict, rank: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch: x (BATCH, FEATURES), y (BATCH,)."""
    g = torch.Generator().manual_seed(10_000 * spec["seed"] + 100 * step + 10 * micro + rank)
    return (torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64),
            torch.randint(0, CLASSES, (BATCH,), generator=g))


def flat(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def reference(spec: dict, grad_scale: float = 1.0, last_micro_only: bool = False) -> list:
    """Plain data parallelism: the parameters after each step. ``grad_scale`` N: the sum over
    the ranks; ``last_micro_only``: each step keeps only its last micro-step's gradient."""
    model = make_model(spec["seed"])
    optimizer_class, options = OPTIMIZERS[spec["optimizer"]]
    optimizer = optimizer_class(model.parameters(), **options)
    after = []
    for step in range(spec["steps"]):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(spec["accum"]):
            if last_micro_only:
                optimizer.zero_grad(set_to_none=True)
            for rank in range(spec["ranks"]):  # the mean over the ranks of each one's loss
                x, y = batch(spec, rank, step, micro)
                loss = F.cross_entropy(model(x), y) / spec["accum"] / spec["ranks"]
                (loss * grad_scale).backward()
        optimizer.step()
        after.append(flat(model))
    return after


class HookLog:
    """The learner's hook, called by Zero2 for each complete bucket, and what each call did."""

    def __init__(self, learner, log):
        self.learner, self.log, self.calls = learner, log, []

    def __call__(self, grads: torch.Tensor, piece: nn.Parameter, group) -> None:
        sent, before = self.log.bytes_sent, len(self.log.collectives) + len(self.log.library)
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
            "called": (self.log.collectives + self.log.library)[before:],
            "took_chunk": chunk_taken(got.detach() - (0 if earlier is None else earlier),
                                      grads, dist.get_world_size(group))})


def chunk_taken(added: torch.Tensor, grads: torch.Tensor, n: int) -> int | None:
    """Which chunk of ``grads``, divided by ``n``, the hook added to piece.grad, if any."""
    s = added.numel()
    return next((k for k in range(n) if torch.allclose(added, grads[k * s:(k + 1) * s] / n,
                                                       rtol=1e-12, atol=0)), None)


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank = dist.get_rank(group)
    model = make_model(spec["seed"])
    optimizer_class, optimizer_options = OPTIMIZERS[spec["optimizer"]]
    passed = None if spec["ranks"] == dist.get_world_size() else group
    after = []
    with tracer.watching(spec["name"], range(spec["ranks"])) as log:
        hook = HookLog(learner, log)
        optimizer = Zero2(model.parameters(), optimizer_class, process_group=passed,
                          bucket_cap_mb=spec["cap"] / MB, bucket_hook=hook, **optimizer_options)
        for step in range(spec["steps"]):
            for micro in range(spec["accum"]):
                x, y = batch(spec, rank, step, micro)
                (F.cross_entropy(model(x), y) / spec["accum"]).backward()  # hooks run here
            optimizer.step()
            optimizer.zero_grad()
            after.append(flat(model))
    return {"name": spec["name"], "ranks": spec["ranks"], "after": after, "hooks": hook.calls,
            "buckets": len(optimizer.buckets), **log.summary()}
