"""Gloo collectives on CUDA tensors, every rank on one GPU, against the same on the CPU.

    COURSE_BACKEND=gloo python -m course_lib.runtime.launch --nproc 3 course_lib.demos.cuda_gloo

What ``scripts/gpu_check.sh`` runs on a machine with one GPU: several ranks share it (NCCL
wants one GPU per rank), Gloo carries the bytes, and each collective's result on the GPU is
compared with the same call on the CPU. Without a GPU it runs on the CPU twice, as a check of
itself (``--device cpu``, the default there).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from course_lib.core.collectives import (
    naive_all_reduce,
    recursive_doubling_all_reduce,
    ring_all_reduce,
)
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import print0, worker

COLLECTIVES = {
    "dist.all_reduce": lambda tensor, group: dist.all_reduce(tensor, group=group),
    "naive_all_reduce": naive_all_reduce,
    "ring_all_reduce": ring_all_reduce,
    "recursive_doubling": recursive_doubling_all_reduce,
}
NUMEL = 1000 + 7  # not a multiple of any world size: uneven chunks


def compare(name: str, rank: int, group, device: torch.device) -> dict:
    """One collective on the CPU and on ``device`` from the same numbers: equal or not."""
    numbers = torch.randn(NUMEL, generator=torch.Generator().manual_seed(rank))  # (NUMEL,)
    on_cpu = numbers.clone()
    COLLECTIVES[name](on_cpu, group)
    on_device, error = numbers.to(device), None
    try:
        COLLECTIVES[name](on_device, group)
    except Exception as failure:  # a collective Gloo refuses on this device: say which
        error = f"{type(failure).__name__}: {str(failure).splitlines()[0][:160]}"
    gap = None if error else (on_device.cpu() - on_cpu).abs().max().item()
    return {"collective": name, "rank": rank, "device": str(on_device.device), "error": error,
            "max_difference": gap}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the tensors live: cuda (every rank on GPU 0) or cpu")
    options = parser.parse_args(argv)
    device = torch.device("cuda", 0) if options.device == "cuda" else torch.device("cpu")
    with worker(seed=0, backend="gloo") as w:
        rows = [compare(name, w.rank, w.group, device) for name in COLLECTIVES]
        gathered = [None] * w.world_size
        dist.all_gather_object(gathered, rows, group=w.group)
        every = [row for rank_rows in gathered for row in rank_rows]
        for name in COLLECTIVES:
            mine = [r for r in every if r["collective"] == name]
            errors = sorted({r["error"] for r in mine if r["error"]})
            worst = max((r["max_difference"] for r in mine if r["error"] is None), default=None)
            verdict = (f"refused: {errors[0]}" if errors else
                       f"equal to the CPU's within {worst:.1e}" if worst else
                       "equal to the CPU's, bit for bit")
            print0(w, f"[gpu] gloo on {device}, {w.world_size} ranks, {name}: {verdict}")
        save_result(every)


if __name__ == "__main__":
    main()
