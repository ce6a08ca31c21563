"""Benchmark the hand-written all-reduces against dist.all_reduce (notebook 06b).

    python scripts/bench_all_reduce.py                 # 4 KB .. 64 MB, 2 and 4 processes
    python scripts/bench_all_reduce.py --quick         # a few sizes, a few repeats (< 1 min)
    python scripts/bench_all_reduce.py --world-sizes 2 --sizes 4194304 --repeats 30

For each world size it launches ``course_lib.demos.bench_all_reduce_worker`` (through
``course_lib.runtime.launch``), which checks once per size that every algorithm gives what
``dist.all_reduce`` gives, then times warm-up + repeats calls of each, interleaved. It writes
a table to stdout, ``all_reduce.json`` and ``all_reduce.png`` (bus bandwidth against size)
to ``--out`` (default ``.bench/``, not tracked by git).

Columns: the median wall time of a call (the slowest rank's); the bus bandwidth
``busbw = bytes / time * 2(N-1)/N`` (nccl-tests' definition: what each link of a ring carries,
comparable across N); ours/PyTorch = PyTorch's time / ours (above 1: ours is faster); the
median CPU time of a call summed over ranks (all threads, Gloo's I/O threads too) and the
same ratio for CPU time. On a shared machine wall times swing by 10-20 % from run to run;
CPU times are steadier and show what each algorithm costs, whatever else is running.

The findings on this course's 2-core CPU and on a GPU are in the README (Performance).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from course_lib.runtime.launch import LaunchError, launch  # noqa: E402

WORKER = "course_lib.demos.bench_all_reduce_worker"
FULL_SIZES = [4 ** k * 4096 for k in range(8)]  # 4 KB, 16 KB, ..., 64 MB
QUICK_SIZES = [4096, 262144, 4194304, 16777216]
OURS = ("naive", "ring", "recursive_doubling", "fast_reuse", "fast_sliced",
        "fast_one_stream")  # the textbook algorithms, then the fast ring one change at a time


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Hand-written all-reduce vs dist.all_reduce")
    parser.add_argument("--quick", action="store_true", help="few sizes and repeats (< 1 min)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="message bytes")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per algorithm")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first")
    parser.add_argument("--out", default=os.path.join(ROOT, ".bench"), help="output folder")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    args.repeats = args.repeats or (5 if args.quick else 15)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if any(n < 2 for n in args.world_sizes):
        parser.error("every world size must be at least 2 (one process has nothing to reduce)")
    return args


def run_world(world_size: int, args: argparse.Namespace) -> dict:
    """One launch: every size, every algorithm, at this world size."""
    worker_args = ["--sizes", *map(str, args.sizes), "--repeats", str(args.repeats),
                   "--warmup", str(args.warmup)]
    timeout = 120 + 20 * len(args.sizes) * args.repeats
    try:
        run = launch(WORKER, nproc=world_size, args=worker_args, timeout_s=timeout, quiet=True)
    except LaunchError as e:  # once more: a rank can abort while Gloo tears down under load
        print(f"[bench] {world_size} processes failed ({str(e).splitlines()[0]}); once more",
              flush=True)
        run = launch(WORKER, nproc=world_size, args=worker_args, timeout_s=timeout, quiet=True)
    return run.result


def add_bandwidths(result: dict) -> list[dict]:
    """Rows with algbw, busbw (GB/s) and the ratio to PyTorch at the same size."""
    n = result["world_size"]
    torch_rows = {r["bytes"]: r for r in result["rows"] if r["algorithm"] == "torch"}
    rows = []
    for r in result["rows"]:
        algbw = r["bytes"] / r["median_s"] / 1e9  # GB/s of the tensor itself
        theirs = torch_rows[r["bytes"]]
        rows.append({**r, "world_size": n, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * 2 * (n - 1) / n,  # what each ring link carries
                     "vs_torch": theirs["median_s"] / r["median_s"],  # bandwidth ratio
                     "cpu_vs_torch": theirs["cpu_median_s"] / r["cpu_median_s"]})
    return rows


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:g} {unit}"
        n /= 1024
    return str(n)


def print_table(rows: list[dict]) -> None:
    print(f"{'N':>2} {'size':>7} {'algorithm':>18} {'median ms':>10} {'busbw GB/s':>10} "
          f"{'vs torch':>8} {'cpu ms':>8} {'cpu vs torch':>12} {'equal':>5}")
    for r in rows:
        print(f"{r['world_size']:>2} {human_bytes(r['bytes']):>7} {r['algorithm']:>18} "
              f"{r['median_s'] * 1e3:>10.3f} {r['busbw_GBps']:>10.3f} {r['vs_torch']:>7.2f}x "
              f"{r['cpu_median_s'] * 1e3:>8.2f} {r['cpu_vs_torch']:>11.2f}x {str(r['equal']):>5}")


def summary_lines(rows: list[dict]) -> list[str]:
    """The target: the ring against dist.all_reduce for messages of 4 MB and more."""
    lines = []
    for n in sorted({r["world_size"] for r in rows}):
        for name in ("ring", "fast_one_stream"):
            big = [r["vs_torch"] for r in rows if r["world_size"] == n
                   and r["algorithm"] == name and r["bytes"] >= 4 * 2**20]
            if big:
                lines.append(f"{name} vs dist.all_reduce at {n} processes, >= 4 MB: "
                             f"min {min(big):.2f}x, median {statistics.median(big):.2f}x")
    return lines


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({r["world_size"] for r in rows})
    fig, axes = plt.subplots(1, len(worlds), figsize=(5.5 * len(worlds), 4), squeeze=False)
    for ax, n in zip(axes[0], worlds, strict=True):
        for name in (*OURS, "torch"):
            pts = sorted((r["bytes"], r["busbw_GBps"]) for r in rows
                         if r["world_size"] == n and r["algorithm"] == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    label="dist.all_reduce" if name == "torch" else name)
        ax.set(xscale="log", yscale="log", xlabel="message size (bytes)",
               ylabel="bus bandwidth (GB/s)",
               title=f"all-reduce, {n} processes")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for n in args.world_sizes:
        print(f"[bench] {n} processes, {len(args.sizes)} sizes x {args.repeats} repeats",
              flush=True)
        try:
            rows += add_bandwidths(run_world(n, args))
        except LaunchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    print_table(rows)
    for line in summary_lines(rows):
        print(line)
    with open(os.path.join(args.out, "all_reduce.json"), "w") as f:
        json.dump({"sizes": args.sizes, "repeats": args.repeats, "warmup": args.warmup,
                   "cpu_count": os.cpu_count(), "rows": rows}, f, indent=1)
    if not args.no_plot:
        plot(rows, os.path.join(args.out, "all_reduce.png"))
    print(f"[bench] wrote all_reduce.json{'' if args.no_plot else ' and all_reduce.png'} "
          f"to {args.out}")
    bad = [r for r in rows if not r["equal"]]
    if bad:
        print(f"error: {len(bad)} results differ from dist.all_reduce", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
