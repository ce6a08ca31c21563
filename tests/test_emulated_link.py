"""The emulated link of notebook 08 (course_lib/lessons/emulated_link.py): its finish times, a
wait that sleeps instead of spinning, the real all-reduce underneath, and its torch DDP hook
against plain DDP (with the learner's hooks of exercise 8.3 on the same launch)."""

import time
from types import SimpleNamespace

import pytest
import torch
from answer_edits import reference

from course_lib.demos.bucket_sweep import learner_hooks
from course_lib.lessons.emulated_link import EmulatedLink, LinkWork
from course_lib.runtime.launch import launch
from course_lib.runtime.workspace import record_pass


class DoneWork:
    """A real all-reduce that has already finished."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True


class FakeAllReduce:
    """Stands in for ``dist.all_reduce``: notes its calls, doubles the tensor (2 ranks)."""

    def __init__(self):
        self.calls = []

    def __call__(self, tensor, group=None, async_op=False):
        self.calls.append((tensor, group, async_op))
        tensor.mul_(2)
        return DoneWork()


def test_messages_queue_one_at_a_time_on_the_link():
    link = EmulatedLink(alpha_s=1e-3, bytes_per_s=1e6, inner=FakeAllReduce())
    assert link.message_s(1000) == pytest.approx(2e-3)  # alpha + 1000 bytes / 1 MB/s
    assert link.schedule(1000, now_s=0.0) == pytest.approx(0.002)
    assert link.schedule(2000, now_s=0.001) == pytest.approx(0.005)  # waits for the first
    assert link.schedule(0, now_s=0.0045) == pytest.approx(0.006)  # alpha alone, queued
    assert link.schedule(1000, now_s=0.010) == pytest.approx(0.012)  # idle link: at once


def test_a_link_needs_a_positive_bandwidth():
    with pytest.raises(ValueError, match="positive bandwidth"):
        EmulatedLink(alpha_s=1e-3, bytes_per_s=0)
    with pytest.raises(ValueError, match="alpha >= 0"):
        EmulatedLink(alpha_s=-1.0, bytes_per_s=1e9)


def test_the_real_all_reduce_runs_and_the_wait_sleeps_until_the_link_is_done():
    inner = FakeAllReduce()
    link = EmulatedLink(alpha_s=0.3, bytes_per_s=1e9, group="group", inner=inner)
    tensor = torch.ones(4)
    wall, cpu = time.perf_counter(), time.process_time()
    handle = link.all_reduce(tensor, group="group", async_op=True)
    assert isinstance(handle, LinkWork) and time.perf_counter() - wall < 0.1  # returns at once
    assert not handle.is_completed()
    assert torch.equal(tensor, torch.full((4,), 2.0))  # the numbers are the real ones
    assert inner.calls[0][1:] == ("group", True)
    handle.wait()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert wall >= 0.3 and handle.is_completed()
    assert cpu < 0.1 * wall, f"the wait used {cpu:.3f} s of CPU in {wall:.3f} s: it spins"


def test_a_synchronous_all_reduce_on_the_link_returns_at_its_finish():
    link = EmulatedLink(alpha_s=0.05, bytes_per_s=1e6, inner=FakeAllReduce())
    start = time.perf_counter()
    assert link.all_reduce(torch.ones(25_000)) is None  # 100 kB at 1 MB/s: 0.1 s, + alpha
    assert time.perf_counter() - start >= 0.15


class FakeBucket:
    def __init__(self, tensor):
        self.tensor = tensor

    def buffer(self):
        return self.tensor


def test_the_ddp_hook_completes_its_future_at_the_finish_from_a_timer_thread(
        one_process_group):
    link = EmulatedLink(alpha_s=0.2, bytes_per_s=1e9, group=one_process_group)
    bucket = torch.full((8,), 3.0)
    wall, cpu = time.perf_counter(), time.process_time()
    future = link.ddp_hook(None, FakeBucket(bucket))
    assert not future.done()
    value = future.wait()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    link.close()
    assert wall >= 0.2 and value is bucket  # the bucket itself, averaged in place
    assert torch.equal(value, torch.full((8,), 3.0))  # one rank: the mean is the value
    assert cpu < 0.1 * wall, f"waiting used {cpu:.3f} s of CPU in {wall:.3f} s: it spins"


@pytest.mark.slow
def test_ddp_on_the_link_and_the_learners_hooks_give_plain_ddps_parameters(workspace):
    path = workspace.put(reference("my_hooks.py"), "my_hooks.py")
    record_pass("8.3", path)
    run = launch("course_lib.demos.bucket_sweep", nproc=2, timeout_s=300, quiet=True,
                 args=["--link-alpha-us", "200", "--link-gb-per-s", "1", "--strategies", "ddp",
                       "--sweep-mb", "", "--hooks", path, "--rounds", "1", "--steps", "2"])
    rows = {row["label"]: row for row in run.result["rows"]}
    assert set(rows) == {"ddp", "your hooks"}
    alpha, bandwidth = run.result["link"]["alpha_s"], run.result["link"]["bytes_per_s"]
    for row in rows.values():
        assert row["max_difference_to_ddp"] == 0.0, row["label"]  # DDP without the link
        assert row["replicas_bitwise_equal"], row["label"]
        comm = [e for e in row["timeline"] if e["kind"] == "comm"]
        assert len(comm) == 4  # 1 MB buckets, as notebook 08
        for e in comm:  # each all-reduce took at least the link's alpha + bytes / bandwidth
            assert e["end_s"] - e["start_s"] >= alpha + e["bytes"] / bandwidth - 1e-4, e
        assert row["link_s"] == pytest.approx(sum(alpha + e["bytes"] / bandwidth
                                                  for e in comm))


def test_hooks_are_run_only_once_they_passed_and_left_out_with_a_reason_before(
        workspace, capsys):
    rank0 = SimpleNamespace(rank=0)
    assert learner_hooks("workspace/my_hooks.py", rank0) is None  # no file yet
    assert "there is no workspace/my_hooks.py" in capsys.readouterr().out
    path = workspace.put(reference("my_hooks.py"), "my_hooks.py")
    assert learner_hooks(path, rank0) is None  # no pass recorded yet
    assert "has not passed exercise 8.3" in capsys.readouterr().out
    record_pass("8.3", path)
    assert learner_hooks(path, rank0).__name__ == "BucketHooks"
