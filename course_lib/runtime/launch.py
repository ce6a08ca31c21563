"""Run a multi-process PyTorch program from a notebook cell or a shell (notebook 00 on).

    from course_lib.runtime.launch import launch
    run = launch("course_lib.demos.hello", nproc=2)    # output streams in, "[rank 1] ..."
    run.returncode, run.output, run.result            # result: what rank 0 passed to save_result

From a shell: ``python -m course_lib.runtime.launch --nproc 2 course_lib.demos.hello``.

``launch`` starts ``python -m torch.distributed.run --standalone --nproc_per_node N`` as a
subprocess (on Linux with ``--run-path --start-method fork``: see ``worker_command``). A failing
rank, a timeout or an interrupt ends every process it started and raises :class:`LaunchError`
naming the rank, with that rank's last lines. Workers die with the launcher.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Sequence

from course_lib.runtime.agent_client import start_agent
from course_lib.runtime.files import read_json, read_text, write_json_atomic
from course_lib.runtime.launch_output import Progress, RankLogs, RankWatch
from course_lib.runtime.process_tree import stop_process_tree

RESULT_ENV = "COURSE_RESULT_PATH"
PROGRESS_ENV = "COURSE_PROGRESS_PATH"
FORK_WORKERS = sys.platform.startswith("linux")  # macOS: forking after torch is unsafe
LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"  # the loopback interface's name
ADDRESS_IN_USE = ("EADDRINUSE", "Address already in use", "address already in use")
# From its second launch on (a notebook kernel's first), a process forks torchrun's agents from a
# server that imported torch once (agent_client.py); COURSE_AGENT_SERVER=0: a fresh agent each time.
AGENT_SERVER = FORK_WORKERS and os.environ.get("COURSE_AGENT_SERVER", "1") != "0"


class LaunchError(RuntimeError):
    """A launched run failed, timed out or was interrupted; the message says which rank."""


@dataclass
class LaunchResult:
    returncode: int  # 0 when every rank finished cleanly
    output: str  # every line the ranks printed, each prefixed "[rank R] "
    result: Any  # the JSON value rank 0 passed to save_result, or None
    elapsed_s: float  # wall time of the whole run


def save_result(obj: Any) -> bool:
    """From rank 0 of a launched run, hand ``obj`` (JSON-serialisable) back to ``launch``.

    Returns True when saved; other ranks, and runs not started by ``launch``, save nothing.
    """
    path = os.environ.get(RESULT_ENV)
    if not path or int(os.environ.get("RANK", "0")) != 0:
        return False
    write_json_atomic(path, obj)
    return True


def report_progress(done: int, total: int, label: str = "steps") -> None:
    """From rank 0, tell the launcher how far the run is (drawn as a progress bar)."""
    path = os.environ.get(PROGRESS_ENV)
    if path and int(os.environ.get("RANK", "0")) == 0:
        write_json_atomic(path, {"done": done, "total": total, "label": label})


def check_target(target: str) -> None:
    """Fail before anything starts when ``target`` is neither a module nor a .py file."""
    if target.endswith(".py"):
        if not os.path.isfile(target):
            raise LaunchError(f"no file {target!r}; pass an existing .py file or a module name "
                              "such as 'course_lib.demos.hello'")
        return
    try:
        found = importlib.util.find_spec(target) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise LaunchError(f"no module named {target!r}; pass a module such as "
                          "'course_lib.demos.hello' or a path to a .py file")


def check_nproc(nproc: int, env: dict) -> None:
    """Fail before anything starts on a process count the machine cannot serve."""
    if not isinstance(nproc, int) or nproc < 1:
        raise LaunchError(f"nproc must be a whole number >= 1, got {nproc!r}")
    if env.get("COURSE_BACKEND", "").lower() == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < nproc:
            raise LaunchError(f"COURSE_BACKEND=nccl needs one GPU per process: nproc={nproc} "
                              f"but {gpus} GPU(s) here; lower nproc or use COURSE_BACKEND=gloo")


def child_env(run_dir: str, extra: dict | None) -> dict:
    """The workers' environment: quiet, unbuffered, single-threaded unless told otherwise."""
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)
    env.update({
        "PYTHONUNBUFFERED": "1",  # lines reach the notebook as they are printed
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),  # fixed: results depend on it
        "MPLBACKEND": "Agg",
        "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME", LOOPBACK),  # one node: loopback
        "TORCH_CPP_LOG_LEVEL": env.get("TORCH_CPP_LOG_LEVEL", "ERROR"),  # quiet c10d warnings
        RESULT_ENV: os.path.join(run_dir, "result.json"),
        PROGRESS_ENV: os.path.join(run_dir, "progress.json"),
    })
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def server_env() -> dict:
    """The environment an agent server starts with: the workers' without a run's own paths."""
    env = child_env("", None)
    for per_run in (RESULT_ENV, PROGRESS_ENV):
        env.pop(per_run)
    return env


