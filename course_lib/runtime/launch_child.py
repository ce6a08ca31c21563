"""The two processes that ``course_lib.runtime.launch`` starts, each tied to the life of its parent.

- ``python -m course_lib.runtime.launch_child agent TORCHRUN_ARGS...`` runs torchrun's agent,
  and dies when the launching process (a notebook kernel, a shell) dies, even if it is killed hard.
- torchrun then runs ``launch_child worker RUN_DIR TARGET ARGS...`` once per rank (on Linux
  in a process forked from the agent, elsewhere in a fresh interpreter): it dies with the
  agent, sends everything the rank prints (C-level output too) to ``RUN_DIR/rank{R}.log``,
  runs TARGET as ``__main__`` and records how the rank ended in ``RUN_DIR/rank{R}.exit``.
  The launcher reads those files to stream output and name a failing rank.

- ``launch_child server`` is the agent server (``agent_server.serve``), which forks agents;
  ``launch_child server --socket PATH`` forks such a server for each process that connects.

A forked rank inherits every module the agent has imported. ``COURSE_PRELOAD`` (module names,
comma-separated, in the launch's environment) names more for the agent to import before it forks
the ranks, so that no rank imports them again (``agent.preload_modules``); the agent server
imports ``PRELOAD`` once for every launch it serves. What the agent, the server and the ranks
all do (``die_with_parent``, ``run_agent``, ...) is in ``agent.py``, which imports neither.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import runpy
import signal
import sys
import threading
import time
import traceback

from course_lib.runtime.agent import (  # noqa: F401 - PRELOAD_ENV: the launch's variable
    PRELOAD_ENV,
    default_signal_handlers,
    die_with_parent,
    run_agent,
)
from course_lib.runtime.agent_server import serve
from course_lib.runtime.files import write_json_atomic


def keep_process_groups() -> list:
    """Keep every process group this rank makes alive until it leaves (with ``os._exit``).

    Destroying a Gloo process group joins its threads while holding Python's GIL; a thread
    that is just then freeing a finished collective started during backward needs the GIL
    (the work holds a Python object), so both wait forever: a rank that hangs in
    ``destroy_process_group`` or when a DDP model is freed. Here ``destroy_process_group``
    still unregisters the group, but the last reference stays in the returned list, so the
    group's threads are never joined; the rank's exit ends them."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    kept = []
    original_destroy, original_new_group = dist.destroy_process_group, dist.new_group

    def new_group(*args, **kwargs):
        group = original_new_group(*args, **kwargs)
        kept.append(group)
        return group

    def destroy_process_group(group: dist.ProcessGroup | None = None):
        if dist.is_initialized():
            kept.append(dist.group.WORLD)
        if group is not None:
            kept.append(group)
        return original_destroy(group)

    for module in (dist, distributed_c10d):
        module.new_group, module.destroy_process_group = new_group, destroy_process_group
    return kept


def redirect_output(log_path: str) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``log_path``."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def run_target(target: str, args: list[str]) -> None:
    """Run a module name or a ``.py`` path as ``__main__`` with ``args`` as its argv."""
    sys.argv = [target, *args]
    if target.endswith(".py"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)


def print_user_traceback(error: BaseException) -> None:
    """Print the traceback without the frames of this wrapper and of runpy."""
    tb = traceback.TracebackException.from_exception(error)
    tb.stack = traceback.StackSummary.from_list(
        [f for f in tb.stack if not f.filename.endswith(("launch_child.py", "runpy>", "runpy.py"))])
    print("".join(tb.format()), end="", file=sys.stderr)


