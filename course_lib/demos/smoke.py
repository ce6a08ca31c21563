"""A smoke test: every rank all-reduces a tensor on its device (notebook 00, before anything).

    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.smoke

One collective on the backend the course picks (Gloo on a CPU, NCCL with one GPU per
process). Where a platform's GPUs cannot talk directly (Kaggle's two T4s have no peer access),
NCCL fails here, at once and with its own words, rather than in the middle of a lesson.
"""

import torch
import torch.distributed as dist

from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import print0, worker


def main() -> None:
    with worker(seed=0) as w:
        tensor = torch.full((1024,), float(w.rank + 1), device=w.device)  # rank r holds r + 1
        dist.all_reduce(tensor, group=w.group)  # every rank: 1 + 2 + ... + world_size
        want = w.world_size * (w.world_size + 1) / 2
        ok = bool((tensor == want).all().item())
        print(f"rank {w.rank}: all-reduce on {w.device} ({w.backend}) "
              f"{'gave' if ok else 'did NOT give'} {want:g} everywhere")
        reports = [None] * w.world_size
        dist.all_gather_object(reports, {"rank": w.rank, "device": str(w.device),
                                         "backend": w.backend, "ok": ok}, group=w.group)
        print0(w, f"smoke test: {sum(r['ok'] for r in reports)} of {w.world_size} ranks right")
        save_result(reports)


if __name__ == "__main__":
    main()
