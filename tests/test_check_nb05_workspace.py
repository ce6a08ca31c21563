"""Exercises 5.3 and 5.4: the learner's token ring in workspace/token_ring.py and
workspace/token_ring_async.py, launched on 2, 3 and 4 processes. Right answers pass; each
realistic wrong one (an edit of the notebook's answer, tests/token_ring_answers.py) gets the
hint that names its mistake and no other."""

import pytest
from answer_edits import reference, skeleton
from check_reports import file_hint
from token_ring_answers import WRONG, answer, line_of

from course_lib.check import nb05
from course_lib.runtime.workspace import has_passed

BLOCKING, ASYNC = "token_ring.py", "token_ring_async.py"
CHECKER = {BLOCKING: nb05.token_ring, ASYNC: nb05.token_ring_async}

# (file, mistake, the world sizes that show it, words only its hint holds)
MISTAKES = [
    (BLOCKING, "every rank sends first", (2,), "a cycle of waits that no rank can leave"),
    (BLOCKING, "the token goes left", (3,), "went round the ring the wrong way"),
    (BLOCKING, "returns its own token", (2,), "returned the token it was given, the same tensor"),
    (BLOCKING, "receives into the token it sends", (2,),
     "received rank 0's token into the token it was given, the one it sends"),
    (BLOCKING, "a float32 buffer", (2,), "was ended by Gloo in recv from rank"),
    (BLOCKING, "rank and size of the whole world", (2,), "PeerOutsideGroup"),
    (BLOCKING, "isend and irecv", (2,), "exercise 5.3 is the blocking version"),  # no launch
    (BLOCKING, "no case for one process", (1,), "ValueError: Invalid destination rank"),
    (ASYNC, "no case for one process", (1,), "Pair is not connected"),
    (ASYNC, "no wait", (2,), "returned without waiting for its isend to rank 1"),
    (ASYNC, "waits on the isend before starting the irecv", (2,),
     "Waiting on an isend's handle blocks like a send"),
]


# the mistakes that a test of their own below looks at more closely
CLOSER = {(BLOCKING, "every rank sends first"), (BLOCKING, "receives into the token it sends"),
          (BLOCKING, "a float32 buffer"), (BLOCKING, "rank and size of the whole world"),
          (BLOCKING, "no case for one process"), (ASYNC, "no case for one process"),
          (BLOCKING, "isend and irecv"),
          (ASYNC, "waits on the isend before starting the irecv")}


def hint_of(workspace, file: str, mistake: str) -> str:
    """The hint the answer with ``mistake`` gets, launched on the fewest processes that show
    it, after asserting that it names that mistake and no other of ``MISTAKES``."""
    world_sizes, words = next((n, w) for f, m, n, w in MISTAKES if (f, m) == (file, mistake))
    path = workspace.put(answer(file, mistake), file)
    hint = file_hint(CHECKER[file], path, world_sizes=world_sizes)
    assert words in hint, hint
    assert not [w for *_, w in MISTAKES if w != words and w in hint], hint
    return hint


@pytest.mark.slow
@pytest.mark.parametrize("file", [BLOCKING, ASYNC])
def test_the_reference_passes_and_is_recorded(workspace, capsys, file):
    """On 3 processes (an odd ring); the notebook's own checker cell, which nbval runs, checks
    it on 2, 3 and 4."""
    path = workspace.put(reference(file), file)
    CHECKER[file](path, world_sizes=(3,))
    assert capsys.readouterr().out == f"Exercise {CHECKER[file].exercise_id}: correct.\n"
    assert has_passed(CHECKER[file].exercise_id, path)


@pytest.mark.slow
@pytest.mark.parametrize("file, right", [(BLOCKING, "rank 0 first, then each rank in turn"),
                                         (ASYNC, "batch_isend_irecv")])
def test_another_right_answer_passes_too(workspace, capsys, file, right):
    path = workspace.put(answer(file, right), file)
    CHECKER[file](path, world_sizes=(2,))  # the reference runs on 2, 3 and 4 processes
    assert capsys.readouterr().out == f"Exercise {CHECKER[file].exercise_id}: correct.\n"
    assert has_passed(CHECKER[file].exercise_id, path)


