"""Split one global batch into world_size x accum_steps micro-batches (notebooks 03, 04, 07).

    global batch = world_size x accum_steps x micro_batch examples

    from course_lib.tasks.batching import micro_batch, micro_batches_of_rank
    part = micro_batch(batch, rank=1, k=0, world_size=2, accum_steps=4)   # a fixed slice
    parts = micro_batches_of_rank(batch, rank=1, world_size=2, accum_steps=4)  # its 4 slices

Rank ``r`` owns the contiguous block ``r`` of the batch and walks through it in ``accum_steps``
micro-steps. Every split covers exactly the same examples, each once, so every (world_size,
accum_steps) pair computes the gradient of the same global batch.

``batch`` can be anything that is cut along its first dimension: a tensor, a
``course_lib.tasks.sequences.TokenBatch``, or a tuple/list of tensors such as ``(x, y)``.
"""

from __future__ import annotations

from typing import Any


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def micro_batch_size(global_size: int, world_size: int, accum_steps: int) -> int:
    """Examples per micro-batch; a clear error when the global batch cannot be split evenly."""
    for name, value in (("world_size", world_size), ("accum_steps", accum_steps)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    parts = world_size * accum_steps
    if global_size < 1 or global_size % parts:
        if global_size >= 1 and global_size % world_size == 0:
            choices = divisors(global_size // world_size)
            hint = f"pick accum_steps in {{{', '.join(map(str, choices))}}}"
        else:
            hint = f"pick a world_size that divides {global_size}"
        raise ValueError(f"global batch {global_size} is not divisible by world_size "
                         f"{world_size} x accum_steps {accum_steps}; {hint}, or make the "
                         f"global batch a multiple of {parts}")
    return global_size // parts


def micro_batch_slice(global_size: int, rank: int, k: int, world_size: int,
                      accum_steps: int) -> slice:
    """Which rows of the global batch rank ``rank`` uses at micro-step ``k``."""
    size = micro_batch_size(global_size, world_size, accum_steps)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    if not 0 <= k < accum_steps:
        raise ValueError(f"micro-step k={k} is outside 0..{accum_steps - 1}")
    start = (rank * accum_steps + k) * size  # rank r owns block r; micro-step k is its k-th part
    return slice(start, start + size)


def batch_length(batch: Any) -> int:
    if isinstance(batch, (tuple, list)):
        lengths = {len(part) for part in batch}
        if len(lengths) != 1:
            raise ValueError(f"the parts of the batch have different lengths {sorted(lengths)}; "
                             "every part needs one row per example")
        return lengths.pop()
    return len(batch)


def take(batch: Any, rows: slice) -> Any:
    """``batch[rows]``, part by part for a tuple or list of tensors."""
    if isinstance(batch, (tuple, list)):
        return type(batch)(part[rows] for part in batch)
    return batch[rows]


def micro_batch(batch: Any, rank: int, k: int, world_size: int, accum_steps: int) -> Any:
    """The micro-batch of ``rank`` at micro-step ``k`` (a view, no copy for tensors)."""
    size = batch_length(batch)
    return take(batch, micro_batch_slice(size, rank, k, world_size, accum_steps))


def micro_batches_of_rank(batch: Any, rank: int, world_size: int, accum_steps: int) -> list:
    """The ``accum_steps`` micro-batches that ``rank`` processes, in order."""
    return [micro_batch(batch, rank, k, world_size, accum_steps) for k in range(accum_steps)]
