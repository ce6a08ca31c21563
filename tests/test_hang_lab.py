"""The hang-diagnosis lab of notebook 09: every failure ends within seconds, and each debugging
aid says what it should (DETAIL names the collective, monitored_barrier names the rank)."""

import pytest

from course_lib.demos.hang_lab import (
    CASES,
    Case,
    blamed_ranks,
    diagnosis,
    error_line,
    summarise_case,
)
from course_lib.runtime.launch import LaunchError, launch


def test_blamed_ranks_are_read_from_monitored_barrier_messages():
    assert blamed_ranks("RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier") == [1]
    assert blamed_ranks("[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 2000 ms") == [
        1, 3]
    assert blamed_ranks("Timed out waiting 3000ms for recv operation to complete") == []


def test_error_line_takes_the_exception_or_says_how_the_rank_ended():
    log = "rank 0 finished step 0\nRuntimeError: Connection closed by peer\n"
    assert error_line(log, 1, stopped=False) == "RuntimeError: Connection closed by peer"
    assert error_line("", -9, stopped=False).startswith("killed by signal 9")
    assert error_line("", -9, stopped=True).startswith("still waiting")
    assert error_line("rank 1 finished step 2\n", 0, stopped=False) == ""


def test_summary_of_a_made_up_stuck_rank():
    logs = ["RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms\n", ""]
    s = summarise_case(Case("stuck-rank", "monitored"), logs, [1, -9], [1], 4.2, 30.0)
    assert s["raised_ranks"] == [0] and s["stopped_ranks"] == [1]
    assert s["blamed_ranks"] == [1] and not s["finished"] and s["ended_in_time"]
    assert diagnosis(s) == "rank 1 named as missing"


@pytest.fixture(scope="module")
def lab():
    run = launch("course_lib.demos.hang_lab", nproc=1, args=["--lab"], timeout_s=120,
                 quiet=True)
    return {(r["failure"], r["setting"]): r for r in run.result}


@pytest.mark.slow
def test_every_case_ends_within_seconds(lab):
    assert sorted(lab) == sorted((c.failure, c.setting) for c in CASES)
    for key, r in lab.items():  # a case still running at the lab's 30 s deadline was killed
        assert r["ended_in_time"], (key, r["seconds"])
    assert lab[("none", "plain")]["finished"]
    assert all(not r["finished"] for key, r in lab.items() if key[0] != "none")


@pytest.mark.slow
def test_without_aids_no_message_names_the_culprit_or_the_collective(lab):
    for failure in ("mismatch", "eval-on-rank0", "dead-rank", "stuck-rank"):
        r = lab[(failure, "plain")]
        assert r["blamed_ranks"] == [] and not r["names_collective"], failure
    assert lab[("mismatch", "plain")]["timed_out"]  # the mismatch just waits for the timeout
    assert diagnosis(lab[("mismatch", "plain")]) == "timed out, no rank named"
    assert diagnosis(lab[("stuck-rank", "plain")]) == "timed out, no rank named"
    assert diagnosis(lab[("dead-rank", "plain")]) == "connection lost, no rank named"
    assert lab[("dead-rank", "plain")]["connection_lost"]  # the survivor loses its peer
    assert lab[("dead-rank", "plain")]["raised_ranks"] == [0]  # the dead rank says nothing


@pytest.mark.slow
def test_detail_names_the_mismatched_collective(lab):
    mismatch = lab[("mismatch", "detail")]
    assert mismatch["names_collective"] and "BROADCAST" in mismatch["first_error"]
    evaluation = lab[("eval-on-rank0", "detail")]
    assert evaluation["names_collective"] and "shapes" in evaluation["first_error"]
    assert lab[("stuck-rank", "detail")]["blamed_ranks"] == [1]


@pytest.mark.slow
def test_monitored_barrier_names_the_missing_rank(lab):
    for failure in ("dead-rank", "stuck-rank"):
        r = lab[(failure, "monitored")]
        assert r["blamed_ranks"] == [1] and r["raised_ranks"] == [0], failure
        assert diagnosis(r) == "rank 1 named as missing"


@pytest.mark.slow
def test_under_torchrun_detail_reaches_the_workers_and_the_run_ends():
    with pytest.raises(LaunchError) as caught:
        launch("course_lib.demos.hang_lab", nproc=2, args=["--failure", "mismatch"],
               env={"COURSE_PG_TIMEOUT_S": "5", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
               timeout_s=90, quiet=True)
    message = str(caught.value)
    assert "Detected mismatch between collectives" in message
    assert "BROADCAST" in message
