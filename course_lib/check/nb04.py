"""Checkers for the exercises of notebook 04 (data parallel in one process)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from course_lib.check.answers import as_number, expect_raises, expect_type
from course_lib.check.checker import exercise, expect
from course_lib.check.own_work import call_own
from course_lib.lessons import replicas
from course_lib.tasks import toy


def _replicas_with_own_grads(world_size: int = 3):
    """``world_size`` equal replicas, each with the gradient of its own shard (not yet synced)."""
    model = toy.make_mlp(hidden=8, norm="layer", seed=4)
    x, y = toy.two_moons(12, seed=5)
    copies = [copy.deepcopy(model) for _ in range(world_size)]
    for rank, replica in enumerate(copies):
        xs, ys = replicas.shard(x, rank, world_size), replicas.shard(y, rank, world_size)
        F.cross_entropy(replica(xs), ys).backward()
    return copies


def _grads(model) -> list[torch.Tensor]:
    return [p.grad for p in model.parameters()]


def _shared_grad(replica_list) -> tuple[int, int] | None:
    """Two replicas (ranks) whose .grad of one parameter lie in the same memory, or None."""
    for grads in zip(*(_grads(r) for r in replica_list), strict=True):
        owner = {}  # storage address -> the first rank whose gradient lies there
        for rank, g in enumerate(grads):
            other = owner.setdefault(g.untyped_storage().data_ptr(), rank)
            if other != rank:
                return other, rank
    return None


def _all_close(got, want) -> bool:
    return all(torch.is_tensor(g) and torch.allclose(g, w, rtol=1e-5, atol=1e-7)
               for g, w in zip(got, want, strict=True))


@exercise("4.1")
def average_gradients(my_average_gradients) -> None:
    """``my_average_gradients(replicas)``: every replica's .grad becomes the mean, in place."""
    ours = _replicas_with_own_grads(world_size=3)
    want = [torch.stack(grads).mean(dim=0)
            for grads in zip(*(_grads(r) for r in ours), strict=True)]
    before = [_grads(r) for r in ours]  # the tensors backward left: to be changed in place
    result = call_own(my_average_gradients, ours, library=[replicas.average_gradients])
    expect(not _all_close(_grads(ours[0]), [3 * w for w in want]),
           "replica 0 holds the sum of the gradients, not their mean")
    expect(result is None or _all_close(_grads(ours[0]), want),
           f"your function returns a {type(result).__name__}, and the replicas' .grad do "
           "not hold the mean: the checker reads each replica's .grad, changed in place")
    for rank, replica in enumerate(ours):
        expect(all(torch.is_tensor(g) for g in _grads(replica)),
               f"replica {rank} has parameters without .grad after your function ran")
        first = "" if rank == 0 else ", though replica 0 does: not every replica gets it"
        expect(_all_close(_grads(replica), want),
               f"replica {rank} does not hold the mean gradient{first}")
    shared = _shared_grad(ours)
    if shared:
        expect(False, f"replicas {shared[0]} and {shared[1]} share one .grad in memory: after "
                      "zero_grad(set_to_none=False) the next backward of every replica adds "
                      "into it, so each would hold the sum; give every replica the mean in its "
                      "own .grad")
    moved = next((rank for rank, r in enumerate(ours)
                  if any(g is not b for g, b in zip(_grads(r), before[rank], strict=True))), None)
    expect(moved is None, f"replica {moved}'s .grad is a new tensor, not the one backward left: "
                          "the exercise asks for the mean in place, written into each .grad "
                          "tensor itself")
    expect(all(torch.equal(a, b) for r in ours[1:]
               for a, b in zip(_grads(ours[0]), _grads(r), strict=True)),
           "the replicas' gradients are close but not bitwise equal: each replica's mean "
           "was computed on its own, and additions in another order round differently")


