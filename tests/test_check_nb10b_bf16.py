"""Exercise 10.5: a torch DDP communication hook that all-reduces in bf16
(workspace/my_bf16_hook.py), launched on several processes under DistributedDataParallel. The
reference is the notebook's own file; other right answers pass too, and each wrong answer, an
edit of the reference launched on 2 processes (3 where the mistake needs a group that is not
the world), gets the hint that names its mistake and no other."""

import re

import pytest
from answer_edits import edited, reference, skeleton
from check_reports import assert_correct, assert_names_its_mistake, file_hint, wrong_file_hint

from course_lib.check import nb10b
from course_lib.check.cases import bf16_hook_cases
from course_lib.runtime.launch import launch
from course_lib.runtime.workspace import has_passed

pytestmark = pytest.mark.slow

HOOK = reference("my_bf16_hook.py")
GROUP = "    group = process_group if process_group is not None else dist.group.WORLD\n"
MESSAGE = "message = buffer.to(torch.bfloat16).div_(group.size())"
REDUCE = "    future = dist.all_reduce(message, group=group, async_op=True).get_future()\n"
BACK = """    def back_to_float32(done):
        buffer.copy_(done.value()[0])  # the bf16 sum, in place, as float32 from here on
        return buffer

    return future.then(back_to_float32)  # runs once the all-reduce has finished
"""

RIGHT = {  # other ways to write it: each passes
    "divided after the sum, in float32, a new tensor": [
        (MESSAGE, "message = buffer.to(torch.bfloat16)"),
        (BACK, "    return future.then(lambda done: done.value()[0].float() / group.size())\n")],
    "all-reduced at once, a future completed by hand": [
        (REDUCE + "\n" + BACK, "    dist.all_reduce(message, group=group)  # waits here\n"
                               "    result = torch.futures.Future()\n"
                               "    result.set_result(message.to(buffer.dtype))\n"
                               "    return result\n")],
}
MISTAKES = {  # name: (the edits, what the hint says, world size)
    "no average": ([(MESSAGE, "message = buffer.to(torch.bfloat16)")],
                   "the gradients are the SUM over the ranks", 2),
    "float32 sent": ([(MESSAGE, "message = buffer / group.size()")],
                     "your hook all-reduces float32", 2),
    "float16 sent": ([(MESSAGE, "message = buffer.to(torch.float16).div_(group.size())")],
                     "your hook sends float16", 2),
    "the world's size": ([(MESSAGE, "message = buffer.to(torch.bfloat16).div_("
                                    "dist.get_world_size())")],
                         "divided by 3, the size of the whole world", 3),
    "the all-reduce on the whole world": ([(REDUCE, "    future = dist.all_reduce(message, "
                                                    "async_op=True).get_future()\n")],
                                          "called all_reduce on the whole world, ranks", 3),
    "the all-reduce's own future": ([(BACK, "    return future\n")],
                                    "holds a list (what an all-reduce's own future holds)", 2),
    "the handle, not a future": ([(REDUCE + "\n" + BACK,
                                   "    return dist.all_reduce(message, group=group, "
                                   "async_op=True)\n")],
                                 "returned the all-reduce's handle (a Work)", 2),
    "never all-reduced": ([(REDUCE + "\n" + BACK, "    result = torch.futures.Future()\n"
                                                  "    result.set_result(buffer)\n"
                                                  "    return result\n")],
                          "handed nothing to an all-reduce", 2),
    "process_group used as it comes": ([(GROUP, "    group = process_group\n")],
                                       "DDP hands the hook process_group=None", 2),
}
MARKS = ("the SUM", "all-reduces float32", "sends float16", "size of the whole world",
         "on the whole world, ranks", "holds a list", "(a Work)", "handed nothing",
         "process_group=None", "differs from the mean")


def test_the_reference_passes_and_is_recorded(workspace, capsys):
    """On 3 processes (a group of 2 among them); nbval runs it on 2, 3 and 4."""
    path = workspace.put(HOOK, "my_bf16_hook.py")
    assert_correct(nb10b.my_bf16_hook, path, capsys, world_sizes=(3,))
    assert has_passed("10.5", path)


@pytest.mark.parametrize("name", RIGHT)
def test_other_right_hooks_pass(workspace, capsys, name):
    path = workspace.put(edited(HOOK, RIGHT[name]), "my_bf16_hook.py")
    assert_correct(nb10b.my_bf16_hook, path, capsys, world_sizes=(2,))


@pytest.mark.parametrize("name", MISTAKES)
def test_a_wrong_hook_gets_the_hint_that_names_its_mistake(workspace, name):
    edits, words, n = MISTAKES[name]
    path = workspace.put(edited(HOOK, edits), "my_bf16_hook.py")
    hint = wrong_file_hint(nb10b.my_bf16_hook, path, n, nb10b, bf16_hook_cases)
    assert_names_its_mistake(hint, words, MARKS, n)


@pytest.mark.parametrize("imported, words", [
    ("from course_lib.core.compress import bf16_comm_hook", "the course's bf16_comm_hook"),
    ("from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook",
     "torch's bf16_compress_hook")])
def test_a_library_hook_is_not_an_answer(workspace, imported, words):
    """Refused before any launch: the library's hook is the answer itself."""
    text = edited(HOOK, [("import torch.distributed as dist\n",
                          f"import torch.distributed as dist\n{imported}\n")])
    hint = file_hint(nb10b.my_bf16_hook, workspace.put(text, "my_bf16_hook.py"))
    assert words in hint and "write it with dist.all_reduce" in hint, hint


def test_the_tolerance_tells_the_mean_from_the_mistakes():
    """bf16's bound holds the mean of bf16 messages and none of the mistakes' values."""
    import torch

    g = torch.Generator().manual_seed(0)
    local = torch.randn(4, 500, generator=g) * torch.logspace(-6, 5, 500)  # (ranks, values)
    mean, size, n = local.mean(0), local.abs().sum(0) / 4, 4
    messages = (local / n).to(torch.bfloat16)
    total = messages[0]
    for m in messages[1:]:
        total = total + m  # rounded in bf16 at every addition, as Gloo adds
    assert nb10b.bf16_close(total.float(), mean, size, n)
    assert not nb10b.bf16_close(total.float() * n, mean, size, n)  # the sum
    assert not nb10b.bf16_close(total.float() * n / 5, mean, size, n)  # by a world of 5
    assert not nb10b.bf16_close(local[0] / n, mean, size, n)  # its own gradient


def test_the_skeleton_is_not_done_yet(workspace, capsys):
    nb10b.my_bf16_hook(workspace.put(skeleton("my_bf16_hook.py"), "my_bf16_hook.py"))
    assert "Exercise 10.5: not done yet" in capsys.readouterr().out


def test_the_file_runs_unchanged_under_torchrun(workspace):
    out = launch(workspace.put(HOOK, "my_bf16_hook.py"), nproc=2, timeout_s=120,
                 quiet=True).output
    errors = re.findall(r"rank \d: \.grad is torch\.float32; bf16's largest error, relative "
                        r"to the largest gradient: ([0-9.e+-]+)", out)
    assert len(errors) == 2, out
    assert all(0 < float(e) <= 2 * 2 ** -8 for e in errors), errors  # rounded, within bf16's
