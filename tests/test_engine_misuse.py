"""Uses of the course's engines that the notebooks do not make, on 2 processes, each against
one process running every rank's batch and, where it applies, against torch DDP: every one ends
in the right result or in an error that names the parameter (or module) and the cause.

One launch of ``tests/workers/misuse_check.py`` runs every case; the tests here judge what each
rank handed back. Gradients and parameters are compared with the one-process run (the worst
difference over the ranks): fp32 rounding of a few small sums, nothing more (RIGHT).
"""

from pathlib import Path

import pytest

from course_lib.runtime.launch import launch

WORKER = str(Path(__file__).parent / "workers" / "misuse_check.py")
RIGHT = 1e-6  # gradients and parameters of about 1: a few fp32 roundings
MARKED_TWICE = "RuntimeError: Expected to mark a variable ready only once"  # DDP's words
DP_WRAPPERS = ("allreduce", "bucketed", "overlap")


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    result = launch(WORKER, nproc=2, timeout_s=240, quiet=True).result
    assert result is not None and result["world_size"] == 2
    return result["ranks"]


def right(outcome: dict) -> bool:
    return "difference" in outcome and outcome["difference"] <= RIGHT


@pytest.mark.slow
def test_a_parameter_used_outside_forward_under_find_unused_parameters_is_refused_like_ddp(
        ranks):
    for found in (rank["regulariser"] for rank in ranks):
        assert found["ddp"]["error"].startswith(MARKED_TWICE)  # torch DDP refuses it
        ours = found["overlap"]["error"]  # buckets sent from hooks: it must refuse too
        assert ours.startswith(MARKED_TWICE) and "'reg.weight'" in ours, ours
        assert "counted it as unused" in ours and "find_unused_parameters=False" in ours, ours
        for kind in ("allreduce", "bucketed"):  # they sync after backward, from .grad: right
            assert right(found[kind]), (kind, found[kind])


@pytest.mark.slow
def test_a_second_backward_through_one_graph_is_refused_where_buckets_leave_in_backward(ranks):
    for found in (rank["retain_graph"] for rank in ranks):
        ours = found["overlap"]["error"]
        assert ours.startswith(MARKED_TWICE) and "retain_graph=True" in ours, ours
        assert "parameter 'b." in ours, ours  # the last layer's: its hook fires first
        for kind in ("allreduce", "bucketed"):
            assert right(found[kind]), (kind, found[kind])
        # torch 2.13's DDP ignores the second backward's hooks: averaged plus local gradients
        assert found["ddp"]["difference"] > 0.01, found["ddp"]


@pytest.mark.slow
def test_two_synced_backward_before_one_sync_give_ddps_result(ranks):
    for found in (rank["two_forwards"] for rank in ranks):
        for kind in ("ddp", *DP_WRAPPERS):  # overlap finishes the first sync at the 2nd forward
            assert right(found[kind]), (kind, found[kind])


@pytest.mark.slow
def test_a_model_changed_after_wrapping_is_refused_at_the_next_forward_or_step(ranks):
    for found in (rank["changed"] for rank in ranks):
        for change, says in (("double", "was torch.float32 on cpu and is torch.float64"),
                             ("freeze", "was frozen (requires_grad_(False))")):
            for kind in DP_WRAPPERS:
                outcome = found[f"{change} {kind}"]
                assert outcome["step"] == 0, outcome  # the very next forward
                assert "changed after it was wrapped: parameter 'a.weight'" in outcome["error"]
                assert says in outcome["error"] and "then wrap the model" in outcome["error"]
            zero2 = found[f"{change} zero2"]
            assert zero2["step"] == 0 and "then build Zero2" in zero2["error"], zero2
            assert "param group 0, parameter 0 (shape (8, 4))" in zero2["error"], zero2
        assert found["freeze ddp"]["step"] == 1  # DDP refuses a frozen one an iteration later
        assert "Expected to have finished reduction" in found["freeze ddp"]["error"]
        assert found["double ddp"]["difference"] > 0.01  # torch 2.13's DDP: silently wrong


@pytest.mark.slow
def test_zero2_accumulates_micro_steps_with_a_parameter_unused_in_one(ranks):
    for found in (rank["zero2_accumulation"] for rank in ranks):
        assert set(found) == {"unused in micro-step 0", "used on rank 0 only, micro-step 1"}
        for case, kinds in found.items():
            assert kinds["ddp"] <= RIGHT and kinds["zero2"] <= RIGHT, (case, kinds)
    assert all(rank["zero2_retain_graph"] <= RIGHT for rank in ranks)  # each backward counts


@pytest.mark.slow
def test_fully_shard_finds_a_dataclass_output_and_refuses_one_it_cannot_look_into(ranks):
    for found in (rank["shard"] for rank in ranks):
        assert found["dataclass output"] <= RIGHT
        opaque = found["opaque output"]["error"]
        assert opaque.startswith("TypeError: fully_shard: the forward of Block (linear.weight, "
                                 "linear.bias) returned Opaque"), opaque
        assert "tuple, list, dict or dataclass" in opaque


@pytest.mark.slow
def test_fully_shard_averages_a_leftover_parameter_that_one_rank_used(ranks):
    for found in (rank["shard"] for rank in ranks):  # no hang: the launch came back
        assert found["leftover used on rank 0 only"] <= RIGHT  # spare, used nowhere: None


@pytest.mark.slow
def test_fully_shard_refuses_a_model_changed_after_wrapping(ranks):
    for found in (rank["shard"] for rank in ranks):
        double = found["double after fully_shard"]["error"]
        assert "fully_shard, ShardNet (bonus, spare, into.weight" in double, double
        assert "was torch.float32 on cpu and is torch.float64" in double
        frozen = found["freeze after fully_shard"]["error"]
        assert "fully_shard, Block (linear.weight, linear.bias)" in frozen, frozen
        assert "was frozen" in frozen and "then wrap the model" in frozen


@pytest.mark.slow
def test_set_requires_gradient_sync_accumulates_like_torchs_fully_shard(ranks):
    for found in (rank["no_sync"] for rank in ranks):
        assert found["vs torch"] <= RIGHT and found["vs one process"] <= RIGHT, found
        assert found["torch vs one process"] <= RIGHT, found
        # per module and step: 4 all-gathers and 2 reduce-scatters of one size, or 1 of them
        assert found["sent"] * 6 == found["sent syncing"] * 5, found
