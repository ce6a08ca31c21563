"""Exercise 10.4: the learner's ZeRO-1 step in workspace/my_zero.py, launched on several
processes and compared with plain data parallelism (SGD with momentum, AdamW). The reference is
the notebook's own file; other right answers pass too, and each wrong answer, an edit of the
reference launched on 2 processes, gets the hint that names its mistake and no other."""

import re

import pytest
from answer_edits import edited, reference, skeleton
from check_reports import checked_lines, file_hint
from shared_launch import share_launches

from course_lib.check import nb10
from course_lib.check.cases import zero_cases
from course_lib.check.checker import ExerciseError
from course_lib.runtime.launch import launch
from course_lib.runtime.workspace import has_passed

pytestmark = pytest.mark.slow

REFERENCE = reference("my_zero.py")
IMPORTS = "chunk_bounds, ring_all_gather, ring_reduce_scatter"
SHARD = "torch.nn.Parameter(flat_params[start:end])"
CHUNK = "    start, end = chunk_bounds(flat_params.numel(), n)[rank]"
MY_CHUNK = CHUNK + "  # my chunk, cut as the ring cuts\n"  # in make_shard_optimizer
ITS_CHUNK = CHUNK + "\n"  # in zero1_step
REDUCE_SCATTER = "ring_reduce_scatter(flat_grad, group)"
MEAN = "shard.grad = flat_grad[start:end] / n"
STEP = "    optimizer.step()  # updates my chunk of flat_params, in place\n"
ALL_GATHER = "    ring_all_gather(flat_params, group)  # every chunk from its owner, to every " \
             "rank\n"
FLOOR = "    size = flat_params.numel() // n  # values per rank\n" \
        "    start, end = rank * size, (rank + 1) * size\n"

LARGER_LAST = '''

def my_bounds(numel, n):
    """Contiguous chunks, the larger ones last."""
    base, extra = divmod(numel, n)
    sizes = [base + (1 if r >= n - extra else 0) for r in range(n)]
    return [(sum(sizes[:r]), sum(sizes[:r + 1])) for r in range(n)]
'''
RIGHT = {  # other ways to write it: each passes
    "a copy of the chunk, copied back": [
        (SHARD, "torch.nn.Parameter(flat_params[start:end].clone())  # a copy"),
        (STEP, "    optimizer.step()  # updates the copy\n"
               "    flat_params[start:end] = shard.detach()  # my new values, in flat_params\n")],
    "the larger chunks last, summed with reduce, shared with broadcast": [
        (IMPORTS + "\n", IMPORTS + "\n" + LARGER_LAST),
        (MY_CHUNK, "    start, end = my_bounds(flat_params.numel(), n)[rank]  # my chunk\n"),
        (ITS_CHUNK, "    start, end = my_bounds(flat_params.numel(), n)[rank]\n"),
        ("    " + REDUCE_SCATTER + "  # my chunk of flat_grad now holds the sum over ranks\n",
         "    for owner, (a, b) in enumerate(my_bounds(flat_params.numel(), n)):\n"
         "        if b > a:  # the sum of each chunk, on its owner\n"
         "            dist.reduce(flat_grad[a:b], group=group, group_dst=owner)\n"),
        (ALL_GATHER, "    for owner, (a, b) in enumerate(my_bounds(flat_params.numel(), n)):\n"
                     "        if b > a:  # each chunk from its owner, to every rank\n"
                     "            dist.broadcast(flat_params[a:b], group=group,\n"
                     "                           group_src=owner)\n")],
}
MISTAKES = {  # name: (the edits, what the hint says)
    "no average": ([(MEAN, "shard.grad = flat_grad[start:end]")],
                   "the step used the SUM of the ranks' gradients"),
    "no all-gather": ([(ALL_GATHER, "")],
                      "after step 1, rank 0's own chunk is updated but the other values are "
                      "still the old ones"),
    "a copy of the chunk": ([(SHARD, "torch.nn.Parameter(flat_params[start:end].clone())")],
                            "after step 1, rank 0's flat_params did not change, yet its optimizer "
                            "updated the tensor it holds: that tensor is a copy of the chunk"),
    "chunks of numel // N": ([(MY_CHUNK, FLOOR), (ITS_CHUNK, FLOOR)],
                             "no rank's optimizer holds value 22 of the 23: no rank updates it; "
                             "and rank 0's optimizer works on values 0..11 (end excluded), but "
                             "ring_reduce_scatter leaves rank 0 the sum of 0..12"),
    "the whole model": ([(SHARD, "torch.nn.Parameter(flat_params)"),
                         (IMPORTS, "chunk_bounds, ring_all_reduce"),
                         (REDUCE_SCATTER, "ring_all_reduce(flat_grad, group)"),
                         (MEAN, "shard.grad = flat_grad / n"), (ALL_GATHER, "")],
                        "rank 0's optimizer holds all 23 values"),
    "an all-reduce": ([(IMPORTS, "chunk_bounds, ring_all_gather, ring_all_reduce"),
                       (REDUCE_SCATTER, "ring_all_reduce(flat_grad, group)")],
                      "zero1_step all-reduces: every rank gets the sum of every value"),
}
MARKS = ("the SUM of the ranks'", "the other values are still the old ones", "a copy of the chunk",
         "no rank's optimizer holds", "holds all", "all-reduces", "did not change at all")


