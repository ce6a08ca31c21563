"""send/recv and the five collectives, each checked on every rank (notebook 05).

    python -m course_lib.runtime.launch --nproc 4 course_lib.demos.collectives_tour

Runs on any world size >= 2, on Gloo (CPU) or NCCL (one GPU per process). Rank r starts with
``start_values(r, N)`` = [10r, 10r + 1, ..., 10r + N - 1]: one number per chunk c, so that
every sum can be read by eye. Each collective runs on a fresh copy, and every rank compares
what it holds afterwards with ``expected_after`` (the definition of the collective, written
in plain Python in ``course_lib/lessons/collective_definitions.py``). Rank 0 gathers every
rank's before, after and verdict and hands them back:

    {"world_size": N, "backend": "gloo", "ranks": [per-rank facts],
     "point_to_point": {...}, "collectives": {name: {"root": 0 or None, "before": [...],
     "after": [...], "ok": [True per rank]}}}
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from course_lib.lessons.collective_definitions import (
    COLLECTIVES,
    ROOT,
    expected_after,
    start_values,
)
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import Worker, print0, worker

# torch 2.13 renamed reduce_scatter_tensor (input: one tensor of N chunks) to this
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


MEANINGS = {
    "broadcast": "every rank gets the root's tensor",
    "reduce": "the root gets the element-wise sum; other buffers are left unspecified",
    "all_reduce": "every rank gets the element-wise sum",
    "all_gather": "every rank gets every rank's piece, in rank order",
    "reduce_scatter": "rank r gets chunk r of the element-wise sum",
}


def start_of(name: str, rank: int, world_size: int) -> list[float]:
    """all_gather starts from one number per rank (its own chunk); the others from N numbers."""
    values = start_values(rank, world_size)
    return [values[rank]] if name == "all_gather" else values


def format_values(values: list[float] | None) -> str:
    return "(unspecified)" if values is None else "[" + ", ".join(f"{v:g}" for v in values) + "]"


def describe_collective(name: str, entry: dict) -> list[str]:
    """Who holds what before and after, as lines of text (rank by rank)."""
    root = f" (root {entry['root']})" if entry["root"] is not None else ""
    lines = [f"{name}{root}: {MEANINGS[name]}",
             f"  {'rank':6s}{'before':22s}{'after':22s}correct"]
    for r, (before, after, ok) in enumerate(zip(entry["before"], entry["after"], entry["ok"],
                                                strict=True)):
        lines.append(f"  {r:<6d}{format_values(before):22s}{format_values(after):22s}{ok}")
    return lines


def run_collective(name: str, w: Worker) -> list[float] | None:
    """Run one collective on this rank's start values; return what this rank holds after."""
    mine = torch.tensor(start_of(name, w.rank, w.world_size), device=w.device)
    if name == "broadcast":
        dist.broadcast(mine, group=w.group, group_src=ROOT)  # in place: overwritten off the root
    elif name == "reduce":
        dist.reduce(mine, op=dist.ReduceOp.SUM, group=w.group, group_dst=ROOT)
        if w.rank != ROOT:
            return None  # what a non-root buffer holds now is not specified
    elif name == "all_reduce":
        dist.all_reduce(mine, op=dist.ReduceOp.SUM, group=w.group)  # in place on every rank
    elif name == "all_gather":
        pieces = [torch.empty_like(mine) for _ in range(w.world_size)]  # N x (1,)
        dist.all_gather(pieces, mine, group=w.group)
        mine = torch.cat(pieces)  # (N,) rank 0's number first
    elif name == "reduce_scatter":
        out = torch.empty(1, device=w.device)  # (1,) this rank's chunk of the sum
        reduce_scatter(out, mine, op=dist.ReduceOp.SUM, group=w.group)
        mine = out
    else:
        raise ValueError(f"unknown collective {name!r}; pick one of {COLLECTIVES}")
    return mine.cpu().tolist()


def tour_collectives(w: Worker) -> dict:
    """Every collective in turn; every rank checks its own result; rank 0 collects all."""
    report = {}
    for name in COLLECTIVES:
        before_all = [start_of(name, r, w.world_size) for r in range(w.world_size)]
        mine = run_collective(name, w)
        ok = mine == expected_after(name, before_all)[w.rank]  # checked here, on this rank
        print(f"{name:15s} rank {w.rank} holds {mine}  correct: {ok}")
        everyone = [None] * w.world_size
        dist.all_gather_object(everyone, (mine, ok), group=w.group)
        report[name] = {"root": ROOT if name in ("broadcast", "reduce") else None,
                        "before": before_all, "after": [a for a, _ in everyone],
                        "ok": [k for _, k in everyone]}
    return report


def point_to_point(w: Worker) -> dict:
    """Rank 0 sends a tensor to rank 1 (blocking); then each rank passes a number right."""
    sent = torch.tensor([1.0, 2.0, 3.0], device=w.device)
    received = None
    # group_dst, group_src: a rank's number in w.group (dst=, src= number the whole world)
    if w.rank == 0:
        dist.send(sent, group=w.group, group_dst=1)  # with Gloo, waits until rank 1 has it
    elif w.rank == 1:
        buffer = torch.zeros(3, device=w.device)
        dist.recv(buffer, group=w.group, group_src=0)  # waits until rank 0's message is here
        received = buffer.cpu().tolist()
    right, left = (w.rank + 1) % w.world_size, (w.rank - 1) % w.world_size
    token = torch.tensor([float(w.rank)], device=w.device)
    incoming = torch.zeros(1, device=w.device)
    # both at once: if every rank first sent, then received, blocking calls could deadlock
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, token, group=w.group, group_peer=right),
        dist.P2POp(dist.irecv, incoming, group=w.group, group_peer=left)])
    for work in works:
        work.wait()
    facts = (received, incoming.item())
    everyone = [None] * w.world_size
    dist.all_gather_object(everyone, facts, group=w.group)
    return {"sent": sent.cpu().tolist(), "received_by_1": everyone[1][0],
            "from_left": [f[1] for f in everyone]}


def whoami(w: Worker) -> dict:
    """What torchrun told this process, and what the worker helper chose."""
    return {"rank": w.rank, "world_size": w.world_size, "local_rank": w.local_rank,
            "backend": w.backend, "device": w.device.type,
            "master_addr": os.environ.get("MASTER_ADDR"),
            "master_port_set": bool(os.environ.get("MASTER_PORT"))}


def main() -> None:
    with worker(seed=0) as w:
        if w.world_size < 2:
            raise SystemExit("the tour needs at least 2 processes; use --nproc 2 or more")
        ranks = [None] * w.world_size
        dist.all_gather_object(ranks, whoami(w), group=w.group)
        p2p = point_to_point(w)
        collectives = tour_collectives(w)
        all_ok = all(all(c["ok"]) for c in collectives.values())
        print0(w, f"every collective correct on every rank: {all_ok}")
        save_result({"world_size": w.world_size, "backend": w.backend, "ranks": ranks,
                     "point_to_point": p2p, "collectives": collectives})


if __name__ == "__main__":
    main()