def test_the_skeletons_are_not_done_yet_without_a_launch(workspace, capsys):
    for file in (BLOCKING, ASYNC):
        CHECKER[file](workspace.put(skeleton(file), file))
    assert capsys.readouterr().out.count("not done yet") == 2


@pytest.mark.slow
@pytest.mark.parametrize("file, mistake", [(f, m) for f, m, *_ in MISTAKES
                                           if (f, m) not in CLOSER])
def test_a_wrong_answer_gets_the_hint_of_its_mistake_only(workspace, file, mistake):
    hint_of(workspace, file, mistake)


def test_isend_in_the_blocking_exercise_is_seen_in_the_file_without_a_launch(workspace):
    hint = hint_of(workspace, BLOCKING, "isend and irecv")
    assert hint.startswith("pass_token called isend or irecv") and "launched" not in hint


@pytest.mark.slow
def test_every_rank_sending_first_names_the_cycle_of_waits_not_the_order_that_breaks_it(
        workspace):
    hint = hint_of(workspace, BLOCKING, "every rank sends first")
    line = line_of(answer(BLOCKING, "every rank sends first"), "dist.send(")
    assert (f"rank 0 is blocked in send to rank 1 (line {line}), rank 1 in send to rank 0 "
            f"(line {line})") in hint, hint
    assert "every rank sends before any receives" in hint
    for answer_words in ("even rank", "odd rank", "% 2", "receive first", "recv first"):
        assert answer_words not in hint, hint


@pytest.mark.slow
def test_receiving_into_the_token_is_named_not_taken_for_returning_its_own(workspace):
    hint = hint_of(workspace, BLOCKING, "receives into the token it sends")
    assert hint.startswith("on rank 1 pass_token received rank 0's token into the token it "
                           "was given, the one it sends: the caller's own token is "
                           "overwritten"), hint
    assert "own token, not" not in hint and "returned" not in hint


@pytest.mark.slow
@pytest.mark.parametrize("file, function, call", [(BLOCKING, "pass_token", "dist.send("),
                                                 (ASYNC, "pass_token_async", "dist.isend(")])
def test_one_process_says_what_a_rank_alone_does(workspace, file, function, call):
    hint = hint_of(workspace, file, "no case for one process")
    line = line_of(answer(file, "no case for one process"), call)
    assert hint.startswith(f"rank 0, workspace/{file} line {line} in {function}:"), hint
    assert "(case: a float32 token of 3 numbers; launched on 1 process)" in hint
    assert hint.endswith("alone on the ring, a rank gets its own token back, as a copy, "
                         "without any message."), hint
    assert "clone" not in hint


@pytest.mark.slow
def test_a_peer_outside_the_group_given_is_refused_at_once(workspace):
    hint = hint_of(workspace, BLOCKING, "rank and size of the whole world")
    text = answer(BLOCKING, "rank and size of the whole world")
    assert hint.startswith(f"rank 0, workspace/token_ring.py line {line_of(text, 'send(')} "
                           "in pass_token:\n    dist.send(token, dst=right, group=group)\n"
                           "PeerOutsideGroup: rank 0 called send to rank 1, which is not in "
                           "the group passed to the function (ranks [0])"), hint


@pytest.mark.slow
def test_a_receive_buffer_of_the_wrong_dtype_names_the_case(workspace):
    hint = hint_of(workspace, BLOCKING, "a float32 buffer")
    assert "an int64 token" in hint and "must have the token's shape and dtype" in hint
    assert "empty_like" not in hint


@pytest.mark.slow
def test_waiting_on_the_isend_first_names_who_waits_on_whom(workspace):
    hint = hint_of(workspace, ASYNC, "waits on the isend before starting the irecv")
    line = line_of(answer(ASYNC, "waits on the isend before starting the irecv"), "isend(")
    assert (f"rank 0 is blocked waiting for its isend to rank 1 (line {line}), rank 1 waiting "
            f"for its isend to rank 0 (line {line})") in hint, hint


def test_every_edit_of_the_notebooks_answers_still_applies():
    for file, mistakes in WRONG.items():
        for mistake in mistakes:
            assert answer(file, mistake) != reference(file)
