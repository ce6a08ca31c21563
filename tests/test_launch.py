"""The launcher: output, results, and every way a run can go wrong ends cleanly and quickly.

"Nothing left" is checked by looking for processes whose command line carries the run's tag.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from course_lib.runtime import launch as launch_module
from course_lib.runtime.agent_client import agent_server_pid
from course_lib.runtime.launch import LaunchError, launch, save_result
from course_lib.runtime.launch_output import library_call, own_frames

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULTS = "course_lib.demos.faults"
HANG_S = 60  # longer than any of these runs takes on a loaded laptop (2-10 s idle): a hang


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Processes whose command line holds ``tag``, and every process this test session's
    agent server forked (an agent it forks, and that agent's ranks, keep the server's command
    line): this test's launches, as a test runs alone in its process."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if tag in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    server = agent_server_pid()
    if server is not None:
        try:
            found += [p for p in psutil.Process(server).children(recursive=True)
                      if p.status() != psutil.STATUS_ZOMBIE and p not in found]
        except psutil.NoSuchProcess:
            pass
    return found


def assert_nothing_left(tag: str, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p.pid, p.name()) for p in tagged_processes(tag)]
    assert not left, f"processes left behind: {left}"


def new_tag() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def nothing_may_start(monkeypatch):
    """Fail the test if the launcher gets as far as starting torchrun."""
    def started(*args, **kwargs):
        raise AssertionError("the launcher started processes")

    monkeypatch.setattr("course_lib.runtime.launch._run_once", started)


@pytest.mark.parametrize("fork", [True, False], ids=["ranks forked", "fresh interpreters"])
def test_two_ranks_stream_output_and_return_result(capsys, monkeypatch, fork):
    # Linux forks the ranks from torchrun's agent; macOS starts a fresh interpreter per rank
    monkeypatch.setattr(launch_module, "FORK_WORKERS", fork)
    run = launch("course_lib.demos.hello", nproc=2, timeout_s=60)
    printed = capsys.readouterr().out
    assert run.returncode == 0
    assert "[rank 0] hello from rank 0 of 2" in printed
    assert "[rank 1] hello from rank 1 of 2" in printed
    assert "[rank 1] hello from rank 1 of 2" in run.output
    assert sorted(r["rank"] for r in run.result) == [0, 1]
    assert {r["backend"] for r in run.result} == {"gloo"}


def test_quiet_run_prints_nothing(capsys):
    run = launch("course_lib.demos.hello", nproc=1, timeout_s=60, quiet=True)
    assert capsys.readouterr().out == ""
    assert run.result[0]["world_size"] == 1


@pytest.mark.parametrize("fork", [True, False], ids=["ranks forked", "fresh interpreters"])
def test_a_rank_that_raises_is_named_and_everything_ends(monkeypatch, fork):
    monkeypatch.setattr(launch_module, "FORK_WORKERS", fork)
    tag = new_tag()
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(FAULTS, nproc=2, args=["--mode", "raise", "--rank", "1", "--tag", tag], quiet=True)
    assert time.monotonic() - start < HANG_S  # no timeout_s: only the failure can end it
    assert "rank 1 failed" in str(err.value)
    assert "RuntimeError: rank 1 fails on purpose" in str(err.value)
    assert_nothing_left(tag)


def test_a_rank_killed_by_a_signal_is_named_not_the_peer_it_disconnected():
    tag = new_tag()
    with pytest.raises(LaunchError) as err:
        launch(FAULTS, nproc=3, args=["--mode", "killed", "--rank", "0", "--tag", tag],
               timeout_s=60, quiet=True)
    assert str(err.value).startswith("rank 0 was killed by signal 9 (SIGKILL)"), str(err.value)
    assert_nothing_left(tag)


def test_a_hung_rank_is_stopped_after_the_timeout():
    tag = new_tag()
    for timeout_s in (6, 20):  # a loaded machine may not reach the hang within 6 s: again
        start = time.monotonic()
        with pytest.raises(LaunchError) as err:
            launch(FAULTS, nproc=2, args=["--mode", "hang", "--tag", tag], timeout_s=timeout_s,
                   quiet=True)
        message = str(err.value)
        assert timeout_s <= time.monotonic() - start < timeout_s + HANG_S  # at the timeout
        assert f"did not finish within {timeout_s} s" in message
        assert_nothing_left(tag)
        if "rank 0 joined" in message and "rank 1 joined" in message:
            break
    assert re.search(r"Rank 1 was still running, at:\n.*faults.py\", line \d+ in main: "
                     r"time.sleep\(3600\)", message), message  # its stack
    assert re.search(r"Rank 0 was still running, at:\n.*inside torch/distributed/"
                     r"distributed_c10d.py, in all_reduce \(line \d+\)\n.*: dist.all_reduce",
                     message), message  # where in torch it waited, then its own line


def test_a_rank_that_never_joins_is_named_with_where_it_was():
    tag = new_tag()
    with pytest.raises(LaunchError) as err:
        launch(FAULTS, nproc=3, args=["--mode", "late", "--rank", "2", "--tag", tag],
               timeout_s=HANG_S, quiet=True, env={"COURSE_PG_TIMEOUT_S": "3"})
    message = str(err.value)
    assert "wait timeout" in message, message  # a peer timed out waiting for rank 2 to join
    assert re.search(r"Rank 2 was still running, at:\n.*time.sleep\(3600\)", message), message
    assert_nothing_left(tag)


def test_a_rank_that_never_starts_gives_a_clear_error():
    tag = new_tag()
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(FAULTS, nproc=3, args=["--mode", "never-start", "--rank", "2", "--tag", tag],
               timeout_s=HANG_S, quiet=True)
    assert time.monotonic() - start < HANG_S  # the failure ended it, not the timeout
    assert "rank 2 failed (exit code 3)" in str(err.value)
    assert "exits before joining" in str(err.value)
    assert_nothing_left(tag)


def test_a_port_in_use_is_refused_before_starting(nothing_may_start):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} .* already in use"):
            launch("course_lib.demos.hello", nproc=2, port=port, quiet=True)


def test_a_fixed_free_port_works():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = launch("course_lib.demos.hello", nproc=2, port=port, timeout_s=60, quiet=True)
    assert len(run.result) == 2


@pytest.mark.parametrize("target, nproc, env, message", [
    ("course_lib.demos.no_such_module", 2, None, "no module named 'course_lib.demos.no_such"),
    ("missing_dir/train.py", 2, None, "no file 'missing_dir/train.py'"),
    ("course_lib.demos.hello", 0, None, "nproc must be a whole number >= 1"),
    ("course_lib.demos.hello", 2, {"COURSE_BACKEND": "nccl"}, "needs one GPU per process"),
])
def test_bad_input_fails_before_anything_starts(target, nproc, env, message,
                                                nothing_may_start):
    if env and env.get("COURSE_BACKEND") == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus >= nproc:
            pytest.skip(f"needs fewer GPUs than {nproc} processes; this machine has {gpus}")
    with pytest.raises(LaunchError, match=message):
        launch(target, nproc=nproc, env=env, quiet=True)


def cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "course_lib.runtime.launch", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_two_launches_at_once_do_not_collide():
    runs = [cli("--nproc", "2", "course_lib.demos.hello") for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in runs]
    for p, (out, err) in zip(runs, outputs, strict=True):
        assert p.returncode == 0, err
        assert "[rank 1] hello from rank 1 of 2" in out
        assert out.count('"rank"') == 2  # the printed result holds both ranks


def test_cli_failure_prints_one_error_and_exits_non_zero():
    p = cli("--nproc", "1", "course_lib.demos.no_such_module")
    out, err = p.communicate(timeout=30)
    assert p.returncode == 1
    assert err.startswith("error: no module named")


def test_killing_the_launcher_hard_leaves_no_worker():
    tag = new_tag()
    p = cli("--nproc", "2", FAULTS, "--mode", "sleep", "--seconds", "60", "--tag", tag)
    deadline = time.monotonic() + 30
    joined = 0
    while joined < 2 and time.monotonic() < deadline:  # wait until both ranks are running
        line = p.stdout.readline()
        joined += "joined (sleep)" in line
    assert joined == 2, "the workers did not start"
    assert len(tagged_processes(tag)) >= 3  # the agent and two workers
    p.send_signal(signal.SIGKILL)  # as when a notebook kernel dies
    p.wait(timeout=10)
    assert_nothing_left(tag, within_s=5)


def test_interrupt_stops_every_process(monkeypatch):
    tag = new_tag()
    seen = {"running": 0}
    real_wait = launch_module._poll_wait

    def wait_then_interrupt(*args):
        seen["running"] = len(tagged_processes(tag))
        if seen["running"] >= 3:  # the agent and both workers run: the learner presses "stop"
            raise KeyboardInterrupt
        real_wait(*args)

    monkeypatch.setattr(launch_module, "_poll_wait", wait_then_interrupt)
    with pytest.raises(LaunchError, match="interrupted"):
        launch(FAULTS, nproc=2, args=["--mode", "sleep", "--seconds", "60", "--tag", tag],
               timeout_s=HANG_S, quiet=True)
    monkeypatch.undo()
    assert seen["running"] >= 3
    assert_nothing_left(tag)


def test_save_result_only_from_rank_0_of_a_launched_run(tmp_path, monkeypatch):
    path = tmp_path / "result.json"
    monkeypatch.delenv("COURSE_RESULT_PATH", raising=False)
    assert save_result({"x": 1}) is False  # not under the launcher
    monkeypatch.setenv("COURSE_RESULT_PATH", str(path))
    monkeypatch.setenv("RANK", "1")
    assert save_result({"x": 1}) is False and not path.exists()
    monkeypatch.setenv("RANK", "0")
    assert save_result({"x": 1}) is True
    assert path.read_text() == '{"x": 1}'


@pytest.mark.slow
def test_the_launch_benchmark_compares_forked_fresh_and_preloaded_ranks():
    done = subprocess.run([sys.executable, "scripts/bench_launch.py", "--nproc", "1",
                           "--repeats", "1", "--preload", "json.tool"], cwd=ROOT,
                          capture_output=True, text=True, timeout=HANG_S * 3)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()  # one rank: each kind of launch at its cheapest
    assert lines[0] == "course_lib.demos.hello on 1 process, median of 1 launch each:"
    assert "ranks forked from torchrun" in lines[1] and "a fresh Python per rank" in lines[2]
    assert "forked, json.tool preloaded" in lines[3], done.stdout
    assert lines[4].startswith("  fresh / forked: wall x"), done.stdout
    assert lines[5].startswith("  forked / preloaded: wall x"), done.stdout
    assert len(lines) == 6, done.stdout


SIGNAL_HANDLERS = """
import signal
from course_lib.runtime.launch import save_result
save_result([signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
             signal.getsignal(signal.SIGINT) is signal.default_int_handler])
