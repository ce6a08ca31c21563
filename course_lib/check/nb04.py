"""Checkers for the exercises of notebook 04 (data parallel in one process)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from course_lib.check.core import exercise, expect
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


def _all_close(got, want) -> bool:
    return all(torch.allclose(g, w, rtol=1e-5, atol=1e-7) for g, w in zip(got, want, strict=True))


@exercise("4.1")
def average_gradients(my_average_gradients) -> None:
    """``my_average_gradients(replicas)``: every replica's .grad becomes the mean, in place."""
    ours = _replicas_with_own_grads(world_size=3)
    want = [torch.stack(grads).mean(dim=0)
            for grads in zip(*(_grads(r) for r in ours), strict=True)]
    result = my_average_gradients(ours)
    expect(result is None or result is ours,
           "change the replicas' .grad in place; there is nothing to return")
    expect(not _all_close(_grads(ours[0]), [3 * w for w in want]),
           "replica 0 holds the sum of the gradients: divide by the number of replicas")
    for rank, replica in enumerate(ours):
        expect(_all_close(_grads(replica), want),
               f"replica {rank} does not hold the mean gradient: write the mean into every "
               "replica's p.grad (p.grad.copy_(mean))")
    expect(all(torch.equal(a, b) for r in ours[1:]
               for a, b in zip(_grads(ours[0]), _grads(r), strict=True)),
           "the replicas' gradients are close but not bitwise equal: compute the mean once "
           "and copy that one tensor into every replica")


@exercise("4.2")
def shard(my_shard) -> None:
    """``my_shard(x, rank, world_size)``: rank's contiguous block of rows; ValueError if uneven."""
    x = torch.arange(24).reshape(12, 2)  # (12, 2): row i is [2i, 2i + 1]
    for world_size in (1, 2, 3, 4, 6):
        parts = [my_shard(x, rank, world_size) for rank in range(world_size)]
        expect(all(torch.is_tensor(p) and p.shape == (12 // world_size, 2) for p in parts),
               f"with {world_size} ranks each shard has 12 / {world_size} = "
               f"{12 // world_size} rows")
        together = torch.cat(parts)  # (12, 2) when the shard sizes are right
        same_rows = torch.equal(together[together[:, 0].argsort()], x)  # x, in any row order
        expect(torch.equal(together, x) or not same_rows,
               "your shards cover every row but not as contiguous blocks: rank r takes rows "
               "r * B / world_size up to (r + 1) * B / world_size (x[r::world_size] interleaves)")
        expect(torch.equal(together, x),
               "the shards, in rank order, should give back the whole batch, each row once")
    try:
        my_shard(torch.zeros(10, 2), 0, 4)
    except ValueError:
        return
    expect(False, "10 rows do not split into 4 equal shards: raise ValueError (and say which "
                  "world sizes would work) instead of dropping or repeating rows")


@exercise("4.3")
def warmup(my_warmup_lr) -> None:
    """``my_warmup_lr(step, peak_lr, warmup_steps)``: linear ramp to the peak, then the peak."""
    for peak, warm in ((0.4, 4), (1.0, 10), (0.1, 1)):
        got = [float(my_warmup_lr(step, peak, warm)) for step in range(warm + 3)]
        want = [replicas.warmup_lr(step, peak, warm) for step in range(warm + 3)]
        expect(got[0] > 0, "step 0 gets learning rate 0, a wasted step: use (step + 1) / "
                           "warmup_steps")
        expect(max(got) <= peak * (1 + 1e-12), f"the rate goes past the peak {peak}: after the "
                                               "warmup it stays at the peak")
        expect(all(abs(a - b) <= 1e-12 * peak for a, b in zip(got, want, strict=True)),
               f"peak {peak}, {warm} warmup steps: expected {[round(v, 4) for v in want]}, "
               f"got {[round(v, 4) for v in got]}")
