"""Which world sizes a multi-process checker launches, and reports of the engine (its verdict,
its tracer) that no one exercise's spec holds."""

import json

import pytest

from course_lib.check.mp.harness import WORLD_SIZES, WORLD_SIZES_ENV, world_sizes_to_run
from course_lib.check.mp.tracer import CaseLog, Tracer


def test_every_world_size_unless_the_environment_names_some(monkeypatch):
    monkeypatch.delenv(WORLD_SIZES_ENV, raising=False)
    assert world_sizes_to_run(WORLD_SIZES) == [2, 3, 4]
    monkeypatch.setenv(WORLD_SIZES_ENV, "3")
    assert world_sizes_to_run(WORLD_SIZES) == [3]
    monkeypatch.setenv(WORLD_SIZES_ENV, "2,4")
    assert world_sizes_to_run((3, 4)) == [4]


def test_a_choice_outside_the_checkers_sizes_keeps_them_all(monkeypatch):
    monkeypatch.setenv(WORLD_SIZES_ENV, "5")  # a checker never runs on sizes it did not ask for
    assert world_sizes_to_run((2, 3)) == [2, 3]


def test_a_file_that_still_holds_its_marked_line_is_open(tmp_path, capsys):
    import ast

    from course_lib.check import nb06
    from course_lib.check.mp.learner import still_open

    text = ('def done(x):\n    return x\n\n\ndef open_one(x):\n'
            '    raise NotImplementedError("Exercise 6.3: replace this line with your code")\n')
    tree = ast.parse(text)
    assert still_open(tree, text, ("open_one",)) and still_open(tree, text, ())
    assert not still_open(tree, text, ("done",))  # another function's line is not this one's
    path = tmp_path / "my_ring.py"
    path.write_text(text.replace("open_one", "ring_all_reduce"))
    nb06.my_ring(str(path))  # no launch: reported at once
    assert capsys.readouterr().out.startswith("Exercise 6.3: not done yet")


def test_a_membership_test_of_tensors_is_named_where_torch_says_only_shapes():
    from course_lib.check.mp.learner import LearnerFile
    from course_lib.check.mp.runner import RankResult, Run
    from course_lib.check.mp.verdict import MEMBERSHIP, SHAPES, learner_error_message

    def report(source: str) -> str:
        error = {"kind": "learner", "type": "RuntimeError", "line": 9, "source": source,
                 "function": "f", "case": "a case", "message": "The size of tensor a (3) "
                 "must match the size of tensor b (16) at non-singleton dimension 1"}
        run = Run(2, [RankResult(0, True, [], error, {}, {})], None, 1.0, "f.py")
        return learner_error_message(run, LearnerFile("f.py", ("f",)))

    found = report("b = next(i for i, bucket in enumerate(buckets) if param in bucket)")
    assert found.endswith(MEMBERSHIP)
    assert report("total = grad + bucket").endswith(SHAPES)  # no `in`: the shapes' sentence


@pytest.mark.slow
def test_an_all_reduce_on_the_whole_world_in_a_hook_is_named_before_gloo_fails(workspace):
    """8.3's case routes dist.all_reduce through its own handler: the tracer's check of the
    group runs before any handler, so the ranks of a smaller group hear why, not Gloo's
    'Connection closed by peer' when the process outside the group leaves."""
    from answer_edits import edited, reference
    from check_reports import file_hint

    from course_lib.check import nb08

    text = edited(reference("my_hooks.py"), [(
        "dist.all_reduce(self.flat[b], group=self.group, async_op=True)",
        "dist.all_reduce(self.flat[b], async_op=True)")])
    hint = file_hint(nb08.my_hooks, workspace.put(text, "my_hooks.py"), world_sizes=(3,))
    assert ("called all_reduce on the whole world, ranks 0..2, but this case gave your "
            "function a group of ranks [1, 2]: rank 0, outside it, never calls it") in hint, hint
    assert "pass that group to dist.all_reduce (group=...)" in hint, hint
    assert "Connection" not in hint, hint


def test_a_wait_is_written_at_once_and_the_return_to_own_code_by_the_watch(tmp_path):
    """Gloo may abort a rank inside a call, so a status that waits is on disk before the call;
    one that says the rank runs its own code again is written by the watch (or with a saved
    result), once, however often it was noted."""
    tracer = Tracer(str(tmp_path), 0, str(tmp_path / "mine.py"))
    tracer.log = CaseLog()

    def on_disk() -> dict:
        return json.loads((tmp_path / "status0.json").read_text())

    tracer.status(op="recv", peer=1, line=7)
    assert on_disk()["op"] == "recv" and on_disk()["peer"] == 1
    tracer.status(op=None)
    assert on_disk()["op"] == "recv"  # not yet: the watch writes it
    tracer.publish_status()
    assert on_disk()["op"] is None
    (tmp_path / "status0.json").unlink()
    tracer.publish_status()  # nothing new since: no second write
    assert not (tmp_path / "status0.json").exists()
