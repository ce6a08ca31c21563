"""Exercise 8.3: the learner's gradient hooks in workspace/my_hooks.py, launched on 2, 3 and 4
processes and compared with the mean of the ranks' gradients (what DDP leaves in .grad). The
reference is the notebook's own file; other right answers pass too, and each wrong answer, an
edit of the reference, gets the hint that names its mistake and no other."""

import pytest
from answer_edits import edited, reference, skeleton
from check_reports import checked_lines, file_hint
from shared_launch import share_launches

from course_lib.check import nb08
from course_lib.check.cases import hook_cases
from course_lib.check.checker import ExerciseError
from course_lib.check.mp import harness, verdict
from course_lib.runtime.workspace import has_passed

pytestmark = pytest.mark.slow

REFERENCE = reference("my_hooks.py")
LAUNCH = ("            handle = dist.all_reduce(self.flat[b], group=self.group, async_op=True)"
          "  # no wait\n")
FULL = "        if self.arrived[b] == len(self.buckets[b]):  # the bucket is full: send it now\n"
HOOK_SENDS = FULL + LAUNCH + "            self.handles.append((b, handle))\n"
WAIT = "            handle.wait()  # the bucket holds the sum over the ranks only from here on\n"
DIVIDE = "            self.flat[b].div_(self.world_size)  # the sum / N: the mean\n"
RESET = "        self.handles, self.arrived = [], [0] * len(self.buckets)"
EACH_HANDLE = "        for b, handle in self.handles:\n"
SEND_ALL = ("        for b, flat in enumerate(self.flat):  # backward is over: send every bucket\n"
            "            self.handles.append((b, dist.all_reduce(flat, group=self.group, "
            "async_op=True)))\n")
BLOCKING_SUM = "            dist.all_reduce(self.flat[b], group=self.group)  # the sum, now\n"

RIGHT = {  # other ways to write it: each passes
    "divide before the sum, wait in reverse order": [
        ("copy_(param.grad.reshape(-1))", "copy_(param.grad.reshape(-1) / self.world_size)"),
        (DIVIDE, ""),
        (EACH_HANDLE, "        for b, handle in reversed(self.handles):  # any order will do\n")],
    "a set of missing gradients per bucket, every wait first": [
        ("        self.arrived = [0] * len(self.buckets)  # gradients copied into each bucket",
         "        self.missing = [set(bucket) for bucket in self.buckets]  # gradients to come"),
        ("        self.arrived[b] += 1\n" + FULL,
         "        self.missing[b].discard(param)\n        if not self.missing[b]:\n"),
        (EACH_HANDLE + WAIT, "        for _, handle in self.handles:\n            handle.wait()\n"
                             "        for b, _ in self.handles:\n"),
        (RESET, "        self.handles, self.missing = [], [set(b) for b in self.buckets]")],
}
MISTAKES = {  # name: (the edits, the world sizes that show it)
    "no wait": ([(WAIT, "")], (2,)),
    "read early": ([(WAIT, ""), (RESET, "        for _, handle in self.handles:\n"
                                        "            handle.wait()\n" + RESET)], (2,)),
    "no divide": ([(DIVIDE, "")], (2,)),
    "after backward": ([(HOOK_SENDS, ""), (EACH_HANDLE, SEND_ALL + EACH_HANDLE)], (2,)),
    "blocking in the hook": ([("group=self.group, async_op=True)", "group=self.group)"),
                              (WAIT, "")], (2,)),
    "blocking, waits on None": ([("group=self.group, async_op=True)", "group=self.group)")],
                                (2,)),
    "blocking in finish": ([(HOOK_SENDS, ""),
                            (EACH_HANDLE + WAIT, "        for b in range(len(self.buckets)):\n"
                                                 + BLOCKING_SUM)], (2,)),
    "all-reduced twice": ([(WAIT, BLOCKING_SUM)], (2,)),
    "no reset": ([(RESET, "        self.handles = []")], (2,)),
    "wait in the hook": ([(LAUNCH, LAUNCH.replace("  # no wait", "")
                           + "            handle.wait()  # right here, in the hook\n")], (2,)),
    "the world's size": ([("dist.get_world_size(group)", "dist.get_world_size()")], (3,)),
}


def line_of(text: str, piece: str) -> int:
    """The number of the line of ``text`` that holds ``piece`` (the only one)."""
    lines = [i for i, line in enumerate(text.split("\n"), 1) if piece in line]
    assert len(lines) == 1, piece
    return lines[0]


