"""Exercise 6.3: the learner's ring all-reduce in workspace/my_ring.py, launched on 2, 3 and 4
processes; realistic wrong versions get the hint that names their mistake."""

import pytest

from course_lib.check import nb06
from course_lib.check.checker import ExerciseError
from course_lib.runtime.workspace import has_passed

pytestmark = pytest.mark.slow


def hint_for(workspace, answer: str, world_sizes=(2, 3, 4)) -> str:
    path = workspace.put(answer, "my_ring.py")
    with pytest.raises(ExerciseError) as err:
        nb06.my_ring(path, world_sizes=world_sizes)
    assert not has_passed("6.3", path)
    return str(err.value)


def test_the_reference_passes_on_2_3_and_4_processes_and_is_recorded(workspace, capsys):
    path = workspace.put("my_ring", "my_ring.py")
    assert nb06.my_ring(path) is None  # a checker prints its verdict, returns nothing
    assert capsys.readouterr().out == "Exercise 6.3: correct.\n"
    assert has_passed("6.3", path)


def test_a_ring_whose_ranks_finish_another_chunk_passes_too(workspace):
    path = workspace.put("my_ring_other_convention", "my_ring.py")
    nb06.my_ring(path, world_sizes=(3, 4))
    assert has_passed("6.3", path)


def test_the_skeleton_is_not_done_yet(workspace, capsys):
    path = workspace.put("my_ring_skeleton", "my_ring.py")
    assert nb06.my_ring(path) is None
    assert "Exercise 6.3: not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    ("my_ring_mean", "the sum divided by N, the mean"),
    ("my_ring_scatter_only", "the reduce-scatter is done, but not the all-gather"),
    ("my_ring_overwrite", "the reduce-scatter replaces its chunk with the incoming one (add it"),
    ("my_ring_all_reduce", "ring_all_reduce calls dist.all_reduce"),
    ("my_ring_library", "calls the library's ring_all_reduce: the point is to write the ring"),
])
def test_a_wrong_answer_is_named_after_the_first_launch(workspace, answer, words):
    hint = hint_for(workspace, answer)
    assert words in hint, hint
    assert "launched on 2 processes" in hint


@pytest.mark.parametrize("world_size", [3, 4])
def test_an_index_one_off_in_the_reduce_scatter_is_named(workspace, world_size):
    hint = hint_for(workspace, "my_ring_off_by_one", world_sizes=(world_size,))
    assert hint.startswith("in the reduce-scatter, rank r sends chunk (r - s) % N but adds what "
                           "arrives into chunk (r - s - 2) % N"), hint


def test_a_non_contiguous_tensor_must_get_the_result_copied_back(workspace):
    hint = hint_for(workspace, "my_ring_no_copy_back")
    assert "a non-contiguous tensor came back unchanged" in hint
    assert "case: a transposed (non-contiguous) float32 view" in hint


def test_sending_the_whole_tensor_every_step_is_too_many_bytes(workspace):
    hint = hint_for(workspace, "my_ring_whole_tensor", world_sizes=(3,))
    numel, size = 12, 4  # the first case: 12 float32 numbers
    assert hint.startswith(f"each rank sent {2 * 2 * numel * size} bytes for a "
                           f"{numel * size}-byte tensor: every step sends the whole tensor")


def test_torch_chunk_runs_out_of_chunks_and_is_explained(workspace):
    hint = hint_for(workspace, "my_ring_torch_chunk")
    assert "IndexError: tuple index out of range" in hint
    assert "fewer than the 2 ranks" in hint
    assert "torch.tensor_split(flat, N) always returns N" in hint


def test_blocking_sends_first_deadlock_names_the_ranks(workspace):
    hint = hint_for(workspace, "my_ring_sends_first")
    assert "rank 0 is blocked in send to rank 1 (line 15), rank 1 in send to rank 0" in hint
    assert "Start each step's receive and send together" in hint