def hand_back_to_agent(frame=None) -> None:
    """A forked rank that finished: give torchrun's agent the return value it waits for, then
    leave at once, as a fresh interpreter's rank does. (Returning instead keeps the rank, and
    its connections, alive until every rank has finished: a peer left waiting in a collective
    this rank skipped would only see its timeout, not "peer gone".) The value travels in the
    queue of torchrun's ``_wrap``, further up this stack (or ``frame``'s, another thread's);
    if that ever changes, just return."""
    frame = frame or sys._getframe()
    while frame is not None and frame.f_code.co_name != "_wrap":
        frame = frame.f_back
    queue = frame.f_locals.get("ret_val_") if frame is not None else None
    if queue is None or not hasattr(queue, "put"):
        return
    queue.put(None)  # what the worker function returned
    os._exit(0)


EXIT_RECORD: dict = {}  # this rank's: {"path": RUN_DIR/rank{R}.exit, "rank": R}, once running


def leave(code: int = 0) -> None:
    """End this rank at once from any thread, as if its target had returned ``code``: the
    exit recorded, torchrun's agent handed its value (a checker that found every rank waiting
    on another ends its ranks so, rather than wait for their process group's timeout)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if EXIT_RECORD:
        write_json_atomic(EXIT_RECORD["path"], {"rank": EXIT_RECORD["rank"], "code": code,
                                                "error": None, "time": time.time()})
    if code == 0 and multiprocessing.parent_process() is not None:
        hand_back_to_agent(sys._current_frames().get(threading.main_thread().ident))
    os._exit(code)


def write_stack_when_stopped(path: str) -> None:
    """Stopped from outside (by torchrun or the launcher, with SIGTERM), write where each
    thread was to ``path``, then end as SIGTERM ends a process: the launcher quotes it for a
    rank that never finished (``RankLogs.where_stopped``). Not on Windows."""
    if hasattr(faulthandler, "register"):
        stack = open(path, "w")  # noqa: SIM115 - faulthandler keeps it, open, to the end
        faulthandler.register(signal.SIGTERM, file=stack, all_threads=True, chain=True)


def run_worker(run_dir: str, target: str, args: list[str]) -> None:
    """One rank: tie to the agent, redirect output, run the target, record the exit."""
    default_signal_handlers()
    die_with_parent()
    rank = int(os.environ.get("RANK", "0"))
    redirect_output(os.path.join(run_dir, f"rank{rank}.log"))
    with open(os.path.join(run_dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))  # lets the launcher notice a rank killed by a signal
    write_stack_when_stopped(os.path.join(run_dir, f"rank{rank}.stack"))
    exit_path = os.path.join(run_dir, f"rank{rank}.exit")
    EXIT_RECORD.update(path=exit_path, rank=rank)
    code, error = 0, None
    kept = keep_process_groups()  # noqa: F841 - alive until os._exit below
    try:
        run_target(target, args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code not in (None, 0) and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
            error = str(e.code)
    except BaseException as e:  # every way a rank can end is recorded
        print_user_traceback(e)
        code, error = 1, f"{type(e).__name__}: {e}"
    sys.stdout.flush()
    sys.stderr.flush()
    write_json_atomic(exit_path, {"rank": rank, "code": code, "error": error,
                                  "time": time.time()})
    if code == 0 and multiprocessing.parent_process() is not None:
        hand_back_to_agent()  # forked by torchrun's agent: it waits for a return value
    # Leave now: the work is done and recorded. A normal interpreter exit runs C++ destructors
    # while Gloo's threads may still run, which can abort ("terminate called without an
    # active exception") and turn a finished rank into a failed one.
    os._exit(code)


def main(argv: list[str]) -> None:
    if len(argv) >= 1 and argv[0] == "agent":
        run_agent(argv[1:])
    elif len(argv) >= 3 and argv[0] == "worker":
        run_worker(argv[1], argv[2], argv[3:])
    elif argv == ["server"]:
        serve()
    elif len(argv) == 3 and argv[:2] == ["server", "--socket"]:
        serve(argv[2])
    else:
        sys.exit("usage: python -m course_lib.runtime.launch_child "
                 "{agent ARGS | worker RUN_DIR TARGET | server [--socket PATH]}")


if __name__ == "__main__":
    main(sys.argv[1:])
