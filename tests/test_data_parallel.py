"""Our data-parallel wrappers and ZeRO-1 (course_lib/core) against torch DDP and one process.

One launch of ``tests/workers/data_parallel_check.py`` per world size (1 to 4) trains every
wrapper with a loop that calls ``loss.backward()`` itself, on a model with a tied weight, a
frozen layer, a layer nobody uses and a branch only rank 0 uses; the tests here judge what it
hands back. The pure pieces (bucket plans, errors) are tested in this process.
"""

from pathlib import Path

import pytest
import torch
from torch import nn

from course_lib.core.buckets import MB, BucketedDataParallel, make_buckets, plan_buckets
from course_lib.core.data_parallel import AllReducePerParameter
from course_lib.core.overlap import OverlapDataParallel
from course_lib.lessons.timeline import overlap_summary
from course_lib.runtime.launch import launch

WORKER = str(Path(__file__).parent / "workers" / "data_parallel_check.py")
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-7  # gradients: float32 rounding, nothing more
PARAM_RTOL, PARAM_ATOL = 1e-5, 1e-5  # parameters after a few steps
FIND_UNUSED = {"allreduce", "bucketed one bucket", "overlap find_unused"}  # as in the worker


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda n: f"world{n}")
def run(request) -> dict:
    result = launch(WORKER, nproc=request.param, timeout_s=240, quiet=True).result
    assert result is not None and result["world_size"] == request.param
    return result


def tensors(values: dict) -> dict:
    return {n: None if v is None else torch.tensor(v) for n, v in values.items()}


def assert_same(ours: dict, theirs: dict, rtol: float, atol: float, what: str) -> None:
    ours, theirs = tensors(ours), tensors(theirs)
    assert ours.keys() == theirs.keys(), what
    for name, want in theirs.items():
        if want is None:
            continue
        torch.testing.assert_close(ours[name], want, rtol=rtol, atol=atol,
                                   msg=lambda m, n=name: f"{what}, {n}: {m}")


@pytest.mark.slow
def test_every_wrapper_trains_like_ddp_and_like_one_process(run):
    for label, v in run["variants"].items():
        assert_same(v["params"], run["ddp"]["params"], PARAM_RTOL, PARAM_ATOL, f"{label} vs DDP")
        assert_same(v["params"], run["reference"]["params"], PARAM_RTOL, PARAM_ATOL,
                    f"{label} vs one process")
        assert_same(v["grads"], run["ddp"]["grads"], GRAD_RTOL, GRAD_ATOL, f"{label} grads")
    assert_same(run["ddp"]["params"], run["reference"]["params"], PARAM_RTOL, PARAM_ATOL, "DDP")


@pytest.mark.slow
def test_a_parameter_no_rank_uses_keeps_no_gradient_like_ddp(run):
    assert run["ddp"]["grads"]["unused.weight"] is None  # the check can tell None apart
    for label, v in run["variants"].items():
        grad = v["grads"]["unused.weight"]
        if label in FIND_UNUSED:
            assert grad is None, label  # as DDP with find_unused_parameters=True
        else:
            assert grad is not None and not any(grad), label  # counted as zeros
        assert v["grads"]["frozen.weight"] is None, label  # requires_grad=False: left out


@pytest.mark.slow
def test_the_tied_weight_and_the_rank_0_branch_get_the_mean_gradient(run):
    reference = tensors(run["reference"]["grads"])
    assert "proj_out.weight" not in reference  # one parameter, listed once
    for label, v in run["variants"].items():
        for name in ("proj_in.weight", "extra.weight"):
            torch.testing.assert_close(torch.tensor(v["grads"][name]), reference[name],
                                       rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=f"{label} {name}")


@pytest.mark.slow
def test_replicas_stay_bitwise_equal_and_no_sync_sends_nothing(run):
    for label, v in [*run["variants"].items(), ("ddp", run["ddp"])]:
        assert all(v["equal_after_step"]) and len(v["equal_after_step"]) == 3, label
        assert v["calls_inside_no_sync"] == 0, label


@pytest.mark.slow
def test_all_reduces_per_step_follow_the_buckets(run):
    trained = [n for n, g in run["reference"]["grads"].items() if g is not None]
    steps = len(run["ddp"]["equal_after_step"])
    for label, v in run["variants"].items():
        if not v["buckets"]:  # one all-reduce per parameter that needs a gradient; the
            unused = 0 if label in FIND_UNUSED else 2  # unused layer's two only without the
            assert v["all_reduces"] == steps * (len(trained) + unused), label  # search
            continue
        names = [n for bucket in v["buckets"] for n in bucket]
        assert sorted(names) == sorted([*trained, "unused.weight", "unused.bias"]), label
        assert v["all_reduces"] == steps * len(v["buckets"]), label
    assert len(run["variants"]["bucketed one bucket"]["buckets"]) == 1
    per_parameter = run["variants"]["bucketed one per parameter"]["buckets"]
    assert all(len(bucket) == 1 for bucket in per_parameter)


