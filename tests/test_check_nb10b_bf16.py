"""Exercise 10.5: a torch DDP communication hook that all-reduces in bf16
(workspace/my_bf16_hook.py), launched on several processes under DistributedDataParallel. The
reference is the notebook's own file; other right answers pass too, and each wrong answer, an
edit of the reference launched on 2 processes (3 where the mistake needs a group that is not
the world), gets the hint that names its mistake and no other."""

import re

import pytest
from answer_edits import edited, reference, skeleton
from check_reports import assert_correct, assert_names_its_mistake, file_hint, wrong_file_hint
from shared_launch import share_launches

from course_lib.check import nb10b
from course_lib.check.cases import bf16_hook_cases
from course_lib.check.checker import ExerciseError
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
    "no async_op": ([(REDUCE, "    future = dist.all_reduce(message, group=group)"
                              ".get_future()\n")],
                    "returns None unless it is called with async_op=True", 2),
    "one all-reduce per parameter": (
        [(REDUCE + "\n" + BACK,
          "    parts = [g.to(torch.bfloat16).div_(group.size()) for g in bucket.gradients()]\n"
          "    futures = [dist.all_reduce(p, group=group, async_op=True).get_future()\n"
          "               for p in parts]\n"
          "    return torch.futures.collect_all(futures).then(lambda done: torch.cat(\n"
          "        [f.value()[0].float().reshape(-1) for f in done.value()]))\n")],
        "one per parameter", 2),
    "the group's size by a message": (
        [(GROUP, GROUP + "    count = torch.ones(1)\n"
                         "    dist.all_reduce(count, group=group)  # how many ranks take part\n"),
         (MESSAGE, "message = buffer.to(torch.bfloat16)"),
         (BACK, "    return future.then(lambda done: done.value()[0].float() / count)\n")],
        "a float32 tensor of 1 value and a bfloat16 tensor", 2),  # mark: "tensor of 1 value"
}
MARKS = ("the SUM", "all-reduces float32", "sends float16", "size of the whole world",
         "on the whole world, ranks", "holds a list", "(a Work)", "handed nothing",
         "process_group=None", "unless it is called with async_op", "one per parameter",
         "tensor of 1 value", "once more", "get_tensor()", "differs from the mean")


SHARED = ("no average", "float32 sent", "float16 sent", "never all-reduced",
          "one all-reduce per parameter", "the group's size by a message", "the world's size")


@pytest.fixture(scope="module", autouse=True)
def shared_launches():
    """One launch per world size for the answers that run to the end (shared_launch.py)."""
    answers = [(HOOK, 3), *((edited(HOOK, edits), 2) for edits in RIGHT.values())]
    answers += [(edited(HOOK, MISTAKES[name][0]), MISTAKES[name][2]) for name in SHARED]
    share_launches(nb10b.BF16_HOOK_CASES, "my_bf16_hook.py", answers)


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


def test_a_mean_divided_twice_is_named():
    """Judged from the values alone (no launch): the ranks' .grad is the mean / n."""
    local = [[1.0, -2.0, 0.5], [3.0, 0.0, 0.25]]  # two ranks' own gradients
    mean = [(a + b) / 2 for a, b in zip(*local, strict=True)]
    by_rank = {r: {"passes": [{"local": local[r], "grad": [m / 2 for m in mean]}]}
               for r in range(2)}
    with pytest.raises(ExerciseError, match="the mean divided by 2 once more"):
        nb10b.judge_pass(by_rank, 2, 2, 0)
    for r in range(2):
        by_rank[r]["passes"][0]["grad"] = mean
    nb10b.judge_pass(by_rank, 2, 2, 0)  # the mean itself passes


@pytest.mark.parametrize("message, source, words", [
    ("'GradBucket' object has no attribute 'get_tensor'", "buffer = bucket.get_tensor()",
     "older torch called it get_tensor()"),
    ("completed() INTERNAL ASSERT FAILED at ...", "mean = future.value()[0] / n",
     "read before the all-reduce had finished"),
    ("'NoneType' object has no attribute 'size'", "n = process_group.size()",
     "process_group=None"),
    ("'NoneType' object has no attribute 'get_future'",
     "f = dist.all_reduce(m, group=group).get_future()", "async_op=True")])
def test_the_errors_a_hook_meets_first_are_explained(message, source, words):
    explained = nb10b.explain_bf16_error({"message": message, "source": source}, "")
    assert words in explained, explained
    assert nb10b.explain_bf16_error({"message": "other", "source": source}, "") is None


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
