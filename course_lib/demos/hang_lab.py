"""The classic ways a data-parallel run hangs, each ended within seconds (notebook 09).

One failure under torchrun, as in a real run (the process-group timeout ends it):

    COURSE_PG_TIMEOUT_S=5 python -m course_lib.runtime.launch --nproc 2 --timeout 60 \\
        course_lib.demos.hang_lab --failure mismatch
    COURSE_PG_TIMEOUT_S=5 TORCH_DISTRIBUTED_DEBUG=DETAIL python -m course_lib.runtime.launch \\
        --nproc 2 --timeout 60 course_lib.demos.hang_lab --failure mismatch
    COURSE_PG_TIMEOUT_S=5 python -m course_lib.runtime.launch --nproc 2 --timeout 60 \\
        course_lib.demos.hang_lab --failure stuck-rank --monitored

The whole lab at once (every failure with and without the debugging aids, 2 ranks each, all
side by side on Gloo, in a few seconds; rank 0 of the one launched process saves the table):

    python -m course_lib.runtime.launch --nproc 1 --timeout 120 course_lib.demos.hang_lab --lab

Failures (``--failure``); each is a short training loop (gradient all-reduce per step) where
rank ``CULPRIT`` or rank 0 goes wrong in step ``BAD_STEP``:

- ``none``: nothing goes wrong (the control).
- ``mismatch``: the culprit calls ``broadcast`` where the others call ``all_reduce``.
- ``eval-on-rank0``: rank 0 evaluates alone and all-reduces its metric; nobody joins it.
- ``dead-rank``: the culprit is killed (SIGKILL, as by the out-of-memory killer).
- ``stuck-rank``: the culprit stops answering (a deadlock, a slow disk...).

``--monitored``: every step starts with ``dist.monitored_barrier``, which names the ranks that
did not arrive. ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` checks that every rank calls the same
collective with the same shapes before each one runs. Any world size >= 2; the single runs
use the worker's backend (``monitored_barrier`` needs Gloo: on NCCL a Gloo group is made for
it); the lab always uses Gloo on CPU so that its messages are the same on every machine.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course_lib.runtime.files import read_text

FAILURES = ("none", "mismatch", "eval-on-rank0", "dead-rank", "stuck-rank")
CULPRIT = 1  # the rank that misbehaves (rank 0 for eval-on-rank0)
BAD_STEP = 1  # the step in which it does
STEPS = 3  # training steps of the loop
GRAD_NUMEL = 1000  # size of the "gradient" all-reduced each step
STUCK_S = 120.0  # how long a stuck rank sleeps: far longer than any timeout here
DYING_S = 1.0  # a dead rank dies this long into its bad step
MONITOR_TIMEOUT_S = 2.0  # monitored_barrier waits this long for the late ranks
LAB_PG_TIMEOUT_S = 3.0  # process-group timeout of every lab case
LAB_GRACE_S = 2.0  # after a rank of a case fails, the others are stopped this much later
LAB_DEADLINE_S = 30.0  # a lab case still running after this is killed (should never happen)
SETTINGS = ("plain", "detail", "monitored")  # no aid, TORCH_DISTRIBUTED_DEBUG=DETAIL, barrier


@dataclass(frozen=True)
class Case:
    """One run of the lab: a failure, seen with one debugging aid (or none)."""

    failure: str  # one of FAILURES
    setting: str  # one of SETTINGS

    @property
    def key(self) -> str:
        return f"{self.failure}-{self.setting}"


CASES = [Case(failure, setting) for failure, setting in (
    ("none", "plain"), ("mismatch", "plain"), ("mismatch", "detail"),
    ("eval-on-rank0", "plain"), ("eval-on-rank0", "detail"),
    ("dead-rank", "plain"), ("dead-rank", "monitored"),
    ("stuck-rank", "plain"), ("stuck-rank", "detail"), ("stuck-rank", "monitored"))]


def misbehave(failure: str, step: int, rank: int, device: torch.device,
              group: dist.ProcessGroup) -> bool:
    """Do this rank's mistake, if any, at the start of a step; True: skip the step's all-reduce.

    The mismatched broadcast takes the place of the all-reduce, so it comes after
    ``monitored_barrier`` (which every rank passes): the barrier does not catch it.
    """
    if step != BAD_STEP or rank != CULPRIT:
        return False
    if failure == "dead-rank":
        time.sleep(DYING_S)  # works on the step a little (the others are waiting by now)...
        os.kill(os.getpid(), signal.SIGKILL)  # ...then is gone: no traceback, no goodbye
    if failure == "stuck-rank":
        time.sleep(STUCK_S)  # alive but never reaching the next collective
    return failure == "mismatch"


def training_loop(failure: str, rank: int, device: torch.device, group: dist.ProcessGroup,
                  monitor_group=None) -> None:
    """A few steps of 'all-reduce the gradients', with one classic mistake in step BAD_STEP."""
    for step in range(STEPS):
        skip = misbehave(failure, step, rank, device, group)
        if monitor_group is not None:  # every rank checks in; rank 0 names the missing ones
            dist.monitored_barrier(group=monitor_group,
                                   timeout=datetime.timedelta(seconds=MONITOR_TIMEOUT_S))
        if skip:  # BUG: every other rank calls all_reduce here
            dist.broadcast(torch.ones(GRAD_NUMEL, device=device), src=0, group=group)
        else:
            grads = torch.full((GRAD_NUMEL,), float(rank + 1), device=device)
            dist.all_reduce(grads, group=group)  # the gradient sync every rank must join
        if failure == "eval-on-rank0" and step == BAD_STEP and rank == 0:
            accuracy = torch.tensor([0.75], device=device)
            dist.all_reduce(accuracy, group=group)  # BUG: the others are not evaluating
        print(f"rank {rank} finished step {step}", flush=True)


# ---- one failure under torchrun ------------------------------------------------------------

def run_one(failure: str, monitored: bool) -> None:
    from course_lib.runtime.worker import worker

    with worker(seed=0) as w:
        monitor_group = None
        if monitored:  # monitored_barrier exists on Gloo only: NCCL runs get a Gloo group
            monitor_group = w.group if w.backend == "gloo" else dist.new_group(backend="gloo")
        training_loop(failure, w.rank, w.device, w.group, monitor_group)
        print(f"rank {w.rank}: all {STEPS} steps done", flush=True)


# ---- the lab: every case at once, each in two forked processes -----------------------------

def lab_rank(case: Case, rank: int, world_size: int, store: str, log_path: str,
             pg_timeout_s: float) -> None:
    """One rank of one lab case (a forked process): its own process group, its own log."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)  # C++ messages (c10d's own log lines) land in the log too
    os.dup2(fd, 2)
    sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
    if case.setting == "detail":
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"  # as if set before starting python
        dist.set_debug_level_from_env()
    code = 0
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=pg_timeout_s))
        monitor = dist.group.WORLD if case.setting == "monitored" else None
        training_loop(case.failure, rank, torch.device("cpu"), dist.group.WORLD, monitor)
    except Exception as e:  # the lab records how each rank ended
        print(f"{type(e).__name__}: {e}", flush=True)
        code = 1
    sys.stdout.flush()
    os._exit(code)  # skip clean-up that could wait for dead peers