"""


@pytest.mark.parametrize("fork", [True, False], ids=["ranks forked", "fresh interpreters"])
def test_a_rank_has_a_fresh_interpreters_signal_handlers(tmp_path, monkeypatch, fork):
    # a forked rank would otherwise keep torchrun's SIGTERM handler, which raises an exception:
    # a rank stopped because a peer died would then look like a rank that failed by itself
    monkeypatch.setattr(launch_module, "FORK_WORKERS", fork)
    script = tmp_path / "handlers.py"
    script.write_text(SIGNAL_HANDLERS)
    assert launch(str(script), nproc=1, timeout_s=HANG_S, quiet=True).result == [True, True]


LOADED_AT_START = """
import sys
from course_lib.runtime.launch import save_result
save_result("json.tool" in sys.modules)  # no rank imports it by itself
"""


@pytest.mark.parametrize("fork", [True, False], ids=["ranks forked", "fresh interpreters"])
def test_preloaded_modules_are_already_loaded_in_a_forked_rank(tmp_path, monkeypatch, fork):
    # COURSE_PRELOAD: the agent imports them once before it forks the ranks, which inherit
    # them; a fresh interpreter imports its own
    monkeypatch.setattr(launch_module, "FORK_WORKERS", fork)
    script = tmp_path / "loaded.py"
    script.write_text(LOADED_AT_START)
    env = {"COURSE_PRELOAD": "json.tool"}
    assert launch(str(script), nproc=2, timeout_s=HANG_S, quiet=True, env=env).result is fork
    assert launch(str(script), nproc=1, timeout_s=HANG_S, quiet=True).result is False


KEPT_ALIVE = """
import gc
import weakref
import torch.distributed as dist
from course_lib.runtime.launch import save_result
dist.init_process_group("gloo")
world, pair = weakref.ref(dist.group.WORLD), weakref.ref(dist.new_group([0, 1]))
dist.destroy_process_group()
gc.collect()
save_result({"kept": world() is not None and pair() is not None, "initialized":
             dist.is_initialized(), "dynamo": "torch._dynamo" in sys.modules})
