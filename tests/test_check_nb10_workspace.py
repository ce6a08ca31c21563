"""Exercise 10.4: the learner's ZeRO-1 step in workspace/my_zero.py, launched on 2, 3 and 4
processes and compared with plain data parallelism (SGD with momentum, AdamW); realistic wrong
versions get the hint that names their mistake."""

import re
import subprocess
import sys

import pytest
from check_reports import shown_report

from course_lib.check import nb10
from course_lib.check.mp import zero_cases
from course_lib.runtime.workspace import has_passed

pytestmark = pytest.mark.slow


def hint_for(workspace, answer: str, world_sizes=(2,)) -> str:
    path = workspace.put(answer, "my_zero.py")
    hint = shown_report(nb10.my_zero, path, nb10, zero_cases, world_sizes=world_sizes)
    assert not has_passed("10.4", path)
    return hint


def test_the_reference_passes_on_2_3_and_4_processes_and_is_recorded(workspace, capsys):
    path = workspace.put("my_zero", "my_zero.py")
    assert nb10.my_zero(path) is None  # a checker prints its verdict, returns nothing
    assert capsys.readouterr().out == "Exercise 10.4: correct.\n"
    assert has_passed("10.4", path)


def test_the_skeleton_is_not_done_yet(workspace, capsys):
    path = workspace.put("my_zero_skeleton", "my_zero.py")
    assert nb10.my_zero(path) is None
    assert "Exercise 10.4: not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    ("my_zero_no_average", "the step used the SUM of the ranks' gradients"),
    ("my_zero_no_all_gather", "after step 1, rank 0's own chunk is updated but the other "
                              "values are still the old ones"),
    ("my_zero_floor_bounds", "rank 0's optimizer works on values 0..11 (end excluded), but the "
                             "reduce-scatter leaves rank 0 the sum of 0..12"),
    ("my_zero_whole_model", "rank 0's optimizer keeps state for all 23 values"),
    ("my_zero_all_reduce_shard", "zero1_step all-reduces: ZeRO-1 needs only its own chunk's "
                                 "sum"),
])
def test_a_wrong_answer_is_named_after_the_first_launch(workspace, answer, words):
    hint = hint_for(workspace, answer)
    assert words in hint, hint
    assert "(case: 23 values, SGD with momentum; launched on 2 processes)" in hint


def test_the_state_is_counted_per_rank_with_adamw_too():
    """AdamW keeps two numbers per value (its 0-d step count is not counted)."""
    spec = zero_cases.case_specs(3, {})[1]
    assert spec["optimizer"] == "AdamW"
    assert zero_cases.reference(spec, 3)["state_per_value"] == 2
    assert zero_cases.reference(spec, 3, grad_scale=3)["after"] != \
        zero_cases.reference(spec, 3)["after"]


def test_the_file_runs_unchanged_under_torchrun(workspace):
    path = workspace.put("my_zero", "my_zero.py")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "3", path], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.findall(r"rank (\d): params\[:3\] = (\[[^\]]*\]), optimizer state: (\d+) "
                       "numbers", done.stdout)  # the ranks' lines may interleave
    found = sorted(found)
    assert [state for _, _, state in found] == ["8", "6", "6"], done.stdout  # 10 values:
    # chunks of 4, 3 and 3, AdamW keeps 2 numbers per value
    assert len({params for _, params, _ in found}) == 1, done.stdout  # the replicas agree
