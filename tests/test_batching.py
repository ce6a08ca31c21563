"""Every (world_size, accum_steps) split covers the same examples, each exactly once."""

import pytest
import torch

from course_lib.tasks.batching import (
    micro_batch,
    micro_batch_size,
    micro_batch_slice,
    micro_batches_of_rank,
)
from course_lib.tasks.sequences import TokenBatch, global_batch


@pytest.mark.parametrize("world_size, accum_steps", [(1, 1), (1, 4), (2, 2), (4, 1), (2, 3)])
def test_split_covers_every_example_once_in_order(world_size, accum_steps):
    rows = torch.arange(24)
    pieces = [micro_batch(rows, r, k, world_size, accum_steps)
              for r in range(world_size) for k in range(accum_steps)]
    assert {len(p) for p in pieces} == {24 // (world_size * accum_steps)}
    assert torch.equal(torch.cat(pieces), rows)  # each row once, rank-major order


def test_rank_owns_a_contiguous_block():
    rows = torch.arange(16)
    mine = micro_batches_of_rank(rows, rank=1, world_size=2, accum_steps=4)
    assert torch.equal(torch.cat(mine), torch.arange(8, 16))
    assert micro_batch_slice(16, 1, 2, 2, 4) == slice(12, 14)


def test_token_batches_and_tuples_are_split_part_by_part():
    batch = global_batch(0, 0, 12)
    part = micro_batch(batch, rank=1, k=1, world_size=2, accum_steps=3)
    assert isinstance(part, TokenBatch)
    assert torch.equal(part.inputs, batch.inputs[8:10])
    x, y = torch.randn(12, 3), torch.arange(12)
    px, py = micro_batch((x, y), rank=0, k=2, world_size=2, accum_steps=3)
    assert torch.equal(px, x[4:6]) and torch.equal(py, y[4:6])
    total = sum(p.num_targets for r in range(2) for p in micro_batches_of_rank(batch, r, 2, 3))
    assert total == batch.num_targets  # no scored token lost or counted twice


def test_uneven_split_gives_a_clear_error_with_choices_that_work():
    with pytest.raises(ValueError) as info:
        micro_batch_size(96, 4, 5)
    message = str(info.value)
    assert message.startswith("global batch 96 is not divisible by world_size 4 x accum_steps 5")
    choices = message.split("{")[1].split("}")[0].split(", ")
    assert choices and all(micro_batch_size(96, 4, int(c)) >= 1 for c in choices)
    with pytest.raises(ValueError, match="pick a world_size that divides 10"):
        micro_batch_size(10, 4, 1)
    with pytest.raises(ValueError, match="accum_steps must be a whole number >= 1"):
        micro_batch_size(8, 1, 0)


def test_bad_rank_or_micro_step_is_refused():
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        micro_batch_slice(8, 2, 0, 2, 2)
    with pytest.raises(ValueError, match="micro-step k=2"):
        micro_batch_slice(8, 0, 2, 2, 2)
    with pytest.raises(ValueError, match="different lengths"):
        micro_batch((torch.zeros(4), torch.zeros(5)), 0, 0, 1, 1)