"""


def test_a_rank_keeps_its_process_groups_until_it_leaves_and_inherits_dynamo(tmp_path):
    # destroying a Gloo group joins its threads while holding the GIL, which hung ranks whose
    # last collective ran during backward: a rank never frees one (launch_child.py). From a
    # process's second launch on, a forked rank has torch._dynamo from the agent server.
    script = tmp_path / "kept.py"
    script.write_text("import sys\n" + KEPT_ALIVE)
    for _ in range(2):
        result = launch(str(script), nproc=2, timeout_s=HANG_S, quiet=True).result
        assert result["kept"] and not result["initialized"], result
    assert result["dynamo"] is (launch_module.FORK_WORKERS and launch_module.AGENT_SERVER)


def test_ddp_minimal_never_hangs_on_its_way_out():
    # it did, 3 times in 22, before the ranks kept their process groups
    for _ in range(3):
        run = launch("course_lib.demos.ddp_minimal", nproc=2, timeout_s=HANG_S, quiet=True)
        assert run.result["world_size"] == 2


def test_a_preloaded_module_that_does_not_exist_fails_the_launch_with_its_name(tmp_path):
    script = tmp_path / "loaded.py"
    script.write_text(LOADED_AT_START)
    with pytest.raises(LaunchError, match="COURSE_PRELOAD names .no_such_module_here., which "
                                          "cannot be imported"):
        launch(str(script), nproc=1, timeout_s=HANG_S, quiet=True,
               env={"COURSE_PRELOAD": "no_such_module_here"})


def test_the_rank_torchrun_reports_is_blamed_not_the_peer_it_stopped_in_the_same_look(tmp_path):
    # rank 1 aborts; torchrun stops rank 0 (SIGTERM) and reports only rank 1's exit code. The
    # launcher saw both gone in one look (rank 0 first): it must name rank 1, with its signal
    from course_lib.runtime.launch_output import RankWatch

    agent_log = tmp_path / "agent.log"
    agent_log.write_text("Failures:\n  <NO_OTHER_FAILURES>\nRoot Cause (first observed failure):\n"
                         "[0]:\n  time      : 2026-12-01_12:00:00\n  host      : localhost\n"
                         "  rank      : 1 (local_rank: 1)\n  exitcode  : -6 (pid: 4242)\n")
    watch = RankWatch(str(tmp_path), nproc=2)
    watch.vanished = {0: 100.0, 1: 100.0}
    assert watch.failure(str(agent_log)) == (1, -6)


def test_the_package_call_a_rank_waited_in_is_named_wherever_packages_are_installed():
    for packages in ("/venv/lib/python3.11/site-packages",
                     "/usr/local/lib/python3.10/dist-packages"):  # pip's; Debian's (Colab)
        stack = (f'Thread 0x1 (most recent call first):\n'
                 f'  File "{packages}/torch/distributed/distributed_c10d.py", line 3252 '
                 f'in all_reduce\n'
                 f'  File "/work/my_ring.py", line 9 in main\n'
                 f'  File "/x/course_lib/runtime/launch_child.py", line 160 in run_worker\n')
        assert library_call(stack) == [
            "inside torch/distributed/distributed_c10d.py, in all_reduce (line 3252)"]
        assert own_frames(stack) == ['File "/work/my_ring.py", line 9 in main']
    assert library_call(stack.replace(f"{packages}/torch", "/work/torch")) == []  # not a package
