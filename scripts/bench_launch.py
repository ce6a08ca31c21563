"""How long a launch takes when torchrun forks the ranks, against a fresh Python per rank.

    python scripts/bench_launch.py                 # 3 processes, 5 launches of each kind
    python scripts/bench_launch.py --nproc 4 --repeats 9

Launches ``course_lib.demos.hello`` (start, join the process group, gather, leave) with
``course_lib.runtime.launch``, alternating the two ways of starting ranks so that both see
the same machine load: forked from torchrun's process (Linux's default here:
``--run-path --start-method fork``) and a fresh interpreter per rank (the default elsewhere).
Prints the median wall time and CPU time (this process's children) of each, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from course_lib.runtime import launch as launch_module


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=3, help="processes per launch (default 3)")
    p.add_argument("--repeats", type=int, default=5, help="launches of each kind (default 5)")
    args = p.parse_args(argv)
    if args.nproc < 1 or args.repeats < 1:
        p.error("--nproc and --repeats must be at least 1")
    return args


def one_launch(fork: bool, nproc: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the launched processes) of one launch."""
    launch_module.FORK_WORKERS = fork
    before = os.times()
    start = time.perf_counter()
    launch_module.launch("course_lib.demos.hello", nproc, timeout_s=120, quiet=True,
                         progress=False)
    wall = time.perf_counter() - start
    after = os.times()
    return wall, (after.children_user - before.children_user
                  + after.children_system - before.children_system)


def main(argv=None) -> None:
    args = parse_args(argv)
    if not sys.platform.startswith("linux"):
        sys.exit("forked ranks are used on Linux only; nothing to compare here")
    one_launch(True, args.nproc)  # warm the file cache for both kinds
    times = {True: [], False: []}
    for _ in range(args.repeats):
        for fork in (True, False):
            times[fork].append(one_launch(fork, args.nproc))
    print(f"{args.nproc} processes, median of {args.repeats} launches each:")
    medians = {}
    for fork, label in ((True, "ranks forked from torchrun"), (False, "a fresh Python per rank")):
        wall = statistics.median(w for w, _ in times[fork])
        cpu = statistics.median(c for _, c in times[fork])
        medians[fork] = (wall, cpu)
        print(f"  {label:28s} wall {wall:5.2f} s   CPU {cpu:5.2f} s")
    print(f"  fresh / forked: wall x{medians[False][0] / medians[True][0]:.2f}, "
          f"CPU x{medians[False][1] / medians[True][1]:.2f}")


if __name__ == "__main__":
    main()
