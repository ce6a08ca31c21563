"""Exercise 7.3: the learner's data-parallel step in workspace/my_dp_step.py, launched on 2, 3
and 4 processes and compared with one process stepping on the whole batch. Right answers pass;
each realistic wrong one (an edit of the notebook's answer) gets the hint that names its
mistake and no other."""

import re

import pytest
from answer_edits import edited, reference, skeleton
from check_reports import checked_lines, file_hint
from shared_launch import share_launches

from course_lib.check import nb07
from course_lib.check.cases import dp_step_cases
from course_lib.check.checker import ExerciseError
from course_lib.check.mp import verdict
from course_lib.runtime.launch import launch
from course_lib.runtime.workspace import has_passed

FILE = "my_dp_step.py"
BROADCAST = """    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=0, group=group)  # rank 0 sends, the others receive
"""
SYNC = """    for p in model.parameters():  # after the last micro-batch only: one sync per step
        ring_all_reduce(p.grad, group)  # the sum over the ranks
        p.grad /= world_size  # the mean: what one process with the whole batch gets
"""
SCALED_LOSS = "loss = loss_fn(model, batch) / accum_steps  # K means add up to one mean"
BACKWARD = "        loss.backward()  # adds into .grad, no communication\n"

RIGHT = {
    "one flat buffer, one all-reduce per step": [(SYNC, """\
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])  # every gradient in one buffer
    ring_all_reduce(flat, group)  # one all-reduce per step
    flat /= world_size
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))  # back into each .grad
""")],
    "one flat broadcast, the gradient divided once": [
        (BROADCAST, """\
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    dist.broadcast(flat, src=0, group=group)  # one message for every parameter
    torch.nn.utils.vector_to_parameters(flat, model.parameters())
"""),
        (SCALED_LOSS, "loss = loss_fn(model, batch)  # divided once, after the ring"),
        ("p.grad /= world_size  #", "p.grad /= world_size * accum_steps  #")],
}

# mistake: (its edits, the world sizes that show it (none: refused before a launch), words
# only its hint holds)
MISTAKES = {
    "the ring's sum, not divided by the world size": (
        [("        p.grad /= world_size  # the mean: what one process with the whole batch "
          "gets\n", "")],
        (2,), "the gradient is 2 times too large: not divided by the world size"),
    "each micro-batch's loss not divided by K": (
        [(SCALED_LOSS, "loss = loss_fn(model, batch)")],
        (2,), "the gradient is 3 times too large: each micro-batch's loss is a mean"),
    "a sync after every micro-batch": (
        [(BACKWARD + SYNC, BACKWARD + """\
        for p in model.parameters():  # keep every rank's .grad averaged as it grows
            ring_all_reduce(p.grad, group)
            p.grad /= world_size
""")],
        (2,), "ring_all_reduce ran after micro-batch 1 of 3"),
    "no broadcast": (
        [(BROADCAST, "    pass  # every rank builds the same model anyway\n")],
        (2,), "still has its own starting weights: here every rank builds its model"),
    "rank 0 skips the broadcast": (
        [(BROADCAST, "    if dist.get_rank(group) == 0:\n"
                     "        return  # rank 0 holds rank 0's weights already\n" + BROADCAST)],
        (2,), "for rank 0, which never called it"),
    "the gradients never zeroed": (
        [("    optimizer.zero_grad()\n", "")],
        (2,), "step 2 used the gradients of step 1 as well"),
    "torch's all_reduce": (
        [("ring_all_reduce(p.grad, group)", "dist.all_reduce(p.grad, group=group)")],
        (), "averaged with torch's all_reduce"),
    "the library's broadcast": (
        [("from course_lib.runtime", "from course_lib.core.data_parallel import "
                                     "broadcast_parameters  # noqa: F401\nfrom course_lib.runtime"),
         ('def broadcast_parameters(model, group=None):\n    """Give every rank rank 0\'s '
          'parameters, in place."""\n' + BROADCAST, "")],
        (), "broadcast_parameters is the library's own"),
    "the library's wrapper": (
        [("from course_lib.runtime", "from course_lib.core.data_parallel import "
                                     "AllReducePerParameter\nfrom course_lib.runtime"),
         ("    optimizer.zero_grad()\n", "    wrapped = AllReducePerParameter(model, group)\n"
                                          "    optimizer.zero_grad()\n"),
         (SYNC, "    wrapped.finish_gradient_sync()\n")],
        (), "uses the library's AllReducePerParameter"),
}


def line_of(text: str, words: str) -> int:
    return next(i for i, line in enumerate(text.split("\n"), 1) if words in line)


