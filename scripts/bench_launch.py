"""How long a launch takes when torchrun forks the ranks, against a fresh Python per rank.

    python scripts/bench_launch.py                 # 3 processes, 5 launches of each kind
    python scripts/bench_launch.py --nproc 4 --repeats 9
    python scripts/bench_launch.py --target course_lib.demos.ddp_minimal --preload torch.nn.parallel

Launches ``course_lib.demos.hello`` (start, join the process group, gather, leave), or
``--target``, with ``course_lib.runtime.launch``, alternating the ways of starting ranks so
that all see the same machine load: forked from torchrun's process (Linux's default here:
``--run-path --start-method fork``) and a fresh interpreter per rank (the default elsewhere);
with ``--preload``, also forked after torchrun's process imported those modules
(``COURSE_PRELOAD``). Prints the median wall time and CPU time (this process's children) of
each, and their ratios. Every launch starts a fresh agent (no agent server, whose agents' CPU
this process could not count). A launch that hangs ends the script with the launcher's error.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from course_lib.runtime import launch as launch_module
from course_lib.runtime.launch_child import PRELOAD_ENV


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=3, help="processes per launch (default 3)")
    p.add_argument("--repeats", type=int, default=5, help="launches of each kind (default 5)")
    p.add_argument("--target", default="course_lib.demos.hello",
                   help="the module or .py file to launch (default course_lib.demos.hello)")
    p.add_argument("--preload", default="",
                   help="modules, comma-separated, to preload in a third kind of launch")
    args = p.parse_args(argv)
    if args.nproc < 1 or args.repeats < 1:
        p.error("--nproc and --repeats must be at least 1")
    return args


def one_launch(kind: str, args: argparse.Namespace) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the launched processes) of one launch of this kind."""
    launch_module.FORK_WORKERS = kind != "fresh"
    launch_module.AGENT_SERVER = False  # a fresh agent each time: its CPU is ours to count
    env = {PRELOAD_ENV: args.preload} if kind == "preloaded" else {}
    before = os.times()
    start = time.perf_counter()
    launch_module.launch(args.target, args.nproc, timeout_s=120, quiet=True, progress=False,
                         env=env)
    wall = time.perf_counter() - start
    after = os.times()
    return wall, (after.children_user - before.children_user
                  + after.children_system - before.children_system)


def main(argv=None) -> None:
    args = parse_args(argv)
    if not sys.platform.startswith("linux"):
        sys.exit("forked ranks are used on Linux only; nothing to compare here")
    labels = {"forked": "ranks forked from torchrun", "fresh": "a fresh Python per rank"}
    if args.preload:
        labels["preloaded"] = f"forked, {args.preload} preloaded"
    one_launch("forked", args)  # warm the file cache for every kind
    times = {kind: [] for kind in labels}
    for _ in range(args.repeats):
        for kind in labels:
            times[kind].append(one_launch(kind, args))
    processes = "process" if args.nproc == 1 else "processes"
    print(f"{args.target} on {args.nproc} {processes}, median of {args.repeats} launch"
          f"{'' if args.repeats == 1 else 'es'} each:")
    medians = {}
    for kind, label in labels.items():
        wall = statistics.median(w for w, _ in times[kind])
        cpu = statistics.median(c for _, c in times[kind])
        medians[kind] = (wall, cpu)
        print(f"  {label:36s} wall {wall:5.2f} s   CPU {cpu:5.2f} s")
    for slower, faster in (("fresh", "forked"), ("forked", "preloaded")):
        if faster in medians:
            print(f"  {slower} / {faster}: wall x{medians[slower][0] / medians[faster][0]:.2f}, "
                  f"CPU x{medians[slower][1] / medians[faster][1]:.2f}")


if __name__ == "__main__":
    main()
