"""Ping-pong between rank 0 and rank 1: how long a message of n bytes takes (notebooks 05, 06).

    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.latency_bandwidth \\
        --sizes 8 1024 65536 1048576 --repeats 20

Runs on any world size >= 2 (ranks above 1 only wait), on Gloo (CPU) or NCCL (one GPU per
process). For each size, rank 0 sends a float32 tensor of that many bytes to rank 1, which
sends it straight back; half of the round trip is one message's time. Each size is checked
once (the echo must equal what was sent), then timed ``--warmup`` + ``--repeats`` times.
Rank 0 hands back the fastest, quartiles, median and slowest one-way time per size; fit them with
``course_lib.lessons.cost_model.fit_alpha_beta``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from course_lib.runtime.launch import report_progress, save_result
from course_lib.runtime.worker import Worker, print0, worker

DEFAULT_SIZES = (8, 1024, 16384, 262144, 1048576, 4194304)  # bytes: 8 B to 4 MiB


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES),
                        help="message sizes in bytes (multiples of 4: float32 elements)")
    parser.add_argument("--repeats", type=int, default=20, help="timed round trips per size")
    parser.add_argument("--warmup", type=int, default=3, help="untimed round trips first")
    args = parser.parse_args()
    if any(s < 4 or s % 4 for s in args.sizes):
        parser.error(f"--sizes must be multiples of 4 bytes (float32), got {args.sizes}")
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    return args


def wait_for_device(device: torch.device) -> None:
    """GPU work is asynchronous: wait for it before reading the clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def round_trip(w: Worker, message: torch.Tensor) -> None:
    """Rank 0 sends ``message`` to rank 1 and receives it back into the same buffer."""
    if w.rank == 0:
        dist.send(message, dst=1, group=w.group)
        dist.recv(message, src=1, group=w.group)
    elif w.rank == 1:
        dist.recv(message, src=0, group=w.group)
        dist.send(message, dst=0, group=w.group)
    wait_for_device(w.device)


def echo_is_exact(w: Worker, nbytes: int) -> bool:
    """Once per size: does the message come back bit for bit? (rank 0 knows; 1 says True)"""
    original = torch.arange(nbytes // 4, dtype=torch.float32, device=w.device)
    message = original.clone() if w.rank == 0 else torch.zeros_like(original)
    round_trip(w, message)
    return w.rank != 0 or torch.equal(message, original)


def one_way_times(w: Worker, nbytes: int, warmup: int, repeats: int) -> list[float]:
    """Seconds per one-way message (half a round trip), as rank 0 saw them."""
    message = torch.zeros(nbytes // 4, dtype=torch.float32, device=w.device)  # (nbytes/4,)
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        round_trip(w, message)
        if i >= warmup:
            times.append((time.perf_counter() - start) / 2)  # there and back: two messages
    return times


def measure(w: Worker, sizes: list[int], warmup: int, repeats: int) -> list[dict]:
    """Every rank calls this; rank 0 returns one row per size (the others an empty list)."""
    rows = []
    for i, nbytes in enumerate(sizes):
        exact = echo_is_exact(w, nbytes)
        times = one_way_times(w, nbytes, warmup, repeats) if w.rank < 2 else []
        if w.rank == 0:
            q1, median, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else times * 3
            rows.append({"bytes": nbytes, "median_s": statistics.median(times),
                         "min_s": min(times), "q1_s": q1, "q3_s": q3, "max_s": max(times),
                         "echo_exact": exact})
            print(f"[time] {nbytes:>9d} bytes: {statistics.median(times) * 1e6:9.1f} us "
                  "one way (median)")
        report_progress(i + 1, len(sizes), "sizes")
    dist.barrier(group=w.group)  # ranks above 1 wait here for the ping-pong to end
    return rows


def main() -> None:
    args = parse_args()
    with worker(seed=0) as w:
        if w.world_size < 2:
            raise SystemExit("ping-pong needs 2 processes; use --nproc 2")
        rows = measure(w, args.sizes, args.warmup, args.repeats)
        print0(w, f"measured {len(rows)} sizes between rank 0 and rank 1")
        save_result({"world_size": w.world_size, "backend": w.backend, "rows": rows})


if __name__ == "__main__":
    main()
