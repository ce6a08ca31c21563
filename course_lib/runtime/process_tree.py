"""Ending a launch's processes: the agent, every worker, and what they started
(``stop_process_tree``, which ``launch`` calls when a run ends, fails, times out or is
interrupted)."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time

import psutil


def running(pid: int) -> bool:
    """Whether ``pid`` runs: not gone, nor ended and waiting for its parent to collect it."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _processes(agent: subprocess.Popen, run_dir: str) -> list[psutil.Process]:
    """The agent, its descendants, and every worker recorded in ``rank{R}.pid`` (a worker
    whose agent is already gone is no longer its descendant)."""
    procs = []
    try:
        parent = psutil.Process(agent.pid)
        procs = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    known = {p.pid for p in procs}
    for path in glob.glob(os.path.join(run_dir, "rank*.pid")):
        try:
            with open(path) as f:
                worker = psutil.Process(int(f.read().strip()))
            if worker.pid not in known and "course_lib.runtime.launch_child" in " ".join(
                    worker.cmdline()):  # the pid still names one of our workers
                procs.append(worker)
        except (ValueError, OSError, psutil.Error):
            continue
    return procs


def stop_process_tree(agent: subprocess.Popen, run_dir: str, grace_s: float = 2.0) -> None:
    """End every worker, then the agent: SIGTERM, wait ``grace_s``, then SIGKILL what is left.

    The agent is paused (SIGSTOP) while its workers end. A worker writes where it was when
    SIGTERM comes (``write_stack_when_stopped``); the agent's own end (its workers die with it)
    or the SIGTERM it passes on would cut that short on a loaded machine, and the rank's stack
    would be lost."""
    procs = _processes(agent, run_dir)
    paused = [p for p in procs if p.pid == agent.pid and _send(p, signal.SIGSTOP)]
    try:
        _end([p for p in procs if p.pid != agent.pid], grace_s)
    finally:
        for p in paused:
            _send(p, signal.SIGCONT)
    _end(_processes(agent, run_dir), grace_s)  # the agent, and anything still left
    try:
        agent.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def _end(procs: list[psutil.Process], grace_s: float) -> None:
    """SIGTERM, then SIGKILL what is still running after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        procs = _running_after([p for p in procs if _send(p, sig)], grace_s)
        if not procs:
            return


def _send(process: psutil.Process, sig: int) -> bool:
    try:
        process.send_signal(sig)
        return True
    except psutil.NoSuchProcess:
        return False


def _running_after(procs: list[psutil.Process], within_s: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after ``within_s`` (or as soon as none is): a process
    that ended but whose parent has not collected it yet (a paused agent's worker) counts as
    ended."""
    deadline = time.monotonic() + within_s
    while True:
        left = [p for p in procs if running(p.pid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)
