"""Inside a worker process: set up and tear down the process group (used from notebook 05 on).

Every multi-process module of the course starts the same way::

    from course_lib.runtime.worker import worker

    with worker(seed=0) as w:          # w.rank, w.world_size, w.backend, w.device, w.group
        ...

The helper picks the backend (NCCL when CUDA has one GPU per local rank, else Gloo; the
environment variable ``COURSE_BACKEND`` overrides), the device, per-rank seeds, a short
process-group timeout (``COURSE_PG_TIMEOUT_S``, default 60 s) and always destroys the process
group at the end, even when the body raises.
"""

from __future__ import annotations

import datetime
import os
import random
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist

BACKEND_ENV = "COURSE_BACKEND"
TIMEOUT_ENV = "COURSE_PG_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Worker:
    """What one process knows about its place in the run."""

    rank: int  # this process's index in the whole run, 0 .. world_size - 1
    world_size: int  # number of processes in the run
    local_rank: int  # index among the processes on this machine (picks the GPU)
    local_world_size: int  # processes on this machine
    backend: str  # "gloo" or "nccl"
    device: torch.device  # where this rank's tensors live
    group: dist.ProcessGroup  # the default process group, passed on explicitly


def choose_backend(local_world_size: int, env: dict | None = None) -> str:
    """NCCL when CUDA has one GPU per local rank, else Gloo; ``COURSE_BACKEND`` overrides."""
    env = os.environ if env is None else env
    forced = env.get(BACKEND_ENV, "").strip().lower()
    if forced:
        if forced not in ("gloo", "nccl"):
            raise ValueError(f"{BACKEND_ENV}={forced!r} is not a backend; use 'gloo' or 'nccl'")
        return forced
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        return "nccl"
    return "gloo"


def check_backend_fits(backend: str, local_world_size: int) -> None:
    """Raise a clear error when NCCL is asked for but there are too few GPUs."""
    if backend != "nccl":
        return
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < local_world_size:
        raise ValueError(
            f"backend nccl needs one GPU per process: {local_world_size} processes on this "
            f"machine but {gpus} GPU(s) available; use fewer processes or {BACKEND_ENV}=gloo"
        )


def seed_everything(seed: int) -> None:
    """Seed every random generator a worker may use."""
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # numpy is optional inside workers
        pass


def quiet_known_warnings() -> None:
    """Keep stderr free of warnings that say nothing to a learner (nbval compares stderr)."""
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
    warnings.filterwarnings("ignore", message=".*barrier\\(\\): using the device under.*")
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")


@contextmanager
def worker(seed: int = 0, timeout_s: float | None = None, backend: str | None = None,
           per_rank_seed: bool = True) -> Iterator[Worker]:
    """Join the process group started by torchrun, yield a :class:`Worker`, always clean up.

    ``seed`` seeds every generator; with ``per_rank_seed`` each rank uses ``seed + rank`` so
    that ranks draw different random numbers (model weights are made equal by a broadcast).
    """
    quiet_known_warnings()
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    if "MASTER_ADDR" not in os.environ:
        raise RuntimeError(
            "this module runs under torchrun; start it with "
            "`python -m course_lib.runtime.launch --nproc 2 MODULE` or "
            "course_lib.runtime.launch.launch(...)"
        )
    backend = backend or choose_backend(local_world_size)
    check_backend_fits(backend, local_world_size)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)  # results depend on thread count; fix it
    seed_everything(seed + rank if per_rank_seed else seed)
    timeout = timeout_s if timeout_s is not None else float(
        os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    dist.init_process_group(
        backend=backend,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout),
        device_id=device if backend == "nccl" else None,
    )
    try:
        yield Worker(rank, world_size, local_rank, local_world_size, backend, device,
                     dist.group.WORLD)
    finally:
        dist.destroy_process_group()


def print0(w: Worker, *args, **kwargs) -> None:
    """Print on rank 0 only (the launcher prefixes every line with its rank)."""
    if w.rank == 0:
        print(*args, **kwargs, flush=True)
