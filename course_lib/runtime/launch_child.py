"""The two processes that ``course_lib.runtime.launch`` starts, each tied to the life of its parent.

- ``python -m course_lib.runtime.launch_child agent TORCHRUN_ARGS...`` runs torchrun's agent,
  and dies when the launching process (a notebook kernel, a shell) dies, even if it is killed hard.
- torchrun then runs ``launch_child worker RUN_DIR TARGET ARGS...`` once per rank (on Linux
  in a process forked from the agent, elsewhere in a fresh interpreter): it dies with the
  agent, sends everything the rank prints (C-level output too) to ``RUN_DIR/rank{R}.log``,
  runs TARGET as ``__main__`` and records how the rank ended in ``RUN_DIR/rank{R}.exit``.
  The launcher reads those files to stream output and name a failing rank.

A forked rank inherits every module the agent has imported. ``COURSE_PRELOAD`` (module names,
comma-separated, in the launch's environment) names more for the agent to import before it forks
the ranks, so that no rank imports them again (``preload_modules``); the agent server imports
``PRELOAD`` once for every launch it serves (``agent_server.serve``).
"""

from __future__ import annotations

import ctypes
import importlib
import multiprocessing
import os
import runpy
import signal
import sys
import threading
import time
import traceback

from course_lib.runtime.files import write_json_atomic

PR_SET_PDEATHSIG = 1  # Linux prctl option: signal this process when its parent dies
PRELOAD_ENV = "COURSE_PRELOAD"
# What every rank that builds an optimizer or DDP imports (torch's optimizers import
# torch._dynamo when the first one is made): 2 s of CPU per rank, paid once by the agent server.
PRELOAD = ("torch._dynamo",)


def die_with_parent() -> None:
    """Exit as soon as the parent process goes away (Linux: at once; elsewhere: within 0.5 s)."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent or parent == 1:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def forks_ranks(torchrun_args: list[str]) -> bool:
    """Whether torchrun will fork the ranks from this process (``--start-method fork``)."""
    return any(a == "--start-method" and b == "fork"
               for a, b in zip(torchrun_args, torchrun_args[1:], strict=False))


def preload_modules() -> list[str]:
    """Import the modules ``COURSE_PRELOAD`` names, once, here in the agent; return their names.
    A module imported here costs its CPU once, not once per rank.

    Ranks forked after the agent had imported ``torch._dynamo`` used to hang now and then on
    their way out (3 of 22 launches of ``demos/ddp_minimal.py``): a Gloo process group
    destroyed while one of its threads waits for the GIL. ``keep_process_groups`` removes
    that cause; ``tests/test_launch.py`` launches ddp_minimal again and again to hold it.
    """
    names = [n.strip() for n in os.environ.get(PRELOAD_ENV, "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            sys.exit(f"{PRELOAD_ENV} names {name!r}, which cannot be imported ({e}); "
                     f"correct or remove it")
    return names


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


def run_agent(torchrun_args: list[str]) -> None:
    """Run torchrun's agent in this process."""
    die_with_parent()
    from torch.distributed.run import main

    if forks_ranks(torchrun_args):
        preload_modules()  # the ranks inherit them; fresh interpreters would not

    main(torchrun_args)


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


def hand_back_to_agent() -> None:
    """A forked rank that finished: give torchrun's agent the return value it waits for, then
    leave at once, as a fresh interpreter's rank does. (Returning instead keeps the rank, and
    its connections, alive until every rank has finished: a peer left waiting in a collective
    this rank skipped would only see its timeout, not "peer gone".) The value travels in the
    queue of torchrun's ``_wrap``, further up this stack; if that ever changes, just return."""
    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "_wrap":
        frame = frame.f_back
    queue = frame.f_locals.get("ret_val_") if frame is not None else None
    if queue is None or not hasattr(queue, "put"):
        return
    queue.put(None)  # what the worker function returned
    os._exit(0)


def default_signal_handlers() -> None:
    """A rank forked from torchrun's agent inherits the agent's handlers (SIGTERM raising an
    exception, ...); give it a fresh interpreter's, so that a signal ends it the same way."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def run_worker(run_dir: str, target: str, args: list[str]) -> None:
    """One rank: tie to the agent, redirect output, run the target, record the exit."""
    default_signal_handlers()
    die_with_parent()
    rank = int(os.environ.get("RANK", "0"))
    redirect_output(os.path.join(run_dir, f"rank{rank}.log"))
    with open(os.path.join(run_dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))  # lets the launcher notice a rank killed by a signal
    exit_path = os.path.join(run_dir, f"rank{rank}.exit")
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
        from course_lib.runtime.agent_server import serve

        serve()
    else:
        sys.exit("usage: python -m course_lib.runtime.launch_child "
                 "{agent ARGS | worker RUN_DIR TARGET | server}")


if __name__ == "__main__":
    main(sys.argv[1:])