@pytest.fixture(scope="module", autouse=True)
def shared_launches():
    """One launch per world size for the answers that run to the end (shared_launch.py)."""
    answers = [(REFERENCE, 4), *((edited(REFERENCE, edits), 2) for edits in RIGHT.values())]
    answers += [(edited(REFERENCE, edits), 2) for edits, _ in MISTAKES.values()]
    share_launches(nb10.ZERO_CASES, "my_zero.py", answers)


def test_the_reference_passes_and_is_recorded(workspace, capsys):
    """On 4 processes (an empty chunk in the case of 3 values); the notebook's own run, which
    nbval repeats, checks it on 2, 3 and 4."""
    path = workspace.put(REFERENCE, "my_zero.py")
    nb10.my_zero(path, world_sizes=(4,))
    assert capsys.readouterr().out == "Exercise 10.4: correct.\n"
    assert has_passed("10.4", path)


@pytest.mark.parametrize("name", RIGHT)
def test_other_right_answers_pass(workspace, capsys, name):
    path = workspace.put(edited(REFERENCE, RIGHT[name]), "my_zero.py")
    nb10.my_zero(path, world_sizes=(2,))  # 23 values: chunks of 11 and 12, or 12 and 11
    assert capsys.readouterr().out == "Exercise 10.4: correct.\n"


def test_the_skeleton_is_not_done_yet(workspace, capsys):
    nb10.my_zero(workspace.put(skeleton("my_zero.py"), "my_zero.py"))
    assert "Exercise 10.4: not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("name", MISTAKES)
def test_a_wrong_answer_gets_the_hint_that_names_its_mistake(workspace, name):
    edits, words = MISTAKES[name]
    hint = file_hint(nb10.my_zero, workspace.put(edited(REFERENCE, edits), "my_zero.py"),
                     world_sizes=(2,))
    checked_lines(ExerciseError(hint), nb10, zero_cases)  # short, no checker code
    assert words in hint, hint
    assert "(case: 23 values, SGD with momentum; launched on 2 processes)" in hint
    named = [mark for mark in MARKS if mark in hint]
    assert named == [next(mark for mark in MARKS if mark in words)], named  # no other mistake


def test_the_reference_of_the_sum_differs_from_that_of_the_mean():
    spec = zero_cases.case_specs(3, {})[1]
    assert spec["optimizer"] == "AdamW"
    assert zero_cases.reference(spec, 3, grad_scale=3) != zero_cases.reference(spec, 3)


def test_the_file_runs_unchanged_under_torchrun(workspace):
    """Its ``__main__`` block on 3 processes: ``launch`` runs torchrun's agent, forked from a
    process that imported torch once (test_check_workspace.py runs a file under a plain
    ``python -m torch.distributed.run``)."""
    out = launch(workspace.put(REFERENCE, "my_zero.py"), nproc=3, timeout_s=120,
                 quiet=True).output
    found = re.findall(r"rank (\d): params\[:3\] = (\[[^\]]*\]), optimizer state: (\d+) "
                       "numbers", out)  # the ranks' lines may interleave
    found = sorted(found)
    assert [state for _, _, state in found] == ["8", "6", "6"], out  # 10 values:
    # chunks of 4, 3 and 3, AdamW keeps 2 numbers per value
    assert len({params for _, params, _ in found}) == 1, out  # the replicas agree
