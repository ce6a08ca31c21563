"""Exercise 9.3: the learner's DDP training script in workspace/my_ddp_train.py, its train(config)
launched on 2, 3 and 4 processes and compared with one process on the whole batches; realistic
wrong versions get the hint that names their mistake."""

import pytest
from check_reports import checked_lines

from course_lib.check import nb09
from course_lib.check.checker import ExerciseError
from course_lib.check.mp import ddp_script_cases, harness, verdict
from course_lib.runtime.workspace import has_passed

pytestmark = pytest.mark.slow


def shown(error: ExerciseError) -> str:
    """What the notebook shows (short, free of checker code: ``check_reports``)."""
    return "\n".join(checked_lines(error, nb09, ddp_script_cases, harness, verdict))


def hint_for(workspace, answer: str, world_sizes=(3,)) -> str:
    path = workspace.put(answer, "my_ddp_train.py")
    with pytest.raises(ExerciseError) as err:
        nb09.my_ddp_train(path, world_sizes=world_sizes)
    shown(err.value)
    assert not has_passed("9.3", path)
    return str(err.value)


def test_the_reference_passes_on_2_3_and_4_processes_and_is_recorded(workspace, capsys):
    path = workspace.put("my_ddp_train", "my_ddp_train.py")
    assert nb09.my_ddp_train(path) is None  # a checker prints its verdict, returns nothing
    assert capsys.readouterr().out == "Exercise 9.3: correct.\n"
    assert has_passed("9.3", path)


def test_the_skeleton_is_not_done_yet(workspace, capsys):
    path = workspace.put("my_ddp_train_skeleton", "my_ddp_train.py")
    assert nb09.my_ddp_train(path, world_sizes=(2,)) is None
    assert "Exercise 9.3: not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    ("my_ddp_train_no_set_epoch", "every epoch saw its examples in the same order"),
    ("my_ddp_train_no_sync_backward", "DDP all-reduced the gradients 16 times for 8 optimizer "
                                      "steps: no_sync() wraps the backward only"),
    ("my_ddp_train_own_loss", "rank 0 and rank 1 logged different losses"),
    ("my_ddp_train_every_rank_saves", "rank 1 wrote the checkpoint too"),
    ("my_ddp_train_wrapper_keys", "the checkpoint's names start with 'module.'"),
])
def test_a_wrong_answer_is_named_after_the_first_launch(workspace, answer, words):
    hint = hint_for(workspace, answer)
    assert words in hint, hint
    assert "launched on 3 processes" in hint


def test_starting_the_group_inside_train_shows_the_line_and_says_where_it_belongs(workspace):
    hint = hint_for(workspace, "my_ddp_train_init_in_train", world_sizes=(2,))
    assert "line 56 in train:\n    dist.init_process_group(\"gloo\")" in hint, hint
    assert "call dist.init_process_group in main(), not in train" in hint


def test_main_must_start_train_and_end_the_group(workspace):
    path = workspace.put("my_ddp_train", "my_ddp_train.py")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:  # a learner who forgot the last line of main()
        f.write(text.replace("    dist.destroy_process_group()\n", ""))
    with pytest.raises(ExerciseError, match="main\\(\\) does not end the process group"):
        nb09.my_ddp_train(path, world_sizes=(2,))
