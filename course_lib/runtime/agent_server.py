"""A process that has imported torch once and forks torchrun's agent for each launch (Linux).

Every launch starts torchrun's agent, and the agent imports torch: about 2 s of CPU, most of
what a short launch costs. A notebook or a test session launches dozens of times, so from its
second launch on (a notebook kernel's first), ``launch`` asks this server instead: it imported
``torch.distributed.run`` once, and for each launch it forks a child that becomes the agent (in
a new session, with the launch's environment, working folder and log file), which forks the
ranks as before.

    agent = start_agent(cmd, env, log_path, extra_env, server_env)  # launch.py's call
    # the first launch: subprocess.Popen(cmd); later ones: AgentServer.spawn, a ForkedAgent

One JSON line per request on the server's stdin; it answers ``{"pid": N}`` on its stdout, and
``{"exit": N, "code": C}`` when agent N ends (C as ``Popen.returncode``: negative for a
signal). The server dies with the process that started it, and the agents with the server
(``die_with_parent``), so nothing outlives a notebook kernel. Each agent gets its launch's whole
environment, but torch was imported with the server's: ``import_time_variables`` says which
variables that fixes, and ``needs_fresh_agent`` whether a launch sets one of them itself.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import subprocess
import sys
import threading
import time
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

def serve() -> None:
    """Import torchrun once, then fork an agent for each request until stdin closes."""
    die_with_parent()
    import torch.distributed.run  # noqa: F401 - the reason this process exists

    for name in PRELOAD:  # what every rank would import again: once here instead (a first
        # launch's fresh agent does not: a process that launches once might never need it)
        importlib.import_module(name)

    start_dir = os.getcwd()
    pending = b""
    os.write(1, b'{"ready": true}\n')
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


# ---- the launcher's side ------------------------------------------------------------------------

class AgentServer:
    """The launcher's handle on a running server."""

    def __init__(self, process: subprocess.Popen, env: dict):
        self.process, self.imported_with = process, import_time_variables(env)
        self.exits: dict[int, int] = {}  # agent pid -> its exit code, once reported
        self.lock = threading.Lock()
        self._buffer = b""

    @classmethod
    def start(cls, env: dict, timeout_s: float = 120.0) -> AgentServer:
        process = subprocess.Popen(
            [sys.executable, "-m", "course_lib.runtime.launch_child", "server"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True)
        server = cls(process, env)
        if server._next_message(timeout_s) != {"ready": True}:
            server.close()
            raise RuntimeError("the agent server did not start")
        return server

    def alive(self) -> bool:
        return self.process.poll() is None

    def spawn(self, argv: list[str], env: dict, cwd: str, log_path: str) -> ForkedAgent:
        """Fork an agent that runs ``torchrun argv``; returns a Popen-like handle."""
        request = {"argv": argv, "env": env, "cwd": cwd, "log": log_path}
        with self.lock:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            while True:
                message = self._next_message(30.0)
                if message is None:
                    raise RuntimeError("the agent server did not answer")
                if "pid" in message:
                    return ForkedAgent(message["pid"], self)

    def collect(self) -> None:
        """Read the exits reported so far, without waiting."""
        with self.lock:
            while self._next_message(0.0) is not None:
                pass

    def _next_message(self, timeout_s: float) -> dict | None:
        """The next message (an exit is recorded on the way), or None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        out = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = max(0.0, deadline - time.monotonic())
            if not select.select([out], [], [], left)[0]:
                return None
            data = os.read(out, 65536)
            if not data:
                return None  # the server ended
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        if "exit" in message:
            self.exits[message["exit"]] = message["code"]
        return message

    def close(self) -> None:
        """End the server (its agents, if any, end with it)."""
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _Agents:
    """How this process starts torchrun's agents: the first one fresh, later ones forked from
    a server (started at the second launch, in a notebook kernel at the first, kept while
    torch's variables are the same)."""

    launches = 0
    server: AgentServer | None = None
    owner = 0  # the process that started the server (a forked copy of it must not use it)


def start_agent(cmd: list[str], env: dict, log_path: str, extra_env: dict | None,
                server_env: dict | None):
    """Start the agent of one launch (``cmd``: ``python -m ...launch_child agent ARGS``);
    returns a Popen, or a ``ForkedAgent``. ``server_env``: the environment a server would
    start with, or None for no server."""
    _Agents.launches += 1
    first_served = 1 if "ipykernel" in sys.modules else 2  # a notebook launches again and again
    if (server_env is not None and _Agents.launches >= first_served
            and not needs_fresh_agent(extra_env)):
        server = _running_server(server_env)
        if server is not None:
            open(log_path, "wb").close()  # there from the start, as a fresh agent's is
            try:
                return server.spawn(cmd[4:], env, os.getcwd(), log_path)
            except (OSError, RuntimeError):  # it died under us (killed, say): a fresh agent
                server.close()
                _Agents.server = None
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)  # our Ctrl-C is handled by us


def _running_server(server_env: dict) -> AgentServer | None:
    """This process's server, (re)started if need be; None if it cannot start (the launch
    then starts a fresh agent)."""
    server = _Agents.server
    if server is not None and (_Agents.owner != os.getpid() or not server.alive()
                               or server.imported_with != import_time_variables(server_env)):
        if _Agents.owner == os.getpid():
            server.close()
        _Agents.server = server = None
    if server is None:
        try:
            _Agents.server, _Agents.owner = AgentServer.start(server_env), os.getpid()
        except (OSError, RuntimeError):
            return None
    return _Agents.server


def agent_server_pid() -> int | None:
    """The pid of this process's agent server, or None (tests tell it from leftovers)."""
    server = _Agents.server
    return server.process.pid if server is not None and _Agents.owner == os.getpid() else None


class ForkedAgent:
    """The part of ``subprocess.Popen`` that ``launch`` uses, for an agent the server forked."""

    def __init__(self, pid: int, server: AgentServer):
        self.pid, self.server = pid, server
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.collect()
            if self.pid in self.server.exits:
                self.returncode = self.server.exits.pop(self.pid)
            elif not self.server.alive():
                self.returncode = -9  # the server died, and its agents with it
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"agent {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
