"""course_lib.core.data_parallel: every strategy equals one process on the whole batch and DDP.

Multi-process checks run in ONE launch per world size (course_lib.demos.data_parallel_selftest
measures on every rank, these tests judge). The pure pieces (bucket plans, graph walk, timeline
arithmetic, errors) are tested in this process.
"""

import datetime
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_lib.core.buckets import (
    MB,
    copy_grad_in,
    copy_grads_out,
    make_buckets,
    parameters_in_graph,
    plan_buckets,
)
from course_lib.core.data_parallel import STRATEGIES, GradSync
from course_lib.demos.data_parallel_selftest import VARIANTS
from course_lib.lessons.timeline import merge_intervals, overlap_summary
from course_lib.runtime.launch import launch

GRAD_RTOL, GRAD_ATOL, GRAD_REL_L2 = 1e-5, 1e-7, 1e-6  # COURSE_DESIGN section 4
PARAM_RTOL, PARAM_ATOL = 1e-5, 1e-5


STRATEGY_LABELS = [label for label in VARIANTS if label in STRATEGIES]  # one per strategy


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def run(request):
    """The selftest's report for one world size (one launch, a few seconds). World 2 runs
    every variant; world 3 runs each strategy with its defaults (test speed)."""
    labels = list(VARIANTS) if request.param == 2 else STRATEGY_LABELS
    result = launch("course_lib.demos.data_parallel_selftest", nproc=request.param,
                    args=[",".join(labels)], timeout_s=240, quiet=True).result
    assert result is not None and result["world_size"] == request.param
    assert list(result["variants"]) == labels
    return result


def as_tensors(grads: dict) -> dict:
    return {n: None if g is None else torch.tensor(g, dtype=torch.float32)
            for n, g in grads.items()}


def assert_grads_match(ours: dict, reference: dict, what: str) -> None:
    """Section 4's gradient tolerance, parameter by parameter and over the whole vector.
    A parameter without a reference gradient (unused everywhere) must come back as zeros."""
    ours, reference = as_tensors(ours), as_tensors(reference)
    assert ours.keys() == reference.keys()
    used = [n for n in ours if reference[n] is not None]
    for name in ours:
        if reference[name] is None:
            assert ours[name] is not None and not ours[name].any(), f"{what}: {name} not zero"
            continue
        torch.testing.assert_close(ours[name], reference[name], rtol=GRAD_RTOL, atol=GRAD_ATOL,
                                   msg=lambda m, n=name: f"{what}, {n}: {m}")
    a = torch.cat([ours[n] for n in used])
    b = torch.cat([reference[n] for n in used])
    assert float((a - b).norm() / b.norm()) <= GRAD_REL_L2, what


def test_every_strategy_runs_in_the_selftest():
    assert STRATEGY_LABELS == list(STRATEGIES)
    assert all(VARIANTS[s]["strategy"] == s for s in STRATEGY_LABELS)


# ---- multi-process: one launch per world size ---------------------------------------------


@pytest.mark.slow
def test_gradients_equal_single_process_big_batch_and_ddp(run):
    ref = run["reference"]
    for label, v in run["variants"].items():
        assert_grads_match(v["one_step"]["grads"], ref["one_step"], f"{label} vs one process")
        assert_grads_match(v["one_step"]["grads"], ref["ddp"], f"{label} vs torch DDP")
        assert_grads_match(v["unused_on_some_ranks"]["grads"], ref["unused_on_some_ranks"],
                           f"{label}, a branch only rank 0 uses")


@pytest.mark.slow
def test_tiny_transformer_token_mean_equals_single_process_and_ddp(run):
    for label, t in run["transformer"].items():
        assert t["rel_l2_single"] <= GRAD_REL_L2 and t["allclose_single"], label
        assert t["rel_l2_ddp"] <= GRAD_REL_L2 and t["allclose_ddp"], label
        assert t["equal_on_ranks"], label


@pytest.mark.slow
def test_replicas_stay_bitwise_equal_and_track_single_process_training(run):
    for label, v in run["variants"].items():
        assert v["one_step"]["equal_on_ranks"], label
        assert all(v["training"]["equal_after_step"]), label
        ours, ref = as_tensors(v["training"]["params"]), as_tensors(run["reference"]["training"])
        for name in ref:
            torch.testing.assert_close(ours[name], ref[name], rtol=PARAM_RTOL, atol=PARAM_ATOL)


