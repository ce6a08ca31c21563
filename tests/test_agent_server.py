"""Launches after the first fork torchrun's agent from a server that imported torch once
(course_lib/runtime/agent_server.py): the same results and errors as a fresh agent, and no
process left behind, not even when the server itself is killed."""

import os
import signal
import subprocess
import sys
import time
import types

import psutil
import pytest

from course_lib.runtime import agent, agent_client, agent_server
from course_lib.runtime import launch as launch_module
from course_lib.runtime.agent_client import (
    SOCKET_ENV,
    AgentServer,
    agent_server_pid,
    start_shared_server,
)
from course_lib.runtime.agent_server import needs_fresh_agent
from course_lib.runtime.launch import LaunchError, launch

HELLO = "course_lib.demos.hello"


def agents_of(server_pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(server_pid).children()
            if p.status() != psutil.STATUS_ZOMBIE]


def wait_until(condition, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@pytest.fixture
def served(monkeypatch):
    """Launches in this test use the server from their first one on: this process's own, or
    the one a test session's shared server forked for it."""
    monkeypatch.setattr(launch_module, "AGENT_SERVER", True)
    monkeypatch.setattr(agent_client._Agents, "launches", 1)


@pytest.fixture(scope="module")
def shared_server():
    """A shared server, as a test session starts one, for this file's tests: (process, path)."""
    process, path = start_shared_server(launch_module.server_env())
    yield process, path
    process.kill()
    process.wait()


@pytest.fixture
def shared(served, shared_server, monkeypatch):
    """Launches in this test reach ``shared_server`` (or start a server of their own)."""
    process, path = shared_server
    monkeypatch.setenv(SOCKET_ENV, path)
    monkeypatch.setattr(agent_client._Agents, "server", None)
    yield process
    if agent_client._Agents.server is not None:
        agent_client._Agents.server.close()


def started_by_me_or_a_shared_server(server: int) -> bool:
    """Whether the server ``server`` is this process's child, or the one the shared server at
    ``$COURSE_AGENT_SOCKET`` (whose command line names it) forked for this process."""
    parent = psutil.Process(server).parent()
    return parent.pid == os.getpid() or (
        SOCKET_ENV in os.environ and os.environ[SOCKET_ENV] in parent.cmdline())


def test_a_served_launch_gives_what_a_fresh_one_gives(served, monkeypatch):
    spawned = []
    real_spawn = AgentServer.spawn
    monkeypatch.setattr(AgentServer, "spawn",
                        lambda self, *a: spawned.append(a) or real_spawn(self, *a))
    fresh = launch(HELLO, nproc=2, quiet=True, env={"OMP_NUM_THREADS": "1"})  # read at import
    assert agent_server_pid() is None or not agents_of(agent_server_pid())
    assert spawned == []
    served_run = launch(HELLO, nproc=2, quiet=True)
    assert len(spawned) == 1  # this one came from the server
    server = agent_server_pid()  # this process's child, or a shared server's
    assert server is not None and started_by_me_or_a_shared_server(server)
    assert sorted(served_run.output.splitlines()) == sorted(fresh.output.splitlines())
    without_pid = [[{k: v for k, v in r.items() if k != "pid"} for r in run.result]
                   for run in (fresh, served_run)]
    assert without_pid[0] == without_pid[1] and len(without_pid[0]) == 2
    assert "[rank 1] hello from rank 1 of 2" in served_run.output
    assert wait_until(lambda: not agents_of(server)), "an agent was left behind"


def test_a_failing_rank_is_named_as_with_a_fresh_agent(served):
    launch(HELLO, nproc=2, quiet=True)  # the server is up
    with pytest.raises(LaunchError) as err:
        launch("course_lib.demos.faults", nproc=2, quiet=True,
               args=["--mode", "raise", "--rank", "1", "--tag", "served"])
    assert "rank 1 failed" in str(err.value)
    assert "RuntimeError: rank 1 fails on purpose" in str(err.value)
    server = agent_server_pid()
    assert wait_until(lambda: not agents_of(server)), "an agent was left behind"


def test_a_killed_server_takes_its_agents_along_and_the_next_launch_starts_another(served):
    launch(HELLO, nproc=2, quiet=True)
    server = agent_server_pid()
    os.kill(server, signal.SIGKILL)
    assert wait_until(lambda: not psutil.pid_exists(server)
                      or psutil.Process(server).status() == psutil.STATUS_ZOMBIE)
    for _ in range(2):  # a fresh agent if the server still looks alive, then a new server
        again = launch(HELLO, nproc=2, quiet=True)
        assert "[rank 0] hello from rank 0 of 2" in again.output
    assert agent_server_pid() not in (None, server)


def test_a_shared_server_forks_each_process_a_server_that_ends_with_its_connection(shared):
    served_run = launch(HELLO, nproc=2, quiet=True)
    server = agent_server_pid()  # this process's own, forked by the shared one
    assert psutil.Process(server).ppid() == shared.pid
    assert "[rank 1] hello from rank 1 of 2" in served_run.output
    again = launch(HELLO, nproc=2, quiet=True)
    assert "[rank 0] hello from rank 0 of 2" in again.output
    assert agent_server_pid() == server  # one connection for every launch
    agent_client._Agents.server.close()
    assert wait_until(lambda: not psutil.pid_exists(server)
                      or psutil.Process(server).status() == psutil.STATUS_ZOMBIE)
    assert shared.poll() is None  # it goes on serving the others


def test_a_server_shared_by_a_process_that_is_killed_ends_with_its_agents(shared, tmp_path):
    script = tmp_path / "launches.py"
    script.write_text("import time\nfrom course_lib.runtime import agent_client\n"
                      "from course_lib.runtime.launch import launch\n"
                      "agent_client._Agents.launches = 1\n"
                      "launch('course_lib.demos.faults', nproc=2, quiet=True, args=['--mode', "
                      "'hang', '--rank', '0', '--tag', 'shared'])\n")
    process = subprocess.Popen([sys.executable, str(script)], env=dict(os.environ))
    assert wait_until(lambda: len(psutil.Process(shared.pid).children(recursive=True)) >= 4,
                      within_s=60)  # its server, the agent and the two ranks
    family = psutil.Process(shared.pid).children(recursive=True)
    process.kill()
    process.wait()
    assert wait_until(lambda: not [p for p in family if p.is_running()
                                   and p.status() != psutil.STATUS_ZOMBIE], within_s=10)


def test_a_shared_server_with_other_import_time_variables_is_not_used(shared, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # read when torch is imported
    launch(HELLO, nproc=1, quiet=True)
    assert psutil.Process(agent_server_pid()).ppid() == os.getpid()  # its own server


def test_a_shared_server_that_never_started_leaves_each_process_its_own(served, monkeypatch,
                                                                         tmp_path):
    monkeypatch.setenv(SOCKET_ENV, str(tmp_path / "server.sock"))  # nothing listens there
    monkeypatch.setattr(agent_client, "CONNECT_S", 0.5)
    monkeypatch.setattr(agent_client._Agents, "server", None)
    try:
        assert "[rank 0] hello" in launch(HELLO, nproc=1, quiet=True).output
        assert psutil.Process(agent_server_pid()).ppid() == os.getpid()
    finally:
        agent_client._Agents.server.close()


def test_variables_torch_reads_when_imported_get_a_fresh_agent():
    assert needs_fresh_agent({"OMP_NUM_THREADS": "4"})
    assert needs_fresh_agent({"TORCH_CPP_LOG_LEVEL": "INFO"})
    assert not needs_fresh_agent({"COURSE_PG_TIMEOUT_S": "10", "COURSE_PRELOAD": "torch._dynamo"})
    assert not needs_fresh_agent(None)


@pytest.mark.parametrize("in_kernel", [False, True], ids=["a shell", "a notebook kernel"])
def test_the_first_served_launch_is_a_kernels_first_or_a_shells_second(in_kernel, monkeypatch):
    # a notebook launches again and again: its first launch already starts the server; a
    # shell's first launch (perhaps its only one) starts a fresh agent
    monkeypatch.setattr(launch_module, "AGENT_SERVER", True)
    monkeypatch.setattr(agent_client._Agents, "launches", 0)
    if in_kernel:
        monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    else:
        monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    spawned = []
    monkeypatch.setattr(AgentServer, "spawn", lambda self, *a: spawned.append(a) or None)
    monkeypatch.setattr(agent_client, "_running_server", lambda env: AgentServer.__new__(
        AgentServer))
    started = []
    monkeypatch.setattr(agent_client.subprocess, "Popen", lambda *a, **k: started.append(a))
    agent_client.start_agent(["python", "-m", "x", "agent"], {}, os.devnull, None, {})
    assert (len(spawned), len(started)) == ((1, 0) if in_kernel else (0, 1))


def test_the_launchers_child_and_its_server_do_not_import_each_other():
    """What both need is in runtime/agent.py; an import inside a function counts too."""
    import ast
    from pathlib import Path

    folder = Path(agent_server.__file__).parent

    def imports(name: str) -> set[str]:
        tree = ast.parse((folder / f"{name}.py").read_text())
        return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}

    assert "course_lib.runtime.launch_child" not in imports("agent_server")
    assert "course_lib.runtime.agent_server" not in imports("agent")
    assert "course_lib.runtime.launch_child" not in imports("agent")


def test_rendezvous_steps_are_named_as_torchs_own_inspect_names_them(monkeypatch):
    """The agent reads a rendezvous step's name from the frame (agent.py), not from
    ``inspect.stack()``: the same name, at every depth torch asks for and beyond the stack."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    torchs = dynamic_rendezvous.get_method_name
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", torchs)
    agent.name_rendezvous_steps_cheaply()
    ours = dynamic_rendezvous.get_method_name
    assert ours is not torchs

    def record(name, depth):  # where torch asks for the name: its handler's _record
        return name(depth)

    def next_rendezvous_round(name, depth):  # the step that records, and is named
        return record(name, depth)

    for depth in (0, 1, 2, 3, 10_000):
        assert next_rendezvous_round(ours, depth) == next_rendezvous_round(torchs, depth), depth
    assert next_rendezvous_round(ours, 2) == "next_rendezvous_round"
    assert next_rendezvous_round(ours, 10_000) == "no_method_name"