@exercise("4.2")
def shard(my_shard) -> None:
    """``my_shard(x, rank, world_size)``: rank's contiguous block of rows; ValueError if uneven."""
    x = torch.arange(24).reshape(12, 2)  # (12, 2): row i is [2i, 2i + 1]
    for world_size in (1, 2, 3, 4, 6):
        parts = [call_own(my_shard, x, rank, world_size, library=[replicas.shard])
                 for rank in range(world_size)]
        for part in parts:
            expect_type(part, torch.Tensor, "return the rank's rows as a tensor (a slice of x)")
        expect(all(p.shape == (12 // world_size, 2) for p in parts),
               f"with {world_size} rank{'s' * (world_size != 1)} and 12 rows, each shard "
               f"should hold an equal share of the rows; yours hold "
               f"{[p.shape[0] for p in parts]}")
        together = torch.cat(parts)  # (12, 2) when the shard sizes are right
        same_rows = torch.equal(together[together[:, 0].argsort()], x)  # x, in any row order
        expect(torch.equal(together, x) or not same_rows,
               "your shards cover every row but not as contiguous blocks: a rank gets every "
               "world_size-th row, not one run of neighbouring rows")
        expect(torch.equal(together, x),
               f"with {world_size} rank{'s' * (world_size != 1)} the shards, in rank order, "
               "do not give back the batch: some rows are missing and others repeated, so a "
               "block does not start where the rank before ends")
    uneven = "10 rows do not split into 4 equal shards"
    expect_raises(lambda: call_own(my_shard, torch.zeros(10, 2), 0, 4, library=[replicas.shard]),
                  ValueError, uneven, f"{uneven}, yet your function returned a shard, so rows are "
                                      "dropped or repeated where the exercise asks for a "
                                      "ValueError")


TOLERANCE = 1e-6  # of the peak: a rate rounded to float32 is still the rate


def _warmup_hint(got: list[float], peak: float, warm: int) -> str:
    """What is off in a warmup schedule ``got`` (steps 0 .. warm + 2)."""
    where = f"peak {peak}, {warm} warmup steps"
    steps = {round(rate / peak, 6) for rate in got[:warm]}  # as fractions of the peak
    if warm > 1 and steps <= {0.0, 1.0} and len(steps) == 2:
        return (f"{where}: your rate is 0 and then jumps to the peak, with no ramp between: "
                "a whole-number division (//) gives 0 until the warmup ends, where the ramp "
                "needs a growing fraction of the peak at every step")
    if got[0] <= 0:
        return (f"{where}: step 0 gets learning rate {got[0]:.4g}, a wasted step; the first "
                "step should already be one step up the ramp")
    if max(got) > peak * (1 + TOLERANCE):
        return f"{where}: the rate goes past the peak; after the warmup it stays at the peak"
    if abs(got[warm - 1] - peak) > TOLERANCE * peak:
        return (f"{where}: at step {warm - 1}, the last warmup step, your rate is "
                f"{got[warm - 1]:.4g}, not yet the peak; the ramp should end there")
    rises = [b - a for a, b in zip(got[:warm - 1], got[1:warm], strict=True)]
    if any(abs(r - got[0]) > TOLERANCE * peak for r in rises):
        return (f"{where}: the ramp does not rise by equal steps, each as big as the rate "
                "of step 0")
    return f"{where}: after the warmup the rate should stay at the peak"


@exercise("4.3")
def warmup(my_warmup_lr) -> None:
    """``my_warmup_lr(step, peak_lr, warmup_steps)``: linear ramp to the peak, then the peak."""
    for peak, warm in ((0.4, 4), (1.0, 10), (0.1, 1)):
        got = []
        for step in range(warm + 3):
            rate = call_own(my_warmup_lr, step, peak, warm, library=[replicas.warmup_lr])
            got.append(as_number(rate, "return the learning rate of that one step, a number"))
        want = [peak * min(1.0, (step + 1) / warm) for step in range(warm + 3)]
        expect(all(abs(a - b) <= TOLERANCE * peak for a, b in zip(got, want, strict=True)),
               _warmup_hint(got, peak, warm))