def torchrun_command(run_dir: str, target: str, nproc: int, args: Sequence[str],
                     port: int | None) -> list[str]:
    if port is None:
        rdzv = ["--standalone"]  # the OS picks a free port for the rendezvous
    else:
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", os.path.basename(run_dir)]
    return [sys.executable, "-m", "course_lib.runtime.launch_child", "agent", *rdzv,
            "--nnodes", "1", "--nproc-per-node", str(nproc), "--monitor-interval", "0.1",
            *worker_command(run_dir, target, args)]


def worker_command(run_dir: str, target: str, args: Sequence[str]) -> list[str]:
    """What torchrun runs once per rank: ``launch_child worker RUN_DIR TARGET ARGS``.

    On Linux torchrun forks each rank from its own process (``--run-path --start-method
    fork``), which has imported torch already: a launch then costs one import of torch, not
    one per rank (about 1.5 s of CPU each). Elsewhere every rank is a fresh interpreter.
    """
    if FORK_WORKERS:
        child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_child.py")
        return ["--run-path", "--start-method", "fork", child,
                "worker", run_dir, target, *map(str, args)]
    return ["-m", "course_lib.runtime.launch_child", "worker", run_dir, target,
            *map(str, args)]


def check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise LaunchError(f"port {port} on 127.0.0.1 is already in use; pick another port "
                              "or pass port=None to let the system choose one") from None


def _poll_wait(seconds: float = 0.05) -> None:
    """The pause between two looks at the running ranks (tests replace it)."""
    time.sleep(seconds)


def launch(target: str, nproc: int, args: Sequence[Any] = (), timeout_s: float | None = None,
           env: dict | None = None, port: int | None = None, quiet: bool = False,
           progress: bool = True) -> LaunchResult:
    """Run ``target`` on ``nproc`` processes with torchrun; stream their output; return it.

    target: a module name (``course_lib.demos.hello``) or a path to a ``.py`` file.
    args: command-line arguments for the target. timeout_s: stop everything after this long.
    env: extra environment variables for the workers. port: a fixed rendezvous port.
    quiet: do not print the ranks' lines (they are still in ``.output``).
    """
    check_target(target)
    full_env_probe = {**os.environ, **{k: str(v) for k, v in (env or {}).items()}}
    check_nproc(nproc, full_env_probe)
    if port is not None:
        check_port_free(port)
    for attempt in range(3):
        run_dir = tempfile.mkdtemp(prefix="course-run-")
        try:
            return _run_once(run_dir, target, nproc, args, timeout_s, env, port, quiet, progress)
        except _AddressInUse:
            if port is not None or attempt == 2:
                raise LaunchError("the rendezvous port was taken by another program three "
                                  "times; try again") from None
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
    raise AssertionError("unreachable")


class _AddressInUse(Exception):
    """torchrun's rendezvous port was taken between choosing it and binding it."""