def hint_of(workspace, mistake: str) -> str:
    """The hint the answer with ``mistake`` gets, on the fewest processes that show it, after
    asserting that it names that mistake and no other of ``MISTAKES``, in a short report."""
    edits, world_sizes, words = MISTAKES[mistake]
    path = workspace.put(edited(reference(FILE), edits), FILE)
    hint = file_hint(nb07.my_dp_step, path, world_sizes=world_sizes)
    shown = ExerciseError(hint)
    shown.exercise_id = "7.3"
    checked_lines(shown, nb07, dp_step_cases, verdict)  # short, no line of checker code
    assert words in hint, hint
    assert not [w for m, (*_, w) in MISTAKES.items() if m != mistake and w in hint], hint
    return hint


@pytest.fixture(scope="module")
def shared_launches():
    """One launch per world size for the answers that run to the end (shared_launch.py)."""
    text = reference(FILE)
    answers = [(text, 3), (edited(text, RIGHT["one flat buffer, one all-reduce per step"]), 3),
               (edited(text, RIGHT["one flat broadcast, the gradient divided once"]), 2)]
    answers += [(edited(text, MISTAKES[name][0]), 2) for name in (
        "the ring's sum, not divided by the world size", "each micro-batch's loss not divided "
        "by K", "a sync after every micro-batch", "no broadcast", "the gradients never zeroed")]
    share_launches(nb07.DP_STEP_CASES, FILE, answers)


@pytest.mark.slow
@pytest.mark.usefixtures("shared_launches")
def test_the_reference_passes_and_is_recorded(workspace, capsys):
    """On 3 processes (an odd ring); the notebook's own checker cell, which nbval runs, checks
    it on 2, 3 and 4."""
    path = workspace.put(reference(FILE), FILE)
    nb07.my_dp_step(path, world_sizes=(3,))
    assert capsys.readouterr().out == "Exercise 7.3: correct.\n"
    assert has_passed("7.3", path)


@pytest.mark.slow
@pytest.mark.usefixtures("shared_launches")
@pytest.mark.parametrize("right, world_sizes", [
    ("one flat buffer, one all-reduce per step", (3,)),  # N = K = 3
    ("one flat broadcast, the gradient divided once", (2,))])
def test_another_right_answer_passes_too(workspace, capsys, right, world_sizes):
    path = workspace.put(edited(reference(FILE), RIGHT[right]), FILE)
    nb07.my_dp_step(path, world_sizes=world_sizes)
    assert capsys.readouterr().out == "Exercise 7.3: correct.\n"
    assert has_passed("7.3", path)


def test_the_skeleton_is_not_done_yet_without_a_launch(workspace, capsys):
    nb07.my_dp_step(workspace.put(skeleton(FILE), FILE))
    assert "Exercise 7.3: not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", [m for m, (_, sizes, _) in MISTAKES.items() if not sizes])
def test_the_library_or_torchs_all_reduce_is_refused_before_a_launch(workspace, mistake):
    hint_of(workspace, mistake)


@pytest.mark.slow
@pytest.mark.usefixtures("shared_launches")
@pytest.mark.parametrize("mistake", [m for m, (_, sizes, _) in MISTAKES.items()
                                     if sizes and m != "rank 0 skips the broadcast"])
def test_a_wrong_answer_gets_the_hint_of_its_mistake_only(workspace, mistake):
    assert "launched on 2 processes" in hint_of(workspace, mistake)


@pytest.mark.slow
def test_rank_0_skipping_the_broadcast_is_blamed_on_the_broadcast_not_the_ring(workspace):
    hint = hint_of(workspace, "rank 0 skips the broadcast")
    text = edited(reference(FILE), MISTAKES["rank 0 skips the broadcast"][0])
    line = line_of(text, "dist.broadcast(")
    assert f"rank 1 waits in broadcast (line {line}) for rank 0, which never called it" in hint
    ring = line_of(text, "ring_all_reduce(p.grad")
    assert re.search(f"rank 0 is blocked [^;.]* rank 1 \\(line {ring}\\)", hint), hint
    for wrong_cause in ("did not pair up", "ring_all_reduce on the same gradients"):
        assert wrong_cause not in hint, hint


@pytest.mark.slow
def test_the_file_runs_unchanged_under_torchrun(workspace):
    """Its ``__main__`` block on 2 processes (``launch`` runs torchrun's agent, forked from a
    process that imported torch once)."""
    out = launch(workspace.put(reference(FILE), FILE), nproc=2, timeout_s=120,
                 quiet=True).output
    found = dict(re.findall(r"rank (\d): weights after one step sum to (-?[\d.]+)",
                            out))  # the ranks' lines may interleave
    assert sorted(found) == ["0", "1"], out
    assert len(set(found.values())) == 1, out  # the replicas agree
