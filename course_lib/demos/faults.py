"""Runs that go wrong on purpose, to see how the launcher ends them (notebooks 00 and 09).

    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.faults --mode raise --rank 1
    python -m course_lib.runtime.launch --nproc 2 --timeout 10 course_lib.demos.faults --mode hang

Modes: ``raise`` (rank R raises), ``killed`` (rank R is killed by SIGKILL), ``hang`` (rank R
never joins the all-reduce the others wait in), ``never-start`` (rank R exits before joining
the process group), ``late`` (rank R never joins the process group: the others time out
waiting for it), ``sleep`` (every rank sleeps ``--seconds``, then all finish).
Any world size >= 2 (``sleep`` also 1).
``--tag`` is ignored by the program: tests use it to find the processes afterwards.
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from course_lib.runtime.worker import worker


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", required=True,
                   choices=["raise", "killed", "hang", "never-start", "late", "sleep"])
    p.add_argument("--rank", type=int, default=1, help="the rank that misbehaves")
    p.add_argument("--seconds", type=float, default=60.0, help="how long 'sleep' sleeps")
    p.add_argument("--tag", default="", help="a marker that tests look for")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    if args.mode == "never-start" and rank == args.rank:
        print(f"rank {rank} exits before joining the process group", flush=True)
        sys.exit(3)
    if args.mode == "late" and rank == args.rank:
        time.sleep(3600)  # the others time out waiting for it to join
    with worker(seed=0) as w:
        print(f"rank {w.rank} joined ({args.mode})", flush=True)
        if args.mode == "sleep":
            time.sleep(args.seconds)
            return
        if w.rank == args.rank and args.mode == "raise":
            raise RuntimeError(f"rank {w.rank} fails on purpose")
        if w.rank == args.rank and args.mode == "killed":
            os.kill(os.getpid(), signal.SIGKILL)  # dies at once: no exception, no exit code
        if w.rank == args.rank and args.mode == "hang":
            time.sleep(3600)  # never reaches the all-reduce below
        dist.all_reduce(torch.ones(1), group=w.group)  # the others wait here for the culprit


if __name__ == "__main__":
    main()
