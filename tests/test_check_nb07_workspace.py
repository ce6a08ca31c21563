"""Exercise 7.3: the learner's data-parallel step in workspace/my_dp_step.py, launched on 2, 3
and 4 processes and compared with one process stepping on the whole batch; realistic wrong
versions get the hint that names their mistake."""

import re
import subprocess
import sys

import pytest
from check_reports import shown_report

from course_lib.check import nb07
from course_lib.check.mp import dp_step_cases
from course_lib.runtime.workspace import has_passed

pytestmark = pytest.mark.slow


def hint_for(workspace, answer: str, world_sizes=(2,)) -> str:
    path = workspace.put(answer, "my_dp_step.py")
    hint = shown_report(nb07.my_dp_step, path, nb07, dp_step_cases, world_sizes=world_sizes)
    assert not has_passed("7.3", path)
    return hint


def test_the_reference_passes_on_2_3_and_4_processes_and_is_recorded(workspace, capsys):
    path = workspace.put("my_dp_step", "my_dp_step.py")
    assert nb07.my_dp_step(path) is None  # a checker prints its verdict, returns nothing
    assert capsys.readouterr().out == "Exercise 7.3: correct.\n"
    assert has_passed("7.3", path)


def test_the_skeleton_is_not_done_yet(workspace, capsys):
    path = workspace.put("my_dp_step_skeleton", "my_dp_step.py")
    assert nb07.my_dp_step(path) is None
    assert "Exercise 7.3: not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    ("my_dp_step_no_divide", "the gradient is 2 times too large: not divided by the world "
                             "size"),
    ("my_dp_step_no_accum_scale", "the gradient is 3 times too large: each micro-batch's loss "
                                  "is a mean"),
    ("my_dp_step_sync_every_micro_step", "ring_all_reduce ran after micro-batch 1 of 3: a sync "
                                         "on every micro-step"),
    ("my_dp_step_no_broadcast", "after broadcast_parameters rank 1 still has its own starting "
                                "weights"),
    ("my_dp_step_dist_all_reduce", "the gradients were averaged with dist.all_reduce: use "
                                   "ring_all_reduce"),
    ("my_dp_step_library_broadcast", "broadcast_parameters is the library's own"),
    ("my_dp_step_library_wrapper", "uses the library's AllReducePerParameter"),
])
def test_a_wrong_answer_is_named_after_the_first_launch(workspace, answer, words):
    hint = hint_for(workspace, answer)
    assert words in hint, hint
    assert "launched on 2 processes" in hint


def test_with_as_many_micro_batches_as_ranks_a_factor_is_named_either_way(workspace):
    hint = hint_for(workspace, "my_dp_step_no_accum_scale", world_sizes=(3,))  # K = 3 too
    assert "the gradient is 3 times too large: either the ring's sum" in hint, hint


def test_the_file_runs_unchanged_under_torchrun(workspace):
    path = workspace.put("my_dp_step", "my_dp_step.py")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "3", path], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = dict(re.findall(r"rank (\d): weights after one step sum to (-?[\d.]+)",
                            done.stdout))  # the ranks' lines may interleave
    assert sorted(found) == ["0", "1", "2"], done.stdout
    assert len(set(found.values())) == 1, done.stdout  # the replicas agree
