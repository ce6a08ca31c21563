"""Exercise 9.3: the learner's DDP training script in workspace/my_ddp_train.py, its
train(config) launched on 2, 3 and 4 processes and compared with one process on the whole
batches. Right answers pass; each realistic wrong one (an edit of the notebook's answer) gets
the hint that names its mistake and no other."""

import pytest
from answer_edits import edited, reference, skeleton
from check_reports import checked_lines, file_hint

from course_lib.check import nb09
from course_lib.check.cases import ddp_script_cases
from course_lib.check.checker import ExerciseError
from course_lib.check.mp import verdict
from course_lib.runtime.workspace import has_passed

FILE = "my_ddp_train.py"
MICRO_STEP = """\
            with contextlib.nullcontext() if last else model.no_sync():  # forward AND backward
                loss = F.cross_entropy(model(x.to(device)), y.to(device)) / config.accum_steps
                loss.backward()  # k scaled means add up to the mean over the step's examples
"""
LOGGED = """\
                dist.all_reduce(step_loss)  # the sum of every rank's mean
                losses.append(step_loss.item() / world_size)  # the mean over the global batch
"""
SAVE = """\
    if rank == 0:
        torch.save(model.module.state_dict(), config.checkpoint)  # one writer: rank 0
"""

RIGHT = {
    "if/else around the micro-step": [(MICRO_STEP, """\
            if last:  # this backward synchronises
                loss = F.cross_entropy(model(x.to(device)), y.to(device)) / config.accum_steps
                loss.backward()
            else:
                with model.no_sync():  # forward AND backward without talking
                    loss = F.cross_entropy(model(x.to(device)), y.to(device)) / config.accum_steps
                    loss.backward()
""")],
    "every step's loss all-reduced at once, at the end": [
        (LOGGED, "                losses.append(step_loss)  # this rank's share, summed below\n"),
        (SAVE, """\
    shares = torch.stack(losses)  # one all-reduce for every step's loss
    dist.all_reduce(shares)
    losses = (shares / world_size).tolist()
""" + SAVE)],
}

# mistake: (its edits, the world sizes that show it (none: refused before a launch), words
# only its hint holds)
MISTAKES = {
    "no set_epoch": (
        [("        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every "
          "rank\n", "")],
        (2,), "every epoch saw its examples in the same order"),
    "no_sync around the backward only": (
        [(MICRO_STEP, """\
            loss = F.cross_entropy(model(x.to(device)), y.to(device)) / config.accum_steps
            with contextlib.nullcontext() if last else model.no_sync():  # backward only
                loss.backward()
""")],
        (2,), "no_sync() wraps the backward only"),
    "each rank logs its own loss": (
        [(LOGGED, "                losses.append(step_loss.item())\n")],
        (2,), "rank 0 and rank 1 logged different losses"),
    "every rank saves": (
        [(SAVE, "    torch.save(model.module.state_dict(), config.checkpoint)\n")],
        (2,), "rank 1 wrote the checkpoint too"),
    "the wrapper's state_dict": (
        [("torch.save(model.module.state_dict()", "torch.save(model.state_dict()")],
        (2,), "the checkpoint's names start with 'module.'"),
    "the loss not divided by the micro-steps": (
        [(") / config.accum_steps", ")")],
        (2,), "each step's gradient is accum_steps times too large"),
    "the group started inside train": (
        [("    rank, world_size, device = dist.get_rank()",
          '    dist.init_process_group("gloo")\n    rank, world_size, device = dist.get_rank()')],
        (2,), "starting one inside train fails"),
    "main never ends the group": (
        [("    dist.destroy_process_group()\n", "")],
        (), "main() does not end the process group"),
}


def hint_of(workspace, mistake: str) -> str:
    """The hint the answer with ``mistake`` gets, on the fewest processes that show it, after
    asserting that it names that mistake and no other of ``MISTAKES``, in a short report."""
    edits, world_sizes, words = MISTAKES[mistake]
    path = workspace.put(edited(reference(FILE), edits), FILE)
    hint = file_hint(nb09.my_ddp_train, path, world_sizes=world_sizes)
    shown = ExerciseError(hint)
    shown.exercise_id = "9.3"
    checked_lines(shown, nb09, ddp_script_cases, verdict)  # short, no line of checker code
    assert words in hint, hint
    assert not [w for m, (*_, w) in MISTAKES.items() if m != mistake and w in hint], hint
    return hint


@pytest.mark.slow
def test_the_reference_passes_and_is_recorded(workspace, capsys):
    """On 3 processes (an odd ring); the notebook's own checker cell, which nbval runs, checks
    it on 2, 3 and 4."""
    path = workspace.put(reference(FILE), FILE)
    nb09.my_ddp_train(path, world_sizes=(3,))
    assert capsys.readouterr().out == "Exercise 9.3: correct.\n"
    assert has_passed("9.3", path)


@pytest.mark.slow
@pytest.mark.parametrize("right, world_sizes", [
    ("if/else around the micro-step", (3,)),
    ("every step's loss all-reduced at once, at the end", (2,))])
def test_another_right_answer_passes_too(workspace, capsys, right, world_sizes):
    path = workspace.put(edited(reference(FILE), RIGHT[right]), FILE)
    nb09.my_ddp_train(path, world_sizes=world_sizes)
    assert capsys.readouterr().out == "Exercise 9.3: correct.\n"
    assert has_passed("9.3", path)


def test_the_skeleton_is_not_done_yet_without_a_launch(workspace, capsys):
    nb09.my_ddp_train(workspace.put(skeleton(FILE), FILE))
    assert "Exercise 9.3: not done yet" in capsys.readouterr().out


def test_main_is_read_before_any_launch(workspace):
    hint = hint_of(workspace, "main never ends the group")
    assert "launched" not in hint, hint


@pytest.mark.slow
@pytest.mark.parametrize("mistake", [m for m, (_, sizes, _) in MISTAKES.items()
                                     if sizes and m != "the group started inside train"])
def test_a_wrong_answer_gets_the_hint_of_its_mistake_only(workspace, mistake):
    assert "launched on 2 processes" in hint_of(workspace, mistake)


@pytest.mark.slow
def test_starting_the_group_inside_train_shows_the_line_and_says_whose_job_it_is(workspace):
    hint = hint_of(workspace, "the group started inside train")
    text = edited(reference(FILE), MISTAKES["the group started inside train"][0])
    line = next(i for i, row in enumerate(text.split("\n"), 1) if "init_process_group" in row)
    assert f'line {line} in train:\n    dist.init_process_group("gloo")' in hint, hint
    assert "that is main()'s job" in hint