def start_case(case: Case, folder: str, world_size: int, pg_timeout_s: float) -> dict:
    """Fork the case's ranks; return what is needed to follow them."""
    context = multiprocessing.get_context("fork")  # torch is imported once, in this process
    store = os.path.join(folder, f"{case.key}.store")
    logs = [os.path.join(folder, f"{case.key}.rank{r}.log") for r in range(world_size)]
    procs = [context.Process(target=lab_rank, daemon=True,
                             args=(case, r, world_size, store, logs[r], pg_timeout_s))
             for r in range(world_size)]
    for p in procs:
        p.start()
    return {"case": case, "procs": procs, "logs": logs, "start": time.monotonic(),
            "failed_at": None, "end": None, "stopped": []}


def follow(runs: list[dict], grace_s: float, deadline_s: float) -> None:
    """Wait until every case has ended. As torchrun does, once a rank of a case has failed the
    others get ``grace_s`` to fail too, then are stopped; nothing outlives ``deadline_s``."""
    while any(run["end"] is None for run in runs):
        time.sleep(0.05)
        now = time.monotonic()
        for run in (r for r in runs if r["end"] is None):
            procs = run["procs"]
            if run["failed_at"] is None and any(p.exitcode for p in procs):
                run["failed_at"] = now
            failed_long_ago = run["failed_at"] is not None and now - run["failed_at"] > grace_s
            if failed_long_ago or now - run["start"] > deadline_s:
                for rank, p in enumerate(procs):
                    if p.is_alive():
                        p.kill()
                        run["stopped"].append(rank)
            if all(not p.is_alive() for p in procs):
                for p in procs:
                    p.join()
                run["end"] = now


