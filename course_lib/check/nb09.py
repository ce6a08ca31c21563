"""Checkers for the exercises of notebook 09 (DDP in practice)."""

from __future__ import annotations

import io
import numbers
import os
import tempfile

import torch
from torch.utils.data.distributed import DistributedSampler

from course_lib.check.answers import describe, expect_function
from course_lib.check.cases import ddp_script
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_exercise
from course_lib.check.own_work import call_own
from course_lib.train.checkpoint import save_checkpoint, write_atomic

SAMPLER_CASES = ((10, 2), (10, 3), (7, 4), (16, 4))  # (dataset size, world size)


def reference_indices(size: int, world_size: int, rank: int, epoch: int, seed: int) -> list:
    sampler = DistributedSampler(range(size), num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


@exercise("9.1")
def sampler_by_hand(indices) -> None:
    """``indices(size, world_size, rank, epoch, seed)``: what DistributedSampler gives."""
    expect_function(indices, "check.nb09.sampler_by_hand(sampler_indices)")
    for size, world_size in SAMPLER_CASES:
        for epoch in (0, 1):
            for rank in range(world_size):
                got = call_own(indices, size, world_size, rank, epoch, 0,
                               library=[DistributedSampler.__init__],
                               hint="your function uses {name}: the point is to write what it "
                                    "does yourself, with torch.randperm and a slice")
                if torch.is_tensor(got):
                    got = got.tolist()  # a tensor of indices counts as its list
                expect(isinstance(got, (list, tuple)) and all(
                    isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in got),
                       f"return this rank's indices as a list of whole numbers; your code "
                       f"returned {describe(got)}")
                got = [int(i) for i in got]
                want = reference_indices(size, world_size, rank, epoch, 0)
                if got == want:
                    continue
                per_rank = -(-size // world_size)
                expect(len(got) == per_rank,
                       f"{size} examples on {world_size} ranks: every rank gets "
                       f"ceil({size}/{world_size}) = {per_rank} indices (the permutation is "
                       f"padded by repeating its first indices), not {len(got)}")
                expect(epoch == 0 or got != reference_indices(size, world_size, rank, 0, 0),
                       "epoch 1 gives the same order as epoch 0: the shuffle's seed must "
                       "change with the epoch (DistributedSampler seeds it with seed + epoch)")
                expect(False, f"size {size}, world {world_size}, rank {rank}, epoch {epoch}: "
                              f"expected {want}, got {got}: rank r's share is every "
                              "world_size-th index of the padded shuffle, from index r on")


def _crashing_save(real_save):
    """A torch.save that writes half of the bytes and then fails, like a full disk."""

    def save(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer)
        data = buffer.getvalue()[: len(buffer.getvalue()) // 2]
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as out:
                out.write(data)
        else:
            f.write(data)
        raise OSError("No space left on device (simulated while saving)")

    return save


def _load(path: str):
    try:
        return torch.load(path, weights_only=True)
    except Exception:  # any failure to read means the file is damaged
        return None


@exercise("9.2")
def atomic_save(save) -> None:
    """``save(obj, path)`` must leave either the old file or the new one, never half."""
    expect_function(save, "check.nb09.atomic_save(save_atomic)")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "checkpoint.pt")
        call_own(save, {"step": 1}, path, library=[write_atomic, save_checkpoint],
                 hint="your function calls the library's {name}: the point is to write the "
                      "two steps yourself")
        expect(os.path.exists(path), "after save(obj, path) there is no file at path: what "
                                     "was written never took path's place")
        expect(_load(path) == {"step": 1}, "the file at path does not hold what was saved")
        real_save = torch.save
        torch.save = _crashing_save(real_save)
        try:
            save({"step": 2}, path)
            crashed = False
        except Exception:  # the simulated crash is expected to come through
            crashed = True
        finally:
            torch.save = real_save
        expect(crashed, "the simulated crash inside torch.save did not reach the caller: "
                        "a swallowed error leaves the caller believing the checkpoint is safe")
        expect(_load(path) == {"step": 1},
               "a crash while writing destroyed the previous checkpoint: the new bytes went "
               "straight into path, so half a file took the old one's place")


# ---- a complete DDP script: the learner's own file, launched on 2, 3 and 4 processes ------

@exercise("9.3")
def my_ddp_train(path: str = ddp_script.EXERCISE.file, world_sizes=WORLD_SIZES) -> None:
    """``train(config)`` in the learner's file: DDP, sampler, no_sync, logging, checkpoint."""
    check_exercise(ddp_script.EXERCISE, path, world_sizes)
