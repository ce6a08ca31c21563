"""A process that has imported torch once and forks torchrun's agent for each launch (Linux).

Every launch starts torchrun's agent, and the agent imports torch: about 2 s of CPU, most of
what a short launch costs. A notebook or a test session launches dozens of times, so from its
second launch on (a notebook kernel's first), ``launch`` asks this server instead: it imported
``torch.distributed.run`` once, and for each launch it forks a child that becomes the agent (in
a new session, with the launch's environment, working folder and log file), which forks the
ranks as before. The launcher's side is ``agent_client.py``.

One JSON line per request on the server's stdin; it answers ``{"pid": N}`` on its stdout, and
``{"exit": N, "code": C}`` when agent N ends (C as ``Popen.returncode``: negative for a
signal). The server dies with the process that started it, and the agents with the server
(``die_with_parent``), so nothing outlives a notebook kernel. Each agent gets its launch's whole
environment, but torch was imported with the server's: ``import_time_variables`` says which
variables that fixes, and ``needs_fresh_agent`` whether a launch sets one of them itself.

``launch_child server --socket PATH`` serves many processes at once (a test session's, whose
every notebook kernel would otherwise import torch for a server of its own): it forks a server
as above for each process that connects to PATH, its requests and answers on the connection.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys
import traceback

from course_lib.runtime.agent import (
    PRELOAD,
    PRELOAD_ENV,
    default_signal_handlers,
    die_with_parent,
    run_agent,
)

# read when torch is imported (thread pools, logging, devices): a launch that sets one of these
# gets an agent of its own
IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "TORCH_", "CUDA_", "LD_", "PYTHON",
                        "MPLBACKEND")


def needs_fresh_agent(extra_env: dict | None) -> bool:
    """Whether a launch's own variables include one that torch reads when it is imported."""
    return any(key.startswith(IMPORT_TIME_PREFIXES) for key in (extra_env or {}))


def import_time_variables(env: dict) -> dict:
    """The variables of ``env`` that a server's import of torch has read: a server started
    with other values of these must be replaced (the others are the agent's own, per launch)."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)}


# ---- the server's side --------------------------------------------------------------------------

def serve(socket_path: str | None = None) -> None:
    """Import torchrun once, then fork an agent for each request until stdin closes. With
    ``socket_path``, fork such a server for each process that connects there instead (its
    requests and answers on the connection), until the process that started this one ends."""
    die_with_parent()
    listener = None
    if socket_path is not None:  # listening before the imports: a process that connects
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # meanwhile waits for
        listener.bind(socket_path)  # its answer; one that finds no socket, a server that
        listener.listen(64)  # never started
    import torch.distributed.run  # noqa: F401 - the reason this process exists

    for name in PRELOAD:  # what every rank would import again: once here instead (a first
        # launch's fresh agent does not: a process that launches once might never need it)
        importlib.import_module(name)
    if listener is None:
        _answer(os.getcwd())
    else:
        _serve_connections(listener)


def _serve_connections(listener: socket.socket) -> None:
    """Fork a server of its own for each connection: it dies with this one, and ends (its
    agents with it) when the process at the other end closes the connection or dies."""
    start_dir = os.getcwd()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # a server that ended is reaped at once
    while True:
        connection, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # it waits for its agents
            os.dup2(connection.fileno(), 0)  # requests come in, answers go out, on it
            os.dup2(connection.fileno(), 1)
            connection.close()
            try:
                die_with_parent()
                _answer(start_dir)
            finally:
                os._exit(0)
        connection.close()


def _answer(start_dir: str) -> None:
    """Say so once ready, then fork an agent for each request on stdin until it closes."""
    pending = b""
    os.write(1, json.dumps({"ready": True, "pid": os.getpid(),
                            "imported_with": import_time_variables(dict(os.environ))}
                           ).encode() + b"\n")
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        _reap()
        if not readable:
            continue
        data = os.read(0, 65536)
        if not data:
            return  # the launching process closed the pipe: it has ended
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            pid = _fork_agent(json.loads(line), start_dir)
            os.write(1, json.dumps({"pid": pid}).encode() + b"\n")


def _reap() -> None:
    """Report every agent that ended (and collect it, so that no zombie is left)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        os.write(1, json.dumps({"exit": pid, "code": code}).encode() + b"\n")


def _keep_imported(env: dict) -> None:
    """Import here, for this launch and every later one, the course's own modules that the
    launch's ``COURSE_PRELOAD`` names (a checker's program and cases: a few tenths of a second
    per rank otherwise; other names the agent imports for its launch alone). A name that fails
    is left to the agent, which reports it as a fresh one would."""
    for name in env.get(PRELOAD_ENV, "").split(","):
        if name.strip().startswith("course_lib.") and name.strip() not in sys.modules:
            try:
                importlib.import_module(name.strip())
            except Exception:  # the agent's own import says what is wrong
                pass


def _fork_agent(request: dict, start_dir: str) -> int:
    _keep_imported(request["env"])
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: become what `python -m course_lib.runtime.launch_child agent` would be
        os.setsid()  # its own session, as Popen(start_new_session=True): our Ctrl-C is ours
        _redirect(request["log"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if sys.path and sys.path[0] == start_dir:
            sys.path[0] = request["cwd"]  # `python -m` puts the working folder first
        default_signal_handlers()
        sys.argv = ["torchrun", *request["argv"]]
        run_agent(request["argv"])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # an agent's failure ends as a fresh one's would
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _redirect(log_path: str) -> None:
    """stdin from /dev/null; stdout and stderr appended to ``log_path``."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