def run_lab(cases: list[Case] = CASES, world_size: int = 2,
            pg_timeout_s: float = LAB_PG_TIMEOUT_S, grace_s: float = LAB_GRACE_S,
            deadline_s: float = LAB_DEADLINE_S) -> list[dict]:
    """Run every case side by side; one summary per case (see ``summarise_case``)."""
    with tempfile.TemporaryDirectory(prefix="hang-lab-") as folder:
        runs = [start_case(case, folder, world_size, pg_timeout_s) for case in cases]
        follow(runs, grace_s, deadline_s)
        return [summarise_case(run["case"], [read_text(p) for p in run["logs"]],
                               [p.exitcode for p in run["procs"]], run["stopped"],
                               run["end"] - run["start"], deadline_s)
                for run in runs]


def error_line(log: str, exit_code: int | None, stopped: bool) -> str:
    """How a rank ended, in one line: its exception, a signal, or "" when it finished."""
    errors = [line for line in log.splitlines() if re.match(r"^\w*(Error|Exception): ", line)]
    if errors:
        return errors[-1]
    if stopped:
        return "still waiting when the others had failed: stopped (no message of its own)"
    if exit_code is not None and exit_code < 0:
        return f"killed by signal {-exit_code} (no traceback, no message)"
    return ""


def blamed_ranks(text: str) -> list[int]:
    """Ranks a message names as missing: "Rank 1 failed to pass monitoredBarrier"."""
    found = re.findall(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text)
    return sorted({int(r) for group in found for r in re.findall(r"\d+", group)})


def summarise_case(case: Case, logs: list[str], exit_codes: list, stopped: list[int],
                   seconds: float, deadline_s: float) -> dict:
    """What a learner should read off one case (JSON-friendly; pure, so it is testable).

    raised_ranks: ranks that ended with a Python error of their own; errors: each rank's
    last line; blamed_ranks: ranks a message names as missing.
    """
    errors = [error_line(log, code, rank in stopped)
              for rank, (log, code) in enumerate(zip(logs, exit_codes, strict=True))]
    raised = [r for r, e in enumerate(errors) if re.match(r"^\w*(Error|Exception): ", e)]
    text = "\n".join(logs)
    return {"failure": case.failure, "setting": case.setting, "seconds": round(seconds, 3),
            "ended_in_time": seconds < deadline_s, "exit_codes": exit_codes,
            "finished": all(code == 0 for code in exit_codes), "raised_ranks": raised,
            "stopped_ranks": sorted(stopped), "errors": errors,
            "first_error": errors[raised[0]] if raised else "",
            "blamed_ranks": blamed_ranks(text),
            "names_collective": "Detected mismatch between collectives" in text,
            "timed_out": "Timed out" in text or "timed out" in text,
            "connection_lost": bool(re.search(r"Connection (reset|closed)", text))}


def diagnosis(summary: dict) -> str:
    """What the messages of one case let you conclude, in a few words."""
    if summary["finished"]:
        return "finished"
    if summary["names_collective"]:
        return "mismatched collective named"
    if summary["blamed_ranks"]:
        return f"rank {', '.join(map(str, summary['blamed_ranks']))} named as missing"
    if summary["timed_out"]:  # first: whoever times out first closes the others' sockets
        return "timed out, no rank named"
    if summary["connection_lost"]:
        return "connection lost, no rank named"
    return "failed, no rank named"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--failure", choices=FAILURES, default="none", help="what goes wrong")
    p.add_argument("--monitored", action="store_true", help="monitored_barrier every step")
    p.add_argument("--lab", action="store_true", help="run every case of the lab at once")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if not args.lab:
        run_one(args.failure, args.monitored)
        return
    from course_lib.runtime.launch import save_result

    results = run_lab()
    for r in results:
        print(f"{r['failure']:>14} {r['setting']:>9}: {diagnosis(r)}", flush=True)
    save_result(results)


if __name__ == "__main__":
    main()
