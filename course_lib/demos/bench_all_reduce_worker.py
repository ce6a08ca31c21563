"""Time the hand-written all-reduces against ``dist.all_reduce`` (notebook 06b; one world size).

    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.bench_all_reduce_worker \
        --sizes 4096 4194304 --repeats 10 --warmup 2

Runs on any world size >= 2, on Gloo (CPU) or NCCL (one GPU per process). For each message
size (bytes of a float32 tensor) it first checks once that every algorithm's result equals
``dist.all_reduce``'s, then times warm-up + repeats calls of each algorithm, interleaved so
that a slow moment of the machine hits all of them alike. A call's time is the slowest rank's
(the all-reduce is done when the last rank has its sum); its CPU time is the sum over ranks.
Rank 0 hands back the medians per algorithm and size with ``save_result``;
``scripts/bench_all_reduce.py`` drives it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch
import torch.distributed as dist

from course_lib.core.collectives import (
    naive_all_reduce,
    recursive_doubling_all_reduce,
    ring_all_reduce,
)
from course_lib.core.fast_ring import fast_ring_all_reduce
from course_lib.runtime.launch import report_progress, save_result
from course_lib.runtime.worker import worker


def torch_all_reduce(tensor, group: dist.ProcessGroup | None = None):
    dist.all_reduce(tensor, group=group)
    return tensor


WHOLE = 1 << 40  # a slice size no chunk reaches: each chunk travels as one message
ALGORITHMS = {
    "naive": naive_all_reduce, "ring": ring_all_reduce,
    "recursive_doubling": recursive_doubling_all_reduce, "torch": torch_all_reduce,
    # the fast ring, one change at a time (course_lib/core/fast_ring.py, notebook 06b)
    "fast_reuse": partial(fast_ring_all_reduce, slice_bytes=WHOLE, depth=0, one_stream=False),
    "fast_sliced": partial(fast_ring_all_reduce, one_stream=False),  # + 4 MB slices, pipelined
    "fast_one_stream": fast_ring_all_reduce,  # + both halves as one stream of messages
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", required=True, help="message bytes")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per algorithm")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS),
                        choices=list(ALGORITHMS))
    return parser.parse_args()


def wait_for_device(device: torch.device) -> None:
    """GPU work is asynchronous: wait for it before reading the clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def results_equal(w, source: torch.Tensor, names: list[str]) -> dict[str, bool]:
    """Once per size: does each algorithm give what ``dist.all_reduce`` gives?"""
    expected = torch_all_reduce(source.clone(), w.group)
    equal = {}
    for name in names:
        ours = ALGORITHMS[name](source.clone(), group=w.group)
        equal[name] = bool(torch.allclose(ours, expected, rtol=1e-5, atol=1e-5))
    return equal


def time_calls(w, source: torch.Tensor, names: list[str], warmup: int,
               repeats: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per algorithm: seconds per call (the slowest rank's) and CPU seconds (all ranks').

    The CPU time of a process counts all its threads (Gloo's I/O threads too), so the sum over
    ranks is the work a call costs, whatever else the machine is doing.
    """
    buffer = torch.empty_like(source)
    wall = {name: [] for name in names}
    cpu = {name: [] for name in names}
    for rep in range(warmup + repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:  # rotate the order: no one always goes first
            buffer.copy_(source)  # each call sums the same data
            wait_for_device(w.device)
            dist.barrier(group=w.group)
            start, start_cpu = time.perf_counter(), time.process_time()
            ALGORITHMS[name](buffer, group=w.group)
            wait_for_device(w.device)
            if rep >= warmup:
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    walls = torch.tensor([wall[n] for n in names], dtype=torch.float64, device=w.device)
    cpus = torch.tensor([cpu[n] for n in names], dtype=torch.float64, device=w.device)
    dist.all_reduce(walls, op=dist.ReduceOp.MAX, group=w.group)  # done when the last rank is
    dist.all_reduce(cpus, group=w.group)  # the work of all ranks together
    return {name: (walls[i].tolist(), cpus[i].tolist()) for i, name in enumerate(names)}


def main() -> None:
    args = parse_args()
    with worker(seed=0) as w:
        if w.world_size < 2:
            raise SystemExit("the benchmark needs at least 2 processes; use --nproc 2 or more")
        rows = []
        for i, size in enumerate(args.sizes):
            source = torch.randn(max(1, size // 4), device=w.device)  # float32: 4 bytes each
            equal = results_equal(w, source, args.algorithms)
            times = time_calls(w, source, args.algorithms, args.warmup, args.repeats)
            for name in args.algorithms:
                wall, cpu = times[name]
                q1, median, q3 = statistics.quantiles(wall, n=4) if len(wall) > 1 else wall * 3
                rows.append({"algorithm": name, "bytes": source.numel() * 4,
                             "median_s": statistics.median(wall), "min_s": min(wall),
                             "q1_s": q1, "q3_s": q3, "max_s": max(wall), "wall_s": wall,
                             "cpu_median_s": statistics.median(cpu), "equal": equal[name]})
            report_progress(i + 1, len(args.sizes), "sizes")
        save_result({"world_size": w.world_size, "backend": w.backend, "rows": rows})
        dist.barrier(group=w.group)  # nobody closes its connections while a peer still talks


if __name__ == "__main__":
    main()