WORDS = {  # what the hint of each mistake says, for the file's text t
    "no wait": lambda t: f"never waited on the all-reduce started at line "
                         f"{line_of(t, 'async_op=True')}",
    "read early": lambda t: "a bucket was read before its all-reduce had finished",
    "no divide": lambda t: "the gradients are the SUM over the ranks",
    "after backward": lambda t: f"no overlap: no all-reduce started while backward ran; the "
                                f"first (line {line_of(t, 'async_op=True')}) started after "
                                "loss.backward() had returned",
    "blocking in the hook": lambda t: f"the all-reduce at line "
                                      f"{line_of(t, 'group=self.group)')} blocks (it has no "
                                      "async_op=True)",
    "blocking, waits on None": lambda t: "dist.all_reduce returns a handle only with "
                                         "async_op=True",
    "blocking in finish": lambda t: f"no overlap: no all-reduce started while backward ran; "
                                    f"the first (line {line_of(t, 'the sum, now')}, blocking) "
                                    "started after",
    "all-reduced twice": lambda t: f"line {line_of(t, 'the sum, now')} all-reduces, after "
                                   "loss.backward() has returned, a bucket whose all-reduce "
                                   f"the hook already started (line {line_of(t, 'async_op')})",
    "no reset": lambda t: "the first step was right, the second is not: in the second step "
                          "the hooks started no all-reduce",
    "wait in the hook": lambda t: f"the all-reduce started at line "
                                  f"{line_of(t, 'async_op=True')} is waited on during backward",
    "the world's size": lambda t: "you divided by the size of the whole world, not of the group",
}
MARKS = ("never waited on", "read before its all-reduce", "SUM over the ranks", "no overlap",
         "blocks (it has no async_op", "only with async_op=True", "summed a second time",
         "the second is not", "waited on during backward", "size of the whole world")


@pytest.fixture(scope="module", autouse=True)
def shared_launches():
    """One launch per world size for the answers that run to the end (shared_launch.py)."""
    answers = [(REFERENCE, 3),
               (edited(REFERENCE, RIGHT["divide before the sum, wait in reverse order"]), 3),
               (edited(REFERENCE, RIGHT["a set of missing gradients per bucket, every wait "
                                        "first"]), 2)]
    answers += [(edited(REFERENCE, MISTAKES[name][0]), MISTAKES[name][1][0])
                for name in MISTAKES if name != "blocking, waits on None"]  # that one raises
    share_launches(nb08.HOOKS_CASES, "my_hooks.py", answers)


def test_the_reference_passes_and_is_recorded(workspace, capsys):
    """On 3 processes (an odd ring); the notebook's own checker cell, which nbval runs, checks
    it on 2, 3 and 4."""
    path = workspace.put(REFERENCE, "my_hooks.py")
    nb08.my_hooks(path, world_sizes=(3,))
    assert capsys.readouterr().out == "Exercise 8.3: correct.\n"
    assert has_passed("8.3", path)


@pytest.mark.parametrize("name, world_sizes", [
    ("divide before the sum, wait in reverse order", (3,)),  # a group smaller than the world
    ("a set of missing gradients per bucket, every wait first", (2,)),
])
def test_other_right_answers_pass(workspace, capsys, name, world_sizes):
    path = workspace.put(edited(REFERENCE, RIGHT[name]), "my_hooks.py")
    nb08.my_hooks(path, world_sizes=world_sizes)
    assert capsys.readouterr().out == "Exercise 8.3: correct.\n"


def test_the_skeleton_is_not_done_yet(workspace, capsys):
    nb08.my_hooks(workspace.put(skeleton("my_hooks.py"), "my_hooks.py"))
    assert "Exercise 8.3: not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("name", MISTAKES)
def test_a_wrong_answer_gets_the_hint_that_names_its_mistake(workspace, name):
    edits, world_sizes = MISTAKES[name]
    text = edited(REFERENCE, edits)
    hint = file_hint(nb08.my_hooks, workspace.put(text, "my_hooks.py"), world_sizes=world_sizes)
    checked_lines(ExerciseError(hint), nb08, hook_cases, harness, verdict)  # short, no code
    assert WORDS[name](text) in hint, hint
    assert f"launched on {world_sizes[0]} processes" in hint
    named = [mark for mark in MARKS if mark in hint]
    assert len(named) == 1, named  # its own mistake, no other


def test_using_the_library_is_refused_before_any_launch(workspace):
    library = "from course_lib.core.overlap import OverlapDataParallel\n"
    text = edited(REFERENCE, [("import torch.nn.functional as F\n",
                               "import torch.nn.functional as F\n\n" + library)])
    hint = file_hint(nb08.my_hooks, workspace.put(text, "my_hooks.py"))
    assert "uses course_lib (course_lib.core.overlap): the point is to write the hooks" in hint


def test_wrapping_the_model_in_torch_ddp_is_refused_too(workspace):
    text = "from torch.nn.parallel import DistributedDataParallel as DDP  # noqa\n" + REFERENCE
    hint = file_hint(nb08.my_hooks, workspace.put(text, "my_hooks.py"))
    assert "uses DistributedDataParallel: the point is" in hint


def test_a_file_without_the_class_is_told_what_to_keep(workspace):
    path = workspace.put(reference("my_ring.py"), "my_hooks.py")  # the wrong file, right name
    assert "defines no class BucketHooks" in file_hint(nb08.my_hooks, path)
