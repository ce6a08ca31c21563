"""The trainer gives the same run however the global batch is split, with every sync strategy.

One global batch of 32 examples, trained for 6 steps as (world_size, accum_steps) = (1, 1),
(1, 4), (2, 2) and (4, 1); the world-size-1 runs happen in this process, the others are
launched (one launch trains every sync strategy from the same start).
"""

import json

import pytest
import torch

from course_lib.runtime.launch import launch
from course_lib.tasks.models import make_transformer
from course_lib.train.config import parse_config
from course_lib.train.trainer import run_single_process

STEPS = 6
COMMON = ["--steps", str(STEPS), "--global-batch", "32", "--seed", "3", "--warmup-steps", "2",
          "--result-params", "--log-every", "3"]  # small for test speed
ALL_SYNCS = "ddp,naive,ring,allreduce,bucketed,overlap"
FP32 = {"rtol": 1e-5, "atol": 1e-5}  # COURSE_DESIGN section 4, parameters and losses
FP64 = {"rtol": 1e-12, "atol": 1e-12}


def in_process(*args):
    return run_single_process(parse_config([*COMMON, *args]))


def launched(nproc, *args):
    run = launch("course_lib.train", nproc, [*COMMON, *args], timeout_s=240, quiet=True)
    assert run.returncode == 0
    return run.result


@pytest.fixture(scope="module")
def reference():
    return in_process("--accum-steps", "1")  # the single big batch


@pytest.fixture(scope="module")
def two_by_two():
    return launched(2, "--accum-steps", "2", "--sync", ALL_SYNCS)["by_sync"]


@pytest.fixture(scope="module")
def four_by_one():
    return launched(4, "--accum-steps", "1", "--sync", "ddp")


def assert_same_run(run, reference, tolerance):
    assert run["steps"] == reference["steps"] == list(range(1, STEPS + 1))
    assert run["tokens"] == reference["tokens"]  # the same examples, however split
    torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(reference["losses"]),
                               **tolerance)
    torch.testing.assert_close(torch.tensor(run["params"]), torch.tensor(reference["params"]),
                               **tolerance)


def test_reference_run_learns_something(reference):
    params = torch.tensor(reference["params"])
    assert reference["global_batch"] == 32 and reference["micro_batch"] == 32
    assert params.numel() == reference["param_summary"]["numel"] > 1000
    assert reference["losses"][-1] < reference["losses"][0]


def test_accumulation_in_one_process_matches(reference):
    run = in_process("--accum-steps", "4")
    assert run["micro_batch"] == 8
    assert_same_run(run, reference, FP32)


def test_two_processes_two_micro_steps_match(reference, two_by_two):
    run = two_by_two["ddp"]
    assert (run["world_size"], run["accum_steps"], run["micro_batch"]) == (2, 2, 8)
    assert_same_run(run, reference, FP32)


def test_four_processes_match(reference, four_by_one):
    assert (four_by_one["world_size"], four_by_one["micro_batch"]) == (4, 8)
    assert_same_run(four_by_one, reference, FP32)
    assert four_by_one["replicas_bitwise_equal"] is True


@pytest.mark.parametrize("name", ["naive", "ring", "allreduce", "bucketed", "overlap"])
def test_every_sync_strategy_equals_ddp(two_by_two, name):
    run, ddp = two_by_two[name], two_by_two["ddp"]
    assert run["sync"] == name and run["first_step"] == 1
    assert_same_run(run, ddp, FP32)
    assert run["replicas_bitwise_equal"] is True  # all-gathered checksums, every step
    totals = run["sync_totals"]
    assert totals["backward_calls"] == STEPS * 2  # two micro-steps per step
    assert totals["synced_steps"] == STEPS  # but only the last one communicates
    per_step = totals["collectives"] / STEPS
    if name in ("bucketed", "overlap"):
        assert per_step == 1  # the whole tiny model fits in one 25 MB bucket
    else:
        assert per_step == len(list(make_transformer().parameters()))  # one per tensor


def test_replicas_are_bitwise_equal_with_ddp(two_by_two):
    run = two_by_two["ddp"]
    assert run["replicas_bitwise_equal"] is True
    assert len(run["replica_checksums"]) == 2  # one hash per rank, gathered every step
    assert len(set(run["replica_checksums"])) == 1
    assert run["param_checksum"].startswith(run["replica_checksums"][0])


def test_float64_matches_to_1e_12():
    single = in_process("--accum-steps", "1", "--dtype", "float64")
    runs = launched(2, "--accum-steps", "2", "--dtype", "float64", "--sync", "ddp,ring")
    for name, run in runs["by_sync"].items():
        assert run["dtype"] == "float64", name
        assert_same_run(run, single, FP64)


def test_mean_of_micro_means_is_visibly_wrong(reference):
    buggy = in_process("--accum-steps", "4", "--loss-norm", "mean_of_means")
    assert buggy["losses"][0] == pytest.approx(reference["losses"][0], rel=1e-5)  # same start
    params_gap = (torch.tensor(buggy["params"]) - torch.tensor(reference["params"])).abs().max()
    assert params_gap > 1e-4  # 10 x the fp32 tolerance that the right normalisation meets
    assert abs(buggy["losses"][-1] - reference["losses"][-1]) > 1e-5


def test_metrics_file_has_one_line_per_step(tmp_path, reference):
    path = tmp_path / "metrics.jsonl"
    run = in_process("--accum-steps", "2", "--metrics", str(path))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, STEPS + 1))
    for m, loss, tokens in zip(lines, run["losses"], reference["tokens"], strict=True):
        assert {"step", "loss", "grad_norm", "tokens", "step_time_s"} <= m.keys()
        assert m["loss"] == loss and m["tokens"] == tokens and m["step_time_s"] > 0
        assert m["grad_norm"] > 0


def test_default_settings_train_the_model_down():
    """The default run (--nproc 2 --accum-steps 2: global batch 64), here in one process."""
    run = run_single_process(parse_config(["--global-batch", "64", "--log-every", "50"]))
    assert run["global_batch"] == 64 and len(run["losses"]) == 150
    first, last = run["losses"][0], sum(run["losses"][-10:]) / 10
    assert last < first - 0.8  # from about 2.6 (guessing among 14 tokens) to well below 2


@pytest.mark.slow
def test_the_logged_loss_is_all_reduced_and_a_ranks_own_loss_is_not_it(four_by_one, reference):
    """Notebook 07, section 5: every rank's own loss is the loss of its share; the logged,
    all-reduced loss is the single process's."""
    own = four_by_one["rank_losses"]
    assert len(own) == 4 and all(len(row) == STEPS for row in own)
    torch.testing.assert_close(torch.tensor(four_by_one["losses"]),
                               torch.tensor(reference["losses"]), **FP32)
    gap = max(abs(a - b) for a, b in zip(own[0], reference["losses"], strict=True))
    assert gap > 1e-2
    assert reference["rank_losses"] == [reference["losses"]]  # one rank: its loss is the loss
