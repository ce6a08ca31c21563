"""Each rank says who it is; rank 0 gathers every report and hands them back (notebook 00).

    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.hello

Runs on any world size (1 and more), on Gloo (CPU) or NCCL (one GPU per process).
"""

import os

import torch
import torch.distributed as dist

from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import print0, worker


def main() -> None:
    with worker(seed=0) as w:
        report = {"rank": w.rank, "world_size": w.world_size, "backend": w.backend,
                  "device": str(w.device), "pid": os.getpid(),
                  "torch": torch.__version__.split("+")[0]}
        print(f"hello from rank {w.rank} of {w.world_size} on {w.device} ({w.backend})")
        reports = [None] * w.world_size
        dist.all_gather_object(reports, report, group=w.group)  # every rank gets every report
        print0(w, f"rank 0 gathered {len(reports)} reports")
        save_result(reports)


if __name__ == "__main__":
    main()
