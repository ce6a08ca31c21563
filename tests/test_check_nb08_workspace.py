"""Exercise 8.3: the learner's gradient hooks in workspace/my_hooks.py, launched on 2, 3 and 4
processes and compared with torch DDP; realistic wrong versions get the hint that names their
mistake."""

import pytest
from check_reports import checked_lines

from course_lib.check import nb08
from course_lib.check.checker import ExerciseError
from course_lib.check.mp import harness, hook_cases, verdict
from course_lib.runtime.workspace import has_passed

pytestmark = pytest.mark.slow


def shown(error: ExerciseError) -> str:
    """What the notebook shows (short, free of checker code: ``check_reports``)."""
    return "\n".join(checked_lines(error, nb08, hook_cases, harness, verdict))


def hint_for(workspace, answer: str, world_sizes=(3,)) -> str:
    path = workspace.put(answer, "my_hooks.py")
    with pytest.raises(ExerciseError) as err:
        nb08.my_hooks(path, world_sizes=world_sizes)
    shown(err.value)
    assert not has_passed("8.3", path)
    return str(err.value)


def test_the_reference_passes_on_2_3_and_4_processes_and_is_recorded(workspace, capsys):
    path = workspace.put("my_hooks", "my_hooks.py")
    assert nb08.my_hooks(path) is None  # a checker prints its verdict, returns nothing
    assert capsys.readouterr().out == "Exercise 8.3: correct.\n"
    assert has_passed("8.3", path)


def test_the_skeleton_is_not_done_yet(workspace, capsys):
    path = workspace.put("my_hooks_skeleton", "my_hooks.py")
    assert nb08.my_hooks(path, world_sizes=(2,)) is None
    assert "Exercise 8.3: not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    ("my_hooks_no_wait", "never waited on the all-reduce started at line 57"),
    ("my_hooks_read_early", "a bucket was read before its all-reduce had finished"),
    ("my_hooks_no_divide", "the gradients are the SUM over the ranks, N times DDP's"),
    ("my_hooks_after_backward", "no overlap: the first all-reduce started after "
                                "loss.backward() had returned"),
    ("my_hooks_blocking", "the all-reduce at line 57 blocks: without async_op=True"),
    ("my_hooks_no_reset", "the first step was right, the second is not"),
    ("my_hooks_wait_in_hook", "the all-reduce started at line 57 is waited on during backward"),
])
def test_a_wrong_answer_is_named_after_the_first_launch(workspace, answer, words):
    hint = hint_for(workspace, answer)
    assert words in hint, hint
    assert "launched on 3 processes" in hint


def test_dividing_by_the_whole_world_is_caught_in_a_smaller_group(workspace):
    hint = hint_for(workspace, "my_hooks_world_size", world_sizes=(2, 3))
    assert hint.startswith("you divided by the size of the whole world, not of the group"), hint
    assert "case: a group of ranks 0..1 (not the whole world); launched on 3 processes" in hint


def test_using_the_library_is_refused_before_any_launch(workspace):
    hint = hint_for(workspace, "my_hooks_library")
    assert "uses course_lib (course_lib.core.overlap): the point is to write the hooks" in hint


def test_a_file_without_the_class_is_told_what_to_keep(workspace):
    path = workspace.put("my_ring", "my_hooks.py")  # the wrong file under the right name
    with pytest.raises(ExerciseError, match="defines no class BucketHooks"):
        nb08.my_hooks(path)


def test_wrapping_the_model_in_torch_ddp_is_refused_too(workspace):
    path = workspace.put("my_hooks", "my_hooks.py")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:  # DDP imported at the top, for use inside the class
        f.write("from torch.nn.parallel import DistributedDataParallel as DDP  # noqa\n" + text)
    with pytest.raises(ExerciseError, match="uses DistributedDataParallel: the point is"):
        nb08.my_hooks(path)
