"""Rank-0 checkpoints that survive being killed mid-write, and exact resume (notebook 09).

    save_checkpoint(directory, step, model, optimizer, rank, world_size, device)  # every rank
    state = load_checkpoint(directory)                       # None when there is none yet
    check_checkpoint(directory)       # before anything starts: raises CheckpointError
    model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"])
    restore_rng(state["rng"], rank, world_size)

What a resumed run needs to continue bit for bit: the weights, the optimizer's state (Adam's
moments and step count), the step, and every rank's random number generators (dropout draws
differ per rank, so rank 0 gathers all of them). The data needs nothing: each step's batch
depends only on the seed and the step.

Rank 0 writes ``checkpoint.pt.tmp`` and then renames it over ``checkpoint.pt``
(``os.replace`` is atomic): a run killed while writing leaves the previous checkpoint whole.
Every rank reads the same file, so several machines need a shared folder. A file that cannot
be read raises :class:`CheckpointError`, a :class:`ConfigError` with one line that names the
file and what to do; ``python -m course_lib.train --resume`` checks it before any process
starts, so the run ends with that line instead of a traceback from every rank.
"""

from __future__ import annotations

import io
import os
import random
import signal

import torch
import torch.distributed as dist

from course_lib.train.errors import CheckpointError

CHECKPOINT_NAME = "checkpoint.pt"
CRASH_ENV = "COURSE_CRASH_IN_CHECKPOINT"  # fault drill: rank 0 is killed while writing this step
KEYS = ("step", "model", "optimizer", "rng")  # what a resumed run reads


def checkpoint_path(directory: str) -> str:
    return os.path.join(directory, CHECKPOINT_NAME)


def rng_state(device: torch.device) -> dict:
    """This process's random generators: torch's CPU one, the GPU's, Python's."""
    state = {"cpu": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(states: list[dict], rank: int, world_size: int,
                device: torch.device | None = None) -> bool:
    """Put back rank ``rank``'s generators; False when the checkpoint had another world size
    (then the generators keep this run's seeding)."""
    if len(states) != world_size:
        return False
    state = states[rank]
    torch.set_rng_state(state["cpu"])
    random.setstate(state["python"])
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    return True


def gather_rng_states(device: torch.device, world_size: int,
                      group: dist.ProcessGroup | None = None) -> list[dict]:
    """Every rank's generator states, in rank order (a collective: every rank calls it)."""
    mine = rng_state(device)
    if world_size == 1:
        return [mine]
    states: list = [None] * world_size
    dist.all_gather_object(states, mine, group=group)
    return states


def write_atomic(path: str, payload: dict, crash: bool = False) -> None:
    """Write to ``path.tmp``, flush it to disk, then rename it over ``path``.

    crash: the fault drill; half the bytes are written, then this process is killed.
    """
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        if crash:
            f.write(data[: len(data) // 2])
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # as if the machine died mid-write
        f.write(data)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp, path)  # atomic: readers see the old file or the new one, never half


def save_checkpoint(directory: str, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, rank: int, world_size: int,
                    device: torch.device, group: dist.ProcessGroup | None = None,
                    extra: dict | None = None) -> None:
    """Every rank calls this after optimizer step ``step``; rank 0 writes the file."""
    states = gather_rng_states(device, world_size, group)
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        payload = {"step": step, "model": model.state_dict(),
                   "optimizer": optimizer.state_dict(), "rng": states,
                   "world_size": world_size, "extra": extra or {}}
        crash = os.environ.get(CRASH_ENV, "") == str(step)
        write_atomic(checkpoint_path(directory), payload, crash=crash)
    if world_size > 1:
        dist.barrier(group=group)  # nobody goes on (or exits) before the file is complete


def load_checkpoint(directory: str) -> dict | None:
    """The last complete checkpoint in ``directory`` (on the CPU), or None if there is none.

    Raises CheckpointError (one line) when the file is unreadable or is not a checkpoint.
    """
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CheckpointError(f"--checkpoint-dir {directory} is a file, not a folder; point "
                              "--checkpoint-dir at a folder")
    path = checkpoint_path(directory)
    if not os.path.exists(path):
        return None
    advice = "delete it to start over, or pass another --checkpoint-dir"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, overwritten, another format: all end the same way
        raise CheckpointError(f"{path} cannot be read ({type(e).__name__}); {advice}") from e
    missing = [key for key in KEYS if key not in state] if isinstance(state, dict) else KEYS
    if missing:
        raise CheckpointError(f"{path} is not a checkpoint of course_lib.train (no "
                              f"{', '.join(missing)}); {advice}")
    return state


def check_checkpoint(directory: str) -> None:
    """Raise CheckpointError unless ``directory`` holds a usable checkpoint or none at all.

    It reads the whole file once more; this course's checkpoints are small.
    """
    load_checkpoint(directory)
