"""Notebook 10b's checkers, judged without a launch (the launches: test_check_file_exercises.py):
bf16's tolerance tells the mean from the mistakes of 10.5, the errors a DDP hook meets first are
explained, the mistakes 10.6 names from the parameters give parameters of their own, and 10.6's
accumulation case leaves buckets incomplete where an out-of-order launch shows."""

import pytest
import torch

from course_lib.check.cases import bf16_hook, hooks, zero2
from course_lib.check.checker import ExerciseError
from course_lib.core.buckets import plan_buckets


def test_the_tolerance_tells_the_mean_from_the_mistakes():
    """bf16's bound holds the mean of bf16 messages and none of the mistakes' values."""
    g = torch.Generator().manual_seed(0)
    local = torch.randn(4, 500, generator=g) * torch.logspace(-6, 5, 500)  # (ranks, values)
    mean, size, n = local.mean(0), local.abs().sum(0) / 4, 4
    messages = (local / n).to(torch.bfloat16)
    total = messages[0]
    for m in messages[1:]:
        total = total + m  # rounded in bf16 at every addition, as Gloo adds
    assert bf16_hook.bf16_close(total.float(), mean, size, n)
    assert not bf16_hook.bf16_close(total.float() * n, mean, size, n)  # the sum
    assert not bf16_hook.bf16_close(total.float() * n / 5, mean, size, n)  # by a world of 5
    assert not bf16_hook.bf16_close(local[0] / n, mean, size, n)  # its own gradient


def test_a_mean_divided_twice_is_named():
    """Judged from the values alone: the ranks' .grad is the mean / n."""
    local = [[1.0, -2.0, 0.5], [3.0, 0.0, 0.25]]  # two ranks' own gradients
    mean = [(a + b) / 2 for a, b in zip(*local, strict=True)]
    by_rank = {r: {"passes": [{"local": local[r], "grad": [m / 2 for m in mean]}]}
               for r in range(2)}
    with pytest.raises(ExerciseError, match="the mean divided by 2 once more"):
        bf16_hook.judge_pass(by_rank, 2, 2, 0)
    for r in range(2):
        by_rank[r]["passes"][0]["grad"] = mean
    bf16_hook.judge_pass(by_rank, 2, 2, 0)  # the mean itself passes


@pytest.mark.parametrize("message, source, words", [
    ("'GradBucket' object has no attribute 'get_tensor'", "buffer = bucket.get_tensor()",
     "older torch called it get_tensor()"),
    ("completed() INTERNAL ASSERT FAILED at ...", "mean = future.value()[0] / n",
     "read before the all-reduce had finished"),
    ("'NoneType' object has no attribute 'size'", "n = process_group.size()",
     "process_group=None"),
    ("'NoneType' object has no attribute 'get_future'",
     "f = dist.all_reduce(m, group=group).get_future()", "async_op=True"),
    ("The size of tensor a (6) must match the size of tensor b (3)", "buffer.copy_(x)",
     "one flat tensor of every gradient of the bucket")])
def test_the_errors_a_hook_meets_first_are_explained(message, source, words):
    explained = bf16_hook.explain({"message": message, "source": source}, "")
    assert words in explained, explained
    assert bf16_hook.explain({"message": "other", "source": source}, "") is None


def test_the_parameters_of_zero2s_mistakes_differ_from_the_right_ones():
    spec = zero2.case_specs(3, {})[1]
    assert spec["accum"] == 2
    plain = zero2.reference(spec, 3)
    assert zero2.reference(spec, 3, grad_scale=3) != plain
    assert zero2.reference(spec, 3, last_micro_only=True) != plain


def test_the_unused_layer_leaves_two_buckets_incomplete_between_complete_ones():
    """10.6's accumulation case: the layer left out of the first micro-step holds parameters of
    buckets 1 and 2 only, so bucket 0 leaves from the hook, and bucket 3 is complete while
    buckets 1 and 2 wait: launching it then is out of order, and the end of backward must
    launch 1, 2 and 3. Without the layer the model computes something else (its loss moves)."""
    spec = next(s for s in zero2.case_specs(2, {}) if s.get("unused_in"))
    model = hooks.make_model(spec["seed"]).double()
    names = [name for name, _ in model.named_parameters()][::-1]  # backward's order
    sizes = [p.numel() * p.element_size() for p in model.parameters()][::-1]
    plan = plan_buckets(sizes, [None] * len(sizes), spec["cap"])
    unused = [b for b, members in enumerate(plan)
              if any(names[i].startswith(f"{zero2.SKIPPED}.") for i in members)]
    assert len(plan) == 4 and unused == [1, 2]
    x, _ = zero2.batch(spec, 0, 0, 0)
    assert not torch.equal(zero2.forward(model, x, skip=True), zero2.forward(model, x, False))
    assert zero2.reference(spec, 2) != zero2.reference({**spec, "unused_in": []}, 2)
