"""The launcher's side of the agent server (``agent_server.py``): start or reach one, and
have it fork the agent of each launch.

    agent = start_agent(cmd, env, log_path, extra_env, server_env)  # launch.py's call
    # the first launch: subprocess.Popen(cmd); later ones: AgentServer.spawn, a ForkedAgent

A process's server is its own child, started at its second launch (a notebook kernel's first),
unless ``$COURSE_AGENT_SOCKET`` names a shared server (``start_shared_server``) that imported
torch with the same variables: then the process connects, and the server forks it a server of
its own, which ends when the process closes the connection or dies.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time

from course_lib.runtime.agent_server import import_time_variables, needs_fresh_agent

SOCKET_ENV = "COURSE_AGENT_SOCKET"  # where a shared server listens, for every process below
CONNECT_S = 5.0  # how long a process waits for a shared server's socket to appear


class AgentServer:
    """The launcher's handle on a running server: its own child, or one a shared server forked
    for this process (``connect``)."""

    def __init__(self, process: subprocess.Popen | _Connection, env: dict):
        self.process, self.imported_with = process, import_time_variables(env)
        self.exits: dict[int, int] = {}  # agent pid -> its exit code, once reported
        self.lock = threading.Lock()
        self._buffer = b""
        self.pid = process.pid  # the process that forks this one's agents
        self.ended = False  # the server closed its end (it died)

    @classmethod
    def start(cls, env: dict, timeout_s: float = 120.0) -> AgentServer:
        process = subprocess.Popen(
            [sys.executable, "-m", "course_lib.runtime.launch_child", "server"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True)
        server = cls(process, env)
        if not (server._next_message(timeout_s) or {}).get("ready"):
            server.close()
            raise RuntimeError("the agent server did not start")
        return server

    @classmethod
    def connect(cls, path: str, env: dict, timeout_s: float = 120.0) -> AgentServer | None:
        """A server of this process's own, forked by the shared server at ``path`` once it has
        imported torch (within ``timeout_s``); None when it imported torch with other values of
        ``env``'s import-time variables, or ended first."""
        deadline = time.monotonic() + CONNECT_S  # it listens before it imports
        while True:
            try:
                connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                connection.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):  # still starting
                connection.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        server = cls(_Connection(connection), env)
        hello = server._next_message(timeout_s) or {}
        if not hello.get("ready") or hello["imported_with"] != server.imported_with:
            server.close()
            return None
        server.pid = hello["pid"]
        return server

    def alive(self) -> bool:
        return self.process.poll() is None and not self.ended

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
            if out < 0 or not select.select([out], [], [], left)[0]:  # < 0: closed here
                return None
            try:
                data = os.read(out, 65536)
            except ConnectionResetError:  # a server at the end of a connection was killed
                data = b""
            if not data:
                self.ended = True
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
        shared = os.environ.get(SOCKET_ENV)
        try:
            server = AgentServer.connect(shared, server_env) if shared else None
        except OSError:  # the shared server is gone: this process starts its own
            server = None
        try:
            _Agents.server = server or AgentServer.start(server_env)
            _Agents.owner = os.getpid()
        except (OSError, RuntimeError):
            return None
    return _Agents.server


def start_shared_server(env: dict) -> tuple[subprocess.Popen, str]:
    """Start a server that processes reach at the returned socket path when
    ``$COURSE_AGENT_SOCKET`` names it, instead of starting their own; it dies with this process.
    The processes wait for it to be ready when they first need it."""
    path = os.path.join(tempfile.mkdtemp(prefix="agent-server-"), "server.sock")
    process = subprocess.Popen(
        [sys.executable, "-m", "course_lib.runtime.launch_child", "server", "--socket", path],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        start_new_session=True)
    return process, path


def agent_server_pid() -> int | None:
    """The pid of this process's agent server, or None (tests tell it from leftovers)."""
    server = _Agents.server
    return server.pid if server is not None and _Agents.owner == os.getpid() else None


class _Connection:
    """The part of ``subprocess.Popen`` that ``AgentServer`` uses, for a server at the other
    end of a connection."""

    def __init__(self, connection: socket.socket):
        self.connection, self.stdin, self.stdout = connection, connection.makefile("wb"), connection
        self.pid = None

    def poll(self) -> int | None:
        return None if self.connection.fileno() >= 0 else 0

    def wait(self, timeout: float | None = None) -> int:
        self.connection.close()  # the server ends, and its agents with it
        return 0

    kill = wait


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
