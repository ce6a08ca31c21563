"""Checkers for the exercises of notebook 09 (DDP in practice)."""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import numbers
import os
import sys
import tempfile

import numpy as np
import torch
import torch.serialization
from torch.utils.data.distributed import DistributedSampler

from course_lib.check import report
from course_lib.check.answers import call, describe, expect_function
from course_lib.check.cases import ddp_script
from course_lib.check.checker import LearnerCodeError, exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_exercise
from course_lib.check.own_work import call_own
from course_lib.train.checkpoint import save_checkpoint, write_atomic

SAMPLER_CASES = ((10, 2), (10, 3), (7, 4), (16, 4))  # (dataset size, world size)
SEEDS = (0, 7)  # every case with seed 0 first: a seed left out or misused shows with seed 7


def reference_indices(size: int, world_size: int, rank: int, epoch: int, seed: int) -> list:
    sampler = DistributedSampler(range(size), num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def first_difference(got: list, want: list) -> str:
    """Where two lists of the same length first differ, without showing either whole."""
    at = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
    return f"position {at} holds {got[at]}, expected {want[at]}"


def indices_of(indices, size: int, world_size: int, rank: int, epoch: int, seed: int) -> list:
    got = call_own(indices, size, world_size, rank, epoch, seed,
                   library=[DistributedSampler.__init__],
                   hint="your function uses {name}: the point is to write what it does "
                        "yourself, with torch.randperm and a slice")
    if isinstance(got, (torch.Tensor, np.ndarray)) and got.ndim == 1:
        got = got.tolist()  # a tensor or array of indices counts as its list
    expect(isinstance(got, (list, tuple)) and all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in got),
        f"return this rank's indices as a list of whole numbers; your code returned "
        f"{describe(got)}")
    return [int(i) for i in got]


@exercise("9.1")
def sampler_by_hand(indices) -> None:
    """``indices(size, world_size, rank, epoch, seed)``: what DistributedSampler gives."""
    expect_function(indices, "check.nb09.sampler_by_hand(sampler_indices)")
    for seed in SEEDS:
        for size, world_size in SAMPLER_CASES:
            for epoch in (0, 1):
                for rank in range(world_size):
                    got = indices_of(indices, size, world_size, rank, epoch, seed)
                    want = reference_indices(size, world_size, rank, epoch, seed)
                    if got != want:
                        name_sampler_mistake(got, want, (size, world_size, rank, epoch, seed))