@pytest.mark.slow
def test_the_training_step_gives_ddps_gradient_on_variable_length_data(run):
    t = run["transformer"]
    ddp = torch.tensor(t["ddp"]["grad"])
    for name, v in t.items():
        assert v["equal_on_ranks"], name
        assert v["loss"] == pytest.approx(t["ddp"]["loss"], rel=1e-6), name
        ours = torch.tensor(v["grad"])
        torch.testing.assert_close(ours, ddp, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)
        assert float((ours - ddp).norm() / ddp.norm()) <= 1e-6, name


@pytest.mark.slow
def test_overlap_starts_sending_before_backward_ends(run):
    for name, events in run["timelines"].items():
        backward = [e for e in events if e["kind"] == "compute"]
        comm = [e for e in events if e["kind"] == "comm"]
        assert len(backward) == 1 and comm and all(e["end_s"] >= e["start_s"] for e in events)
        first = min(e["start_s"] for e in comm)
        if name == "overlap" and run["world_size"] > 1:
            assert first < backward[0]["end_s"], "the first bucket waited for backward"
            assert overlap_summary(events)["hidden_s"] > 0
        elif name != "overlap":
            assert first >= backward[0]["end_s"], f"{name} must wait for backward"


@pytest.mark.slow
def test_zero1_equals_plain_data_parallelism_with_1_over_n_of_the_state(run):
    plain, zero = run["zero"]["plain"], run["zero"]["zero"]
    assert_same(zero["params"], plain["params"], PARAM_RTOL, PARAM_ATOL, "ZeRO-1 vs DDP")
    assert zero["equal_on_ranks"] and plain["equal_on_ranks"]
    unused_after = torch.tensor(zero["params"]["unused.weight"])  # no gradient anywhere:
    unused_before = torch.tensor(run["reference"]["params"]["unused.weight"])  # ...left alone
    torch.testing.assert_close(unused_after, unused_before, rtol=0, atol=0)
    n, per_rank = run["world_size"], zero["state_bytes_per_rank"]
    numel = sum(len(v) for v in plain["params"].values())  # every parameter, frozen ones too
    pieces = len(plain["params"])  # at most one piece of each parameter per rank
    # AdamW keeps 2 float32 moments per value and a 4-byte step count per (piece of a) tensor
    assert max(per_rank) <= 8 * -(-numel // n) + 4 * pieces  # my chunk's moments: 1/N
    assert sum(per_rank) >= 8 * (plain["state_bytes"] // 8)  # every trained value, once
    if n > 1:
        assert max(per_rank) < plain["state_bytes"]


# ---- in this process -------------------------------------------------------------------------


def test_plan_buckets_fills_greedily_and_splits_on_dtype():
    assert plan_buckets([100, 200, 300, 50], ["f"] * 4, 300) == [[0, 1], [2], [3]]
    assert plan_buckets([500, 10, 10], ["f"] * 3, 300) == [[0], [1, 2]]  # too big: alone
    assert plan_buckets([10, 10, 10], ["f", "h", "h"], 300) == [[0], [1, 2]]
    assert plan_buckets([], [], 300) == []
    with pytest.raises(ValueError, match="bucket_mb > 0"):
        plan_buckets([10], ["f"], 0)


def test_make_buckets_gives_each_parameter_a_slot_of_its_shape():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    params = list(model.parameters())[::-1]  # last layer first
    buckets = make_buckets(params, bucket_mb=40 / MB)
    assert [p for b in buckets for p in b.params] == params
    for b in buckets:
        assert b.buffer.numel() == sum(p.numel() for p in b.params)
        for p in b.params:
            assert b.slot(p).shape == p.shape
            assert b.slot(p).data_ptr() >= b.buffer.data_ptr()  # a view into the buffer
    assert len(make_buckets(params, None)) == 1
    assert len(make_buckets(params, 1e-9)) == len(params)


@pytest.mark.parametrize("wrapper", [AllReducePerParameter, BucketedDataParallel,
                                     OverlapDataParallel])
def test_finishing_without_a_synced_forward_says_what_to_do(one_process_group, wrapper):
    model = wrapper(nn.Linear(3, 2), one_process_group)
    with pytest.raises(RuntimeError, match="outside no_sync"):
        model.finish_gradient_sync()  # nothing ran yet
    with model.no_sync():
        model(torch.randn(4, 3)).sum().backward()
    with pytest.raises(RuntimeError, match="outside no_sync"):
        model.finish_gradient_sync()  # only a no_sync forward ran
    model(torch.randn(4, 3)).sum().backward()
    model.finish_gradient_sync()  # now it works; one rank: the gradients stay as they are
    assert all(p.grad is not None for p in model.parameters())
