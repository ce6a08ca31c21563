"""Exercises 5.3 and 5.4: the learner's token ring in workspace/token_ring.py, launched on
2, 3 and 4 processes; realistic wrong versions get the hint that names their mistake."""

import pytest

from course_lib.check import nb05
from course_lib.check.checker import ExerciseError
from course_lib.runtime.workspace import has_passed

pytestmark = pytest.mark.slow


def hint_for(checker, workspace, answer: str, **kwargs) -> str:
    path = workspace.put(answer, "token_ring.py")
    with pytest.raises(ExerciseError) as err:
        checker(path, **kwargs)
    assert not has_passed(checker.exercise_id, path)
    return str(err.value)


@pytest.mark.parametrize("checker", [nb05.token_ring, nb05.token_ring_async])
def test_the_reference_passes_on_2_3_and_4_processes_and_is_recorded(workspace, capsys,
                                                                    checker):
    path = workspace.put("token_ring", "token_ring.py")
    assert checker(path) is None  # a checker prints its verdict, returns nothing
    assert capsys.readouterr().out == f"Exercise {checker.exercise_id}: correct.\n"
    assert has_passed(checker.exercise_id, path)


def test_a_batch_isend_irecv_answer_passes_too(workspace, capsys):
    path = workspace.put("token_ring_batch", "token_ring.py")
    nb05.token_ring_async(path, world_sizes=(3,))
    assert has_passed("5.4", path)


def test_the_skeleton_is_not_done_yet(workspace, capsys):
    path = workspace.put("token_ring_skeleton", "token_ring.py")
    assert nb05.token_ring(path) is None and nb05.token_ring_async(path) is None
    assert capsys.readouterr().out.count("not done yet") == 2


def test_the_wrong_neighbour_is_named_once_there_are_three_ranks(workspace):
    hint = hint_for(nb05.token_ring, workspace, "token_ring_wrong_neighbour")
    assert "got the token of rank 1, its right neighbour" in hint
    assert "launched on 3 processes" in hint


def test_returning_its_own_token(workspace):
    hint = hint_for(nb05.token_ring, workspace, "token_ring_own_token")
    assert hint.startswith("rank 0 returned its own token: return the tensor received from "
                           "rank 1")


def test_one_process_must_return_a_copy(workspace):
    hint = hint_for(nb05.token_ring, workspace, "token_ring_one_process")
    assert "line 11 in pass_token" in hint and "ValueError: Invalid destination rank" in hint
    assert "in a group of 1 process" in hint
    assert "when dist.get_world_size(group) is 1, return token.clone()" in hint


def test_a_peer_outside_the_group_given_is_refused_at_once(workspace):
    hint = hint_for(nb05.token_ring, workspace, "token_ring_ignores_group")
    assert hint.startswith("rank 0, workspace/token_ring.py line 13 in pass_token:\n"
                           "    dist.send(token, dst=(rank + 1) % n)\n"
                           "PeerOutsideGroup: rank 0 called send to rank 1, which is not in "
                           "the group passed to the function (ranks [0])"), hint


def test_a_receive_buffer_of_the_wrong_dtype_is_ended_by_gloo_and_explained(workspace):
    hint = hint_for(nb05.token_ring, workspace, "token_ring_float_buffer")
    assert "was ended by Gloo in recv from rank" in hint
    assert "an int64 token" in hint
    assert "torch.empty_like(token)" in hint


def test_returning_before_waiting_on_the_handles(workspace):
    hint = hint_for(nb05.token_ring_async, workspace, "token_ring_async_no_wait")
    assert hint.startswith("rank 0 returned without waiting for its isend to rank 1 (line 12)")


def test_waiting_on_the_isend_before_starting_the_irecv_deadlocks(workspace):
    hint = hint_for(nb05.token_ring_async, workspace, "token_ring_async_wait_send_first")
    assert ("rank 0 is blocked waiting for its isend to rank 1 (line 12), rank 1 waiting for "
            "its isend to rank 0 (line 12)") in hint
    assert "Start both messages, isend and irecv, before waiting on either" in hint


def test_the_blocking_exercise_refuses_isend(workspace):
    path = workspace.put("token_ring", "token_ring.py")
    with open(path, "a") as f:  # a learner who answers 5.3 with the async version
        f.write("\npass_token = pass_token_async\n")
    with pytest.raises(ExerciseError, match="pass_token is the blocking version"):
        nb05.token_ring(path)