def name_sampler_mistake(got: list, want: list, case: tuple) -> None:
    size, world_size, rank, epoch, seed = case
    per_rank = -(-size // world_size)
    expect(len(got) == per_rank,
           f"{size} examples on {world_size} ranks: every rank gets ceil({size}/{world_size}) "
           f"= {per_rank} indices (the permutation is padded by repeating its first indices), "
           f"not {len(got)}")
    expect(epoch == 0 or got != reference_indices(size, world_size, rank, 0, seed),
           "epoch 1 gives the same order as epoch 0: the shuffle's seed must change with the "
           "epoch (DistributedSampler seeds it with seed + epoch)")
    where = f"size {size}, world {world_size}, rank {rank}, epoch {epoch}, seed {seed}"
    expect(seed == 0 or got != reference_indices(size, world_size, rank, epoch, 0),
           f"{where}: your order is the one of seed 0: the seed is left out (DistributedSampler "
           "seeds the shuffle with seed + epoch)")
    expect(seed == 0, f"{where}: your indices are right with seed 0 but not with seed {seed} "
                      f"({first_difference(got, want)}): the generator's seed must be "
                      "seed + epoch, as the exercise says")
    expect(False, f"{where}: {first_difference(got, want)}. Rank r's share is every "
                  "world_size-th index of the padded shuffle, from index r on")


# ---- 9.2: a disk on which writing the new checkpoint fails halfway -----------------------

def _names(file, path: str) -> bool:
    """Whether ``file`` (a path, a descriptor, a file object, ...) names ``path``."""
    if isinstance(file, bytes):
        file = os.fsdecode(file)
    if not isinstance(file, (str, os.PathLike)):
        return False
    return os.path.realpath(os.fspath(file)) == os.path.realpath(path)


def _through(default: str) -> str:
    """The library function through which the learner's code reached a hook (shutil.copyfile,
    pathlib.Path.write_bytes), or ``default`` when the learner's code called it itself."""
    frame, outermost = sys._getframe(2), None
    while frame is not None and not report.is_learner_file(frame.f_code.co_filename):
        outermost, frame = frame, frame.f_back
    if outermost is None:
        return f"{default} in your code"
    name = f"{outermost.f_globals.get('__name__', '?')}.{outermost.f_code.co_qualname}"
    return f"{name}, called by your code,"


class CrashingDisk:
    """While ``active()``: every torch.save (if ``crash_saves``), and any write into ``path``
    itself, or removal of it, stops halfway with "No space left on device". A torch.save is
    caught inside torch.serialization, so also under another name (``from torch import save
    as s``, ``torch.serialization.save``); a write to ``path`` is caught where files are opened
    (``open``, ``io.open``, ``os.open`` and IPython's ``open`` in a notebook: shutil and
    pathlib go through them). Only a rename (``os.replace``) may put a new file at ``path``.
    ``causes`` says what touched ``path``."""

    def __init__(self, path: str, crash_saves: bool):
        self.path, self.crash_saves = path, crash_saves
        self.causes: list[tuple[str, str]] = []  # ("write" or "remove", what did it)
        self.saves = 0  # torch.save calls that reached the disk's hook
        self.real = {"open": builtins.open, "os.open": os.open, "remove": os.remove,
                     "unlink": os.unlink, "zip": torch.serialization._open_zipfile_writer,
                     "file_like": torch.serialization._open_file_like}

    def crash(self):
        return OSError(errno.ENOSPC, "No space left on device (simulated by the checker)")

    def tear(self) -> None:
        """What a crash while path is rewritten leaves there: half of the old file."""
        if not os.path.exists(self.path):  # already removed: nothing left to tear
            return
        with self.real["open"](self.path, "rb") as old:
            data = old.read()
        with self.real["open"](self.path, "wb") as torn:
            torn.write(data[: len(data) // 2])

    def open(self, file, mode="r", *args, **kwargs):
        if _names(file, self.path) and set(mode) & set("wax+"):
            self.causes.append(("write", _through(f"open(path, {mode!r})")))
            self.tear()
            raise self.crash()
        return self.real["open"](file, mode, *args, **kwargs)

    def os_open(self, file, flags, *args, **kwargs):
        if _names(file, self.path) and flags & (os.O_WRONLY | os.O_RDWR):
            self.causes.append(("write", _through("os.open(path, ...)")))
            self.tear()
            raise self.crash()
        return self.real["os.open"](file, flags, *args, **kwargs)

    def remover(self, name: str):
        def remove(file, *args, **kwargs):
            if _names(file, self.path):
                self.causes.append(("remove", _through(f"os.{name}(path)")))
                self.real[name](file, *args, **kwargs)
                raise self.crash()
            return self.real[name](file, *args, **kwargs)
        return remove

    def writer(self, real_opener):
        """torch.serialization's opener for a save, writing through a buffer that reaches
        the file half written."""
        def opener(f, *mode):
            if mode and "w" not in mode[0]:  # _open_file_like also opens for reading
                return real_opener(f, *mode)
            self.saves += 1
            if not (self.crash_saves or _names(f, self.path)):
                return real_opener(f, *mode)
            buffer = io.BytesIO()
            return HalfWritten(self, f, buffer, real_opener(buffer, *mode))
        return opener

    @contextlib.contextmanager
    def active(self):
        hooks = [(builtins, "open", self.open), (io, "open", self.open),
                 (os, "open", self.os_open), (os, "remove", self.remover("remove")),
                 (os, "unlink", self.remover("unlink")),
                 (torch.serialization, "_open_zipfile_writer", self.writer(self.real["zip"])),
                 (torch.serialization, "_open_file_like", self.writer(self.real["file_like"]))]
        shell = sys.modules.get("IPython.core.interactiveshell")  # a notebook's open() calls
        if shell is not None and hasattr(shell, "io_open"):  # its io_open, bound at import
            hooks.append((shell, "io_open", self.open))
        saved = [(module, name, getattr(module, name)) for module, name, _ in hooks]
        try:
            for module, name, hook in hooks:
                setattr(module, name, hook)
            yield self
        finally:
            for module, name, original in saved:
                setattr(module, name, original)


class HalfWritten:
    """A torch.save's file: serialised into ``buffer``, then half of it written to ``target``."""

    def __init__(self, disk: CrashingDisk, target, buffer: io.BytesIO, in_memory):
        self.disk, self.target, self.buffer, self.in_memory = disk, target, buffer, in_memory

    def __enter__(self):
        return self.in_memory.__enter__()

    def __exit__(self, kind, error, tb):
        self.in_memory.__exit__(kind, error, tb)
        if kind is not None:
            return False
        half = self.buffer.getvalue()[: len(self.buffer.getvalue()) // 2]
        if _names(self.target, self.disk.path):
            self.disk.causes.append(("write", "torch.save(obj, path)"))
        if isinstance(self.target, (str, bytes, os.PathLike)):
            with self.disk.real["open"](self.target, "wb") as out:
                out.write(half)
        else:
            self.target.write(half)
        raise self.disk.crash()


def _load(path: str):
    try:
        return torch.load(path, weights_only=True)
    except Exception:  # any failure to read means the file is damaged
        return None


def expect_checkpoint(path: str, want: dict, disk: CrashingDisk, otherwise: str) -> None:
    """``path`` holds ``want``, whole; if not, say what touched it (``otherwise``: nothing
    the disk saw did)."""
    if _load(path) == want:
        return
    expect(bool(disk.causes), otherwise)
    kind, cause = disk.causes[0]
    expect(kind != "remove", f"a crash right after {cause} left no checkpoint at path: the "
                             "previous one must stay there until the new one, complete, takes "
                             "its place")
    expect(False, f"a crash while writing destroyed the previous checkpoint: {cause} wrote "
                  "straight into path, so half a file took the old one's place")


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
        crash_inside_save(save, path)
        writes_beside(save, path)


def crash_inside_save(save, path: str) -> None:
    """Every torch.save stops halfway: path keeps the old checkpoint, the error comes out."""
    disk = CrashingDisk(path, crash_saves=True)
    with disk.active():
        try:
            save({"step": 2}, path)
            crashed = False
        except Exception:  # the simulated crash is expected to come through
            crashed = True
    expect(crashed or disk.saves, "your code never called torch.save: the checker makes "
                                  "torch.save crash to see what is left at path")
    expect_checkpoint(path, {"step": 1}, disk, "a crash while writing destroyed the previous "
                      "checkpoint: the new bytes went into path, so half a file took its place")
    expect(crashed, "the simulated crash inside torch.save did not reach the caller: "
                    "a swallowed error leaves the caller believing the checkpoint is safe")


def writes_beside(save, path: str) -> None:
    """torch.save works, but writing into path itself crashes: only a rename may replace it."""
    disk = CrashingDisk(path, crash_saves=False)
    with disk.active():
        try:
            call(save, {"step": 3}, path)
        except LearnerCodeError:
            if not disk.causes:  # an error of the learner's own: that is the report
                raise
    expect_checkpoint(path, {"step": 3}, disk, "after a second save(obj, path), path does not "
                      "hold obj: the new file must take the old one's place")


# ---- a complete DDP script: the learner's own file, launched on 2, 3 and 4 processes ------

@exercise("9.3")
def my_ddp_train(path: str = ddp_script.EXERCISE.file, world_sizes=WORLD_SIZES) -> None:
    """``train(config)`` in the learner's file: DDP, sampler, no_sync, logging, checkpoint."""
    check_exercise(ddp_script.EXERCISE, path, world_sizes)
