"""The workspace and the harness that launches a learner's file: passes, bad files, a deadlock
of three ranks ended in time with nothing left behind (each exercise's own mistakes:
test_check_file_exercises.py)."""

import os
import subprocess
import sys
import time

import psutil
import pytest
from answer_edits import edited, line_of, reference
from file_exercises import TOKEN_RING
from test_launch import tagged_processes

from course_lib.check import nb05
from course_lib.check.checker import ExerciseError
from course_lib.lessons.notebook_setup import setup_notebook
from course_lib.runtime.agent_client import agent_server_pid
from course_lib.runtime.workspace import has_passed, mine_or_library, record_pass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def library_function(tensor, group=None):
    return tensor


def test_the_notebook_setup_makes_the_folder_that_writefile_cells_write_into(workspace):
    assert not os.path.isdir("workspace")
    setup_notebook(seed=0)
    assert os.path.isdir(os.path.join(workspace.root, "workspace"))


def test_a_pass_holds_only_for_the_file_that_passed(workspace):
    path = workspace.put(reference("my_ring.py"), "my_ring.py")
    assert not has_passed("6.3", path)
    record_pass("6.3", path)
    assert has_passed("6.3", path)
    assert not has_passed("6.2", path)
    with open(path, "a") as f:
        f.write("\n# changed\n")
    assert not has_passed("6.3", path)


def test_mine_or_library_prints_one_line_and_falls_back_until_the_exercise_passed(
        workspace, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    path = workspace.put(reference("my_ring.py"), "my_ring.py")
    got = mine_or_library("my_ring", "ring_all_reduce", "6.3", library_function)
    assert got is library_function
    assert capsys.readouterr().out == ("using the library's ring_all_reduce: exercise 6.3 is "
                                       "still open\n")
    record_pass("6.3", path)
    mine = mine_or_library("my_ring", "ring_all_reduce", "6.3", library_function)
    assert mine is not library_function and mine.__module__ == "my_ring"
    assert capsys.readouterr().out == ""


def test_mine_or_library_is_quiet_on_other_ranks_and_notices_a_changed_file(
        workspace, monkeypatch, capsys):
    path = workspace.put(reference("my_ring.py"), "my_ring.py")
    record_pass("6.3", path)
    with open(path, "a") as f:
        f.write("\n# changed after it passed\n")
    monkeypatch.setenv("RANK", "1")
    assert mine_or_library("my_ring", "ring_all_reduce", "6.3", library_function) \
        is library_function
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    mine_or_library("my_ring", "ring_all_reduce", "6.3", library_function)
    assert "changed since it passed exercise 6.3" in capsys.readouterr().out


def test_a_missing_file_says_which_cell_to_run(workspace):
    with pytest.raises(ExerciseError, match=r"no file workspace/token_ring.py yet: run the cell "
                                            r"that starts with %%writefile"):
        nb05.token_ring("workspace/token_ring.py")


def test_a_file_without_the_function_names_it(workspace):
    path = workspace.put(reference("my_ring.py"), "token_ring.py")
    with pytest.raises(ExerciseError, match="defines no function pass_token"):
        nb05.token_ring(path)


def test_a_syntax_error_is_shown_with_its_line(workspace):
    path = workspace.put(reference("token_ring.py"), "token_ring.py")
    with open(path, "a") as f:
        f.write("def broken(:\n")
    with pytest.raises(ExerciseError, match=r"token_ring.py line \d+: SyntaxError"):
        nb05.token_ring(path)


@pytest.mark.slow
def test_top_level_code_that_fails_on_import_is_explained(workspace):
    path = workspace.put(reference("token_ring.py"), "token_ring.py")
    with open(path, "a") as f:  # try-out code without the __main__ guard
        f.write("dist.init_process_group('gloo')\n")
    with pytest.raises(ExerciseError) as err:
        nb05.token_ring(path)
    assert "ValueError: trying to initialize the default process group twice" in str(err.value)
    assert "keep code that tries the functions out under `if __name__" in str(err.value)


def spawned_by(process, before, server) -> bool:
    """Whether a process was started by one that was already running (a session's Chromium
    starts renderers whenever it likes), other than the agent server, whose children are ours."""
    try:
        return any(p in before and p.pid != server for p in process.parents())
    except psutil.NoSuchProcess:
        return True  # it has ended: nothing is left behind


@pytest.mark.slow
def test_a_deadlock_ends_within_30_s_naming_who_waits_on_whom(workspace):
    text = edited(reference("token_ring.py"), TOKEN_RING.wrong["every rank sends first"].edits)
    path = workspace.put(text, "token_ring.py")
    line = line_of(text, "dist.send(")
    before = set(psutil.Process().children(recursive=True))  # e.g. a session's JupyterLab
    start = time.monotonic()
    with pytest.raises(ExerciseError) as err:
        nb05.token_ring(path, world_sizes=(3,))
    assert time.monotonic() - start < 30
    hint = str(err.value)
    assert (f"rank 0 is blocked in send to rank 1 (line {line}), rank 1 in send to rank 2 "
            f"(line {line}), rank 2 in send to rank 0 (line {line})") in hint, hint
    assert "every rank sends before any receives, so no send can complete" in hint
    time.sleep(0.5)
    server = agent_server_pid()  # started by this check, perhaps: it is no leftover
    left = set(psutil.Process().children(recursive=True)) - before
    assert {p for p in left if p.pid != server and not spawned_by(p, before, server)} == set()
    assert tagged_processes(str(workspace.root)) == []


@pytest.mark.slow
def test_the_reference_ring_runs_unchanged_under_plain_torchrun(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    script = tmp_path / "my_ring.py"
    script.write_text(reference("my_ring.py"))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    sums = [float((i + 0) + (i + 1)) for i in range(3)]  # x[i] = i + rank on ranks 0 and 1
    for rank in range(2):
        assert f"rank {rank}: ok, x[:3] = {sums}" in done.stdout, done.stdout
