"""Checkers for the exercises of notebook 09 (DDP in practice)."""

from __future__ import annotations

import io
import os
import tempfile

import torch
from torch.utils.data.distributed import DistributedSampler

from course_lib.check.core import exercise, expect

SAMPLER_CASES = ((10, 2), (10, 3), (7, 4), (16, 4))  # (dataset size, world size)


def reference_indices(size: int, world_size: int, rank: int, epoch: int, seed: int) -> list:
    sampler = DistributedSampler(range(size), num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


@exercise("9.1")
def sampler_by_hand(indices) -> None:
    """``indices(size, world_size, rank, epoch, seed)``: what DistributedSampler gives."""
    for size, world_size in SAMPLER_CASES:
        for epoch in (0, 1):
            for rank in range(world_size):
                got = [int(i) for i in indices(size, world_size, rank, epoch, 0)]
                want = reference_indices(size, world_size, rank, epoch, 0)
                if got == want:
                    continue
                per_rank = -(-size // world_size)
                expect(len(got) == per_rank,
                       f"{size} examples on {world_size} ranks: every rank gets "
                       f"ceil({size}/{world_size}) = {per_rank} indices (the permutation is "
                       f"padded by repeating its first indices), not {len(got)}")
                expect(epoch == 0 or got != reference_indices(size, world_size, rank, 0, 0),
                       "epoch 1 gives the same order as epoch 0: seed the shuffle with "
                       "seed + epoch (that is what set_epoch does)")
                expect(False, f"size {size}, world {world_size}, rank {rank}, epoch {epoch}: "
                              f"expected {want}, got {got}. Shuffle with torch.randperm and "
                              "a Generator seeded with seed + epoch, pad, then take every "
                              "world_size-th index starting at rank")


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
    except Exception:  # noqa: BLE001 - any failure to read means the file is damaged
        return None


@exercise("9.2")
def atomic_save(save) -> None:
    """``save(obj, path)`` must leave either the old file or the new one, never half."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "checkpoint.pt")
        save({"step": 1}, path)
        expect(os.path.exists(path), "after save(obj, path) there is no file at path: write "
                                     "to a temporary file, then os.replace it onto path")
        expect(_load(path) == {"step": 1}, "the file at path does not hold what was saved")
        real_save = torch.save
        torch.save = _crashing_save(real_save)
        try:
            save({"step": 2}, path)
            crashed = False
        except Exception:  # noqa: BLE001 - the simulated crash is expected to come through
            crashed = True
        finally:
            torch.save = real_save
        expect(crashed, "the simulated crash inside torch.save did not reach the caller: "
                        "do not swallow errors while saving")
        expect(_load(path) == {"step": 1},
               "a crash while writing destroyed the previous checkpoint: write the new one "
               "to path + '.tmp' and only then os.replace(tmp, path)")
