"""Checkers for the exercises of notebook 10b (sharding everything: ZeRO-2 and ZeRO-3): each
a file of the learner's, launched on 2, 3 and 4 processes (its cases and judge:
``course_lib/check/cases/``)."""

from __future__ import annotations

from course_lib.check.cases import bf16_hook, shard_unit, zero2
from course_lib.check.checker import exercise
from course_lib.check.mp.harness import WORLD_SIZES, check_exercise


@exercise("10.5")
def my_bf16_hook(path: str = bf16_hook.EXERCISE.file, world_sizes=WORLD_SIZES) -> None:
    """``bf16_hook(process_group, bucket)`` in the learner's file, as torch DDP's
    communication hook."""
    check_exercise(bf16_hook.EXERCISE, path, world_sizes)


@exercise("10.6")
def my_zero2(path: str = zero2.EXERCISE.file, world_sizes=WORLD_SIZES) -> None:
    """``reduce_scatter_bucket(grads, piece, group)`` in the learner's file, as Zero2's hook."""
    check_exercise(zero2.EXERCISE, path, world_sizes)


@exercise("10.7")
def my_flat_shard(path: str = shard_unit.EXERCISE.file, world_sizes=WORLD_SIZES) -> None:
    """``unshard(unit)``, ``reshard(unit)`` and ``reduce_grad(unit)`` in the learner's file,
    as the moments of the course's fully sharded modules."""
    check_exercise(shard_unit.EXERCISE, path, world_sizes)