def _run_once(run_dir, target, nproc, args, timeout_s, env, port, quiet, progress):
    cmd = torchrun_command(run_dir, target, nproc, args, port)
    agent_log_path = os.path.join(run_dir, "agent.log")
    logs = RankLogs(run_dir, nproc, echo=not quiet)
    bar = Progress(os.path.join(run_dir, "progress.json"), enabled=progress and not quiet)
    start = time.monotonic()
    agent = start_agent(cmd, child_env(run_dir, env), agent_log_path, env,
                        server_env=server_env() if AGENT_SERVER else None)
    watch = RankWatch(run_dir, nproc)
    failure_seen_at = None
    try:
        while agent.poll() is None:
            _poll_wait()
            logs.pump()
            bar.update()
            watch.poll()
            if failure_seen_at is None and watch.failure(agent_log_path) is not None:
                failure_seen_at = time.monotonic()
            if failure_seen_at is not None and time.monotonic() - failure_seen_at > 5:
                break  # a rank failed and torchrun has not ended the others: we do
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                stop_process_tree(agent, run_dir)
                logs.pump(final=True)
                raise LaunchError(_timeout_message(target, timeout_s, logs))
    except KeyboardInterrupt:
        stop_process_tree(agent, run_dir)
        logs.pump(final=True)
        raise LaunchError(f"interrupted: all {nproc} processes of {target} were stopped") from None
    finally:
        bar.close()  # also when the run failed: the bar says how far it got
    stop_process_tree(agent, run_dir)  # normally nothing is left; make sure
    logs.pump(final=True)
    elapsed = time.monotonic() - start
    code = agent.returncode if agent.returncode is not None else 1
    rank = watch.failure(agent_log_path)
    if code != 0 or rank is not None:
        agent_text = read_text(agent_log_path)
        if logs.empty() and any(s in agent_text for s in ADDRESS_IN_USE):
            raise _AddressInUse()
        raise LaunchError(_failure_message(target, rank, logs, agent_text))
    return LaunchResult(0, logs.text(), read_json(os.path.join(run_dir, "result.json")), elapsed)


def _timeout_message(target: str, timeout_s: float, logs: RankLogs) -> str:
    running = logs.ranks_without_exit()
    which = ", ".join(map(str, running)) if running else "none"
    return (f"{target} did not finish within {timeout_s:g} s; every process was stopped. "
            f"Ranks still running at the time: {which} (a rank waiting in a collective for a "
            f"peer that never joins looks like this).\n{logs.tails(running or None)}"
            + (f"\n{logs.where_stopped(running)}" if running else ""))


def _failure_message(target: str, rank, logs: RankLogs, agent_text: str) -> str:
    if rank is None:
        tail = "\n".join(agent_text.strip().splitlines()[-15:])
        return f"{target} failed before any rank reported an error; torchrun said:\n{tail}"
    rank_id, code = rank
    if code is None:
        how = "ended without reporting why (killed from outside?)"
    elif code < 0:
        how = f"was killed by signal {-code} ({_signal_name(-code)})"
    else:
        how = f"failed (exit code {code})"
    message = (f"rank {rank_id} {how} in {target}; every process was stopped. "
               f"Last lines of rank {rank_id}:\n{logs.tails([rank_id])}")
    waiting = [r for r in logs.ranks_without_exit() if r != rank_id]
    if waiting and re.search(r"time(d)? ?out", logs.tails([rank_id]), re.IGNORECASE):
        message += f"\n{logs.where_stopped(waiting)}"  # it waited for them: say where they were
    return message


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.runtime.launch",
        description="Run a course module on several processes, as a notebook does.")
    parser.add_argument("--nproc", type=int, default=2, help="number of processes (ranks)")
    parser.add_argument("--timeout", type=float, default=None, help="stop after this many s")
    parser.add_argument("--port", type=int, default=None, help="fixed rendezvous port")
    parser.add_argument("target", help="module name (course_lib.demos.hello) or file.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the target")
    ns = parser.parse_args(argv)
    try:
        run = launch(ns.target, ns.nproc, ns.args, timeout_s=ns.timeout, port=ns.port)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if run.result is not None:
        print(f"result: {json.dumps(run.result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