@pytest.mark.slow
def test_broadcast_makes_different_replicas_equal_to_rank_0(run):
    b = run["broadcast"]
    assert b["equal_before"] is False  # seeds differ per rank: the check can fail
    assert b["equal_after"] and b["equal_to_rank0"]


@pytest.mark.slow
def test_unsynced_micro_steps_communicate_nothing(run):
    for label, v in run["variants"].items():
        acc = v["accumulation"]
        assert v["one_step"]["calls"] > 0, label  # the call counter does see a synced step
        assert acc["calls_unsynced"] == 0, label
        assert acc["collectives_unsynced"] == 0 and acc["bytes_unsynced"] == 0, label
        assert acc["local_untouched"], label  # .grad stayed this rank's own sum


@pytest.mark.slow
def test_sync_on_last_micro_step_equals_sync_every_micro_step(run):
    ref = run["reference"]["accumulation"]
    for label, v in run["variants"].items():
        acc = v["accumulation"]
        assert_grads_match(acc["grads_last"], acc["grads_every"], f"{label}: last vs every")
        assert acc["grads_no_sync"] == acc["grads_last"], label  # the same computation
        assert_grads_match(acc["grads_last"], ref, f"{label}: accumulated vs one process")


def first_comm_and_backward_end(timeline: list) -> tuple[float, float]:
    backward = [e for e in timeline if e["name"] == "backward"]
    assert len(backward) == 1
    return min(e["start_s"] for e in timeline if e["kind"] == "comm"), backward[0]["end_s"]


@pytest.mark.slow
def test_overlap_starts_communication_before_backward_ends(run):
    for label in run["variants"]:
        options = VARIANTS[label]
        for timeline in (run["transformer"][label]["timeline"],
                         run["variants"][label]["one_step"]["timeline"]):
            assert all(e["end_s"] >= e["start_s"] >= 0 for e in timeline), label
        first, end = first_comm_and_backward_end(run["transformer"][label]["timeline"])
        if options["strategy"] == "overlap":
            assert first < end, f"{label}: first bucket left at {first}, backward ended {end}"
        else:
            assert first >= end, f"{label} must communicate only after backward"
    # the small MLP has unused layers: the walk over the graph lets its first bucket leave
    if run["world_size"] == 2:  # the world-2 run has every variant
        first, end = first_comm_and_backward_end(
            run["variants"]["overlap find_unused"]["one_step"]["timeline"])
        assert first < end


@pytest.mark.slow
def test_buckets_respect_size_and_backward_order(run):
    names = list(run["reference"]["one_step"])  # registration order, requires_grad only
    for label, v in run["variants"].items():
        buckets, cap = v["one_step"]["buckets"], v["one_step"]["bucket_mb"] * MB
        if v["options"]["strategy"] not in ("bucketed", "overlap"):
            assert buckets == [], label
            continue
        assert [n for b in buckets for n in b["names"]] == names[::-1], label
        for b, after in zip(buckets, buckets[1:] + [None], strict=True):
            assert b["bytes"] <= cap or len(b["names"]) == 1, label
            assert sum(b["param_bytes"]) == b["bytes"], label
            if after is not None:  # closed only because the next parameter would not fit
                assert b["bytes"] + after["param_bytes"][0] > cap, label
        assert len(v["one_step"]["timeline"]) == 1 + len(buckets), label
        assert v["one_step"]["stats"]["collectives"] == len(buckets), label


@pytest.mark.slow
def test_stats_count_bytes(run):
    n = run["world_size"]
    shapes = run["reference"]["training"]  # every parameter, frozen ones too
    trained = run["reference"]["one_step"]  # the ones that need gradients
    total = 4 * sum(len(shapes[name]) for name in trained)  # float32 bytes
    for label, v in run["variants"].items():
        assert v["one_step"]["stats"]["bytes_reduced"] == total, label
    naive = run["variants"]["naive"]["one_step"]["stats"]
    assert naive["bytes_sent"] == (n - 1) * total  # rank 0 sends the sum to N-1 ranks
    ring = run["variants"]["ring"]["one_step"]["stats"]["bytes_sent"]
    assert 0 < ring <= 2 * total  # at most 2(N-1)/N of every tensor, plus rounding of chunks


# ---- in this process -------------------------------------------------------------------------


def test_plan_buckets_fills_greedily_and_splits_on_dtype():
    assert plan_buckets([100, 200, 300, 50], ["f"] * 4, 300) == [[0, 1], [2], [3]]
    assert plan_buckets([500, 10, 10], ["f"] * 3, 300) == [[0], [1, 2]]  # too big: alone
    assert plan_buckets([10, 10, 10], ["f", "h", "h"], 300) == [[0], [1, 2]]
    assert plan_buckets([], [], 300) == []
    with pytest.raises(ValueError, match="bucket_mb > 0"):
        plan_buckets([10], ["f"], 0)


def small_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(2, 2))
    model[1].weight.requires_grad_(False)
    return model


def test_make_buckets_reverse_order_skips_frozen_and_moves_grads():
    model = small_model()
    buckets = make_buckets(list(model.named_parameters()), bucket_bytes=40)
    names = [n for b in buckets for n in b.names]
    assert names == ["2.bias", "2.weight", "1.bias", "0.bias", "0.weight"]
    assert all(b.nbytes <= 40 or len(b.params) == 1 for b in buckets)
    for b in buckets:
        for i, p in enumerate(b.params):
            p.grad = torch.full_like(p, 6.0) if i % 2 == 0 else None
            copy_grad_in(b, i, world_size=3)
        assert b.complete()
        copy_grads_out(b)
        for i, p in enumerate(b.params):
            expected = 2.0 if i % 2 == 0 else 0.0  # 6 / 3 ranks; no gradient counts as 0
            assert torch.equal(p.grad, torch.full_like(p, expected))
            assert p.grad.data_ptr() != b.slots[i].data_ptr()  # a copy
        b.reset()
        copy_grad_in(b, 0, world_size=2)  # 2.0 / 2
        copy_grads_out(b, as_views=True)
        assert b.params[0].grad.data_ptr() == b.slots[0].data_ptr()  # no copy: the slot itself
        assert torch.equal(b.params[0].grad, torch.full_like(b.params[0], 1.0))


def test_parameters_in_graph_finds_only_used_leaves():
    model = small_model()
    loss = model[0](torch.randn(5, 3)).sum()  # layers 1 and 2 take no part
    found = parameters_in_graph(loss)
    assert found == {id(model[0].weight), id(model[0].bias)}


def test_overlap_summary_counts_hidden_communication_once():
    events = [{"name": "backward", "kind": "compute", "start_s": 0.0, "end_s": 1.0, "bytes": 0},
              {"name": "bucket 0", "kind": "comm", "start_s": 0.5, "end_s": 1.5, "bytes": 8},
              {"name": "bucket 1", "kind": "comm", "start_s": 0.75, "end_s": 1.25, "bytes": 8}]
    s = overlap_summary(events)
    assert s["comm_s"] == pytest.approx(1.0) and s["hidden_s"] == pytest.approx(0.5)
    assert s["hidden_fraction"] == pytest.approx(0.5) and s["step_s"] == pytest.approx(1.5)
    assert s["comm_bytes"] == 16
    assert merge_intervals([(2, 3), (0, 1), (0.5, 2)]) == [(0, 3)]


@pytest.fixture
def one_rank_group():
    """A process group of one rank in this process (a file store: no port needed)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=20))
        try:
            yield dist.group.WORLD
        finally:
            dist.destroy_process_group()


def test_bad_options_say_what_to_change():
    with pytest.raises(ValueError, match="pick one of"):
        GradSync(small_model(), None, strategy="fastest")
    with pytest.raises(ValueError, match="bucket_mb must be > 0"):
        GradSync(small_model(), None, strategy="bucketed", bucket_mb=0)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_misuse_raises_and_one_rank_keeps_gradients(one_rank_group, strategy):
    model = small_model()
    gs = GradSync(model, one_rank_group, strategy=strategy, bucket_mb=1e-5)
    x = torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="sync=True"):
        gs.finish()  # nothing synced yet
    gs.backward(model(x).square().mean(), sync=True)
    with pytest.raises(RuntimeError, match="finish"):
        gs.backward(model(x).square().mean(), sync=True)  # forgot finish()
    gs.finish()
    expected = small_model()
    expected.load_state_dict(model.state_dict())
    expected(x).square().mean().backward()
    for p, q in zip(model.parameters(), expected.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None)
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)  # world 1: unchanged
    gs.remove_hooks()
